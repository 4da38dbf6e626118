"""Row-sparse values: a few rows of a big table (embedding gradients, row_sparse pulls).

``row_sparse_array((data, row_ids), shape=(N, ...))`` holds ``data[i]`` as row ``row_ids[i]`` of
an ``N``-row array; every other row is zero.  ``todense()`` materialises it.  Row ids may be
unsorted or repeated (repeats add up when densified or pushed).  ``unique_rows`` and
``combine_rows`` are the row arithmetic workers and servers share.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from psnode.errors import ShapeMismatch
from psnode.math.dynrows import HEIGHT


def _shape(shape: Any) -> tuple[int, ...]:
    """A shape; a first dimension of None (a table without a row count) reads as HEIGHT."""
    return tuple(HEIGHT if d is None and i == 0 else int(d) for i, d in enumerate(shape))


@dataclass
class RowSparseArray:
    data: np.ndarray
    indices: np.ndarray
    shape: tuple[int, ...]

    stype = "row_sparse"
    table: dict[str, Any] | None = None   # a table without a row count: its options (:func:`table`)

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    def todense(self) -> np.ndarray:
        out = np.zeros(self.shape, dtype=self.data.dtype)
        np.add.at(out, self.indices, self.data)
        return out

    def __repr__(self) -> str:
        return f"<RowSparseArray {self.shape} {self.dtype} with {len(self.indices)} rows>"


def row_sparse_array(arg: Any, shape: tuple[int, ...] | None = None,
                     dtype: Any = None) -> RowSparseArray:
    """Build from ``(data, row_ids)`` (MXNet's form) or from a dense array (non-zero rows kept)."""
    if isinstance(arg, tuple) and len(arg) == 2:
        data = np.asarray(arg[0], dtype=dtype)
        ids = np.asarray(arg[1]).astype(np.int64, copy=False).reshape(-1)
        if shape is None:
            raise ShapeMismatch("row_sparse_array((data, row_ids)) needs shape=(rows, ...)")
        shape = _shape(shape)
        if data.ndim == len(shape) - 1 and len(ids) == 1:
            data = data.reshape((1, *data.shape))
        if data.shape != (len(ids), *shape[1:]):
            raise ShapeMismatch(f"row_sparse data of shape {list(data.shape)} does not hold "
                                f"{len(ids)} rows of {list(shape[1:])}")
        if len(ids) and shape[0] != HEIGHT and (ids.min() < 0 or ids.max() >= shape[0]):
            raise ShapeMismatch(f"row id {int(ids.max() if ids.max() >= shape[0] else ids.min())} "
                                f"is outside 0..{shape[0] - 1}")
        return RowSparseArray(np.ascontiguousarray(data), ids, shape)
    dense = np.asarray(arg, dtype=dtype)
    if dense.ndim < 1:
        raise ShapeMismatch("a row_sparse array needs at least one dimension")
    ids = np.flatnonzero(dense.reshape(dense.shape[0], -1).any(axis=1))
    return RowSparseArray(np.ascontiguousarray(dense[ids]), ids.astype(np.int64), dense.shape)


def zeros(shape: tuple[int | None, ...], dtype: Any = np.float32) -> RowSparseArray:
    """A row_sparse array with no rows present (``(None, width)``: the template of a table
    without a row count, psnode.math.dynrows)."""
    shape = _shape(shape)
    return RowSparseArray(np.zeros((0, *shape[1:]), dtype=dtype), np.zeros(0, np.int64), shape)


def table(width: int, *, min_count: int = 1, ttl: int = 0, max_rows: int = 0, absent: str = "init",
          dtype: Any = np.float32) -> RowSparseArray:
    """The template of a table without a row count (``kv.init(key, psnode.sparse.table(16,
    ...), psnode.init.ps_initializer(init))``): any int64 id is a row, made on first touch.
    ``min_count``: an id's rows train from its k-th occurrence; ``ttl``: rows untouched for
    more rounds are evicted (0: never); ``max_rows``: rows per server, least recently used
    evicted beyond (0: no cap); ``absent``: what a pull of an id not admitted returns,
    ``"init"`` (its initial values) or ``"zeros"``.  See psnode.server.dyntable."""
    out = zeros((None, width), dtype)
    out.table = {"width": int(width), "min_count": int(min_count), "ttl": int(ttl), "max_rows": int(max_rows),
                 "absent": str(absent)}
    return out


def unique_rows(ids: np.ndarray, runs: bool = False) -> np.ndarray:
    """np.unique of a 1-d array (sorted, distinct), without its overhead (several times faster).
    ``runs``: ``ids`` are sorted runs put end to end (a stable sort merges them: a tenth of a
    general sort's time)."""
    ids = np.sort(ids, kind="stable" if runs else None)
    return ids[np.r_[True, ids[1:] != ids[:-1]]] if len(ids) else ids


def sort_rows(ids: np.ndarray, n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """``(order, ids[order])`` with ``order`` = np.argsort(ids, kind="stable"), 1-d int64 ids.

    Ids inside 0..n_rows-1 are sorted as one int64 key each (row id above, position below):
    numpy's plain sort of those is several times faster than a stable argsort and gives the
    same order (equal ids keep their positions).  Other ids take the stable argsort."""
    m = len(ids)
    shift = max(m - 1, 0).bit_length()
    if m > 1 and (n_rows << shift) < 1 << 62 and ids.min() >= 0 and ids.max() < n_rows:
        key = np.left_shift(ids, shift)
        key |= np.arange(m, dtype=np.int64)
        key.sort()
        return key & ((1 << shift) - 1), key >> shift
    order = np.argsort(ids, kind="stable")
    return order, ids[order]


def sorted_runs(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                                     np.ndarray]:
    """Row_sparse parts ``(rows, data)`` together: their rows sorted (stable), their data as
    given, the order that sorts them, and where each run of equal rows begins (none if empty)."""
    rows = np.concatenate([p[0] for p in parts]).astype(np.int64, copy=False)
    data = np.concatenate([p[1] for p in parts])
    order = np.argsort(rows, kind="stable")
    rows = rows[order]
    starts = np.flatnonzero(np.concatenate(([True], rows[1:] != rows[:-1]))) if len(rows) else order[:0]
    return rows, data, order, starts


def combine_rows(parts: list[tuple[np.ndarray, np.ndarray]],
                 buf: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Sum row_sparse parts: sorted unique rows and the summed data (a fresh array, or a view
    of ``buf``, a flat scratch buffer of the data's dtype, when it is big enough).

    The sums are bit-identical to ``np.add.reduceat`` over the parts' rows in stable sorted
    order (each row's pushes added in part order)."""
    if len(parts) == 1:
        rows, data = parts[0]
        if len(rows) <= 1 or bool(np.all(rows[1:] > rows[:-1])):
            return rows.astype(np.int64, copy=False), np.array(data, copy=True)
    merged = _merge_sorted(parts, buf)
    if merged is not None:
        return merged
    rows, data, order, starts = sorted_runs(parts)
    if not len(rows):
        return rows, data
    # one gather from the pushes straight into the result (not a sorted copy of all data first)
    out = np.take(data, order[starts], axis=0).astype(np.add.reduce(data[:1], axis=0).dtype,
                                                      copy=False)  # (sums' dtype)
    if len(starts) == len(rows):
        return rows, out
    # sum only the rows that repeat: np.add.reduceat over all of data is slow along axis 0;
    # over just the repeated runs (same runs, same order) it gives bit-identical sums
    multi, first, sel = _repeated_runs(starts, len(rows))
    out[multi] = np.add.reduceat(data[order[sel]], first, axis=0)
    return rows[starts], out


def _repeated_runs(starts: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For runs of equal sorted ids beginning at ``starts`` (of ``n`` ids): the runs longer than
    one (their indices among the runs), where each begins in the selection, and the selection
    (the sorted positions of their ids, run after run): ``np.add.reduceat(x[sel], first)``
    sums each repeated run."""
    lens = np.diff(np.append(starts, n))
    multi = np.flatnonzero(lens > 1)
    mlens = lens[multi]
    first = np.cumsum(mlens) - mlens
    return multi, first, np.repeat(starts[multi] - first, mlens) + np.arange(int(mlens.sum()))


def _merge_sorted(parts: list[tuple[np.ndarray, np.ndarray]],
                  buf: np.ndarray | None) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`combine_rows` of floating-point parts whose rows are each strictly increasing
    (what psnode's workers send): each part is written straight into its rows' slots of the
    result (no concatenated copy of the data, no gather of it); rows that several parts hold
    are then summed by ``np.add.reduceat`` over just their pushes, in the reference order.
    None: another case (the general path)."""
    dtype, cols = parts[0][1].dtype, parts[0][1].shape[1:]
    if dtype.kind != "f":
        return None   # (integer and bool sums are wider than the data)
    for r, d in parts:
        if d.dtype != dtype or r.ndim != 1 or d.shape[1:] != cols \
                or (len(r) > 1 and not bool(np.all(r[1:] > r[:-1]))):
            return None
    rows = np.concatenate([r for r, _ in parts]).astype(np.int64, copy=False)
    n = len(rows)
    if n == 0:
        return None
    order = np.argsort(rows, kind="stable")
    srows = rows[order]
    new = np.empty(n, bool)
    new[0] = True
    np.not_equal(srows[1:], srows[:-1], out=new[1:])
    slot_sorted = np.cumsum(new) - 1
    slot = np.empty(n, np.int64)
    slot[order] = slot_sorted
    shape = (int(slot_sorted[-1]) + 1, *cols)
    size = math.prod(shape)
    out = buf[:size].reshape(shape) if buf is not None and buf.dtype == dtype and buf.size >= size \
        else np.empty(shape, dtype)
    at = 0
    for r, d in parts:
        out[slot[at:at + len(r)]] = d
        at += len(r)
    if shape[0] == n:
        return srows, out
    # rows held by several parts: their pushes in sorted (stable) order, summed as the
    # reference sums them
    multi, first, sel = _repeated_runs(np.flatnonzero(new), n)
    sel = order[sel]
    bounds = np.cumsum([len(r) for r, _ in parts])
    which = np.searchsorted(bounds, sel, side="right")
    held = np.empty((len(sel), *cols), dtype)
    for k, (r, d) in enumerate(parts):
        mine = np.flatnonzero(which == k)
        if len(mine):
            held[mine] = d[sel[mine] - (bounds[k] - len(r))]
    out[multi] = np.add.reduceat(held, first, axis=0)
    return srows[new], out
