"""The parts of MXNet's KVStore API that MXNet's own tests (tests/mxnet/test_port_*.py) leave
out: type names and their errors, what broadcast leaves alone, the Python updater's errors and
its replacement by set_optimizer, pushpull into row_sparse outputs, optimizer states kept
across a change of learning rate."""
from __future__ import annotations

import numpy as np
import pytest

import psnode
from psnode.errors import ConfigError
from psnode.math.sparse import RowSparseArray, zeros
from psnode.worker.kvstore import MXNET_TYPES, resolve_type

F = np.float32


@pytest.mark.parametrize(("name", "mode"), [("local", "local"), ("Device", "local"), ("local_update_cpu", "local"),
                                            ("DIST", "dist_sync"), ("dist_device_sync", "dist_sync"),
                                            ("dist_async", "dist_async"), ("dist_device_async", "dist_async")])
def test_type_names(name: str, mode: str) -> None:
    assert resolve_type(name) == mode


def test_type_name_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError,
                       match=r"unknown KVStore type 'dist_syncc': did you mean 'dist_sync'\? use one of local"):
        psnode.kv.create("dist_syncc")
    with pytest.raises(ConfigError, match="a KVStore type is a string, not int 3"):
        resolve_type(3)
    monkeypatch.setattr("psnode.worker.kvstore._has_gpu", lambda: False)
    with pytest.raises(ConfigError, match="'nccl' is MXNet's NCCL store and needs an NVIDIA GPU.*use 'device'"):
        psnode.kv.create("nccl")
    monkeypatch.setattr("psnode.worker.kvstore._has_gpu", lambda: True)
    assert psnode.kv.create("nccl").type == "nccl"
    assert set(MXNET_TYPES.values()) <= {"local", "dist_sync", "dist_async"}
    with pytest.raises(ConfigError, match="needs a running job"):
        psnode.kv.create("dist_device_sync")


def test_broadcast_leaves_its_value_alone_and_fills_every_output() -> None:
    kv = psnode.kv.create("device")
    value = np.full(3, 2, F)
    outs = [np.zeros(3, F), np.zeros(3, F)]
    kv.broadcast("w", value, outs)
    assert all((o == 2).all() for o in outs)
    kv.push("w", np.full(3, 5, F))
    kv.broadcast("w", value, outs[0])               # initialised already: the stored value
    assert (outs[0] == 5).all() and (value == 2).all()


def test_is_capable() -> None:
    assert psnode.worker.kvstore.KVStore.is_capable("OPTIMIZER")
    with pytest.raises(ConfigError, match="unknown KVStore capability 'compression'"):
        psnode.kv.create().is_capable("compression")


def test_updater_errors_reach_the_caller_as_themselves() -> None:
    kv = psnode.kv.create()
    kv.init(0, np.zeros(2, F))

    def bad(key, recv, stored):
        raise AssertionError(f"updater saw key {key}")
    kv.set_updater(bad)
    with pytest.raises(AssertionError, match="updater saw key 0"):
        kv.push(0, np.ones(2, F))
    with pytest.raises(AssertionError, match="updater saw key 0"):
        kv.pushpull(0, np.ones(2, F))
    kv.set_updater(lambda key, recv, stored: np.add(stored, recv, out=stored))
    kv.push(0, np.full(2, 3, F))                # the store goes on: the failed rounds completed
    np.testing.assert_array_equal(kv.pull(0), np.full(2, 3, F))
    with pytest.raises(ConfigError, match="set_updater takes a function"):
        kv.set_updater(3)


def test_set_optimizer_replaces_the_updater() -> None:
    kv = psnode.kv.create()
    kv.init(0, np.zeros(2, F))
    kv._set_updater(lambda key, recv, stored: np.add(stored, recv, out=stored))
    kv.push(0, np.ones(2, F))
    kv.push(0, np.ones(2, F))
    np.testing.assert_array_equal(kv.pull(0), np.full(2, 2, F))
    kv.set_optimizer(psnode.optimizer.create("sgd", learning_rate=0.5))
    kv.push(0, np.ones(2, F))
    np.testing.assert_array_equal(kv.pull(0), np.full(2, 1.5, F))


def test_updater_gets_row_sparse_aggregates_of_row_sparse_keys() -> None:
    kv = psnode.kv.create()
    kv.init("e", zeros((4, 2)))
    got = []

    def update(key, recv, stored):
        got.append((key, type(recv).__name__, recv.indices.tolist()))
        stored[recv.indices] += recv.data
    kv.set_updater(update)
    kv.push("e", RowSparseArray(np.ones((2, 2), F), np.array([3, 1]), (4, 2)))
    assert got == [("e", "RowSparseArray", [1, 3])]
    np.testing.assert_array_equal(kv.pull("e"), np.array([[0, 0], [1, 1], [0, 0], [1, 1]], F))


def test_pushpull_into_row_sparse_outputs_pushes_and_leaves_them() -> None:
    kv = psnode.kv.create()
    kv.init(["a", "b"], [np.zeros(2, F), np.zeros(2, F)])
    rsp = RowSparseArray(np.ones((1, 2), F), np.array([0]), (1, 2))
    dense = np.zeros(2, F)
    with pytest.warns(UserWarning, match="key 'a' into a row_sparse output was ignored"):
        got = kv.pushpull(["a", "b"], [np.ones(2, F), np.full(2, 3, F)], out=[rsp, dense])
    assert got[0] is rsp and rsp.indices.tolist() == [0] and (dense == 3).all()
    np.testing.assert_array_equal(kv.pull("a"), np.ones(2, F))   # pushed all the same


def test_optimizer_states_kept_when_only_its_parameters_change() -> None:
    kv = psnode.kv.create()
    kv.init(0, np.zeros(1, F))
    kv.set_optimizer(psnode.optimizer.create("sgd", learning_rate=1.0, momentum=0.5))
    kv.push(0, np.ones(1, F))                                   # mom -1, w -1
    kv.set_optimizer(psnode.optimizer.create("sgd", learning_rate=0.5, momentum=0.5))
    kv.push(0, np.ones(1, F))                                   # mom 0.5*-1 - 0.5 = -1, w -2
    np.testing.assert_array_equal(kv.pull(0), np.full(1, -2, F))
    kv.set_optimizer(psnode.optimizer.create("adam", learning_rate=0.5))   # another optimizer: fresh states
    kv.push(0, np.ones(1, F))                                   # adam's first step: w -= lr (sign of g)
    np.testing.assert_allclose(kv.pull(0), np.full(1, -2.5, F), rtol=1e-6)
