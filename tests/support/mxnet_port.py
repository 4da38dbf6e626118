"""What the ports of MXNet's KVStore tests share: MXNet's test helpers on numpy arrays.

The ports (``test_port_*.py``) re-express MXNet 1.9's ``tests/python/unittest/test_kvstore.py``,
``test_kvstore_custom.py`` and the local tests of ``tests/nightly/test_kvstore.py`` for psnode's
numpy API, test by test: an ``mx.nd`` array is a float32 numpy array, a row_sparse NDArray a
:class:`psnode.math.sparse.RowSparseArray`, a list of arrays on several devices a list of arrays,
``MXNetError`` a psnode error.  Where psnode keeps a deliberate difference the port asserts
psnode's behaviour and says why, next to MXNet's line.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from psnode.math.sparse import RowSparseArray, row_sparse_array

F = np.float32


def ones(shape: tuple[int, ...], stype: str = "default") -> Any:
    """``mx.nd.ones(shape).tostype(stype)``."""
    return tostype(np.ones(shape, F), stype)


def zeros(shape: tuple[int, ...], stype: str = "default") -> Any:
    """``mx.nd.zeros(shape, stype=stype)``."""
    return tostype(np.zeros(shape, F), stype)


def tostype(arr: np.ndarray, stype: str) -> Any:
    """``arr.tostype(stype)``: a row_sparse array keeps the non-zero rows."""
    return row_sparse_array(arr) if stype == "row_sparse" else np.array(arr, F)


def asnumpy(a: Any) -> np.ndarray:
    return a.todense() if isinstance(a, RowSparseArray) else np.asarray(a)


def check_diff_to_scalar(a: Any, x: float) -> None:
    """MXNet's ``assert np.sum(np.abs((A - x).asnumpy())) == 0``."""
    got = asnumpy(a)
    assert np.sum(np.abs(got - x)) == 0, (got, x)


def rand_ndarray(shape: tuple[int, ...], stype: str, rng: np.random.Generator) -> Any:
    """``mxnet.test_utils.rand_ndarray``: uniform [0, 1) values; row_sparse: a random half of
    the rows present (density 0.5)."""
    dense = rng.random(shape).astype(F)
    if stype != "row_sparse":
        return dense
    rows = np.flatnonzero(rng.random(shape[0]) < 0.5)
    return RowSparseArray(np.ascontiguousarray(dense[rows]), rows.astype(np.int64), shape)


def copy(a: Any) -> Any:
    """``a.copyto(device)``: another array with the same values."""
    if isinstance(a, RowSparseArray):
        return RowSparseArray(a.data.copy(), a.indices.copy(), a.shape)
    return np.array(a, copy=True)
