"""Whole messages to frames and back: :func:`encode` and :func:`decode` pick the encoding by the
version tag (:mod:`psnode.protocol` describes both)."""
from __future__ import annotations

from typing import Any

from psnode.errors import ProtocolError
from psnode.protocol.codec import Resolver, decode_data, encode_data
from psnode.protocol.frames import DATA_VERSION, VERSION, Message, as_bytes, decode_json, encode_json


def encode(msg: Message) -> list[Any]:
    """Frames for ``msg``: binary when it carries ``ops`` (a data message), else JSON."""
    if msg.ops is not None:
        return encode_data(msg.cmd, msg.job, msg.ops)
    return encode_json(msg)


def decode(frames: list[Any], job_id: str | None, max_bytes: int, resolve: Resolver | None = None) -> Message:
    """Validate and decode ``frames`` (identity already removed).

    ``job_id`` None accepts any job (used only by tools that list jobs).  Raises
    ProtocolError with a short reason on any violation.
    """
    if len(frames) < 2:
        raise ProtocolError(f"{len(frames)} frame(s); a message has at least 2")
    tag = as_bytes(frames[0])
    if tag == VERSION:
        return decode_json(frames, job_id, max_bytes)
    if tag == DATA_VERSION:
        return decode_data(frames, job_id, max_bytes, resolve)
    raise ProtocolError(f"bad version tag {tag[:16]!r}")


__all__ = ["decode", "encode"]
