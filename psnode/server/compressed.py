"""Compressed pushes on a server: one setting for all workers, checked, decoded where summed.

A compressed dense push carries its tag (psnode.protocol.comptag, checked on decode) and the
payload.  The store records each worker's tag and refuses a push whose setting differs from
another worker's (:func:`agree`: every worker must call ``kv.set_gradient_compression`` alike),
checks the payload against the key part (:func:`packed_push`) and keeps it packed: a sync round
decodes it straight into the buffer it is summed into (:class:`Packed`; psnode.server.rounds).
What a payload means is psnode.math.compression's (:func:`spec_of_tag`).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from psnode.math.compression import CompressionSpec
from psnode.protocol import parse_tag
from psnode.server.replies import OpError


def spec_of_tag(tag: Any) -> CompressionSpec:
    """The spec of a compression tag (ProtocolError unless a valid tag: psnode.protocol.comptag);
    remembered, as tags come with every compressed push."""
    if type(tag) is not str:
        parse_tag(tag)   # (raises)
    return _spec_of(tag)


@functools.lru_cache(maxsize=64)
def _spec_of(tag: str) -> CompressionSpec:
    return CompressionSpec.from_tag(parse_tag(tag))


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
        """``acc = (acc + gradient) * scale``, as psnode.math.aggregation's fold_scaled would for a sum."""
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


def agree(settings: dict[int, str], worker: int, tag: str) -> None:
    """Record ``tag`` (its compression tag, "" for none) as the gradient compression of
    ``worker``'s pushes, unless another worker pushes with other settings: then OpError
    (ConfigError) naming this worker and both settings (nothing is recorded)."""
    for other, theirs in settings.items():
        if other != worker and theirs != tag:
            raise OpError("ConfigError",
                          f"worker {worker} pushes with gradient compression {describe_tag(tag)}, but worker "
                          f"{other} pushes with {describe_tag(theirs)}: every worker must call "
                          "kv.set_gradient_compression with the same settings before its first push")
    settings[worker] = tag


def describe_tag(tag: str) -> str:
    """A compression tag as the user wrote it: ``{'type': '2bit', 'threshold': 0.5}``, or none."""
    return str(spec_of_tag(tag).to_params()) if tag else "none (uncompressed float32)"


__all__ = ["Packed", "agree", "describe_tag", "packed_push", "spec_of_tag"]
