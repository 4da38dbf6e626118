"""A job whose supervisor is killed with SIGKILL while the job runs, then ended by ``mxdist``.

Shared by ``tests/cluster/test_launch_orphan.py`` (this machine) and
``tests/ssh/test_ssh_orphan.py`` (the SSH testbed).  The supervisor is ``mxdist launch`` itself
(attached) or its background child (``-d``); with it gone nobody removes the job's secret files
at the job's end, so either the user's ``mxdist stop <id>`` (:func:`mxdist.control.takeover.stop_orphan`)
or, once the processes ended by themselves, the next ``mxdist status``
(:func:`mxdist.control.takeover.refresh`, which finalises the record) must end every process and remove
them: the launcher's copy ``MXDIST_HOME/jobs/<id>/job.key`` and ``<run dir>/job.key`` on every
host.  Every wait is bounded.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
from pathlib import Path
from typing import Any

from tests.support.cli import (
    assert_nothing_left,
    kill_cli,
    records,
    run_cli,
    start_cli,
    wait_for,
)
from tests.support.cli import left_over as processes_left

#: each worker marks itself ready after the barrier, then waits (bounded) for the ``go`` file
WAITS = textwrap.dedent("""
    import numpy as np, os, pathlib, psnode, sys, time
    ready, go = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    kv = psnode.kv.create('dist_sync')
    kv.init('w', np.zeros(4, np.float32))
    kv.barrier()
    (ready / f"worker-{kv.rank}").touch()
    deadline = time.monotonic() + 90
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    kv.push('w', np.full(4, kv.rank + 1, np.float32))
    got = kv.pull('w')
    print("PULLED", got.tolist(), flush=True)
    assert (got == 1.5).all(), got
    kv.close()
""")


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def secret_files(rec: dict[str, Any]) -> list[Path]:
    """The job's secret files: the launcher's copy and each host's ``<run dir>/job.key``."""
    return [Path(rec["key_file"]), *(Path(p) for p in dict(rec.get("remote_keys") or {}).values())]


def start_and_kill_the_supervisor(launch: list[str], detached: bool, env: dict[str, str], home: Path,
                                  tmp_path: Path, hosts: int = 1) -> tuple[dict[str, Any], Path]:
    """Start ``mxdist launch [-d] LAUNCH WAITS ready go`` (2 workers), wait until both workers
    passed the barrier, SIGKILL the supervisor and wait (bounded) until it is gone; the job's
    record as the supervisor left it (``running``) and the ``go`` file's path."""
    ready, go = tmp_path / "ready", tmp_path / "go"
    ready.mkdir()
    job = tmp_path / "waits.py"
    job.write_text(WAITS)
    argv = ["launch", *(["-d"] if detached else []), *launch, str(job), str(ready), str(go)]
    proc: subprocess.Popen[str] | None = None
    try:
        if detached:
            res = run_cli(argv, env)
            assert res.returncode == 0, res.stdout + res.stderr
        else:
            proc = start_cli(argv, env)
        wait_for(lambda: len(list(ready.iterdir())) == 2, 90, "both workers past the barrier")
        rec = records(home)[-1]
        assert rec["state"] == "running", rec
        sup = rec["supervisor"]["pid"]
        if proc is not None:   # attached: ``mxdist launch`` supervises (its output a pipe: in its child)
            parent = int(Path(f"/proc/{sup}/stat").read_text().rsplit(")", 1)[1].split()[1])
            assert proc.pid in (sup, parent), (sup, parent, proc.pid)
        os.kill(sup, signal.SIGKILL)
        if proc is not None:
            proc.wait(10)
        wait_for(lambda: not _alive(sup), 10, "the supervisor to be gone")
    except BaseException:
        go.touch()   # the workers end by themselves
        raise
    finally:
        if proc is not None:
            kill_cli(proc)
    after = records(home)[-1]
    assert after["state"] == "running" and after["id"] == rec["id"], after
    assert len([p for p in after["procs"] if p["pid"]]) == 2 + 1 + int(launch[launch.index("-s") + 1])
    files = secret_files(after)
    assert len(files) == 1 + (hosts if after.get("remote_keys") else 0), files
    assert all(f.exists() for f in files), files     # nobody removed them yet
    assert processes_left(home), "the job's processes should run on without their supervisor"
    return after, go


def stop_it(rec: dict[str, Any], env: dict[str, str], home: Path) -> None:
    """``mxdist stop <id>``: every process stopped, the record ``stopped``, every secret removed."""
    stop = run_cli(["stop", rec["id"]], env)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert "nothing of the job left" in stop.stderr and "not verified" not in stop.stderr, stop.stderr
    assert not processes_left(home)
    final = json.loads(run_cli(["status", rec["id"], "--json"], env).stdout)
    assert final["state"] == "stopped" and final["exit_code"] == 143, final
    assert not [f for f in secret_files(rec) if f.exists()]
    assert_nothing_left(home)


def let_it_finish(rec: dict[str, Any], go: Path, env: dict[str, str], home: Path) -> None:
    """The workers end by themselves with exact values; the next ``mxdist status`` finalises the
    record (``succeeded``) and removes every secret."""
    go.touch()
    wait_for(lambda: not processes_left(home), 60, "the job's processes to end without their supervisor")
    # the processes' own logs: locally the record's; over SSH in the run dir (every host of the
    # testbed is this machine), as the record's are copies fetched by the (killed) supervisor
    logs = [Path(rec["run_dir"]) / f"{p['name']}.log" if rec["backend"] == "ssh" else Path(p["log"])
            for p in rec["procs"] if p["role"] == "worker"]
    assert len(logs) == 2 and all("PULLED [1.5, 1.5, 1.5, 1.5]" in log.read_text() for log in logs), logs
    assert all(f.exists() for f in secret_files(rec))    # still there: nobody finalised the job yet
    view = json.loads(run_cli(["status", rec["id"], "--json"], env).stdout)
    assert view["state"] == "succeeded" and view["exit_code"] == 0, view
    assert any("supervisor was lost" in note for note in view["notes"]), view
    assert not [f for f in secret_files(rec) if f.exists()]
    final = records(home)[-1]
    assert final["state"] == "succeeded" and final["supervisor_lost"] and not final.get("unverified"), final
    assert_nothing_left(home)
