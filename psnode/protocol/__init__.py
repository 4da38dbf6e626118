"""The wire format: every psnode message, and its validation.

A message is one ZeroMQ multipart message (a ROUTER socket prepends the peer's identity).
Frame 0 is a version tag that says how frame 1 is encoded:

**Control messages** (membership, heartbeats, barriers, status; :class:`Command`)::

    frame 0   b"PSN1"
    frame 1   UTF-8 JSON {"c": command, "j": job id, "s": sender ("worker:0", ...),
                          "b": body (object: the command's body),
                          "a": [[dtype, [dim, ...], frame, offset], ...]  one entry per array}
    frame 2.. raw C-order array buffers

Every command's body is a frozen dataclass of :mod:`psnode.protocol.control` (its table maps
each command to its body: REGISTER :class:`~psnode.protocol.control.Register`, WELCOME
:class:`~psnode.protocol.control.Welcome`, SERVERS, MEMBERSHIP, BARRIER, ..., STATUS_REPLY
:class:`~psnode.protocol.control.StatusAnswer` with :class:`~psnode.protocol.status.NodeRow`
rows): senders build it, ``to_body`` writes it, and the receiver decodes it once
(:func:`psnode.protocol.control.decode`), every field checked.

**Data messages** (worker -> server ``DATA``, server -> worker ``DATA_REPLY``): a batch of
typed operations (:mod:`psnode.protocol.ops`), binary header, little-endian::

    frame 0   b"PSD1"
    frame 1   u8 kind (1 DATA, 2 DATA_REPLY), u8 0, u16 op count, u16 array count,
              u8 job id length, job id (UTF-8)
              per array:  u8 dtype code (index in DTYPE_NAMES), u8 ndim, u8 location, u8 0,
                          u32 index, u64 byte offset, ndim x u64 dims
              per op:     u8 code (OpCode), u8 flags (Flag), u16 part, u64 request id,
                          i64 seq, i32 first array, u16 array count,
                          key: u8 0 + i64 (int key) | u8 1 + u16 length + UTF-8 (str key),
                          u32 length + JSON object of the op's other fields (0: none)
    frame 2.. raw array buffers (location 0: frame ``index`` at ``offset``)

In both encodings an array of 64 KiB or more has a frame of its own, sent and received without
copies; smaller arrays share one frame at 16-byte aligned offsets.  Locations 1 and 2 (a
shared-memory segment of the sender or of the receiver, ``index`` its number) are accepted
only on the same-host data path, whose datagrams :mod:`psnode.protocol.samehost` defines.

Data operations (fields; ``seq`` and the flags live in the record, the rest in the JSON):

============== ======================================================================
``INIT``        key, part, dtype, shape, SYNC, SPARSE; agg = the aggregation rule's name
                (psnode.math.aggregation; absent: average); array: rank 0's value, or
                fill = the spec the server computes the values from (psnode.math.initializers
                .FillSpec, JSON); bare = true: answer without the value.
                Ok: the stored value; seq = pushes of this worker's rank already taken.
``PUSH``        key, part, seq (1, 2, ... per worker and key part); arrays: data, and with
                ROWS the local row ids (row_sparse).  NA: answered only if it fails; without
                NA: Ok, seq = the durable watermark (below) once the push is durable.
                c: the compression tag of a compressed dense push (its grammar and payload
                dtype: :mod:`psnode.protocol.comptag`); data is then its payload.
``PULL``        key, part, seq = after (the worker's last push); with ROWS: row ids.
                Ok once that push was applied (sync: its round complete): the value; seq =
                the worker's durable watermark: its pushes 1..seq of the key part survive a
                restart of the server (psnode.worker.journal).
``PUSHPULL``    key, part, seq; array: dense data.  Ok: the value after round ``seq`` (seq:
                as for PULL).  (A dist_sync push over the same-host link is sent as PUSHPULL:
                the pull after it then needs no request of its own.)
``FLUSH``       check = [[key, part, [seq, ...]], ...] pushes sent; d = false: only a check.
                Ok (every push listed received and, without d = false, durable), or Missing.
``SET_OPTIMIZER`` spec (psnode.math.optimizers's JSON spec).  Ok.
``GET_STATES``  Ok: names = [[key, part, state name], ...], one array per name.
``LOAD_STATES`` names as above, one array per name.  Ok.
============== ======================================================================

Answers echo the request id: ``OK`` (arrays, seq, names), ``WAIT`` (the server holds the
request: nothing lost; with GAP, seq names a push of this worker the server never received;
blockers = workers whose pushes the round waits for), ``MISSING`` (missing = [[key, part,
[seq, ...]], ...]), ``FAILED`` (kind: an error class of :data:`psnode.errors.KINDS`, err: the
message; NA when it answers a push).  Flags: RE (sent again), NA, SYNC, SPARSE, ROWS,
GAP.  Keys are ints (64-bit) or strs of at most 256 characters.

:func:`decode` checks everything before a byte of array data is interpreted: version, header
encoding, job id, command or op code, that every declared array has a known dtype, a sane shape
and exactly the bytes its frame holds, every index and count, and the size limits; a control
body is checked by its receiver's :func:`psnode.protocol.control.decode`.  Any violation raises
:class:`ProtocolError`; receivers log it and drop the message.  Nothing is ever unpickled.

Also here: the same-host link's datagrams (:mod:`psnode.protocol.samehost`), the status rows
of ``mxdist status`` (:mod:`psnode.protocol.status`) and the failure records the launcher
reads to name a failed job's root cause (:mod:`psnode.protocol.failure`).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from psnode.protocol.answers import Answer, Failed, Missing, Ok, Wait
    from psnode.protocol.comptag import CompressionTag, parse_tag
    from psnode.protocol.frames import (
        DATA_VERSION,
        DTYPE_NAMES,
        DTYPES,
        MAX_HEADER_BYTES,
        MAX_NDIM,
        PACK_BYTES,
        VERSION,
        Command,
        Message,
        check_key,
    )
    from psnode.protocol.ops import (
        BUCKET,
        Flag,
        Flush,
        GetStates,
        Init,
        Join,
        Key,
        LoadStates,
        Op,
        OpCode,
        PartKey,
        Pull,
        Push,
        PushPull,
        SetOptimizer,
        bucket_key,
        bucket_of,
        resent,
        without_dest,
    )
    from psnode.protocol.wire import decode, encode

#: where each name of the package lives; loaded on first use, so that the control messages, the
#: status rows and the failure records (standard library only) are read without numpy
_HOMES: dict[str, str] = {
    **dict.fromkeys(("Answer", "Failed", "Missing", "Ok", "Wait"), "psnode.protocol.answers"),
    **dict.fromkeys(("CompressionTag", "parse_tag"), "psnode.protocol.comptag"),
    **dict.fromkeys((
        "Command", "DATA_VERSION", "DTYPES", "DTYPE_NAMES", "MAX_HEADER_BYTES", "MAX_NDIM", "Message",
        "PACK_BYTES", "VERSION", "check_key"
    ), "psnode.protocol.frames"),
    **dict.fromkeys((
        "BUCKET", "Flag", "Flush", "GetStates", "Init", "Join", "Key", "LoadStates", "Op", "OpCode",
        "PartKey", "Pull", "Push", "PushPull", "SetOptimizer", "bucket_key", "bucket_of", "resent",
        "without_dest"
    ), "psnode.protocol.ops"),
    **dict.fromkeys(("decode", "encode"), "psnode.protocol.wire"),
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'psnode.protocol' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


__all__ = [
    "BUCKET",
    "DATA_VERSION",
    "DTYPES",
    "DTYPE_NAMES",
    "MAX_HEADER_BYTES",
    "MAX_NDIM",
    "PACK_BYTES",
    "VERSION",
    "Answer",
    "Command",
    "CompressionTag",
    "Failed",
    "Flag",
    "Flush",
    "GetStates",
    "Init",
    "Join",
    "Key",
    "LoadStates",
    "Message",
    "Missing",
    "Ok",
    "Op",
    "OpCode",
    "PartKey",
    "Pull",
    "Push",
    "PushPull",
    "SetOptimizer",
    "Wait",
    "bucket_key",
    "bucket_of",
    "check_key",
    "decode",
    "encode",
    "parse_tag",
    "resent",
    "without_dest",
]
