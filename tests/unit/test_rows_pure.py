"""Row-sparse helpers: the fast paths give exactly what the plain numpy formulation gives."""
from __future__ import annotations

import numpy as np
import pytest

from psnode.sparse import combine_rows as _combine_rows
from psnode.sparse import unique_rows as _unique


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
