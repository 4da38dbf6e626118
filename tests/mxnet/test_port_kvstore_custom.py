"""MXNet 1.9's ``tests/python/unittest/test_kvstore_custom.py``, ported to psnode's numpy API.

MXNet runs each test on its native ``'device'`` store and on ``'teststore'``, the Python
KVStoreBase subclass MXNet registers for testing; psnode's numpy API has no registry of Python
stores, so the ``'teststore'`` runs use a psnode store created under MXNet's other name for it
in these tests, ``'local'``.  (tests/mxnet/test_mx_custom.py runs this file as written, with
MXNet, on 'device', 'teststore' and psnode's registered store.)  The three tests about the
test store's missing optimizer (test_custom_store, test_get_type_device, test_set_optimizer)
assert psnode's capability instead: a deliberate difference, psnode's stores run optimizers.
"""
from __future__ import annotations

import numpy as np
import pytest

import psnode
from tests.support.mxnet_port import F, check_diff_to_scalar

shape = (4, 4)
keys = [5, 7, 11]
str_keys = ["b", "c", "d"]
NAMES = {"device": "device", "teststore": "local"}   # MXNet's name -> the psnode store in its place


def init_kv(name: str = "device") -> psnode.kv.KVStore:
    return psnode.kv.create(NAMES[name])


@pytest.mark.parametrize("key", [3, "a"])
@pytest.mark.parametrize("name", ["device", "teststore"])
def test_broadcast_single_kv_pair(name: str, key: int | str) -> None:
    """single key-value pair push & pull"""
    kv = init_kv(name)
    ones = np.ones(shape, F)                                  # single output
    out = np.empty(shape, F)
    kv.broadcast(key, ones, out)
    check_diff_to_scalar(out, 1)
    out_list = [np.empty(shape, F)] * 3                       # list output
    key_list = key + key                                      # (MXNet's line: 6, or 'aa')
    kv.broadcast(key_list, ones, out_list)
    for o in out_list:
        check_diff_to_scalar(o, 1)


@pytest.mark.parametrize("key", [keys, str_keys], ids=["int", "str"])
def test_broadcast_list_kv_pair(key: list) -> None:
    """list key-value pair push & pull"""
    kv = init_kv()
    ones = [np.ones(shape, F)] * len(key)
    out = [np.empty(shape, F)] * len(key)
    kv.broadcast(key, ones, out)
    for o in out:
        check_diff_to_scalar(o, 1)
    out_list = [[np.empty(shape, F)] * 2 for _ in range(len(key))]
    key_list = [k + k for k in key]
    kv.broadcast(key_list, ones, out_list)
    for o in out_list:
        for oo in o:
            check_diff_to_scalar(oo, 1)


CASES = [("device", 3, keys), ("device", "a", str_keys), ("teststore", 3, None), ("teststore", "a", None)]
IDS = ["device-int", "device-str", "teststore-int", "teststore-str"]


@pytest.mark.parametrize(("name", "key", "key_list"), CASES, ids=IDS)
def test_pushpull_single_kv_pair(name: str, key: int | str, key_list: list | None) -> None:
    """aggregate value on multiple devices"""
    kv = init_kv(name)
    kv.broadcast(key, np.zeros(shape, F), out=np.empty(shape, F))
    num_devs = 4
    vals = [np.ones(shape, F) for _ in range(num_devs)]       # single
    outs = [np.empty(shape, F) for _ in range(num_devs)]
    kv.pushpull(key, vals, out=outs)
    for out in outs:
        check_diff_to_scalar(out, num_devs)
    kv.pushpull(key, vals)                                    # inplace
    for val in vals:
        check_diff_to_scalar(val, num_devs)
    if key_list is None:                                      # list
        return
    num_keys = len(key_list)
    kv.broadcast(key_list, [np.zeros(shape, F)] * num_keys, out=[np.empty(shape, F)] * num_keys)
    vals2 = [[np.ones(shape, F) * 2.0 for _ in range(num_devs)]] * num_keys
    outs2 = [[np.empty(shape, F) for _ in range(num_devs)]] * num_keys
    kv.pushpull(key_list, vals2, out=outs2)
    for out in outs2:
        for o in out:
            check_diff_to_scalar(o, num_devs * 2.0)
    kv.pushpull(key_list, vals2)                              # inplace
    for val in vals2:
        for v in val:
            check_diff_to_scalar(v, num_devs * 2.0)


@pytest.mark.parametrize(("name", "key", "key_list"), CASES, ids=IDS)
def test_pushpull_list_kv_pair(name: str, key: int | str, key_list: list | None) -> None:
    """aggregate value on multiple devices"""
    kv = init_kv(name)
    kv.broadcast(key, np.zeros(shape, F), out=np.empty(shape, F))
    num_devs = 4
    vals = [np.ones(shape, F) for _ in range(num_devs)]
    outs = [np.empty(shape, F) for _ in range(num_devs)]
    kv.pushpull(key, vals, out=outs)
    for out in outs:
        check_diff_to_scalar(out, num_devs)
    if key_list is None:
        return
    num_keys = len(key_list)
    kv.broadcast(key_list, [np.zeros(shape, F)] * num_keys, out=[np.empty(shape, F)] * num_keys)
    vals2 = [[np.ones(shape, F) * 2.0 for _ in range(num_devs)]] * num_keys
    outs2 = [[np.empty(shape, F) for _ in range(num_devs)]] * num_keys
    kv.pushpull(key_list, vals2, out=outs2)
    for out in outs2:
        for o in out:
            check_diff_to_scalar(o, num_devs * 2.0)


def test_custom_store() -> None:
    kv = init_kv("teststore")
    out = np.empty((1,), F)
    kv.broadcast(1, np.ones((1,), F), out=out)
    check_diff_to_scalar(out, 1)
    # MXNet: assert type(kv).is_capable('optimizer') == False (its test store has no optimizer)
    assert type(kv).is_capable("optimizer") is True
    kv.broadcast(1, np.ones((1,), F), out=out)
    check_diff_to_scalar(out, 1)
    arr_list = [np.empty((1,), F)] * 2
    kv.pushpull(1, [np.ones((1,), F)] * 2, out=arr_list)
    for arr in arr_list:
        check_diff_to_scalar(arr, 2)
    kv.pushpull(1, arr_list)
    for arr in arr_list:
        check_diff_to_scalar(arr, 4)


def test_get_type_device() -> None:
    # MXNet: kvtype = 'teststore'; psnode has no such store: the name a store was created with
    kvtype = "device"
    kv = psnode.kv.create(kvtype)
    assert kv.type == kvtype


def test_set_optimizer(tmp_path) -> None:
    # MXNet's test store raises NotImplementedError for set_optimizer and the optimizer states;
    # psnode's stores have them (deliberate difference): they work, and the states round-trip.
    kv = init_kv("teststore")
    assert kv.is_capable("optimizer")
    kv.set_optimizer(psnode.optimizer.create("sgd", learning_rate=0.5, momentum=0.5))
    kv.init(0, np.zeros(2, F))
    kv.push(0, np.ones(2, F))
    np.testing.assert_array_equal(kv.pull(0), np.full(2, -0.5, F))
    kv.save_optimizer_states(str(tmp_path / "test.npz"))
    kv.load_optimizer_states(str(tmp_path / "test.npz"))
    kv.push(0, np.ones(2, F))          # momentum 0.5 * -0.5 - 0.5 = -0.75
    np.testing.assert_array_equal(kv.pull(0), np.full(2, -1.25, F))
