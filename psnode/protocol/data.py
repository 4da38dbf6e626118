"""Binary encoding of data messages (layout in :mod:`psnode.protocol`'s docstring).

A data message is a batch of typed operations (:mod:`psnode.protocol.ops`) and the arrays they
refer to.  Its header is packed with :mod:`struct`, not JSON: a few microseconds per message
and about one per operation, which is what lets hundreds of small keys share a message.
:func:`decode_data` checks every count, index, length and dtype before an array is viewed, and
raises only :class:`ProtocolError`.
"""
from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from psnode.errors import ProtocolError
from psnode.protocol.frames import (
    BY_CODE,
    CODES,
    DATA_VERSION,
    JSON_ENC,
    MAX_HEADER_BYTES,
    MAX_NDIM,
    Command,
    Message,
    as_bytes,
    buffer,
    contiguous,
    pack,
    parse_json,
    view,
)
from psnode.protocol.ops import ANSWERS, REQUESTS, Key

KIND_DATA, KIND_REPLY = 1, 2
LOC_FRAME = 0      # an array in frame ``index`` of this message at ``offset``
# (locations 1 and 2 name shared-memory segments: see psnode.protocol and psnode.shm)

HEAD = struct.Struct("<BBHHB")      # kind, reserved, op count, array count, job id length
ARRAY = struct.Struct("<BBBxIQ")    # dtype code, ndim, location, index, byte offset
RECORD = struct.Struct("<BBHQqiH")  # code, flags, part, id, seq, first array, array count
KEY_INT = struct.Struct("<Bq")      # 0, int key
KEY_STR = struct.Struct("<BH")      # 1, length of the UTF-8 key that follows
EXTRA = struct.Struct("<I")         # length of the JSON object that follows (0: none)
_DIMS = [struct.Struct(f"<{n}Q") for n in range(MAX_NDIM + 1)]

Resolver = Callable[[int, int, int, int], Any]   # (location, index, offset, nbytes) -> buffer


def encode_records(ops: Sequence[Any], arrays: list[np.ndarray]) -> bytes:
    """The op records of ``ops``; their arrays are appended to ``arrays`` (in order)."""
    out = []
    for op in ops:
        flags, part, seq, key, arrs, extra = op.wire()
        out.append(RECORD.pack(op.code, flags, part, op.id, seq, len(arrays), len(arrs)))
        arrays.extend(arrs)
        if type(key) is int:
            out.append(KEY_INT.pack(0, key))
        else:
            raw = key.encode()
            out.append(KEY_STR.pack(1, len(raw)))
            out.append(raw)
        if extra is None:
            out.append(b"\0\0\0\0")
        else:
            raw = JSON_ENC.encode(extra).encode()
            out.append(EXTRA.pack(len(raw)))
            out.append(raw)
    return b"".join(out)


def encode_arrays(arrays: list[np.ndarray], where: list[tuple[int, int, int]]) -> bytes:
    """Array descriptors: ``where[i] = (location, index, offset)`` of ``arrays[i]``."""
    out = []
    for arr, (loc, index, offset) in zip(arrays, where, strict=True):
        code = CODES.get(arr.dtype)
        if code is None:
            raise ProtocolError(f"dtype {arr.dtype} cannot be sent")
        out.append(ARRAY.pack(code, arr.ndim, loc, index, offset))
        out.append(_DIMS[arr.ndim].pack(*arr.shape))
    return b"".join(out)


def encode_data(cmd: Command, job: str, ops: Sequence[Any]) -> list[Any]:
    """Frames of a data message: ``[DATA_VERSION, header, array frames...]``."""
    arrays: list[np.ndarray] = []
    records = encode_records(ops, arrays)
    arrays = [contiguous(a) for a in arrays]
    placed, bufs = pack(arrays)
    descr = encode_arrays(arrays, [(LOC_FRAME, f, o) for f, o in placed])
    raw_job = job.encode()
    kind = KIND_DATA if cmd is Command.DATA else KIND_REPLY
    head = HEAD.pack(kind, 0, len(ops), len(arrays), len(raw_job))
    return [DATA_VERSION, b"".join((head, raw_job, descr, records)), *bufs]


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, s: struct.Struct) -> tuple[Any, ...]:
        if self.pos + s.size > len(self.buf):
            raise ProtocolError("data header is truncated")
        out = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return out

    def raw(self, n: int) -> bytes:
        if self.pos + n > len(self.buf):
            raise ProtocolError("data header is truncated")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out


def decode_data(frames: list[Any], job_id: str | None, max_bytes: int,
                resolve: Resolver | None = None) -> Message:
    """Validate and decode a data message (version tag already checked).  ``resolve`` maps
    a shared-memory location to its buffer (None: only arrays in frames are accepted)."""
    head = as_bytes(frames[1])
    if len(head) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {len(head)} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        return _decode(head, frames[2:], job_id, max_bytes, resolve)
    except ProtocolError:
        raise
    except Exception as exc:  # noqa: BLE001 - a decoder bug must not kill a role either
        raise ProtocolError(f"bad data message: {exc!r}"[:200]) from None


def _decode(head: bytes, frames: list[Any], job_id: str | None, max_bytes: int,
            resolve: Resolver | None) -> Message:
    r = _Reader(head)
    kind, _, n_ops, n_arrays, job_len = r.take(HEAD)
    if kind not in (KIND_DATA, KIND_REPLY):
        raise ProtocolError(f"unknown data message kind {kind}")
    try:
        job = r.raw(job_len).decode()
    except UnicodeDecodeError:
        raise ProtocolError("job id is not UTF-8") from None
    if job_id is not None and job != job_id:
        raise ProtocolError(f"frame of job {job[:64]!r} (this is job {job_id!r})")
    bufs = [buffer(f) for f in frames]
    arrays = decode_arrays(r, n_arrays, bufs, max_bytes, resolve)
    table = REQUESTS if kind == KIND_DATA else ANSWERS
    ops = decode_records(r, n_ops, arrays, table)
    if r.pos != len(head):
        raise ProtocolError(f"{len(head) - r.pos} stray bytes after the last operation")
    cmd = Command.DATA if kind == KIND_DATA else Command.DATA_REPLY
    return Message(cmd=cmd, job=job, sender="", ops=ops)


def decode_arrays(r: _Reader, n: int, bufs: list[memoryview], max_bytes: int,
                  resolve: Resolver | None) -> list[np.ndarray]:
    arrays = []
    used: set[int] = set()
    for _ in range(n):
        code, ndim, loc, index, offset = r.take(ARRAY)
        if code >= len(BY_CODE):
            raise ProtocolError(f"dtype code {code} is not allowed")
        if ndim > MAX_NDIM:
            raise ProtocolError(f"array of {ndim} dimensions")
        shape = r.take(_DIMS[ndim])
        dtype = BY_CODE[code]
        if loc == LOC_FRAME:
            used.add(index)
            arrays.append(view(dtype, shape, index, offset, bufs, max_bytes))
        elif resolve is None:
            raise ProtocolError(f"array location {loc} is not accepted here")
        else:
            count = 1
            for d in shape:
                count *= d
            nbytes = count * dtype.itemsize
            if nbytes > max_bytes:
                raise ProtocolError(f"array of {nbytes} bytes exceeds the limit of {max_bytes}")
            buf = resolve(loc, index, offset, nbytes)
            arrays.append(view(dtype, shape, 0, 0, [buf], max_bytes))
    if len(used) != len(bufs):
        raise ProtocolError(f"{len(bufs)} array frames but {len(used)} referenced")
    return arrays


def decode_records(r: _Reader, n: int, arrays: list[np.ndarray], table: dict[int, Any]) -> list[Any]:
    ops = []
    for _ in range(n):
        code, flags, part, rid, seq, first, count = r.take(RECORD)
        cls = table.get(code)
        if cls is None:
            raise ProtocolError(f"unknown operation code {code}")
        if first < 0 or first + count > len(arrays):
            raise ProtocolError(f"operation refers to arrays {first}..{first + count} of {len(arrays)}")
        tag = r.buf[r.pos] if r.pos < len(r.buf) else -1
        key: Key
        if tag == 0:
            key = r.take(KEY_INT)[1]
        elif tag == 1:
            length = r.take(KEY_STR)[1]
            if length > 1024:
                raise ProtocolError(f"key of {length} bytes")
            try:
                key = r.raw(length).decode()
            except UnicodeDecodeError:
                raise ProtocolError("key is not UTF-8") from None
        else:
            raise ProtocolError(f"bad key tag {tag}")
        (size,) = r.take(EXTRA)
        extra: dict[str, Any] = {}
        if size:
            try:
                extra = parse_json(r.raw(size))
            except (UnicodeDecodeError, ValueError, RecursionError):
                raise ProtocolError("operation fields are not JSON") from None
            if type(extra) is not dict:
                raise ProtocolError("operation fields are not a JSON object")
        ops.append(cls.unwire(flags, part, rid, seq, key, arrays[first:first + count], extra))
    return ops


__all__ = ["ARRAY", "HEAD", "KIND_DATA", "KIND_REPLY", "LOC_FRAME", "RECORD", "Resolver",
           "decode_arrays", "decode_data", "decode_records", "encode_arrays", "encode_data",
           "encode_records"]
