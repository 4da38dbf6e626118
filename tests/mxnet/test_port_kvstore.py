"""MXNet 1.9's ``tests/python/unittest/test_kvstore.py``, ported to psnode's numpy API (tests.support.mxnet_port).

Each MXNet test is one function here, its loops (storage types, int or str keys, store types)
made pytest parameters.  ``mx.kv.create()`` is ``psnode.kv.create()``: a 'local' store.
"""
from __future__ import annotations

import numpy as np
import pytest

import psnode
from psnode.errors import ConfigError, PSError
from psnode.math.sparse import RowSparseArray
from tests.support.mxnet_port import F, asnumpy, check_diff_to_scalar, copy, ones, rand_ndarray, zeros

shape = (4, 4)
keys = [5, 7, 11]
str_keys = ["b", "c", "d"]
STYPES = ["default", "row_sparse"]


def init_kv(stype: str = "default") -> psnode.kv.KVStore:
    kv = psnode.kv.create()
    kv.init(3, zeros(shape, stype))                                  # single
    kv.init(keys, [zeros(shape, stype)] * len(keys))                 # list
    return kv


def init_kv_with_str(stype: str = "default") -> psnode.kv.KVStore:
    kv = psnode.kv.create()
    kv.init("a", zeros(shape, stype))
    kv.init(str_keys, [zeros(shape, stype)] * len(keys))
    return kv


STORES = {"int": (init_kv, 3, keys), "str": (init_kv_with_str, "a", str_keys)}


@pytest.mark.parametrize("stype", STYPES)
@pytest.mark.parametrize("kind", ["int", "str"])
def test_single_kv_pair(stype: str, kind: str) -> None:
    """single key-value pair push & pull"""
    make, key, _ = STORES[kind]
    kv = make()
    kv.push(key, ones(shape, stype))
    val = np.empty(shape, F)
    kv.pull(key, out=val)
    check_diff_to_scalar(val, 1)


@pytest.mark.parametrize("count", [1, 4])
def test_row_sparse_pull(count: int) -> None:
    kv = init_kv_with_str("row_sparse")
    kv.init("e", ones(shape, "row_sparse"))
    rng = np.random.default_rng(count)
    num_rows = shape[0]
    vals, row_ids = [], []
    all_row_ids = np.arange(num_rows)
    for _ in range(count):
        vals.append(zeros(shape, "row_sparse"))
        row_id = rng.integers(num_rows, size=num_rows)
        row_ids.append(np.array(row_id, F).reshape((2, num_rows // 2)))   # mx.nd.array: float32
    row_ids_to_pull = row_ids[0] if len(row_ids) == 1 else row_ids
    vals_to_pull = vals[0] if len(vals) == 1 else vals
    kv.row_sparse_pull("e", out=vals_to_pull, row_ids=row_ids_to_pull)
    for val, row_id in zip(vals, row_ids, strict=True):
        retained = asnumpy(val)
        excluded_row_ids = np.setdiff1d(all_row_ids, row_id)
        for row in range(num_rows):
            expected_val = np.zeros_like(retained[row])
            expected_val += 0 if row in excluded_row_ids else 1
            np.testing.assert_array_equal(retained[row], expected_val)


@pytest.mark.parametrize("key", [3, "a"])
def test_init(key: int | str) -> None:
    kv = psnode.kv.create()
    kv.init(key, np.ones(shape, F) * 4)
    a = np.zeros(shape, F)
    kv.pull(key, out=a)
    check_diff_to_scalar(a, 4)


@pytest.mark.parametrize("name", ["device", "local"])
def test_pull(name: str) -> None:
    kv = psnode.kv.create(name)
    a = np.ones(shape, F)
    b = np.zeros(shape, F)
    kv.init("1", np.zeros(shape, F))
    kv.push("1", [a, a, a, a])
    kv.pull("1", b)
    check_diff_to_scalar(b, 4)
    kv.init("2", np.zeros(shape, F))
    kv.pull("2", b)
    check_diff_to_scalar(b, 0)


@pytest.mark.parametrize("stype", STYPES)
@pytest.mark.parametrize("kind", ["int", "str"])
def test_list_kv_pair(stype: str, kind: str) -> None:
    """list key-value pair push & pull"""
    make, _, key = STORES[kind]
    kv = make()
    kv.push(key, [ones(shape, stype) * 4 if stype == "default" else _scaled(ones(shape, stype), 4)] * len(key))
    val = [np.empty(shape, F)] * len(key)
    kv.pull(key, out=val)
    for v in val:
        check_diff_to_scalar(v, 4)


def _scaled(a: RowSparseArray, x: float) -> RowSparseArray:
    """``rsp * x`` (an NDArray operator MXNet has for row_sparse arrays)."""
    return RowSparseArray(a.data * F(x), a.indices, a.shape)


@pytest.mark.parametrize("stype", STYPES)
@pytest.mark.parametrize("kind", ["int", "str"])
def test_aggregator(stype: str, kind: str) -> None:
    """aggregate value on multiple devices"""
    make, key, key_list = STORES[kind]
    kv = make()
    num_devs = 4
    vals = [ones(shape, stype) for _ in range(num_devs)]                 # single
    outs = [np.empty(shape, F) for _ in range(num_devs)]
    kv.push(key, vals)
    kv.pull(key, out=outs)
    for out in outs:
        check_diff_to_scalar(out, num_devs)
    two = [_times(ones(shape, stype), 2.0) for _ in range(num_devs)]      # list
    vals2 = [two] * len(key_list)
    outs2 = [[np.empty(shape, F) for _ in range(num_devs)]] * len(key_list)
    kv.push(key_list, vals2)
    kv.pull(key_list, out=outs2)
    for out in outs2:
        for o in out:
            check_diff_to_scalar(o, num_devs * 2.0)


def _times(a: object, x: float) -> object:
    return _scaled(a, x) if isinstance(a, RowSparseArray) else a * F(x)  # type: ignore[operator]


@pytest.mark.parametrize("sparse_pull", [False, True])
def test_sparse_aggregator(sparse_pull: bool) -> None:
    """aggregate sparse ndarray on multiple devices"""
    stype = "row_sparse"
    kv = init_kv_with_str(stype)
    rng = np.random.default_rng(7)
    num_devs = 4
    vals = [copy(rand_ndarray(shape, stype, rng)) for _ in range(num_devs)]     # single
    expected_sum = np.zeros(shape)
    for v in vals:
        expected_sum += asnumpy(v)
    kv.push("a", vals)
    all_rows = np.arange(shape[0]).astype(F)
    if sparse_pull:
        kv.row_sparse_pull("a", out=vals, row_ids=[all_rows] * len(vals))
    else:
        kv.pull("a", out=vals, ignore_sparse=False)
    result_sum = np.zeros(shape)
    for v in vals:
        result_sum += asnumpy(v)
    np.testing.assert_allclose(result_sum, expected_sum * num_devs, rtol=1e-6)

    one = [copy(rand_ndarray(shape, stype, rng)) for _ in range(num_devs)]      # list
    vals2 = [one] * len(keys)
    expected_sum = np.zeros(shape)
    for v in vals2[0]:
        expected_sum += asnumpy(v)
    kv.push(str_keys, vals2)
    if sparse_pull:
        kv.row_sparse_pull(str_keys, out=vals2, row_ids=[[all_rows] * num_devs] * len(vals2))
    else:
        kv.pull(str_keys, out=vals2, ignore_sparse=False)
    for vv in vals2:
        result_sum = np.zeros(shape)
        for v in vv:
            result_sum += asnumpy(v)
        np.testing.assert_allclose(result_sum, expected_sum * num_devs, rtol=1e-6)


def updater(key: object, recv: np.ndarray, local: np.ndarray) -> None:
    """use updater: += with int keys"""
    assert isinstance(key, int)
    local += recv


def str_updater(key: object, recv: np.ndarray, local: np.ndarray) -> None:
    """use updater: += with str keys (MXNet may pass bytes: psnode passes the str)"""
    assert isinstance(key, str)
    local += recv


@pytest.mark.parametrize("stype", STYPES)
@pytest.mark.parametrize("kind", ["int", "str"])
def test_updater(stype: str, kind: str) -> None:
    """updater"""
    kv = init_kv() if kind == "int" else init_kv_with_str()
    kv._set_updater(updater if kind == "int" else str_updater)
    key, key_list = (3, keys) if kind == "int" else ("a", str_keys)
    num_devs = 4
    vals = [ones(shape, stype) for _ in range(num_devs)]                       # single
    outs = [np.empty(shape, F) for _ in range(num_devs)]
    kv.push(key, vals)
    kv.pull(key, out=outs)
    for out in outs:
        check_diff_to_scalar(out, num_devs)
    vals2 = [[ones(shape, stype) for _ in range(num_devs)]] * len(key_list)    # list
    outs2 = [[np.empty(shape, F) for _ in range(num_devs)]] * len(key_list)
    num_push = 4
    for _ in range(num_push):
        kv.push(key_list, vals2)
    kv.pull(key_list, out=outs2)
    for out in outs2:
        for o in out:
            check_diff_to_scalar(o, num_devs * num_push)


def test_get_type() -> None:
    kvtype = "local_allreduce_cpu"
    kv = psnode.kv.create(kvtype)
    assert kv.type == kvtype


# ---------------------------------------------------------------- test_invalid_pull, check by check
def check_ignored_pull_single(kv: psnode.kv.KVStore, key: object) -> None:
    rsp_val = ones(shape, "row_sparse")
    rsp_val = _scaled(rsp_val, 2)
    with pytest.warns(UserWarning, match="row_sparse output was ignored"):
        kv.pull(key, out=rsp_val)
    check_diff_to_scalar(rsp_val, 2)


def check_ignored_pull_list(kv: psnode.kv.KVStore, key: list) -> None:
    rsp_val = [_scaled(ones(shape, "row_sparse"), 2) for _ in key]
    kv.pull(key, out=rsp_val)
    for v in rsp_val:
        check_diff_to_scalar(v, 2)


def check_invalid_rsp_pull_single(kv: psnode.kv.KVStore, key: object) -> None:
    # MXNet: assertRaises(MXNetError, kv.row_sparse_pull, key, out=dns_val, row_ids=mx.nd.array([1]))
    # psnode's deliberate difference: a dense output of the key's shape is allowed, and only the
    # rows asked for are written (one API for embedding tables held as dense arrays, torch
    # tensors included); the key itself may be dense too.
    dns_val = np.ones(shape, F) * 2
    kv.row_sparse_pull(key, out=dns_val, row_ids=np.array([1], F))
    want = np.full(shape, 2, F)
    want[1] = 0                       # the stored value's row 1 (the store holds zeros)
    np.testing.assert_array_equal(dns_val, want)


def check_invalid_rsp_pull_list(kv: psnode.kv.KVStore, key: list) -> None:
    # MXNet: assertRaises(MXNetError, ...); psnode: as check_invalid_rsp_pull_single
    dns_val = [np.ones(shape, F) * 2 for _ in key]
    kv.row_sparse_pull(key, out=dns_val, row_ids=[np.array([1], F)] * len(key))
    for v in dns_val:
        assert (v[1] == 0).all() and (np.delete(v, 1, axis=0) == 2).all()


def check_invalid_key_types_single(kv: psnode.kv.KVStore, key: object) -> None:
    dns_val = np.ones(shape, F) * 2
    rsp_val = _scaled(ones(shape, "row_sparse"), 2)
    for call in (lambda: kv.init(key, dns_val), lambda: kv.push(key, dns_val), lambda: kv.pull(key, dns_val),
                 lambda: kv.row_sparse_pull(key, rsp_val, row_ids=np.array([1], F))):
        with pytest.raises(ConfigError, match="a KVStore's keys are all ints or all strs"):
            call()


def check_invalid_key_types_list(kv: psnode.kv.KVStore, key: list) -> None:
    dns_val = [np.ones(shape, F) * 2] * len(key)
    rsp_val = [_scaled(ones(shape, "row_sparse"), 2) for _ in key]
    for call in (lambda: kv.init(key, dns_val), lambda: kv.push(key, dns_val), lambda: kv.pull(key, dns_val),
                 lambda: kv.row_sparse_pull(key, rsp_val, row_ids=[np.array([1], F)] * len(key))):
        with pytest.raises(PSError, match="a KVStore's keys are all ints or all strs"):
            call()


CHECKS = [check_ignored_pull_single, check_ignored_pull_list, check_invalid_rsp_pull_single,
          check_invalid_rsp_pull_list, check_invalid_key_types_single, check_invalid_key_types_list]


@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
@pytest.mark.parametrize("i", [0, 1], ids=["int_kv", "str_kv"])
def test_invalid_pull(i: int, check: object) -> None:
    kvs = [init_kv(), init_kv_with_str()]
    single_keys = [3, "a"]
    list_keys = [keys, str_keys]
    name = check.__name__  # type: ignore[attr-defined]
    if "key_types" in name:     # kvstore should be restricted to only accept either int or str keys
        key = single_keys[1 - i] if name.endswith("single") else list_keys[1 - i]
    else:
        key = single_keys[i] if name.endswith("single") else list_keys[i]
    check(kvs[i], key)  # type: ignore[operator]
