"""Gluon training through psnode under ``mxdist launch`` (real scheduler, servers and workers on
127.0.0.1, the mxnet venv's interpreter for every process).

* examples/gluon_mlp.py with 2 workers and 2 servers against one process with twice the batch:
  the same updates (psnode.mxnet sums the workers' gradients, the script steps with W*b), so
  both ranks end equal and agree with the single process (accuracy within a point, weights to
  1e-3), with the optimizer on the servers and on the workers.
* A script that differs from a single-process Gluon script only by ``kvstore='psnode'`` (the
  name, not an instance): exact closed-form weights on both ranks, and ``'psnode_async'``.
"""
from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mxnet")

from tests.ssh.mxdist_testing import ROOT, assert_nothing_left, cli_env, run_cli

EXAMPLE = str(ROOT / "examples" / "gluon_mlp.py")


def metric(out: str, name: str) -> float:
    found = re.findall(rf"{name}=([0-9.]+)", out)
    assert found, f"no {name}= in:\n{out}"
    return float(found[-1])


@pytest.mark.parametrize("update", ["--update-on-kvstore", "--no-update-on-kvstore"])
def test_gluon_example_two_workers_match_one_process(tmp_path: Path, update: str) -> None:
    home = tmp_path / "home"
    args = ["--epochs", "3", update]
    r = run_cli(["launch", "-n", "2", "-s", "2", EXAMPLE, *args, "--batch-size", "32",
                 "--save", str(tmp_path / "w{rank}.npz")], cli_env(home), timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "kvstore=dist_sync workers=2 servers=2" in r.stdout, r.stdout
    assert f"update_on_kvstore={update == '--update-on-kvstore'}" in r.stdout
    single = subprocess.run([sys.executable, EXAMPLE, *args, "--batch-size", "64", "--save",
                             str(tmp_path / "one.npz")], capture_output=True, text=True, timeout=180,
                            env=cli_env(home, PYTHONPATH=str(ROOT)), cwd=ROOT)
    assert single.returncode == 0, single.stdout + single.stderr
    assert "kvstore=local workers=1" in single.stdout
    acc_dist, acc_one = metric(r.stdout, "accuracy"), metric(single.stdout, "accuracy")
    assert acc_one > 0.9 and abs(acc_dist - acc_one) <= 0.01, (acc_dist, acc_one)
    with np.load(tmp_path / "w0.npz") as a, np.load(tmp_path / "w1.npz") as b, \
            np.load(tmp_path / "one.npz") as one:
        assert sorted(a.files) == sorted(one.files) and len(a.files) == 4
        for k in a.files:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)             # both ranks end equal
            np.testing.assert_allclose(a[k], one[k], atol=1e-3, err_msg=k)   # and as one process
    assert_nothing_left(home)


BY_NAME = textwrap.dedent("""
    import sys
    import mxnet as mx
    from mxnet import autograd, gluon
    import psnode.mxnet

    name = sys.argv[1]
    kv = mx.kv.create(name)                    # the job's store (shared with the Trainer's)
    net = gluon.nn.Dense(1, in_units=1, use_bias=False)
    net.initialize(mx.init.Constant(1.0 + kv.rank))   # rank 0's value reaches every worker
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.25, "momentum": 0.5},
                            kvstore=name)       # the name, as a single-process script writes it
    for step in range(3):
        with autograd.record():
            loss = net(mx.nd.full((2, 1), kv.rank + 1)).sum()   # gradient 2 * (rank + 1)
        loss.backward()
        trainer.step(2)
    kv.barrier()
    print("rank", kv.rank, "type", trainer._kvstore.type, "update_on_kvstore", trainer._update_on_kvstore,
          "same", trainer._kvstore.store is kv.store, "w", repr(float(net.weight.data().asnumpy()[0, 0])),
          flush=True)
""")


def test_trainer_by_name_under_launch_exact(tmp_path: Path) -> None:
    """Both ranks: w0 = 1 (rank 0's), g = (2*1 + 2*2) / 2 = 3 every step (the sum over workers,
    rescaled by 1/2), lr 0.25, momentum 0.5: mom -0.75, -1.125, -1.3125; w 0.25, -0.875, -2.1875."""
    home = tmp_path / "home"
    script = tmp_path / "by_name.py"
    script.write_text(BY_NAME)
    r = run_cli(["launch", "-n", "2", "-s", "2", str(script), "psnode"], cli_env(home), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in (0, 1):
        assert f"rank {rank} type dist_sync update_on_kvstore True same True w -2.1875" in r.stdout, r.stdout
    assert_nothing_left(home)


def test_psnode_async_under_launch(tmp_path: Path) -> None:
    """'psnode_async': dist_async, so the Trainer updates on the servers (MXNet's rule for async)."""
    home = tmp_path / "home"
    script = tmp_path / "by_name.py"
    script.write_text(BY_NAME)
    r = run_cli(["launch", "-n", "2", "-s", "1", str(script), "psnode_async"], cli_env(home), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in (0, 1):
        assert f"rank {rank} type dist_async update_on_kvstore True same True w " in r.stdout, r.stdout
    assert_nothing_left(home)
