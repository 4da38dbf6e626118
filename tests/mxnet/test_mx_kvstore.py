"""MXNet 1.9's kvstore unit tests (``tests/python/unittest/test_kvstore.py``) with MXNet itself,
on ``mx.kv.create('psnode')``: MXNet's NDArrays, row_sparse NDArrays, several CPU contexts and
Python updaters through psnode.mxnet.  MXNet's test steps, in this file's words; the
deliberate differences are those of the numpy-API port (test_port_kvstore.py).
"""
from __future__ import annotations

import numpy as np
import pytest

mx = pytest.importorskip("mxnet")

import psnode.mxnet  # noqa: E402,F401 - registers 'psnode'
from psnode.errors import ConfigError  # noqa: E402

shape = (4, 4)
keys = [5, 7, 11]
str_keys = ["b", "c", "d"]
NUM_DEVS = 4
STYPES = ["default", "row_sparse"]


def init_kv(stype: str = "default", str_keys_: bool = False):
    kv = mx.kv.create("psnode")
    first, rest = ("a", str_keys) if str_keys_ else (3, keys)
    kv.init(first, mx.nd.zeros(shape, stype=stype))
    kv.init(rest, [mx.nd.zeros(shape, stype=stype)] * len(rest))
    return kv, first, rest


def check_diff_to_scalar(a, x) -> None:
    assert np.sum(np.abs((a - x).asnumpy())) == 0, (a, x)


def devices():
    return [mx.Context("cpu", i) for i in range(NUM_DEVS)]


@pytest.mark.parametrize("stype", STYPES)
@pytest.mark.parametrize("str_keys_", [False, True], ids=["int", "str"])
def test_single_and_list_kv_pairs(stype: str, str_keys_: bool) -> None:
    kv, key, key_list = init_kv(str_keys_=str_keys_)
    kv.push(key, mx.nd.ones(shape).tostype(stype))
    val = mx.nd.empty(shape)
    kv.pull(key, out=val)
    check_diff_to_scalar(val, 1)
    kv.push(key_list, [mx.nd.ones(shape).tostype(stype) * 4] * len(key_list))
    vals = [mx.nd.empty(shape)] * len(key_list)
    kv.pull(key_list, out=vals)
    for v in vals:
        check_diff_to_scalar(v, 4)


@pytest.mark.parametrize("count", [1, 4])
def test_row_sparse_pull(count: int) -> None:
    kv, _, _ = init_kv("row_sparse", str_keys_=True)
    kv.init("e", mx.nd.ones(shape).tostype("row_sparse"))
    rng = np.random.default_rng(count)
    vals = [mx.nd.zeros(shape).tostype("row_sparse") for _ in range(count)]
    row_ids = [mx.nd.array(rng.integers(shape[0], size=shape[0])).reshape((2, shape[0] // 2))
               for _ in range(count)]
    kv.row_sparse_pull("e", out=vals[0] if count == 1 else vals, row_ids=row_ids[0] if count == 1 else row_ids)
    for val, ids in zip(vals, row_ids, strict=True):
        want = np.zeros(shape, np.float32)
        want[np.unique(ids.asnumpy().astype(np.int64))] = 1
        np.testing.assert_array_equal(val.asnumpy(), want)


@pytest.mark.parametrize("stype", STYPES)
def test_aggregator_over_devices(stype: str) -> None:
    kv, key, key_list = init_kv()
    kv.push(key, [mx.nd.ones(shape, d).tostype(stype) for d in devices()])
    outs = [mx.nd.empty(shape, d) for d in devices()]
    kv.pull(key, out=outs)
    for o in outs:
        check_diff_to_scalar(o, NUM_DEVS)
    kv.push(key_list, [[mx.nd.ones(shape, d).tostype(stype) * 2.0 for d in devices()]] * len(key_list))
    outs2 = [[mx.nd.empty(shape, d) for d in devices()]] * len(key_list)
    kv.pull(key_list, out=outs2)
    for out in outs2:
        for o in out:
            check_diff_to_scalar(o, NUM_DEVS * 2.0)


@pytest.mark.parametrize("sparse_pull", [False, True])
def test_sparse_aggregator(sparse_pull: bool) -> None:
    from mxnet.test_utils import rand_ndarray
    kv, _, _ = init_kv("row_sparse", str_keys_=True)
    vals = [rand_ndarray(shape, "row_sparse").copyto(d) for d in devices()]
    expected = sum(v.asnumpy() for v in vals)
    kv.push("a", vals)
    if sparse_pull:
        kv.row_sparse_pull("a", out=vals, row_ids=[mx.nd.array(np.arange(shape[0]))] * len(vals))
    else:
        kv.pull("a", out=vals, ignore_sparse=False)
    np.testing.assert_allclose(sum(v.asnumpy() for v in vals), expected * NUM_DEVS, rtol=1e-6)


@pytest.mark.parametrize("stype", STYPES)
@pytest.mark.parametrize("str_keys_", [False, True], ids=["int", "str"])
def test_updater(stype: str, str_keys_: bool) -> None:
    kv, key, key_list = init_kv(str_keys_=str_keys_)
    kinds = []

    def updater(k, recv, local):
        kinds.append(type(k))
        local += recv
    kv._set_updater(updater)
    kv.push(key, [mx.nd.ones(shape, d).tostype(stype) for d in devices()])
    outs = [mx.nd.empty(shape, d) for d in devices()]
    kv.pull(key, out=outs)
    for o in outs:
        check_diff_to_scalar(o, NUM_DEVS)
    for _ in range(4):
        kv.push(key_list, [[mx.nd.ones(shape, d).tostype(stype) for d in devices()]] * len(key_list))
    outs2 = [[mx.nd.empty(shape, d) for d in devices()]] * len(key_list)
    kv.pull(key_list, out=outs2)
    for out in outs2:
        for o in out:
            check_diff_to_scalar(o, NUM_DEVS * 4)
    assert set(kinds) == {str if str_keys_ else int}


@pytest.mark.parametrize("str_keys_", [False, True], ids=["int", "str"])
def test_invalid_pull(str_keys_: bool) -> None:
    kv, key, key_list = init_kv(str_keys_=str_keys_)
    rsp = (mx.nd.ones(shape) * 2).tostype("row_sparse")
    kv.pull(key, out=rsp)                                     # ignored: a row_sparse output
    check_diff_to_scalar(rsp, 2)
    rsps = [(mx.nd.ones(shape) * 2).tostype("row_sparse") for _ in key_list]
    kv.pull(key_list, out=rsps)
    for v in rsps:
        check_diff_to_scalar(v, 2)
    other, others = (3, keys) if str_keys_ else ("a", str_keys)  # the other kind of key: refused
    for call in (lambda: kv.init(other, mx.nd.ones(shape)), lambda: kv.push(other, mx.nd.ones(shape)),
                 lambda: kv.pull(other, mx.nd.ones(shape)),
                 lambda: kv.init(others, [mx.nd.ones(shape)] * 3)):
        with pytest.raises(ConfigError, match="keys are all ints or all strs"):
            call()
