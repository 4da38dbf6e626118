"""Dense arithmetic of the servers' rounds (pure numpy), and the decoding of compressed pushes."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from psnode.math.compression import CompressionSpec, spec_of_tag
from psnode.server.parts import OpError

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


@dataclass(frozen=True, slots=True)
class Packed:
    """A compressed push of a key part, checked but not decoded yet: a sync round decodes it
    straight into the buffer it is summed into (:meth:`into`, :meth:`add_into`), without a
    float32 temporary of its own.  ``payload`` is read-only and stays valid while referenced
    (a TCP frame, or the worker's push slot: reused only after a pull after this push)."""

    spec: CompressionSpec
    payload: np.ndarray
    shape: tuple[int, ...]

    def decode(self) -> np.ndarray:
        """The float32 gradient, in a fresh array."""
        return self.spec.decompress(self.payload, math.prod(self.shape)).reshape(self.shape)

    def into(self, out: np.ndarray) -> None:
        """``out = gradient`` (``out`` a contiguous float32 array of the part's shape)."""
        self.spec.decompress(self.payload, out.size, out=out)

    def add_into(self, acc: np.ndarray, scale: float = 1.0) -> None:
        """``acc = (acc + gradient) * scale``, as :func:`add_scaled` would compute it."""
        self.spec.accumulate(acc, self.payload, scale)


def packed_push(tag: str, data: np.ndarray, like: np.ndarray, what: str, sparse: bool = False) -> Packed:
    """A compressed push (tag ``tag``, payload ``data``) for a key part whose value is ``like``,
    checked: a key that is not dense float32, or a payload of another size, raises OpError
    naming ``what``."""
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
    return Packed(spec, data, like.shape)


__all__ = ["CHUNK", "Packed", "add_scaled", "packed_push"]
