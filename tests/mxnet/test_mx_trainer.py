"""psnode.mxnet in one process, with MXNet 1.9 itself (the mxnet venv; tests/mxnet/conftest.py).

Registration, zero-copy NDArray views, MXNet's optimizers translated to psnode's (exact closed
forms, and equality with MXNet running the same optimizer on the worker), gluon.Trainer with
update_on_kvstore both ways, and the refusals with their fixes.
"""
from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip("mxnet")
from mxnet import autograd, gluon  # noqa: E402

import psnode.mxnet  # noqa: E402
from psnode.errors import ConfigError  # noqa: E402

F = np.float32


def test_registered_names_make_psnode_stores() -> None:
    for name in ("psnode", "PSNode", "psnode_async"):
        kv = mx.kv.create(name)
        assert isinstance(kv, psnode.mxnet.PSNode), name
        assert (kv.type, kv.rank, kv.num_workers) == ("local", 0, 1)   # no launcher: the local store
    assert isinstance(mx.kv.create("psnode_async"), psnode.mxnet.PSNode_Async)
    assert type(mx.kv.create("psnode")).is_capable("optimizer")
    with pytest.raises(ValueError, match="Unknown capability: gradient"):
        mx.kv.create("psnode").is_capable("gradient")
    assert type(mx.kv.create("local")).__name__ == "KVStore"             # MXNet's own, untouched


def test_cpu_ndarrays_are_read_and_written_in_place() -> None:
    nd = mx.nd.zeros((3, 4))
    view = psnode.mxnet._dlpack(nd, write=True)
    view[1] = 7                                                           # no copy: nd changes
    assert (nd.asnumpy()[1] == 7).all() and (nd.asnumpy()[0] == 0).all()
    nd[2] = 5                                                             # and the view sees MXNet's writes
    assert (psnode.mxnet._dlpack(nd, write=False)[2] == 5).all()
    before = psnode.mxnet._dlpack(nd, write=False).ctypes.data
    kv = mx.kv.create("psnode")
    kv.init(0, mx.nd.ones((3, 4)) * 3)
    kv.pull(0, out=nd)                                                    # the pull lands in nd's memory
    assert psnode.mxnet._dlpack(nd, write=False).ctypes.data == before
    np.testing.assert_array_equal(nd.asnumpy(), np.full((3, 4), 3, F))
    g = mx.nd.ones((3, 4)) * 2
    kv.pushpull(0, g)                                                     # in place: g gets the aggregate
    np.testing.assert_array_equal(g.asnumpy(), np.full((3, 4), 2, F))


def test_row_sparse_ndarrays_cross_both_ways() -> None:
    kv = mx.kv.create("psnode")
    kv.init("emb", mx.nd.zeros((6, 2)).tostype("row_sparse"))
    grad = mx.nd.sparse.row_sparse_array((np.array([[1, 2], [3, 4]], F), np.array([4, 1])), shape=(6, 2))
    kv.push("emb", grad)
    out = mx.nd.sparse.zeros("row_sparse", (6, 2))
    kv.row_sparse_pull("emb", out=out, row_ids=mx.nd.array([4, 4, 0]))
    assert out.stype == "row_sparse" and out.indices.asnumpy().tolist() == [0, 4]
    want = np.zeros((6, 2), F)
    want[4] = [1, 2]
    np.testing.assert_array_equal(out.asnumpy(), want)
    full = mx.nd.sparse.zeros("row_sparse", (6, 2))
    kv.pull("emb", out=full)                                              # ignored (MXNet's default)
    assert full.indices.shape == (0,)
    kv.pull("emb", out=full, ignore_sparse=False)                         # every row
    want[1] = [3, 4]
    np.testing.assert_array_equal(full.asnumpy(), want)


def _linear(w0: float = 2.0) -> gluon.nn.Dense:
    net = gluon.nn.Dense(1, in_units=1, use_bias=False)
    net.initialize(mx.init.Constant(w0))
    return net


def _steps(trainer: gluon.Trainer, net: gluon.nn.Block, n: int, batch: int = 4) -> list[float]:
    """``n`` steps of loss = sum(net(ones)): the weight's gradient is ``batch``, rescaled to 1."""
    out = []
    for _ in range(n):
        with autograd.record():
            loss = net(mx.nd.ones((batch, 1))).sum()
        loss.backward()
        trainer.step(batch)
        out.append(float(net.weight.data().asnumpy()[0, 0]))
    return out


@pytest.mark.parametrize("update_on_kvstore", [True, False])
@pytest.mark.parametrize("kvstore", ["psnode", "instance"])
def test_trainer_sgd_momentum_wd_closed_form(update_on_kvstore: bool, kvstore: str) -> None:
    """g = 1 each step; lr 0.5, momentum 0.5, wd 0.25, w0 = 2:
    mom1 = -0.5*0.25*2 - 0.5 = -0.75, w1 = 1.25; mom2 = 0.5*mom1 - 0.5*0.25*1.25 - 0.5 = -1.03125,
    w2 = 0.21875 (exact in float32)."""
    net = _linear()
    kv = mx.kv.create("psnode") if kvstore == "instance" else "psnode"
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.5, "momentum": 0.5, "wd": 0.25},
                            kvstore=kv, update_on_kvstore=update_on_kvstore)
    assert _steps(trainer, net, 2) == [1.25, 0.21875]
    assert isinstance(trainer._kvstore, psnode.mxnet.PSNode) and trainer._update_on_kvstore is update_on_kvstore


def _mlp(seed: int = 3) -> gluon.nn.HybridSequential:
    mx.random.seed(seed)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(8, activation="relu", in_units=5), gluon.nn.Dense(3, in_units=8))
    net.initialize(mx.init.Xavier())
    return net


def _train(kvstore, optimizer: str, params: dict, update_on_kvstore, steps: int = 5,
           lr_at: dict[int, float] | None = None) -> dict[str, np.ndarray]:
    net = _mlp()
    trainer = gluon.Trainer(net.collect_params(), optimizer, dict(params), kvstore=kvstore,
                            update_on_kvstore=update_on_kvstore)
    rng = np.random.default_rng(0)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for step in range(steps):
        if lr_at and step in lr_at:
            trainer.set_learning_rate(lr_at[step])
        x = mx.nd.array(rng.standard_normal((6, 5)))
        y = mx.nd.array(rng.integers(0, 3, 6))
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()
        trainer.step(6)
    return {k.split("_", 1)[1]: p.data().asnumpy() for k, p in net.collect_params().items()}


OPTIMIZERS = [("sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.01}),
              ("sgd", {"learning_rate": 0.2, "clip_gradient": 0.05}),
              ("adam", {"learning_rate": 0.01, "wd": 0.001, "beta1": 0.8}),
              ("adagrad", {"learning_rate": 0.1, "wd": 0.01, "eps": 1e-6})]


@pytest.mark.parametrize(("optimizer", "params"), OPTIMIZERS, ids=["sgd-mom-wd", "sgd-clip", "adam", "adagrad"])
@pytest.mark.parametrize("update_on_kvstore", [True, False])
def test_trainer_matches_mxnet_running_the_optimizer(optimizer: str, params: dict, update_on_kvstore: bool) -> None:
    """The weights after 5 steps equal MXNet's own (its optimizer on the worker, no kvstore),
    up to float32 rounding of the update formulas."""
    want = _train(None, optimizer, params, None)
    got = _train("psnode", optimizer, params, update_on_kvstore)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=1e-6, err_msg=k)


def test_learning_rate_change_reaches_the_servers_and_keeps_momentum() -> None:
    params = {"learning_rate": 0.1, "momentum": 0.9}
    want = _train(None, "sgd", params, None, steps=6, lr_at={3: 0.02})
    got = _train("psnode", "sgd", params, True, steps=6, lr_at={3: 0.02})
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=2e-5, atol=1e-6, err_msg=k)
    unchanged = _train("psnode", "sgd", params, True, steps=6)
    assert not np.allclose(unchanged["weight"], got["weight"])   # (the change mattered)


@pytest.mark.parametrize(("optimizer", "params", "reason"), [
    ("nag", {"momentum": 0.9}, "'NAG' has no psnode server-side equivalent"),
    ("sgd", {"lr_scheduler": mx.lr_scheduler.FactorScheduler(step=2)}, "has an lr_scheduler"),
    ("sgd", {"multi_precision": True}, "multi_precision=True"),
])
def test_what_the_servers_cannot_run_is_refused_with_the_fix(optimizer: str, params: dict, reason: str) -> None:
    net = _linear()
    trainer = gluon.Trainer(net.collect_params(), optimizer, params, kvstore="psnode", update_on_kvstore=True)
    with pytest.raises(ConfigError, match=reason) as err:
        _steps(trainer, net, 1)
    assert "update_on_kvstore=False" in str(err.value)
    net = _linear()                                                   # the fix: MXNet's optimizer on the worker
    trainer = gluon.Trainer(net.collect_params(), optimizer, params, kvstore="psnode", update_on_kvstore=False)
    _steps(trainer, net, 1)


def test_per_parameter_lr_mult_is_refused() -> None:
    net = _linear()
    net.weight.lr_mult = 0.5
    trainer = gluon.Trainer(net.collect_params(), "sgd", {}, kvstore="psnode", update_on_kvstore=True)
    with pytest.raises(ConfigError, match=r"has lr_mult=0\.5"):
        _steps(trainer, net, 1)


def test_optimizer_spec_is_data() -> None:
    opt = mx.optimizer.create("adam", learning_rate=0.01, beta2=0.99, rescale_grad=0.25, clip_gradient=2)
    assert psnode.mxnet.optimizer_spec(opt) == {"name": "adam", "params": {
        "learning_rate": 0.01, "wd": 0.0, "rescale_grad": 0.25, "clip_gradient": 2.0,
        "beta1": 0.9, "beta2": 0.99, "epsilon": 1e-8}}


def test_trainer_states_save_and_load(tmp_path) -> None:
    net = _linear()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.5, "momentum": 0.5, "wd": 0.25},
                            kvstore="psnode", update_on_kvstore=True)
    _steps(trainer, net, 1)                                           # w = 1.25, mom = -0.75
    trainer.save_states(str(tmp_path / "s.npz"))
    _steps(trainer, net, 1)                                           # w = 0.21875, mom = -1.03125
    trainer.load_states(str(tmp_path / "s.npz"))                      # mom = -0.75 again
    assert trainer.optimizer.momentum == 0.5
    # mom = 0.5*-0.75 - 0.5*0.25*0.21875 - 0.5 = -0.90234375 (not -1.04296875 from -1.03125)
    assert _steps(trainer, net, 1) == [0.21875 - 0.90234375]


def test_python_updater_on_ndarrays() -> None:
    """MXNet's _set_updater: the updater gets NDArrays, and ``stored += recv`` changes the store."""
    kv = mx.kv.create("psnode")
    kv.init(3, mx.nd.zeros((2, 2)))
    seen = []

    def update(key, recv, stored):
        seen.append((key, type(recv).__name__, type(stored).__name__))
        stored += recv * 2
    kv._set_updater(update)
    kv.push(3, [mx.nd.ones((2, 2))] * 3)
    out = mx.nd.zeros((2, 2))
    kv.pull(3, out=out)
    np.testing.assert_array_equal(out.asnumpy(), np.full((2, 2), 6, F))
    assert seen == [(3, "NDArray", "NDArray")]
