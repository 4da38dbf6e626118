"""Every calling form MXNet's KVStore documents, with MXNet's meaning (on the 'local' store;
tests/cluster/test_forms_cluster.py runs the same forms in a dist_sync job)."""
from __future__ import annotations

import numpy as np
import pytest

import psnode
from psnode.errors import ConfigError, ShapeMismatch
from psnode.math.sparse import RowSparseArray, row_sparse_array

F = np.float32
S = (2, 3)


def _kv():
    return psnode.kv.create("local", aggregator="sum")


def test_init_forms() -> None:
    kv = _kv()
    kv.init("200", [np.ones(S, F) * 2])                   # MXNet's nightly test: one-element list
    kv.init(["3", "5"], [np.ones(S, F)] * 2)
    kv.init(["7", "9"], [[np.ones(S, F) * 7], [np.ones(S, F) * 9]])   # lists of one-element lists
    kv.init("11", np.ones(S, F) * 11)
    for k, v in (("200", 2), ("3", 1), ("5", 1), ("7", 7), ("9", 9), ("11", 11)):
        assert (kv.pull(k) == v).all() and kv.pull(k).shape == S
    with pytest.raises(ConfigError, match="key 11 is an int, but this KVStore uses str keys"):
        kv.init(11, np.ones(S, F))              # MXNet's rule: one store's keys are all ints or all strs
    with pytest.raises(ConfigError, match="one value"):
        kv.init("x", [np.ones(S, F), np.ones(S, F)])
    with pytest.raises(ConfigError, match="2 keys but 3 values"):
        kv.init(["a", "b"], [np.ones(S, F)] * 3)


def test_push_forms_sum_lists_like_devices() -> None:
    kv = _kv()
    kv.init(["a", "b", "c"], [np.zeros(S, F)] * 3)
    kv.push("a", np.ones(S, F) * 8)                              # one array
    assert (kv.pull("a") == 8).all()
    kv.push("a", [np.ones(S, F)] * 4)                            # several "devices": summed
    assert (kv.pull("a") == 4).all()
    kv.push(["b", "c"], [np.ones(S, F) * 2, np.ones(S, F) * 3])  # list of keys, one each
    assert (kv.pull("b") == 2).all() and (kv.pull("c") == 3).all()
    kv.push(["b", "c"], [[np.ones(S, F)] * 2, [np.ones(S, F)] * 3])   # list of lists
    assert (kv.pull("b") == 2).all() and (kv.pull("c") == 3).all()


def test_pull_forms_fill_every_output() -> None:
    kv = _kv()
    kv.init(["a", "b"], [np.full(S, 5, F), np.full(S, 6, F)])
    outs = [np.zeros(S, F) for _ in range(3)]
    got = kv.pull("a", out=outs)                                  # one key into several outputs
    assert all(g is o for g, o in zip(got, outs, strict=True)) and all((o == 5).all() for o in outs)
    a, b = np.zeros(S, F), np.zeros(S, F)
    got = kv.pull(["a", "b"], out=[a, b])
    assert got[0] is a and got[1] is b and (a == 5).all() and (b == 6).all()
    lists = [[np.zeros(S, F)] * 2, [np.zeros(S, F), np.zeros(S, F)]]
    kv.pull(["a", "b"], out=lists)                                # list of lists
    assert all((o == 5).all() for o in lists[0]) and all((o == 6).all() for o in lists[1])
    fresh = kv.pull(["a", "b"])                                   # allocated
    assert [float(x[0, 0]) for x in fresh] == [5, 6]
    strided = np.zeros((2, 6), F)[:, ::2]
    kv.pull("a", out=strided)
    assert (strided == 5).all()


def test_pushpull_forms() -> None:
    kv = _kv()
    kv.init(["a", "b"], [np.zeros(S, F)] * 2)
    out = np.zeros(S, F)
    kv.pushpull("a", np.ones(S, F) * 8, out=out)
    assert (out == 8).all()
    vals = [np.ones(S, F)] * 2
    got = kv.pushpull("a", [np.ones(S, F), np.ones(S, F)], out=out)  # summed, then pulled
    assert got is out and (out == 2).all()
    vals = [np.ones(S, F), np.ones(S, F) * 2]
    kv.pushpull("b", vals)                                          # out None: into every value
    assert all((v == 3).all() for v in vals)
    pairs = [[np.ones(S, F)] * 2, [np.ones(S, F) * 5]]
    pairs = [[a.copy() for a in p] for p in pairs]
    kv.pushpull(["a", "b"], pairs)                                  # list of lists, out None
    assert all((v == 2).all() for v in pairs[0]) and (pairs[1][0] == 5).all()


def _table():
    kv = _kv()
    kv.init("e", np.zeros((6, 2), F), stype="row_sparse")
    kv.push("e", row_sparse_array((np.arange(12, dtype=F).reshape(6, 2), np.arange(6)), shape=(6, 2)))
    return kv


def test_row_sparse_pull_row_id_forms() -> None:
    kv = _table()
    want = np.arange(12, dtype=F).reshape(6, 2)
    rsp = kv.row_sparse_pull("e", row_ids=np.array([[4., 1.], [1., 4.]], F))  # 2-d float ids
    assert isinstance(rsp, RowSparseArray) and rsp.indices.tolist() == [1, 4]
    assert np.array_equal(rsp.data, want[[1, 4]])
    dense = np.zeros((6, 2), F)
    kv.row_sparse_pull("e", out=dense, row_ids=[5, 0, 5])                     # a plain list of ids
    assert np.array_equal(dense[[0, 5]], want[[0, 5]]) and (dense[1:5] == 0).all()
    outs = [np.zeros((6, 2), F), psnode.sparse.zeros((6, 2))]
    kv.row_sparse_pull("e", out=outs, row_ids=np.array([2]))                  # one ids for all outs
    assert np.array_equal(outs[0][2], want[2]) and outs[1].indices.tolist() == [2]
    outs = [np.zeros((6, 2), F), np.zeros((6, 2), F)]
    kv.row_sparse_pull("e", out=outs, row_ids=[np.array([0]), np.array([3])])  # one ids per out
    assert outs[0][0].tolist() == [0, 1] and (outs[0][3] == 0).all() and outs[1][3].tolist() == [6, 7]
    empty = psnode.sparse.zeros((6, 2))
    kv.row_sparse_pull("e", out=empty, row_ids=np.array([], F))              # no rows at all
    assert empty.data.shape == (0, 2) and empty.todense().sum() == 0
    with pytest.raises(ConfigError, match="whole numbers"):
        kv.row_sparse_pull("e", row_ids=np.array([1.5]))
    with pytest.raises(ShapeMismatch, match="outside"):
        kv.row_sparse_pull("e", row_ids=[6])
    with pytest.raises(ConfigError, match="2 outputs but 3 row_ids"):
        kv.row_sparse_pull("e", out=[dense, dense], row_ids=[np.array([0])] * 3)


def test_row_sparse_pull_lists_of_keys() -> None:
    kv = _table()
    kv.init("f", np.ones((3, 2), F), stype="row_sparse")
    a, b, c = np.zeros((6, 2), F), np.zeros((3, 2), F), np.zeros((3, 2), F)
    kv.row_sparse_pull(["e", "f"], out=[a, [b, c]], row_ids=[np.array([1]), [np.array([0]), np.array([2])]])
    assert a[1].tolist() == [2, 3] and b[0].tolist() == [1, 1] and (b[2] == 0).all() and c[2].tolist() == [1, 1]
    got = kv.row_sparse_pull(["e", "f"], row_ids=[np.array([0]), np.array([1])])
    assert [r.indices.tolist() for r in got] == [[0], [1]]
