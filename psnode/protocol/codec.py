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
from psnode.protocol.answers import ANSWERS
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
from psnode.protocol.ops import REQUESTS, Key

KIND_DATA, KIND_REPLY = 1, 2
LOC_FRAME = 0      # an array in frame ``index`` of this message at ``offset``
# (locations 1 and 2 name shared-memory segments: see psnode.protocol.samehost)

HEAD = struct.Struct("<BBHHB")      # kind, reserved, op count, array count, job id length
ARRAY = struct.Struct("<BBBxIQ")    # dtype code, ndim, location, index, byte offset
RECORD = struct.Struct("<BBHQqiH")  # code, flags, part, id, seq, first array, array count
KEY_INT = struct.Struct("<Bq")      # 0, int key
KEY_STR = struct.Struct("<BH")      # 1, length of the UTF-8 key that follows
EXTRA = struct.Struct("<I")         # length of the JSON object that follows (0: none)
_DIMS = [struct.Struct(f"<{n}Q") for n in range(MAX_NDIM + 1)]

Resolver = Callable[[int, int, int, int], Any]   # (location, index, offset, nbytes) -> buffer


def encode_record(op: Any, first: int) -> tuple[bytes, list[np.ndarray]]:
    """The record of ``op`` whose arrays will be the message's arrays ``first``, ``first+1``..."""
    flags, part, seq, key, arrs, extra = op.wire()
    head = RECORD.pack(op.code, flags, part, op.id, seq, first, len(arrs))
    if type(key) is int:
        tail = KEY_INT.pack(0, key)
    else:
        raw = key.encode()
        tail = KEY_STR.pack(1, len(raw)) + raw
    if extra is None:
        return head + tail + b"\0\0\0\0", arrs
    raw = JSON_ENC.encode(extra).encode()
    return head + tail + EXTRA.pack(len(raw)) + raw, arrs


def encode_records(ops: Sequence[Any], arrays: list[np.ndarray]) -> bytes:
    """The op records of ``ops``; their arrays are appended to ``arrays`` (in order)."""
    out = []
    for op in ops:
        record, arrs = encode_record(op, len(arrays))
        out.append(record)
        arrays.extend(arrs)
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



def encode_single(kind: int, job: bytes, record: bytes, arrays: list[np.ndarray],
                  where: list[tuple[int, int, int]]) -> bytes:
    """The header of a message of one operation (``record``, from :func:`encode_record` with
    ``first`` 0) whose arrays lie where ``where`` says (no inline payload)."""
    descr = []
    for arr, (loc, index, offset) in zip(arrays, where, strict=True):
        code = CODES.get(arr.dtype)
        if code is None:
            raise ProtocolError(f"dtype {arr.dtype} cannot be sent")
        if arr.ndim == 1:
            descr.append(_ARRAY_1D_PACK(code, 1, loc, index, offset, arr.shape[0]))
        else:
            descr.append(ARRAY.pack(code, arr.ndim, loc, index, offset))
            descr.append(_DIMS[arr.ndim].pack(*arr.shape))
    return b"".join((HEAD.pack(kind, 0, 1, len(arrays), len(job)), job, *descr, record))

def encode_placed(kind: int, job: bytes, op: Any, loc: int, limit: int) -> tuple[bytes, list[np.ndarray]] | None:
    """The header of a message of ``op`` alone (:func:`encode_single`) whose arrays all lie
    where ``op.at`` places them (psnode.protocol.ops.Where: segment and offset, in location
    ``loc``), and those arrays; None when one of them has no place, or the header would pass
    ``limit`` bytes."""
    record, arrays = encode_record(op, 0)
    at = getattr(op, "at", None) or ()
    if len(at) < len(arrays) or len(record) + 64 * len(arrays) > limit:
        return None
    where = []
    for arr_at in at[:len(arrays)]:
        if arr_at is None:
            return None
        where.append((loc, arr_at[0], arr_at[1]))
    return encode_single(kind, job, record, arrays, where), arrays


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
    except struct.error:
        raise ProtocolError("data header is truncated") from None
    except Exception as exc:  # noqa: BLE001 - a decoder bug must not kill a role either
        raise ProtocolError(f"bad data message: {exc!r}"[:200]) from None


def _decode(head: bytes, frames: list[Any], job_id: str | None, max_bytes: int,
            resolve: Resolver | None) -> Message:
    kind, _, n_ops, n_arrays, job_len = HEAD.unpack_from(head, 0)
    if kind != KIND_DATA and kind != KIND_REPLY:
        raise ProtocolError(f"unknown data message kind {kind}")
    pos = HEAD.size + job_len
    raw = head[HEAD.size:pos]
    if len(raw) != job_len:
        raise ProtocolError("data header is truncated")
    try:
        job = raw.decode()
    except UnicodeDecodeError:
        raise ProtocolError("job id is not UTF-8") from None
    if job_id is not None and job != job_id:
        raise ProtocolError(f"frame of job {job[:64]!r} (this is job {job_id!r})")
    bufs = [buffer(f) for f in frames]
    arrays, pos = decode_arrays(head, pos, n_arrays, bufs, max_bytes, resolve)
    ops, pos = decode_records(head, pos, n_ops, arrays, REQUESTS if kind == KIND_DATA else ANSWERS)
    if pos != len(head):
        raise ProtocolError(f"{len(head) - pos} stray bytes after the last operation")
    return Message(cmd=Command.DATA if kind == KIND_DATA else Command.DATA_REPLY, job=job, sender="", ops=ops)



def _read_key(buf: bytes | memoryview, pos: int) -> tuple[Key, int]:
    """The key written at ``pos`` (tag 0: int, tag 1: UTF-8 string of at most 1024 bytes) and
    the position after it; ProtocolError for a bad tag, length or encoding (IndexError when
    ``pos`` is past the end: the caller says what that means)."""
    tag = buf[pos]
    if tag == 0:
        return KEY_INT.unpack_from(buf, pos)[1], pos + KEY_INT.size
    if tag == 1:
        length = KEY_STR.unpack_from(buf, pos)[1]
        pos += KEY_STR.size
        if length > 1024 or pos + length > len(buf):
            raise ProtocolError(f"key of {length} bytes")
        try:
            return bytes(buf[pos:pos + length]).decode(), pos + length
        except UnicodeDecodeError:
            raise ProtocolError("key is not UTF-8") from None
    raise ProtocolError(f"bad key tag {tag}")


def decode_single(data: bytes, pos: int, job_id: str, job: bytes, max_bytes: int,
                  resolve: Resolver) -> Message | None:
    """The common small data message in one pass: one operation, 1-d arrays all in shared
    memory, no extra fields, the header running to the end of ``data`` from ``pos``.  None
    for any other form (then :func:`decode_data` applies); a message of this form that breaks
    a rule raises ProtocolError as :func:`decode_data` would (struct.error when cut short)."""
    kind, _, n_ops, n_arrays, job_len = HEAD.unpack_from(data, pos)
    pos += HEAD.size
    if n_ops != 1 or n_arrays > 2 or job_len != len(job):
        return None
    if data[pos:pos + job_len] != job:
        raise ProtocolError(f"frame of job {data[pos:pos + job_len][:64]!r} (this is job {job_id!r})")
    pos += job_len
    arrays = []
    for _ in range(n_arrays):
        code, ndim, loc, index, offset, count = _ARRAY_1D_UNPACK(data, pos)
        if ndim != 1 or loc == LOC_FRAME:
            return None
        pos += _ARRAY_1D
        if code >= _N_CODES:
            raise ProtocolError(f"dtype code {code} is not allowed")
        dtype = BY_CODE[code]
        nbytes = count * dtype.itemsize
        if nbytes > max_bytes:
            raise ProtocolError(f"array of {nbytes} bytes exceeds the limit of {max_bytes}")
        if nbytes == 0:
            return None
        arrays.append(np.frombuffer(resolve(loc, index, offset, nbytes), dtype, count))
    code, flags, part, rid, seq, first, count = RECORD.unpack_from(data, pos)
    pos += RECORD.size
    if first != 0 or count != n_arrays:
        return None
    cls = (REQUESTS if kind == KIND_DATA else ANSWERS).get(code) if kind in (KIND_DATA, KIND_REPLY) else None
    if cls is None:
        return None
    key, pos = _read_key(data, pos)
    if data[pos:pos + EXTRA.size] != _NO_EXTRA or pos + EXTRA.size != len(data):
        return None
    op = cls.unwire(flags, part, rid, seq, key, arrays, _NO_FIELDS)
    return Message(cmd=Command.DATA if kind == KIND_DATA else Command.DATA_REPLY, job=job_id, sender="", ops=[op])


_ARRAY_1D_STRUCT = struct.Struct(ARRAY.format + "Q")   # a 1-d array's descriptor and its length
_ARRAY_1D_PACK = _ARRAY_1D_STRUCT.pack
_ARRAY_1D_UNPACK = _ARRAY_1D_STRUCT.unpack_from
_ARRAY_1D = _ARRAY_1D_STRUCT.size
_N_CODES = len(BY_CODE)
_NO_EXTRA = EXTRA.pack(0)

def decode_arrays(head: bytes, pos: int, n: int, bufs: list[memoryview], max_bytes: int,
                  resolve: Resolver | None) -> tuple[list[np.ndarray], int]:
    """``n`` arrays described at ``pos`` of ``head`` (struct.error when it is cut short)."""
    arrays = []
    used: set[int] = set()
    unpack, size, codes = ARRAY.unpack_from, ARRAY.size, len(BY_CODE)
    for _ in range(n):
        code, ndim, loc, index, offset = unpack(head, pos)
        pos += size
        if code >= codes:
            raise ProtocolError(f"dtype code {code} is not allowed")
        if ndim > MAX_NDIM:
            raise ProtocolError(f"array of {ndim} dimensions")
        dims = _DIMS[ndim]
        shape = dims.unpack_from(head, pos)
        pos += dims.size
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
            arrays.append(view(dtype, shape, 0, 0, [resolve(loc, index, offset, nbytes)], max_bytes))
    if len(used) != len(bufs):
        raise ProtocolError(f"{len(bufs)} array frames but {len(used)} referenced")
    return arrays, pos


_NO_FIELDS: dict[str, Any] = {}


def decode_records(head: bytes, pos: int, n: int, arrays: list[np.ndarray],
                   table: dict[int, Any]) -> tuple[list[Any], int]:
    """``n`` operation records at ``pos`` of ``head``, as typed operations."""
    ops = []
    unpack, size, narrays = RECORD.unpack_from, RECORD.size, len(arrays)
    for _ in range(n):
        code, flags, part, rid, seq, first, count = unpack(head, pos)
        pos += size
        cls = table.get(code)
        if cls is None:
            raise ProtocolError(f"unknown operation code {code}")
        if first < 0 or first + count > narrays:
            raise ProtocolError(f"operation refers to arrays {first}..{first + count} of {narrays}")
        if pos >= len(head):
            raise ProtocolError("bad key tag -1")
        key, pos = _read_key(head, pos)
        (extra_size,) = EXTRA.unpack_from(head, pos)
        pos += EXTRA.size
        extra = _NO_FIELDS
        if extra_size:
            raw = head[pos:pos + extra_size]
            pos += extra_size
            if len(raw) != extra_size:
                raise ProtocolError("data header is truncated")
            try:
                extra = parse_json(raw)
            except (UnicodeDecodeError, ValueError, RecursionError):
                raise ProtocolError("operation fields are not JSON") from None
            if type(extra) is not dict:
                raise ProtocolError("operation fields are not a JSON object")
        ops.append(cls.unwire(flags, part, rid, seq, key, arrays[first:first + count], extra))
    return ops, pos


__all__ = ["ARRAY", "HEAD", "KIND_DATA", "KIND_REPLY", "LOC_FRAME", "RECORD", "Resolver",
           "decode_arrays", "decode_data", "decode_records", "decode_single", "encode_arrays",
           "encode_data", "encode_placed", "encode_record", "encode_records", "encode_single"]
