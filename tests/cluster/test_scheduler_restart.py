"""A scheduler killed with kill -9 mid-job costs seconds, not the job: ``mxdist launch`` restarts
it at its address (psnode: whatever ``--max-restarts``), the live nodes rejoin it with their
ranks, and the workers' rounds go on meanwhile (data does not pass the scheduler).

Real processes on 127.0.0.1 through ``mxdist launch``: W=3 workers, S=2 servers, every round
checked against its closed form (rank r pushes (r+1)*(step+1); dist_sync averages: 2*(step+1)).
Each test asserts exit 0, exact values on every rank, the restart in the output, the closing
line and ``mxdist status``, and that nothing of the job is left.
"""
from __future__ import annotations

import json
import os
import signal
import textwrap
from pathlib import Path

from tests.support.cli import assert_nothing_left, cli_env, kill_cli, latest, run_cli, start_cli, wait_for
from tests.support.scheduler_restart import ROUNDS

# workers 0 and 1 wait in kv.barrier() while the scheduler is killed; worker 2 enters it after
IN_BARRIER = textwrap.dedent("""
    import pathlib, sys, time, numpy as np, psnode
    flags = pathlib.Path(sys.argv[1])
    kv = psnode.kv.create('dist_sync')
    kv.init('w', np.zeros(8, np.float32))
    bad = []

    def rounds(first, last):
        for step in range(first, last):
            kv.push('w', np.full(8, (kv.rank + 1) * (step + 1), np.float32))
            got = kv.pull('w')
            if not (got == 2.0 * (step + 1)).all():
                bad.append((step, float(got[0])))

    rounds(0, 5)
    if kv.rank == 2:
        deadline = time.monotonic() + 120
        while not (flags / 'go').exists():
            assert time.monotonic() < deadline, 'no go'
            time.sleep(0.02)
    else:
        (flags / f'barrier{kv.rank}').touch()
    kv.barrier()
    rounds(5, 10)
    kv.barrier()
    print('RANK', kv.rank, 'BAD', bad, flush=True)
    kv.close()
""")


def _script(tmp_path: Path, text: str) -> str:
    path = tmp_path / "job.py"
    path.write_text(text)
    return str(path)


def _scheduler(home: Path) -> dict:
    return next(p for p in latest(home)["procs"] if p["name"] == "scheduler")


def _psnode_child(reaper: int) -> int:
    """The psnode scheduler under its reaper (mxdist.backends.agent)."""
    children = wait_for(lambda: Path(f"/proc/{reaper}/task/{reaper}/children").read_text().split(), 30,
                        "the scheduler's process under its reaper")
    return int(children[0])


def _assert_job_ended_well(home: Path, out: str, code: int | None, how: str) -> None:
    assert code == 0, out
    assert f"scheduler on localhost {how}: restarting it at" in out, out
    last = out.splitlines()[-1]
    assert "succeeded in" in last and last.endswith(": scheduler restarted 1 time"), out
    rec = latest(home)
    assert rec["state"] == "succeeded" and rec["exit_code"] == 0
    job = json.loads(run_cli(["status", rec["id"], "--json"], cli_env(home)).stdout)
    sched = next(n for n in job["nodes"] if n["role"] == "scheduler")
    assert sched["restarts"] == 1, sched
    assert_nothing_left(home)


def test_scheduler_killed_mid_job_is_restarted_and_every_rank_ends_exactly(tmp_path):
    home, flags = tmp_path / "home", tmp_path / "flags"
    flags.mkdir()
    proc = start_cli(["launch", "-n", "3", "-s", "2", _script(tmp_path, ROUNDS), str(flags), "150"], cli_env(home))
    try:
        wait_for(lambda: (flags / "round5").exists(), 90, "worker 0 to finish round 5")
        os.killpg(_scheduler(home)["pid"], signal.SIGKILL)   # the scheduler and its reaper: no exit status
        out, _ = proc.communicate(timeout=180)
    finally:
        kill_cli(proc)
    lines = sorted(line for line in out.splitlines() if "RANK" in line and "BAD" in line)
    assert [line.split("] ", 1)[-1] for line in lines] == [f"RANK {r} ROUNDS 150 BAD []" for r in range(3)], out
    _assert_job_ended_well(home, out, proc.returncode,
                           "ended without an exit status (killed together with its reaper?)")


def test_scheduler_killed_while_workers_wait_in_a_barrier(tmp_path):
    home, flags = tmp_path / "home", tmp_path / "flags"
    flags.mkdir()
    proc = start_cli(["launch", "-n", "3", "-s", "2", _script(tmp_path, IN_BARRIER), str(flags)], cli_env(home))
    try:
        wait_for(lambda: (flags / "barrier0").exists() and (flags / "barrier1").exists(), 90,
                 "workers 0 and 1 to enter the barrier")
        first = _scheduler(home)["pid"]
        os.kill(_psnode_child(first), signal.SIGKILL)
        wait_for(lambda: _scheduler(home)["restarts"] == 1, 60, "the launcher to restart the scheduler")
        (flags / "go").touch()
        out, _ = proc.communicate(timeout=180)
    finally:
        kill_cli(proc)
    lines = sorted(line for line in out.splitlines() if "RANK" in line and "BAD" in line)
    assert [line.split("] ", 1)[-1] for line in lines] == [f"RANK {r} BAD []" for r in range(3)], out
    _assert_job_ended_well(home, out, proc.returncode, "killed by SIGKILL")
