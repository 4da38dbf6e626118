"""The compression tag of a compressed push: what a valid tag looks like on the wire.

A push or pushpull whose gradient is compressed names its setting in the op's ``c`` field
(psnode.protocol.ops) with a short string in one exact form::

    tag        type | type ":" threshold
    type       "1bit" | "2bit" | "fp16" | "none"      (a push never carries "none")
    threshold  1bit and 2bit only, and required there: the repr() of a Python float whose
               value is a float32 value, finite; greater than 0 for 2bit

so ``"2bit:0.5"``, ``"1bit:-1.0"``, ``"fp16"``; never ``"2bit:0.50"``, ``"2bit:0.1"`` (0.1 is
not a float32 value: its tag is ``"2bit:0.10000000149011612"``) or ``"fp16:0.5"``.  One setting
has one tag, so servers compare workers' settings as strings.  The payload is 1-d, of
:attr:`CompressionTag.payload_dtype`: uint8 (1bit, 2bit), float16 (fp16), float32 (none).

:func:`parse_tag` checks a tag and returns its :class:`CompressionTag`; anything else raises
:class:`ProtocolError`.  The tag's meaning (how a payload decodes) is
psnode.math.compression's: ``CompressionSpec.from_tag(parse_tag(tag))`` is its spec, and
``CompressionSpec.tag`` writes this form.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from psnode.errors import ProtocolError

TYPES = ("none", "1bit", "2bit", "fp16")
THRESHOLDED = ("1bit", "2bit")
PAYLOAD_DTYPES: dict[str, np.dtype] = {"none": np.dtype(np.float32), "1bit": np.dtype(np.uint8),
                                       "2bit": np.dtype(np.uint8), "fp16": np.dtype(np.float16)}
MAX_LENGTH = 64
_ACCEPTED = ", ".join(repr(t) for t in TYPES)


@dataclass(frozen=True, slots=True)
class CompressionTag:
    """A valid tag, parsed: its type and threshold (a float32 value; 0.0 for a type without)."""

    type: str
    threshold: float = 0.0

    @property
    def active(self) -> bool:
        """The payload is compressed (every type but ``none``)."""
        return self.type != "none"

    @property
    def payload_dtype(self) -> np.dtype:
        return PAYLOAD_DTYPES[self.type]

    @property
    def text(self) -> str:
        """The tag in its exact form."""
        return f"{self.type}:{self.threshold!r}" if self.type in THRESHOLDED else self.type


def parse_tag(tag: Any) -> CompressionTag:
    """The :class:`CompressionTag` of ``tag``; ProtocolError unless it is a valid tag in its
    exact form (see the module docstring).  Remembered: tags come with every compressed push."""
    if type(tag) is not str or len(tag) > MAX_LENGTH:
        raise ProtocolError(f"bad compression tag {str(tag)[:40]!r}")
    return _parse(tag)


@functools.lru_cache(maxsize=64)
def _parse(tag: str) -> CompressionTag:
    kind, sep, text = tag.partition(":")
    if kind not in TYPES:
        raise ProtocolError(f"bad compression tag {tag!r}: the type is {kind!r}; accepted: {_ACCEPTED}")
    if kind not in THRESHOLDED:
        if sep:
            raise ProtocolError(f"bad compression tag {tag!r}: {kind} takes no threshold")
        return CompressionTag(kind)
    if not sep:
        raise ProtocolError(f"bad compression tag {tag!r}: {kind} needs a threshold ({kind}:<value>)")
    try:
        with np.errstate(over="ignore"):
            threshold = float(np.float32(float(text)))
    except (TypeError, ValueError, OverflowError):
        raise ProtocolError(f"bad compression tag {tag!r}: the threshold must be a number") from None
    if not math.isfinite(threshold):
        raise ProtocolError(f"bad compression tag {tag!r}: the threshold must be finite in float32")
    if kind == "2bit" and threshold <= 0:
        raise ProtocolError(f"bad compression tag {tag!r}: the threshold must be greater than 0 for 2bit")
    parsed = CompressionTag(kind, threshold)
    if parsed.text != tag:
        raise ProtocolError(f"bad compression tag {tag[:40]!r} (the exact form is {parsed.text!r})")
    return parsed


__all__ = ["PAYLOAD_DTYPES", "THRESHOLDED", "TYPES", "CompressionTag", "parse_tag"]
