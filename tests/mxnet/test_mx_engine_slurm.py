"""``mxdist launch --launcher slurm --engine mxnet`` in a real Slurm allocation (tests/slurm's
three emulated nodes): MXNet's scheduler, servers and workers as job steps on two nodes, the
mxnet venv's interpreter as ``--python``; examples/gluon_mlp.py reaches the accuracy band of one
process, and no step or MXNet process of the job is left."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import mxnet  # noqa: F401 - this tier runs in MXNet's venv

from tests.support.cli import ROOT, cli_env, latest, wait_for
from tests.support.mxnet_engine import assert_no_mxnet_left, metric, port_of

EXAMPLE = str(ROOT / "examples" / "gluon_mlp.py")


def test_gluon_example_as_slurm_steps(slurm3, tmp_path: Path) -> None:
    home = tmp_path / "home"
    r = subprocess.run(["salloc", "-N2", "--ntasks-per-node=1", "--immediate=30", sys.executable, "-m", "mxdist",
                        "launch", "--launcher", "slurm", "--engine", "mxnet", "--python", sys.executable,
                        "-n", "2", "-s", "2", EXAMPLE, "--epochs", "3"],
                       env=slurm3.env(cli_env(home)), cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "kvstore=dist_sync workers=2 servers=2" in r.stdout, r.stdout
    assert metric(r.stdout, "accuracy") > 0.96, r.stdout     # one process with batch 64: 0.9777
    rec = latest(home)
    assert (rec["engine"], rec["backend"], rec["state"]) == ("mxnet", "slurm", "succeeded")
    assert [(p["name"], p["host"]) for p in rec["procs"]] == [
        ("scheduler", "127.0.0.2"), ("server-0", "127.0.0.2"), ("server-1", "127.0.0.3"),
        ("worker-0", "127.0.0.2"), ("worker-1", "127.0.0.3")]
    wait_for(lambda: not [s for s in slurm3.steps() if " mxdist." in s], 30, "the job's steps to leave the queue")
    assert_no_mxnet_left(port_of(rec))
