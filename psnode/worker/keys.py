"""What a worker knows of each key it initialised (pure: no I/O).

:class:`KeyInfo` holds a key's shape, dtype, kind (dense or row_sparse), its placement on the
servers (:mod:`psnode.worker.placement`), the bucket it shares with other small keys
(:mod:`psnode.worker.bucketing`) and this worker's push count (the number of the next push;
after a restart, the count its servers had taken at init).  :meth:`KeyInfo.check` is the one
check of an array against its key: :class:`~psnode.errors.ShapeMismatch` naming the key, or
:class:`~psnode.errors.DTypeMismatch` (with the fix) when only the dtype differs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from psnode.errors import DTypeMismatch, ShapeMismatch
from psnode.worker.bucketing import Bucket
from psnode.worker.placement import Part, Placement


@dataclass
class KeyInfo:
    shape: tuple[int, ...]
    dtype: np.dtype
    sparse: bool
    placement: Placement
    seq: int = 0        # pushes of this key sent by this worker (numbers the next push)
    taken: int = 0      # pushes of this rank every part's server had taken at init (restarts)
    counts: dict[int, int] = field(default_factory=dict)   # part -> its server's count at init
    bucket: Bucket | None = None   # the bucket it shares with other small keys (psnode.server.buckets)
    dynamic: bool = False   # a table without a row count (psnode.math.dynrows): rows by id hash

    def part_shape(self, part: Part) -> tuple[int, ...]:
        if not self.placement.split or self.dynamic:
            return self.shape
        return (part.hi - part.lo, *self.shape[1:]) if self.placement.by_rows else (part.hi - part.lo,)

    def region(self, arr: np.ndarray, part: Part) -> np.ndarray:
        """The part of ``arr`` (of the key's shape) that ``part`` holds."""
        if not self.placement.split:
            return arr
        return arr[part.lo:part.hi] if self.placement.by_rows else arr.reshape(-1)[part.lo:part.hi]

    def part_nbytes(self, part: Part) -> int:
        return math.prod(self.part_shape(part)) * self.dtype.itemsize

    def check(self, key: Any, shape: tuple[int, ...], dtype: np.dtype, out: bool = False) -> None:
        """A value (``out``: a pull's output) of ``shape`` and ``dtype`` for ``key``: ShapeMismatch,
        or DTypeMismatch (with the fix) when only the dtype differs."""
        got = np.dtype(dtype)
        if tuple(shape) == self.shape and got != self.dtype:
            fix = (f"pull into a {self.dtype.name} array (np.empty({self.shape}, np.{self.dtype.name}))" if out
                   else f"convert it with .astype(np.{self.dtype.name})")
            raise DTypeMismatch(f"key {key!r} holds {self.dtype}{list(self.shape)}; got {got}{list(shape)}: {fix}")
        if tuple(shape) != self.shape or got != self.dtype:
            raise ShapeMismatch(f"key {key!r} holds {self.dtype}{list(self.shape)}; "
                                f"got {got}{list(shape)}")


#: ``(key, its KeyInfo, what the call gave for it)``: one key of a KVStore call.
Item = tuple[Any, KeyInfo, Any]

__all__ = ["Item", "KeyInfo"]
