"""Which small keys share a bucket (pure; identical on every worker, as placement is).

In a ``dist_sync`` job, a floating-point dense key whose part lives whole on one server and is
smaller than ``KEY_BYTES`` joins that server's open bucket for its dtype when it is
initialised, at the next free offset; a bucket holds up to ``BUCKET_BYTES``.  Buckets close at
the worker's first push or pull, so keys initialised later start new ones (a bucket's members
are fixed before it is used).  Workers initialise keys in the same order (MXNet's rule, which
placement already relies on), so every worker computes the same buckets.  What a bucket is
for, and what it means on the server: psnode.server.buckets.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from psnode.protocol import PACK_BYTES, bucket_key

KEY_BYTES = PACK_BYTES - 1          # (members always travel copied in TCP frames)
BUCKET_BYTES = 4 * 2**20


@dataclass
class Bucket:
    bid: int
    server: int
    dtype: np.dtype
    key: str                                   # its reserved key on the wire
    members: list[Any] = field(default_factory=list)
    offsets: dict[Any, tuple[int, int]] = field(default_factory=dict)   # key -> (offset, size)
    used: int = 0
    closed: bool = False
    label: str = ""                            # its keys, for messages (set when it closes)


class Bucketer:
    """Buckets of one worker (see the module docstring)."""

    def __init__(self) -> None:
        self.buckets: list[Bucket] = []
        self._open: dict[tuple[int, str], Bucket] = {}

    def assign(self, key: Any, server: int, dtype: np.dtype, size: int) -> tuple[Bucket, int] | None:
        """The bucket and offset of a new key of ``size`` elements on ``server`` (None: it does
        not go into a bucket)."""
        nbytes = size * dtype.itemsize
        if dtype.kind != "f" or not 0 < nbytes <= KEY_BYTES:
            return None
        slot = (server, dtype.str)
        b = self._open.get(slot)
        if b is None or b.closed or (b.used + size) * dtype.itemsize > BUCKET_BYTES:
            bid = len(self.buckets)
            b = Bucket(bid, server, dtype, bucket_key(bid))
            self.buckets.append(b)
            self._open[slot] = b
        offset = b.used
        b.members.append(key)
        b.offsets[key] = (offset, size)
        b.used += size
        return b, offset

    def close_all(self) -> None:
        if self._open:
            for b in self._open.values():
                b.closed = True
                b.label = label(b.members)
            self._open.clear()


def label(keys: list[Any]) -> str:
    """Keys, for messages: "key 'w'", or "keys 'a', 'b', 'c' and 97 more"."""
    if len(keys) == 1:
        return f"key {keys[0]!r}"
    shown = ", ".join(repr(k) for k in keys[:3])
    return f"keys {shown}" + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")


__all__ = ["BUCKET_BYTES", "KEY_BYTES", "Bucket", "Bucketer", "label"]
