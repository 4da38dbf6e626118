"""mxdist launch on this machine, end to end: real scheduler, servers and training scripts.

Each test runs the CLI as a subprocess with a private MXDIST_HOME and ends by checking that no
process of the job remains.
"""
from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.cli import (
    ROOT,
    assert_nothing_left,
    cli_env,
    kill_cli,
    latest,
    run_cli,
    start_cli,
    wait_for,
)

TRAIN = textwrap.dedent("""
    import numpy as np, psnode.kv
    kv = psnode.kv.create('dist_sync')
    kv.init(3, np.zeros((2, 3), np.float32))
    kv.push(3, np.full((2, 3), kv.rank + 1, np.float32))
    out = np.empty((2, 3), np.float32); kv.pull(3, out=out)
    assert (out == sum(range(1, kv.num_workers + 1)) / kv.num_workers).all(), out
    print("rank", kv.rank, "of", kv.num_workers, "ok", float(out[0, 0]))
    kv.close()
""")

DDP = textwrap.dedent("""
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = DDP(torch.nn.Linear(1, 1, bias=False))
    with torch.no_grad():
        model.module.weight.fill_(1.0)
    model(torch.full((1, 1), float(rank + 1))).sum().backward()
    grad = model.module.weight.grad.item()   # mean over ranks of (rank + 1)
    assert grad == sum(range(1, world + 1)) / world, grad
    print("ddp rank", rank, "grad", grad)
    dist.barrier()                # leave together, and free DDP before its group: otherwise
    del model                     # torch 2.13 aborts at exit in about 1 run in 10
    dist.destroy_process_group()
""")

SLEEPER = textwrap.dedent("""
    import os, time
    print("started rank", os.environ["RANK"], flush=True)
    time.sleep(300)
""")

FAILING = textwrap.dedent("""
    import os, sys, time
    if os.environ["RANK"] == "1":
        time.sleep(0.5)
        print("rank 1: bad things", file=sys.stderr)
        sys.exit(7)
    time.sleep(300)
""")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "mxdist-home"


def script(tmp_path: Path, text: str, name: str = "job.py") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_psnode_training_job_and_logs(home, tmp_path):
    env = cli_env(home)
    res = run_cli(["launch", "-n", "3", "-s", "2", script(tmp_path, TRAIN)], env)
    assert res.returncode == 0, res.stdout + res.stderr
    for rank in range(3):
        assert f"[worker {rank} @ localhost] rank {rank} of 3 ok 2.0" in res.stdout
    rec = latest(home)
    assert rec["state"] == "succeeded"
    assert {p["name"]: p["state"] for p in rec["procs"]}["worker-2"] == "exited"
    log = Path(rec["procs"][-1]["log"])
    assert log.parent == home / "jobs" / rec["id"] and "ok 2.0" in log.read_text()
    one = run_cli(["logs", rec["id"], "--role", "worker", "--rank", "1"], env)
    assert one.returncode == 0 and one.stdout.strip() == "rank 1 of 3 ok 2.0"
    every = run_cli(["logs"], env)
    assert "[worker 2 @ localhost] rank 2 of 3 ok 2.0" in every.stdout
    status = run_cli(["status", "--json"], env)
    assert {n["state"] for n in json.loads(status.stdout)["nodes"] if n["role"] == "worker"} == {"exited"}
    assert_nothing_left(home)


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
def test_torch_ddp_script_runs_unchanged_without_servers(home, tmp_path):
    res = run_cli(["launch", "-n", "2", "-s", "0", "-e", "OMP_NUM_THREADS=1", script(tmp_path, DDP)],
                  cli_env(home), timeout=180)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "[worker 0 @ localhost] ddp rank 0 grad 1.5" in res.stdout
    assert "[worker 1 @ localhost] ddp rank 1 grad 1.5" in res.stdout
    assert_nothing_left(home)


def test_failing_worker_reports_first_failure_and_stops_all(home, tmp_path):
    res = run_cli(["launch", "-n", "2", "-s", "1", "--grace", "2", script(tmp_path, FAILING)], cli_env(home))
    assert res.returncode == 1, res.stdout + res.stderr
    assert "worker 1 on localhost: exit code 7" in res.stderr
    assert "[worker 1 @ localhost] rank 1: bad things" in res.stdout   # streamed (the panel omits the tail)
    rec = latest(home)
    assert rec["state"] == "failed"
    states = {p["name"]: p["state"] for p in rec["procs"]}
    assert states["worker-1"] == "failed" and states["worker-0"] == "stopped"
    assert_nothing_left(home)


def test_ctrl_c_stops_the_job(home, tmp_path):
    proc = start_cli(["launch", "-n", "2", script(tmp_path, SLEEPER)], cli_env(home))
    try:
        seen: list[str] = []
        wait_for(lambda: seen.append(proc.stdout.readline()) or sum("started rank" in s for s in seen) == 2,
                 60, "both workers to start", interval=0)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 130, out
    finally:
        kill_cli(proc)
    assert latest(home)["state"] == "stopped"
    assert_nothing_left(home)


def test_detached_job_status_and_stop(home, tmp_path):
    env = cli_env(home)
    res = run_cli(["launch", "--detach", "-n", "2", "-s", "0", script(tmp_path, SLEEPER)], env)
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip().splitlines()[-1]
    wait_for(lambda: "started rank 1" in run_cli(["logs", job], env).stdout, 30, "worker 1 output")
    view = json.loads(run_cli(["status", job, "--json"], env).stdout)
    assert [n["state"] for n in view["nodes"] if n["role"] == "worker"] == ["running", "running"]
    stop = run_cli(["stop", job], env)
    assert stop.returncode == 0 and "localhost: nothing of the job left" in stop.stderr
    assert_nothing_left(home)
    assert run_cli(["stop", job], env).returncode == 0
    view = json.loads(run_cli(["status", job, "--json"], env).stdout)
    assert view["state"] == "stopped"
    assert {n["state"] for n in view["nodes"] if n["role"] == "worker"} <= {"stopped", "lost", "failed"}


def test_ctrl_c_tests_hold_when_the_suite_starts_with_sigint_ignored(tmp_path):
    """A suite started as a script's background job inherits SIGINT ignored; its Ctrl-C tests
    still send Ctrl-C to an mxdist that takes it (tests.support.interruptible), in every tier."""
    test = "tests/cluster/test_launch_local.py::test_ctrl_c_stops_the_job"
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test], cwd=ROOT,
                         capture_output=True, text=True, timeout=180,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert res.returncode == 0 and "1 passed" in res.stdout, res.stdout[-3000:] + res.stderr[-2000:]
