"""MXNet 1.9's kvstore contract tests (``tests/python/unittest/test_kvstore_custom.py``) with
MXNet itself, on psnode's registered store beside MXNet's ``'device'`` and ``'teststore'``.

The same steps as MXNet's tests, on NDArrays (several "devices" are CPU contexts), with
``'psnode'`` added to the stores each test runs on: the broadcast and pushpull results must be
those of MXNet's own stores.  (test_port_kvstore_custom.py is the numpy-API port.)
"""
from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip("mxnet")

import psnode.mxnet  # noqa: E402,F401 - registers 'psnode'

shape = (4, 4)
keys = [5, 7, 11]
str_keys = ["b", "c", "d"]
NUM_DEVS = 4


def check_diff_to_scalar(a, x) -> None:
    assert np.sum(np.abs((a - x).asnumpy())) == 0, (a, x)


def devices():
    return [mx.Context("cpu", i) for i in range(NUM_DEVS)]


@pytest.mark.parametrize("key", [3, "a"])
@pytest.mark.parametrize("name", ["device", "teststore", "psnode"])
def test_broadcast_single_kv_pair(name: str, key) -> None:
    kv = mx.kv.create(name)
    out = mx.nd.empty(shape)
    kv.broadcast(key, mx.nd.ones(shape), out)
    check_diff_to_scalar(out, 1)
    outs = [mx.nd.empty(shape)] * 3
    kv.broadcast(key + key, mx.nd.ones(shape), outs)          # (a new key: 6, or 'aa')
    for o in outs:
        check_diff_to_scalar(o, 1)


@pytest.mark.parametrize("key", [keys, str_keys], ids=["int", "str"])
@pytest.mark.parametrize("name", ["device", "psnode"])
def test_broadcast_list_kv_pair(name: str, key: list) -> None:
    kv = mx.kv.create(name)
    kv.broadcast(key, [mx.nd.ones(shape)] * len(key), [mx.nd.empty(shape)] * len(key))
    out = [[mx.nd.empty(shape)] * 2 for _ in key]
    kv.broadcast([k + k for k in key], [mx.nd.ones(shape)] * len(key), out)
    for o in out:
        for oo in o:
            check_diff_to_scalar(oo, 1)


CASES = [(name, key, lst) for name in ("device", "psnode") for key, lst in ((3, keys), ("a", str_keys))] + \
        [("teststore", 3, None), ("teststore", "a", None)]


@pytest.mark.parametrize(("name", "key", "key_list"), CASES)
def test_pushpull(name: str, key, key_list) -> None:
    kv = mx.kv.create(name)
    kv.broadcast(key, mx.nd.zeros(shape), out=mx.nd.empty(shape))
    vals = [mx.nd.ones(shape, d) for d in devices()]
    outs = [mx.nd.empty(shape, d) for d in devices()]
    kv.pushpull(key, vals, out=outs)
    for o in outs:
        check_diff_to_scalar(o, NUM_DEVS)
    kv.pushpull(key, vals)                                     # in place
    for v in vals:
        check_diff_to_scalar(v, NUM_DEVS)
    if key_list is None:
        return
    n = len(key_list)
    kv.broadcast(key_list, [mx.nd.zeros(shape)] * n, out=[mx.nd.empty(shape)] * n)
    vals2 = [[mx.nd.ones(shape, d) * 2.0 for d in devices()]] * n
    outs2 = [[mx.nd.empty(shape, d) for d in devices()]] * n
    kv.pushpull(key_list, vals2, out=outs2)
    for out in outs2:
        for o in out:
            check_diff_to_scalar(o, NUM_DEVS * 2.0)
    kv.pushpull(key_list, vals2)
    for val in vals2:
        for v in val:
            check_diff_to_scalar(v, NUM_DEVS * 2.0)


def test_psnode_in_place_of_the_test_store() -> None:
    """MXNet's test_custom_store steps; psnode, unlike MXNet's test store, runs optimizers."""
    kv = mx.kv.create("psnode")
    out = mx.nd.empty((1,))
    kv.broadcast(1, mx.nd.ones((1,)), out=out)
    check_diff_to_scalar(out, 1)
    assert type(kv).is_capable("optimizer") is True
    arr_list = [mx.nd.empty((1,))] * 2
    kv.pushpull(1, [mx.nd.ones((1,))] * 2, out=arr_list)
    for arr in arr_list:
        check_diff_to_scalar(arr, 2)
    kv.pushpull(1, arr_list)
    for arr in arr_list:
        check_diff_to_scalar(arr, 4)
    kv.set_optimizer(mx.optimizer.create("sgd", learning_rate=0.5))
    kv.pushpull(1, mx.nd.ones((1,)), out=out)                  # 4 - 0.5 * 1
    check_diff_to_scalar(out, 3.5)
