"""Gluon training through psnode under ``mxdist launch`` (real scheduler, servers and workers on
127.0.0.1, the mxnet venv's interpreter for every process).

* examples/gluon_mlp.py with 2 workers and 2 servers against one process with twice the batch:
  the same updates (psnode.mxnet sums the workers' gradients, the script steps with W*b), so
  both ranks end equal and agree with the single process (accuracy within a point, weights to
  1e-3), with the optimizer on the servers and on the workers.
* A script that differs from a single-process Gluon script only by ``kvstore='psnode'`` (the
  name, not an instance): exact closed-form weights on both ranks, and ``'psnode_async'``.
* ``'psnode_ssp'`` (dist_ssp, the servers' optimizer): exact weights at staleness 2 and 0, and
  without the servers' optimizer, refused by name.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

pytest.importorskip("mxnet")

from tests.support.cli import ROOT, assert_nothing_left, cli_env, run_cli
from tests.support.mxnet_engine import assert_matches_one_process

EXAMPLE = str(ROOT / "examples" / "gluon_mlp.py")


@pytest.mark.parametrize("update", ["--update-on-kvstore", "--no-update-on-kvstore"])
def test_gluon_example_two_workers_match_one_process(tmp_path: Path, update: str) -> None:
    home = tmp_path / "home"
    args = ["--epochs", "3", update]
    r = run_cli(["launch", "-n", "2", "-s", "2", EXAMPLE, *args, "--batch-size", "32",
                 "--save", str(tmp_path / "w{rank}.npz")], cli_env(home), timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "kvstore=dist_sync workers=2 servers=2" in r.stdout, r.stdout
    assert f"update_on_kvstore={update == '--update-on-kvstore'}" in r.stdout
    assert_matches_one_process(r.stdout, tmp_path, home, args, timeout=180)
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


SSP = textwrap.dedent("""
    import sys, time
    import mxnet as mx
    from mxnet import autograd, gluon
    import psnode.mxnet

    psnode.mxnet.PSNode_SSP.STALENESS = int(sys.argv[1])
    momentum = float(sys.argv[2])
    kv = mx.kv.create('psnode_ssp')
    net = gluon.nn.Dense(1, in_units=1, use_bias=False)
    net.initialize(mx.init.Constant(1.0 + kv.rank))   # rank 0's value reaches every worker
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.25, "momentum": momentum},
                            kvstore='psnode_ssp')
    for step in range(3):
        time.sleep(0.2 * kv.rank)                       # rank 1 is the slow one
        with autograd.record():
            loss = net(mx.nd.full((2, 1), kv.rank + 1)).sum()   # gradient 2 * (rank + 1)
        loss.backward()
        trainer.step(2)
    kv.barrier()
    w = mx.nd.zeros((1, 1))
    kv.pull(0, out=w)                                   # after the barrier: every push applied
    print("rank", kv.rank, "type", trainer._kvstore.type, "staleness", kv._kv.staleness,
          "update_on_kvstore", trainer._update_on_kvstore, "w", repr(float(w.asnumpy()[0, 0])), flush=True)
""")


@pytest.mark.parametrize("staleness,momentum,w", [(2, 0.0, "-1.25"), (0, 0.5, "-2.1875")])
def test_psnode_ssp_under_launch_exact(tmp_path: Path, staleness: int, momentum: float, w: str) -> None:
    """'psnode_ssp': dist_ssp with the servers' optimizer.  Staleness 2, plain SGD: each push is
    applied on its own, rank 0's gradient 2 * 1 / 2 = 1 and rank 1's 2 * 2 / 2 = 2 (rescaled by
    1/2), 3 steps each at lr 0.25, in any order: w = 1 - 0.25 * 3 * 3 = -1.25.  Staleness 0 is
    dist_sync: the momentum run of test_trainer_by_name_under_launch_exact, -2.1875."""
    home = tmp_path / "home"
    script = tmp_path / "ssp.py"
    script.write_text(SSP)
    r = run_cli(["launch", "-n", "2", "-s", "2", str(script), str(staleness), str(momentum)], cli_env(home),
                timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in (0, 1):
        assert f"rank {rank} type dist_ssp staleness {staleness} update_on_kvstore True w {w}" in r.stdout, r.stdout
    assert_nothing_left(home)


def test_psnode_ssp_without_the_servers_optimizer_is_refused_by_name(tmp_path: Path) -> None:
    """'psnode_ssp' with update_on_kvstore=False: each push would replace the value, so the first
    push is refused naming the fix, and the job fails with that message (no hang)."""
    home = tmp_path / "home"
    script = tmp_path / "ssp_workers.py"
    script.write_text(SSP.replace('kvstore=\'psnode_ssp\')', 'kvstore=\'psnode_ssp\', update_on_kvstore=False)'))
    r = run_cli(["launch", "-n", "2", "-s", "1", str(script), "1", "0.0"], cli_env(home), timeout=120)
    assert r.returncode != 0, r.stdout + r.stderr
    out = r.stdout + r.stderr
    assert "mx.kv.create('psnode_ssp') applies each push with the servers' optimizer, and none is set" in out, out
    assert_nothing_left(home)
