"""mxdist launch options that become psnode configuration, end to end with real processes:
--distribution, --skip-nonfinite, --max-restarts, --checkpoint-* / --resume, --cpu-policy, and
a launcher killed with kill -9 mid-job.  Every test ends by checking that no process of the job is left.
"""
from __future__ import annotations

import json
import os
import signal
import textwrap
import time
from pathlib import Path

import pytest

from tests.support.cli import (
    assert_nothing_left,
    cli_env,
    group_members,
    kill_cli,
    latest,
    left_over,
    run_cli,
    start_cli,
    wait_for,
)

OPTIONS = textwrap.dedent("""
    import os, numpy as np, psnode
    kv = psnode.kv.create('dist_sync')
    kv.init('w', np.ones(3, np.float32))
    kv.push('w', np.full(3, np.nan if kv.rank == 1 else 5.0, np.float32))
    skipped = (kv.pull('w') == 1).all()
    print("DIST", kv.distribution, "SKIPPED", bool(skipped), "KEY", os.environ.get("PSNODE_KEY_FILE"))
    kv.close()
""")

# tests/cluster/test_restart.py's script: rank 1 crashes (exit 9) at step 3 of its first run
RESTART = textwrap.dedent("""
    import os, numpy as np, psnode
    kv = psnode.kv.create('dist_sync')
    kv.set_optimizer(psnode.optimizer.create('sgd', learning_rate=0.125))
    kv.init('w', np.zeros(3, np.float32))
    start = kv.num_pushes('w')
    print("START", start, "RESTARTS", kv.restarts, flush=True)
    for step in range(start, 6):
        if kv.rank == 1 and step == 3 and os.environ.get('PSNODE_RESTART_COUNT', '0') == '0':
            print("crashing at step", step, flush=True)
            os._exit(9)
        kv.push('w', np.full(3, (kv.rank + 1) * (step + 1), np.float32))
        kv.pull('w')
    print("FINAL", kv.pull('w').tolist(), flush=True)
    kv.close()
""")

FIRST = textwrap.dedent("""
    import numpy as np, psnode
    kv = psnode.kv.create('dist_sync')
    kv.set_optimizer(psnode.optimizer.create('sgd', learning_rate=0.5))
    kv.init('w', np.zeros(4, np.float32))
    for s in range(3):
        kv.push('w', np.full(4, kv.rank + 1, np.float32))
        kv.pull('w')
    print("W", kv.pull('w').tolist())
    kv.close()
""")

SECOND = textwrap.dedent("""
    import numpy as np, psnode
    kv = psnode.kv.create('dist_sync')
    w = np.full(4, 99, np.float32)
    kv.init('w', w)                    # the checkpoint wins over init
    print("W", w.tolist())
    kv.close()
""")

SLOW = textwrap.dedent("""
    import sys, time, numpy as np, psnode
    kv = psnode.kv.create('dist_sync')
    kv.init('w', np.zeros(2, np.float32))
    for step in range(40):
        kv.push('w', np.ones(2, np.float32)); kv.pull('w')
        if step == 2:
            print("TRAINING", flush=True)
        time.sleep(0.1)
    print("DONE", kv.pull('w').tolist(), flush=True)
    kv.close()
""")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "mxdist-home"


def script(tmp_path: Path, text: str, name: str = "job.py") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def lines(out: str, tag: str) -> list[str]:
    return [line.split("] ", 1)[1] for line in out.splitlines() if "] " in line and f"] {tag}" in line]


def test_distribution_and_skip_nonfinite_reach_the_scripts(home, tmp_path):
    res = run_cli(["launch", "-n", "2", "-s", "1", "--distribution", "data", "--skip-nonfinite",
                   script(tmp_path, OPTIONS)], cli_env(home))
    assert res.returncode == 0, res.stdout + res.stderr
    key = home / "jobs" / latest(home)["id"] / "job.key"          # every job has a secret, local ones too
    assert lines(res.stdout, "DIST") == [f"DIST data SKIPPED True KEY {key}"] * 2
    server_log = Path(next(p["log"] for p in latest(home)["procs"] if p["name"] == "server-0")).read_text()
    assert "non-finite gradient from worker(s) [1]" in server_log
    assert_nothing_left(home)


def test_failed_worker_is_restarted_and_the_job_ends_exactly(home, tmp_path):
    res = run_cli(["launch", "-n", "2", "-s", "2", "--max-restarts", "1", script(tmp_path, RESTART)],
                  cli_env(home), timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "worker-1 on localhost exit code 9: restarting it with rank 1 (restart 1 of 1)" in res.stderr
    want = [-0.125 * 1.5 * sum(range(1, 7))] * 3        # the uninterrupted closed form
    assert sorted(lines(res.stdout, "FINAL")) == [f"FINAL {want}"] * 2
    assert "[worker 1 @ localhost] START 3 RESTARTS 1" in res.stdout
    assert res.stdout.count("[worker 1 @ localhost] crashing at step 3") == 1   # no replayed output
    rec = latest(home)
    assert rec["state"] == "succeeded"
    w1 = next(p for p in rec["procs"] if p["name"] == "worker-1")
    assert w1["restarts"] == 1 and w1["state"] == "exited"
    assert_nothing_left(home)


def test_without_restarts_the_same_crash_fails_the_job(home, tmp_path):
    res = run_cli(["launch", "-n", "2", "-s", "2", "--grace", "2", script(tmp_path, RESTART)],
                  cli_env(home), timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "worker 1 on localhost: exit code 9" in res.stderr
    assert "[worker 1 @ localhost] crashing at step 3" in res.stdout   # streamed, so the panel omits the tail
    assert "restarting" not in res.stderr
    assert latest(home)["state"] == "failed"
    assert_nothing_left(home)


def test_checkpoint_then_resume_in_a_new_launch(home, tmp_path):
    ckpt = tmp_path / "ckpt"
    env = cli_env(home)
    first = run_cli(["launch", "-n", "2", "-s", "2", "--checkpoint-dir", str(ckpt),
                     "--checkpoint-rounds", "1", script(tmp_path, FIRST, "first.py")], env)
    assert first.returncode == 0, first.stdout + first.stderr
    files = os.listdir(ckpt)      # each server's chain: its base, and the deltas after it
    assert {"server-0.npz", "server-1.npz"} <= set(files) and all(f.startswith("server-") for f in files), files
    saved = lines(first.stdout, "W")
    assert saved == ["W [-2.25, -2.25, -2.25, -2.25]"] * 2     # 3 rounds of -0.5 * 1.5
    second = run_cli(["launch", "-n", "2", "-s", "2", "--checkpoint-dir", str(ckpt), "--resume",
                      script(tmp_path, SECOND, "second.py")], env)
    assert second.returncode == 0, second.stdout + second.stderr
    assert lines(second.stdout, "W") == saved
    missing = run_cli(["launch", "-n", "2", "-s", "3", "--checkpoint-dir", str(ckpt), "--resume",
                       script(tmp_path, SECOND, "second.py")], env)
    assert missing.returncode == 2 and "no checkpoint server-2.npz" in missing.stderr
    assert "Traceback" not in missing.stderr
    assert_nothing_left(home)


def test_killed_launcher_leaves_a_job_that_ends_by_itself(home, tmp_path):
    env = cli_env(home)
    proc = start_cli(["launch", "-n", "2", "-s", "1", "--heartbeat-interval", "0.5",
                      script(tmp_path, SLOW)], env)
    try:
        seen: list[str] = []
        wait_for(lambda: seen.append(proc.stdout.readline()) or any("TRAINING" in s for s in seen),
                 60, "training to start", interval=0)
        rec = latest(home)
        pgids = [p["pid"] for p in rec["procs"]]
        assert len(pgids) == 4 and all(pgids)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        kill_cli(proc)
    t0 = time.monotonic()
    wait_for(lambda: not left_over(home), 30, "the job's processes to end without the launcher")
    assert time.monotonic() - t0 < 30
    logs = {p["name"]: Path(p["log"]).read_text() for p in rec["procs"]}
    assert all("DONE [" in logs[f"worker-{r}"] for r in range(2)), logs
    # the next status notices the lost supervisor and finalises the record from the exit codes
    view = json.loads(run_cli(["status", rec["id"], "--json"], env).stdout)
    assert view["state"] == "succeeded" and view["exit_code"] == 0, view
    assert any("supervisor was lost" in note for note in view["notes"]), view
    final = latest(home)
    assert final["supervisor_lost"] and final["ended"] and final["state"] == "succeeded"
    stop = run_cli(["stop", rec["id"]], env)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert "already succeeded: nothing to stop" in stop.stderr, stop.stderr
    assert latest(home)["state"] == "succeeded"
    assert_nothing_left(home)


SERVER_KILLED = textwrap.dedent("""
    import sys, time, pathlib, numpy as np, psnode
    flags = pathlib.Path(sys.argv[1])
    kv = psnode.kv.create('dist_sync')
    kv.set_optimizer(psnode.optimizer.create('adam', learning_rate=0.125))
    for k in ('a', 'b', 'c'):
        kv.init(k, np.zeros(4, np.float32))
    for step in range(6):
        if kv.rank == 1 and step == 3:
            deadline = time.monotonic() + 60
            while not (flags / 'go').exists():
                assert time.monotonic() < deadline
                time.sleep(0.02)
        for k in ('a', 'b', 'c'):
            kv.push(k, np.full(4, (kv.rank + 1) * (step + 1), np.float32))
        if kv.rank == 0 and step == 3:
            (flags / 'pushed').touch()
        for k in ('a', 'b', 'c'):
            kv.pull(k)
    print("FINAL", [kv.pull(k).tolist() for k in ('a', 'b', 'c')], flush=True)
    kv.close()
""")


def test_killed_server_is_restarted_from_its_checkpoint_and_the_job_ends_exactly(home, tmp_path):
    flags = tmp_path / "flags"
    flags.mkdir()
    env = cli_env(home)
    proc = start_cli(["launch", "-n", "2", "-s", "2", "--max-restarts", "1", "--checkpoint-dir",
                      str(tmp_path / "ckpt"), "--checkpoint-rounds", "1",
                      script(tmp_path, SERVER_KILLED), str(flags)], env)
    try:
        wait_for(lambda: (flags / "pushed").exists(), 60, "worker 0 to push round 4")
        reaper = next(p["pid"] for p in latest(home)["procs"] if p["name"] == "server-1")
        children = Path(f"/proc/{reaper}/task/{reaper}/children").read_text().split()
        os.kill(int(children[0]), signal.SIGKILL)         # the psnode server under its reaper
        wait_for(lambda: next(p for p in latest(home)["procs"] if p["name"] == "server-1")["restarts"] == 1,
                 30, "the launcher to restart server-1")
        (flags / "go").touch()
        out, _ = proc.communicate(timeout=90)            # (stderr goes to out)
    finally:
        kill_cli(proc)
    assert proc.returncode == 0, out
    assert "server-1 on localhost killed by SIGKILL: restarting it with rank 1 (restart 1 of 1)" in out, out
    # the uninterrupted run, on a 'local' store fed the workers' average gradient
    import numpy as np

    import psnode
    kv = psnode.kv.create("local")
    kv.set_optimizer(psnode.optimizer.create("adam", learning_rate=0.125))
    for k in ("a", "b", "c"):
        kv.init(k, np.zeros(4, np.float32))
    for step in range(6):
        for k in ("a", "b", "c"):
            kv.push(k, np.full(4, 1.5 * (step + 1), np.float32))
    want = [kv.pull(k).tolist() for k in ("a", "b", "c")]
    assert sorted(lines(out, "FINAL")) == [f"FINAL {want}"] * 2, out
    rec = latest(home)
    assert rec["state"] == "succeeded"
    assert next(p for p in rec["procs"] if p["name"] == "server-1")["restarts"] == 1
    server_log = Path(next(p["log"] for p in rec["procs"] if p["name"] == "server-1")).read_text()
    assert "restored 2 key parts" in server_log or "restored 1 key parts" in server_log, server_log
    assert_nothing_left(home)


POLICY = textwrap.dedent("""
    import pathlib, sys, time, numpy as np, psnode
    kv = psnode.kv.create('dist_sync')
    kv.init('w', np.zeros(2, np.float32))
    kv.push('w', np.ones(2, np.float32))
    print("READY", kv.pull('w').tolist(), flush=True)
    flag, deadline = pathlib.Path(sys.argv[1]), time.monotonic() + 60
    while not flag.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    kv.close()
""")


@pytest.mark.parametrize("flags, policy", [([], os.SCHED_BATCH), (["--cpu-policy", "normal"], os.SCHED_OTHER)])
def test_cpu_policy_of_every_thread_of_every_process(home, tmp_path, flags, policy):
    """By default the scheduler, the servers and the psnode workers run under SCHED_BATCH, every
    thread of them (the workers' engine threads included); ``--cpu-policy normal`` leaves them
    under SCHED_OTHER.  Read from /proc while the job runs."""
    flag = tmp_path / "done"
    proc = start_cli(["launch", "-n", "2", "-s", "2", *flags, script(tmp_path, POLICY), str(flag)], cli_env(home))
    try:
        seen: list[str] = []
        wait_for(lambda: seen.append(proc.stdout.readline()) or sum("READY" in s for s in seen) == 2,
                 60, "both workers to be ready", interval=0)
        procs = latest(home)["procs"]
        assert sorted(p["name"] for p in procs) == ["scheduler", "server-0", "server-1", "worker-0", "worker-1"]
        found = {}
        for p in procs:   # (the recorded pid is the launcher's guard; the process is its child)
            inner = [m for m in group_members(p["pid"]) if m != p["pid"]]
            assert len(inner) == 1, (p["name"], inner)
            tids = os.listdir(f"/proc/{inner[0]}/task")
            assert len(tids) >= 3, (p["name"], tids)    # (its own threads: ZeroMQ's, the engine's)
            found[p["name"]] = {os.sched_getscheduler(int(t)) for t in tids}
        assert found == {p["name"]: {policy} for p in procs}, found
        flag.touch()
        out, _ = proc.communicate(timeout=60)
    finally:
        kill_cli(proc)
    assert proc.returncode == 0, "".join(seen) + out
    assert sum("READY [1.0, 1.0]" in s for s in seen) == 2
    assert_nothing_left(home)
