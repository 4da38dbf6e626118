"""This worker's gradient compression: the spec in force and a residual per key (no I/O).

``kv.set_gradient_compression`` sets the spec (:mod:`psnode.math.compression`: the arithmetic);
:class:`Compressor` keeps this worker's residuals, zero at first, each advanced once per push
(the journal keeps the payload, so a resend never compresses again):

* a user key has its own residual; a split key's part compresses with its slice of it;
* a bucket of small keys compresses with one residual over all its members, each member's
  residual a view of it (:meth:`Compressor.residual` with the member's bucket);
* a ``'local'`` store follows MXNet's local rule (:meth:`Compressor.device_sum`): each array of a
  list pushed for one key (one per device) is compressed with its own residual (per key and list
  position) and decoded, then the decoded arrays are summed.

Only dense float32 keys compress: :meth:`Compressor.check` raises ConfigError naming the first
other key before anything is sent.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from psnode.math.compression import CompressionSpec, Residual
from psnode.math.sparse import RowSparseArray
from psnode.worker.bucketing import Bucket
from psnode.worker.keys import Item, KeyInfo


class Compressor:
    """The compression spec of one worker (``spec``: None when off) and its residuals."""

    def __init__(self) -> None:
        self.spec: CompressionSpec | None = None
        self._residuals: dict[Any, Residual] = {}    # key (or bucket key) -> its residual
        self._scratch: dict[Any, np.ndarray] = {}    # bucket key -> its gradient, before compression

    def set(self, spec: CompressionSpec) -> None:
        """Compress with ``spec`` from now on (off when it is not active); residuals start at zero."""
        self.spec = spec if spec.active else None
        self._residuals, self._scratch = {}, {}

    @contextlib.contextmanager
    def suspended(self) -> Iterator[None]:
        """Send without compression inside (a 'local' store's pushes were decoded already:
        :meth:`device_sum`)."""
        spec, self.spec = self.spec, None
        try:
            yield
        finally:
            self.spec = spec

    def residual(self, key: Any, size: int, bucket: Bucket | None = None) -> Residual | None:
        """The residual of ``key`` (a user key, or a bucket's key for the whole bucket), zero at
        first; a member of ``bucket`` gets a view of its bucket's.  None: the type keeps none."""
        spec = self.spec
        if spec is None or not spec.thresholded:
            return None
        res = self._residuals.get(key)
        if res is None:
            if bucket is not None:
                whole = self.residual(bucket.key, bucket.used)
                assert whole is not None
                offset, n = bucket.offsets[key]
                res = whole.part(offset, offset + n)
            else:
                res = Residual(np.zeros(size, np.float32))
            self._residuals[key] = res
        return res

    def scratch(self, bucket: Bucket) -> np.ndarray:
        """Where a bucket's members' gradients are put end to end before it is compressed."""
        data = self._scratch.get(bucket.key)
        if data is None:
            data = self._scratch[bucket.key] = np.empty(bucket.used, bucket.dtype)
        return data

    def check(self, items: list[Item]) -> None:
        """ConfigError naming the first key compression cannot push (row_sparse, not float32)."""
        spec = self.spec
        if spec is not None:
            for k, info, v in items:
                spec.check_key(k, info.dtype, info.sparse or isinstance(v, RowSparseArray))

    def check_lists(self, groups: list[tuple[Any, list[Any]]], info: Callable[[Any], KeyInfo]
                    ) -> list[tuple[Any, KeyInfo, list[Any]]]:
        """The same check for a 'local' store's push (``(key, arrays)`` groups, ``info`` the key's
        KeyInfo): ``(key, info, arrays)``, every key checked before any is compressed."""
        spec = self.spec
        assert spec is not None
        checked = []
        for k, values in groups:
            key_info = info(k)
            spec.check_key(k, key_info.dtype, key_info.sparse)
            checked.append((k, key_info, values))
        return checked

    def device_sum(self, key: Any, info: KeyInfo, values: list[Any]) -> np.ndarray:
        """MXNet's rule for a 'local' store: each array of ``values`` compressed with its own
        residual and decoded, then the decoded arrays summed (float32)."""
        spec = self.spec
        assert spec is not None
        total: np.ndarray | None = None
        for i, v in enumerate(values):
            arr = v.todense() if isinstance(v, RowSparseArray) else np.asarray(v)
            info.check(key, arr.shape, arr.dtype)
            res = self.residual(key, arr.size, info.bucket) if i == 0 else self.residual((key, i), arr.size)
            dec = spec.roundtrip(arr, res)
            if total is None:
                total = dec
            else:
                np.add(total, dec, out=total)
        assert total is not None
        return total


__all__ = ["Compressor"]
