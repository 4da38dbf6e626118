"""Dense arithmetic of the servers' rounds (pure numpy), and the decoding of compressed pushes."""
from __future__ import annotations

import numpy as np

from psnode.compression import spec_of_tag
from psnode.entry import OpError

CHUNK = 65536   # elements per step of add_scaled (a few hundred KiB: the sum is still in cache)


def add_scaled(a: np.ndarray, b: np.ndarray, out: np.ndarray, scale: float = 1.0,
               to: np.ndarray | None = None) -> None:
    """``out = a + b``, then (``scale`` != 1) ``out *= scale`` -- or, with ``to``, ``to = out *
    scale`` -- chunk by chunk, so the second pass reads what the first just wrote from cache.
    The result is bit-identical to the two whole-array passes."""
    if scale == 1.0 and to is None:
        np.add(a, b, out=out)
        return
    a, b, out = a.reshape(-1), b.reshape(-1), out.reshape(-1)
    dest = out if to is None else to.reshape(-1)
    for lo in range(0, out.size, CHUNK):
        hi = lo + CHUNK
        o = out[lo:hi]
        np.add(a[lo:hi], b[lo:hi], out=o)
        np.multiply(o, scale, out=dest[lo:hi], casting="unsafe")


def decode_push(tag: str, data: np.ndarray, like: np.ndarray, what: str, sparse: bool = False) -> np.ndarray:
    """The float32 gradient a compressed push stands for (psnode.compression), shaped like the
    key part's value ``like``: a fresh array (a round may keep it by reference).  A key that is
    not dense float32, or a payload of another size, raises OpError naming ``what``."""
    spec = spec_of_tag(tag)
    if sparse:
        raise OpError("ConfigError", f"{what} is row_sparse: gradient compression ({spec.type.value}) applies "
                                     "to dense float32 keys only")
    if like.dtype != np.float32:
        raise OpError("ConfigError", f"{what} holds {like.dtype.name}: gradient compression ({spec.type.value}) "
                                     "applies to float32 keys only")
    want = spec.packed_size(like.size)
    if data.shape != (want,):
        raise OpError("ShapeMismatch", f"{what} has {like.size} elements: its {spec.type.value} payload is "
                                       f"{spec.wire_dtype.name}[{want}], the push sent {list(data.shape)}")
    return spec.decompress(data, like.size).reshape(like.shape)


__all__ = ["CHUNK", "add_scaled", "decode_push"]
