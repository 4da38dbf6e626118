"""What ``mxdist status`` and the closing panel say of a job's processes, end to end on this
machine: the same pid for a process while it runs and after ``stop``, and a worker that failed
with the root cause's own error named as failed with it.

Each test runs the CLI as a subprocess with a private MXDIST_HOME and ends by checking that no
process of the job remains.
"""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

from tests.support.cli import assert_nothing_left, cli_env, latest, run_cli, wait_for

WAITER = textwrap.dedent("""
    import time
    import psnode.kv
    kv = psnode.kv.create('dist_sync')
    print("ready", flush=True)
    time.sleep(120)
""")


def _pids(env: dict[str, str], job: str) -> dict[str, tuple[int, str]]:
    """Per process (role, rank): its pid in ``status --json`` and where the row came from."""
    res = run_cli(["status", job, "--json"], env)
    assert res.returncode == 0, res.stdout + res.stderr
    return {f"{n['role']} {n['rank']}": (n["pid"], n["source"]) for n in json.loads(res.stdout)["nodes"]}


def test_status_shows_each_process_with_one_pid_while_it_runs_and_after_stop(tmp_path: Path):
    home = tmp_path / "home"
    env = cli_env(home)
    script = tmp_path / "waiter.py"
    script.write_text(WAITER)
    res = run_cli(["launch", "-d", "-n", "2", "-s", "1", str(script)], env)
    assert res.returncode == 0, res.stdout + res.stderr
    job = res.stdout.split()[-1]
    wait_for(lambda: all(src == "scheduler" for who, (_, src) in _pids(env, job).items() if who != "scheduler None"),
             60, "the scheduler's live rows for the server and both workers")
    running = _pids(env, job)
    recorded = {f"{p['role']} {p['rank']}": p["pid"] for p in latest(home)["procs"]}
    assert {who: pid for who, (pid, _) in running.items()} == recorded
    stop = run_cli(["stop", job], env)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert {who: pid for who, (pid, _) in _pids(env, job).items()} == recorded
    assert_nothing_left(home)


BOTH_FAIL = textwrap.dedent("""
    import os, pathlib, signal, time
    flag = pathlib.Path(__file__).with_name("worker0.pid")
    armed = pathlib.Path(__file__).with_name("worker1.armed")
    deadline = time.monotonic() + 60
    if os.environ["RANK"] == "0":            # fails first, once worker 1 can outlive the job's stop
        while not armed.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        flag.write_text(str(os.getpid()))
    else:                                    # fails too, once worker 0 is gone, whatever the job's stop
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        armed.write_text("")

        def gone():
            try:
                stat = pathlib.Path(f"/proc/{flag.read_text()}/stat").read_text()
            except (OSError, ValueError):
                return flag.exists()
            return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")
        while not gone() and time.monotonic() < deadline:
            time.sleep(0.02)
    import nosuchmod_b46
""")


def test_a_worker_that_failed_with_the_root_causes_error_is_named_failed_with_it(tmp_path: Path):
    home = tmp_path / "home"
    script = tmp_path / "both.py"
    script.write_text(BOTH_FAIL)
    res = run_cli(["launch", "-n", "2", "-s", "1", "--grace", "10", str(script)], cli_env(home))
    assert res.returncode == 1, res.stdout + res.stderr
    text = " ".join(res.stderr.replace("│", " ").split())
    error = "ModuleNotFoundError: No module named 'nosuchmod_b46'"
    assert f"worker 0 on localhost: {error}" in text, text
    assert f"worker 1 on localhost: failed too, with the same error ({error})" in text, text
    assert latest(home)["consequences"][-1] == f"worker 1 on localhost: failed too, with the same error ({error})"
    assert_nothing_left(home)
