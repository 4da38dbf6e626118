"""The sum kernel of the servers' rounds (pure numpy): two pushes added and scaled, chunk by
chunk while the sum is still in cache (psnode.server.rounds, psnode.server.buckets)."""
from __future__ import annotations

import numpy as np

CHUNK = 65536   # elements per step of add_scaled (a few hundred KiB: the sum is still in cache)


def add_scaled(a: np.ndarray, b: np.ndarray, out: np.ndarray, scale: float = 1.0,
               to: np.ndarray | None = None) -> None:
    """``out = a + b``, then (``scale`` != 1) ``out *= scale`` -- or, with ``to``, ``to = out *
    scale`` -- chunk by chunk, so the second pass reads what the first just wrote from cache.
    The result is bit-identical to the two whole-array passes."""
    if scale == 1.0 and to is None:
        np.add(a, b, out=out)
        return
    if out.size <= CHUNK and a.shape == b.shape == out.shape and (to is None or to.shape == out.shape):
        np.add(a, b, out=out)       # (one chunk: no views to make)
        np.multiply(out, scale, out=out if to is None else to, casting="unsafe")
        return
    a, b, out = a.reshape(-1), b.reshape(-1), out.reshape(-1)
    dest = out if to is None else to.reshape(-1)
    for lo in range(0, out.size, CHUNK):
        hi = lo + CHUNK
        o = out[lo:hi]
        np.add(a[lo:hi], b[lo:hi], out=o)
        np.multiply(o, scale, out=dest[lo:hi], casting="unsafe")


__all__ = ["CHUNK", "add_scaled"]
