"""Row-sparse helpers: the fast paths give exactly what the plain numpy formulation gives."""
from __future__ import annotations

import numpy as np
import pytest

from psnode.math.sparse import combine_rows as _combine_rows
from psnode.math.sparse import unique_rows as _unique


def _reference(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    rows = np.concatenate([p[0] for p in parts]).astype(np.int64, copy=False)
    data = np.concatenate([p[1] for p in parts])
    if not len(rows):
        return rows, data
    order = np.argsort(rows, kind="stable")
    rows, data = rows[order], data[order]
    starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
    return rows[starts], np.add.reduceat(data, starts, axis=0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int8, np.uint8, np.int32, np.bool_])
def test_combine_rows_is_bit_identical_to_reduceat(dtype: type) -> None:
    rng = np.random.default_rng(3)
    for trial in range(150):
        cols = [(64,), (), (2, 3)][trial % 3]
        parts = []
        for _ in range(int(rng.integers(2, 4))):
            n = int(rng.integers(0, 200))
            ids = rng.integers(0, int(rng.choice([4, 50, 10**5])), n)
            if rng.random() < 0.5:
                ids = np.sort(ids)
            with np.errstate(all="ignore"):
                data = (rng.standard_normal((n,) + cols) * 100).astype(dtype)
            parts.append((ids.astype(rng.choice([np.int64, np.int32])), data))
        rows, data = _combine_rows(parts)
        want_rows, want = _reference(parts)
        assert rows.dtype == want_rows.dtype and np.array_equal(rows, want_rows)
        assert data.dtype == want.dtype and data.shape == want.shape
        assert np.array_equal(data.view(np.uint8), want.view(np.uint8))


def test_unique_matches_numpy() -> None:
    rng = np.random.default_rng(4)
    for n in (0, 1, 2, 7, 1000):
        ids = rng.integers(-3, 40, n)
        got, want = _unique(ids), np.unique(ids)
        assert got.dtype == want.dtype and np.array_equal(got, want)


def test_sort_rows_is_the_stable_argsort() -> None:
    """One-key sort == np.argsort(kind="stable") for repeats, ids outside the bound (fallback),
    empty and one-element arrays, and a bound too big for the packed key (fallback)."""
    from psnode.math.sparse import sort_rows
    rng = np.random.default_rng(11)
    cases = [(np.zeros(0, np.int64), 10), (np.array([5], np.int64), 10), (np.array([3, 3, 3, 1, 1], np.int64), 4),
             (np.array([-1, 2, 2], np.int64), 5), (np.array([7, 2], np.int64), 5),
             (np.array([2**40, 3, 2**40], np.int64), 2**50)]
    for _ in range(300):
        bound = int(rng.choice([1, 7, 1000, 200_000]))
        cases.append((rng.integers(0, bound, int(rng.integers(0, 3000))).astype(np.int64), bound))
    for ids, bound in cases:
        order, ids_sorted = sort_rows(ids, bound)
        want = np.argsort(ids, kind="stable")
        assert order.dtype == np.int64 and ids_sorted.dtype == np.int64
        assert np.array_equal(order, want) and np.array_equal(ids_sorted, ids[want])



@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_merge_of_increasing_parts_is_bit_identical_to_reduceat(dtype: type) -> None:
    """What psnode's workers send (each part's rows strictly increasing) takes the merge path:
    every part written into its rows' slots, rows several parts hold summed by reduceat.  Same
    bits as the reference, -0.0 included, with and without a scratch buffer (too small, wrong
    dtype, big enough: then the result is a view of it)."""
    rng = np.random.default_rng(8)
    for trial in range(300):
        cols = [(64,), (), (1,), (2, 3)][trial % 4]
        parts = []
        for _ in range(int(rng.integers(2, 6))):
            n = int(rng.integers(0, 120))
            ids = np.sort(rng.choice(int(rng.choice([130, 1000, 10**5])), n, replace=False))
            data = (rng.standard_normal((n, *cols)) * 100).astype(dtype)
            if trial % 5 == 0 and n:
                data.reshape(-1)[::3] = -0.0
            parts.append((ids.astype(rng.choice([np.int64, np.int32])), data))
        want_rows, want = _reference(parts)
        size = want.size   # (the sums' elements: what the buffer must hold)
        buf = [None, np.empty(size + 7, dtype), np.empty(max(size - 1, 0), dtype), np.empty(size, np.int64)][trial % 4]
        rows, data = _combine_rows(parts, buf)
        assert rows.dtype == want_rows.dtype and np.array_equal(rows, want_rows)
        assert data.dtype == want.dtype and data.shape == want.shape
        assert np.array_equal(data.view(np.uint8), want.view(np.uint8))
        if trial % 4 == 1 and data.size:
            assert np.shares_memory(data, buf)
        elif buf is not None and data.size:
            assert not np.shares_memory(data, buf)
