"""The examples run as real jobs (scheduler, servers, workers on 127.0.0.1) and learn.

Accuracy check: W=2 workers with ``--batch-size b`` against one process with
``--batch-size 2b`` over the same epochs, so both see the same number of samples.  The examples
make the two runs compute the *same* sequence of updates (examples/common.py: one permutation
per epoch; worker r takes positions r, r+2, ...; batch i of both workers together is batch i of
the single run; dist_sync + average gives the server the mean gradient over those 2b samples;
the server's SGD is the same code as the 'local' store's).  The only difference is float32
rounding in the order of the sums, ~1e-7 relative per step, so the weights agree to ~1e-5 and
the test accuracies to within one test sample (1/360 = 0.3 points) in practice; the issue's
tolerance of 1 point (3 samples) is what is asserted, plus the weights to 1e-3.

CI installs torch and scikit-learn: there missing packages are errors; elsewhere tests skip.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from tests.support.cluster import ROOT, free_port, kill_job, start_job
from tests.support.examples import EXAMPLES, metric, require_module, run_example, runner


def run_single(example: str, args: list[str], timeout: float = 60) -> str:
    """Run an example as a plain process (no launcher: it falls back to 'local')."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PSNODE_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, str(EXAMPLES / example), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def assert_progress(out: str, epochs: int) -> None:
    for e in range(1, epochs + 1):
        assert re.search(rf"^epoch {e}/{epochs} loss=\S+ test_acc=0\.\d+", out, re.M), out


def test_numpy_dist_sync_matches_single_process(tmp_path: Path) -> None:
    require_module("sklearn")
    epochs, b = 3, 32
    dist = run_example("mlp_numpy.py", 2, 2, ["--epochs", str(epochs), "--batch-size", str(b),
                                              "--save", str(tmp_path / "dist.npz")], tmp_path)
    single = run_single("mlp_numpy.py", ["--epochs", str(epochs), "--batch-size", str(2 * b),
                                         "--save", str(tmp_path / "single.npz")])
    assert "workers=2 servers=2" in dist and "kvstore=dist_sync" in dist
    assert "using a 'local' kvstore" in single
    assert_progress(dist, epochs)
    assert metric(dist, "samples") == metric(single, "samples") > 0
    acc_dist, acc_single = metric(dist, "accuracy"), metric(single, "accuracy")
    assert acc_single > 0.9
    assert abs(acc_dist - acc_single) <= 0.01, (acc_dist, acc_single)
    with np.load(tmp_path / "dist.npz") as d, np.load(tmp_path / "single.npz") as s:
        for k in s.files:
            np.testing.assert_allclose(d[k], s[k], atol=1e-3, err_msg=k)


def test_numpy_dist_async_learns_and_workers_end_equal(tmp_path: Path) -> None:
    require_module("sklearn")
    out = run_example("async_numpy.py", 2, 2, ["--epochs", "2", "--save", str(tmp_path / "w{rank}.npz")],
                      tmp_path)
    assert "kvstore=dist_async" in out
    assert_progress(out, 2)
    assert metric(out, "accuracy") > 0.9
    with np.load(tmp_path / "w0.npz") as a, np.load(tmp_path / "w1.npz") as b:
        for k in a.files:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_torch_example_workers_agree(tmp_path: Path) -> None:
    """mlp_torch.py as a job (its equality with single-process torch: test_torch_trainer.py)."""
    require_module("torch")
    require_module("sklearn")
    out = run_example("mlp_torch.py", 2, 2, ["--epochs", "1", "--save", str(tmp_path / "t{rank}.npz")],
                      tmp_path)
    assert_progress(out, 1)
    assert metric(out, "accuracy") > 0.9
    with np.load(tmp_path / "t0.npz") as a, np.load(tmp_path / "t1.npz") as b:
        assert a.files == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
        for k in a.files:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_ddp_gloo_runs_with_launcher_env(tmp_path: Path) -> None:
    """Collective mode (-s 0): the launcher's torch variables are all DDP needs."""
    require_module("torch")
    require_module("sklearn")
    master = str(free_port())
    env = {r: {"RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": master} for r in range(2)}
    job = start_job(runner("ddp_gloo.py", ["--epochs", "2"]), 2, 0, tmp=tmp_path, worker_env=env)
    try:   # no server, and DDP workers never talk to the scheduler: wait for the workers only
        assert job.drained.wait(job.workers, time.monotonic() + 60), job.describe()
    finally:
        kill_job(job)
    assert all(p.code == 0 for p in job.workers), job.describe()
    out = job.workers[0].out
    assert "backend=gloo world_size=2" in out
    assert_progress(out, 2)
    assert metric(out, "accuracy") > 0.9
    assert "accuracy=" not in job.workers[1].out        # rank 0 reports
