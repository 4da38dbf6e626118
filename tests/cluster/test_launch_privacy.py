"""Shared machines: MXDIST_HOME, job directories, logs, records and keys are private to the user
who launched the job (directories 0700, files 0600), and another user can neither see nor touch
them: not read the record, the logs or the key, not leave a stop request for the supervisor,
not take its lock, not signal the job's processes.

The other user is a real Unix user created for the test (``other_user``, tests/conftest.py).
It runs an interpreter it may run (the project's own lives under /root, which it cannot enter:
then the system Python) with the project on PYTHONPATH, and uses ``mxdist.job.records`` (imported from
the ``cli/`` folder, as ``cli.jobs``: that interpreter has no install) -- the standard-library
module through which ``mxdist status`` and ``mxdist stop`` reach a job -- and plain file and
signal calls.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import textwrap
from pathlib import Path

import pytest

from tests.support.cli import ROOT, assert_nothing_left, cli_env, latest, run_cli, wait_for

SLEEPER = textwrap.dedent("""
    import os, time
    print("started rank", os.environ["RANK"], flush=True)
    time.sleep(300)
""")

PROBE = textwrap.dedent("""
    import json, os, signal, sys
    from pathlib import Path
    from cli.job import records
    home, job, pids = Path(sys.argv[1]), sys.argv[2], [int(p) for p in sys.argv[3:]]
    records.use_home(home)
    out = {}

    def attempt(name, fn):
        try:
            fn()
            out[name] = "allowed"
        except PermissionError:
            out[name] = "denied"
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {exc}"

    attempt("list home", lambda: os.listdir(home))
    attempt("list jobs", lambda: os.listdir(home / "jobs"))
    attempt("read record", lambda: (home / "jobs" / f"{job}.json").read_text())
    attempt("read log", lambda: (home / "jobs" / job / "worker-0.log").read_text())
    attempt("stop request", lambda: records.write_atomic(records.stop_request_path(job), "{}"))
    attempt("supervisor lock", lambda: records.try_lock(job))
    attempt("write record", lambda: records.save(records.JobRecord(id=job, command=[], backend="local")))
    try:
        records.resolve(job)
        out["status"] = "allowed"
    except records.JobNotFound as exc:
        out["status"] = str(exc)
    for pid in pids:
        attempt(f"kill {pid}", lambda pid=pid: os.kill(pid, signal.SIGTERM))
    print(json.dumps(out))
""")


@pytest.fixture
def shared_home():
    """An MXDIST_HOME in a directory every user may enter (a home directory is usually 0755)."""
    base = Path(tempfile.mkdtemp(prefix="mxdist-priv-", dir="/tmp"))
    os.chmod(base, 0o755)
    home = base / "home"
    home.mkdir(mode=0o755)          # as an older mxdist (or a umask of 022) left it
    try:
        yield home
    finally:
        shutil.rmtree(base, ignore_errors=True)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_another_user_cannot_see_or_touch_a_job(other_user, shared_home, tmp_path):
    env = cli_env(shared_home)
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text(SLEEPER)
    res = run_cli(["launch", "-d", "-n", "1", "-s", "1", str(sleeper)], env)
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip().splitlines()[-1]
    jobdir = shared_home / "jobs" / job
    wait_for(lambda: (jobdir / "worker-0.log").exists() and "started" in (jobdir / "worker-0.log").read_text(),
             30, "the worker's first line")
    assert mode(shared_home) == 0o700 and mode(shared_home / "jobs") == 0o700 and mode(jobdir) == 0o700
    files = [shared_home / "jobs" / f"{job}.json", *jobdir.iterdir()]
    assert {f.name: mode(f) for f in files} == {f.name: 0o600 for f in files}
    rec = latest(shared_home)
    pids = [str(p["pid"]) for p in rec["procs"]] + [str(rec["supervisor"]["pid"])]
    probe = other_user.run([other_user.python, "-c", PROBE, str(shared_home), job, *pids],
                           env={"PYTHONPATH": str(ROOT)})
    assert probe.returncode == 0, probe.stderr
    seen = json.loads(probe.stdout)
    assert "permission denied" in seen.pop("status")
    assert set(seen.values()) == {"denied"}, seen
    view = json.loads(run_cli(["status", job, "--json"], env).stdout)
    assert view["state"] == "running" and {n["state"] for n in view["nodes"]} <= {"running", "alive", "registered"}
    stop = run_cli(["stop", job], env)
    assert stop.returncode == 0, stop.stderr
    assert latest(shared_home)["state"] == "stopped"
    assert_nothing_left(shared_home)
