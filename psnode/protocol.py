"""The wire format: every psnode message, and its validation.

A message is one ZeroMQ multipart message (a ROUTER socket prepends the peer's identity)::

    frame 0   VERSION (b"PSN1")
    frame 1   header: UTF-8 JSON object
                {"c": command, "j": job id, "s": sender ("worker:0", "server:1", ...),
                 "b": body (a JSON object, command specific),
                 "a": [[dtype, [dim, ...], frame, offset], ...]   one entry per array}
    frame 2.. raw C-order array buffers: an array of 64 KiB or more has a frame of its own
              (sent and received without copies); smaller arrays share one frame, each at
              its byte offset (one frame for hundreds of small keys)

Data messages (``DATA`` worker -> server, ``DATA_REPLY`` server -> worker) carry a batch of
operations in ``body["ops"]``; each op is a JSON object with a request id ``"id"`` and the
indices of its arrays in ``"a"``.  Replies echo the request id.  Several small keys bound for
one server travel in one message.

:func:`decode` checks everything before a byte of array data is interpreted: version, JSON,
job id, command, that every declared array has a known dtype, a sane shape and exactly the
number of bytes its frame holds, and the size limits.  Any violation raises
:class:`ProtocolError`; receivers log it and drop the message.  Nothing is ever unpickled.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from psnode.errors import ProtocolError

VERSION = b"PSN1"
MAX_HEADER_BYTES = 16 * 2**20
MAX_NDIM = 32
PACK_BYTES = 65536  # arrays below this share one frame

#: dtypes allowed on the wire (no object, no structured dtypes).
DTYPES = frozenset(
    ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32", "float64"]
)


_NAMES = {np.dtype(n): n for n in DTYPES}   # dtype -> wire name (dtype.name is slow)
_BY_NAME = {n: np.dtype(n) for n in DTYPES}
_PAD = bytes(16)
# headers are plain trees of dicts, lists, strings and numbers: no cycle check needed (faster)
_JSON = json.JSONEncoder(separators=(",", ":"), check_circular=False)
_JSON_DEC = json.JSONDecoder()


class Command(str, Enum):
    # membership (node <-> scheduler)
    REGISTER = "register"          # node -> scheduler: role, host, port, pid, rank wish
    WELCOME = "welcome"            # scheduler -> node: rank and the address book
    HEARTBEAT = "heartbeat"        # node -> scheduler, with counters
    HEARTBEAT_ACK = "heartbeat_ack"
    BARRIER = "barrier"            # worker -> scheduler
    BARRIER_DONE = "barrier_done"
    FINISH = "finish"              # worker -> scheduler: this worker is done
    FINISH_ACK = "finish_ack"
    MEMBERSHIP = "membership"      # scheduler -> servers: the active workers
    PEER_LOST = "peer_lost"        # scheduler -> all: a node died; the job ends
    SHUTDOWN = "shutdown"          # scheduler -> all: end now (body: reason, ok)
    BYE = "bye"                    # node -> scheduler: leaving (body: error, or restart)
    SERVERS = "servers"            # scheduler -> workers: a server is down ("down": rank) or
                                   # was replaced ("servers": address book, "restored": rank)
    # control (mxdist status / stop -> scheduler)
    STATUS = "status"
    STATUS_REPLY = "status_reply"
    STOP = "stop"
    STOP_ACK = "stop_ack"
    # data (worker <-> server)
    DATA = "data"
    DATA_REPLY = "data_reply"


@dataclass
class Message:
    """A decoded message.  ``arrays`` are read-only views of the received frames."""

    cmd: Command
    job: str
    sender: str
    body: dict[str, Any] = field(default_factory=dict)
    arrays: list[np.ndarray] = field(default_factory=list)


def encode(msg: Message) -> list[Any]:
    """Frames for ``msg``.

    Arrays of at least PACK_BYTES travel as their own frame, without a copy.  Smaller ones are
    copied into one shared frame (16-byte aligned offsets): one frame instead of hundreds when
    many small keys are fused into a message.
    """
    metas: list[list[Any]] = []
    bufs: list[Any] = []
    small: list[Any] = []        # the pack's pieces: arrays and padding
    packed: list[list[Any]] = []  # their metas (frame index set at the end)
    pack_size = 0
    for arr in msg.arrays:
        if type(arr) is not np.ndarray:
            arr = np.asarray(arr)
        if not arr.flags.c_contiguous:
            arr = arr.copy(order="C")  # (np.ascontiguousarray would make 0-d arrays 1-d)
        name = _NAMES.get(arr.dtype)
        if name is None:
            raise ProtocolError(f"dtype {arr.dtype} cannot be sent (allowed: {sorted(DTYPES)})")
        nbytes = arr.nbytes
        if nbytes >= PACK_BYTES:
            metas.append([name, list(arr.shape), len(bufs), 0])
            bufs.append(arr.reshape(-1).view(np.uint8))
        else:
            meta = [name, list(arr.shape), 0, pack_size]
            metas.append(meta)
            packed.append(meta)
            if nbytes:
                small.append(arr.data if arr.ndim else arr.reshape(1).data)
            pad = -nbytes % 16
            if pad:
                small.append(_PAD[:pad])
            pack_size += nbytes + pad
    if packed:
        for meta in packed:
            meta[2] = len(bufs)
        bufs.append(b"".join(small))  # one copy of every small array, 16-byte aligned offsets
    header = {"c": msg.cmd.value, "j": msg.job, "s": msg.sender, "b": msg.body, "a": metas}
    return [VERSION, _JSON.encode(header).encode(), *bufs]


def _buffer(frame: Any) -> memoryview:
    buf = getattr(frame, "buffer", None)
    return memoryview(frame) if buf is None else buf


_COMMANDS = {c.value: c for c in Command}


def _parse(raw: bytes) -> Any:
    """json.loads(raw): the UTF-8 text directly when it is plain UTF-8 (json.loads of bytes
    guesses the encoding first, in Python); anything else goes the way of json.loads."""
    if raw[:1] in (b"{", b"["):
        try:
            return _JSON_DEC.decode(raw.decode())
        except ValueError:  # (UnicodeDecodeError too) e.g. UTF-16 text: json.loads decides
            pass
    return json.loads(raw)


def decode(frames: list[Any], job_id: str | None, max_bytes: int) -> Message:
    """Validate and decode ``frames`` (identity already removed).

    ``job_id`` None accepts any job (used only by tools that list jobs).  Raises
    ProtocolError with a short reason on any violation.
    """
    if len(frames) < 2:
        raise ProtocolError(f"{len(frames)} frame(s); a message has at least 2")
    tag = frames[0]
    if (tag if type(tag) is bytes else bytes(_buffer(tag))) != VERSION:
        raise ProtocolError(f"bad version tag {bytes(_buffer(frames[0]))[:16]!r}")
    raw = frames[1] if type(frames[1]) is bytes else bytes(_buffer(frames[1]))
    if len(raw) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {len(raw)} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        header = _parse(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"header is not JSON: {str(exc)[:80]}") from None
    if not isinstance(header, dict):
        raise ProtocolError("header is not a JSON object")
    c = header.get("c")
    cmd = _COMMANDS.get(c) if type(c) is str else None
    if cmd is None:
        raise ProtocolError(f"unknown command {str(header.get('c'))[:32]!r}")
    job, sender, body, metas = header.get("j"), header.get("s"), header.get("b"), header.get("a")
    if not isinstance(job, str) or not isinstance(sender, str) or not isinstance(body, dict):
        raise ProtocolError("header lacks a string job id, a string sender or an object body")
    if job_id is not None and job != job_id:
        raise ProtocolError(f"frame of job {job[:64]!r} (this is job {job_id!r})")
    if not isinstance(metas, list):
        raise ProtocolError("header has no array list")
    bufs = [_buffer(f) for f in frames[2:]]
    arrays = [_array(meta, bufs, max_bytes) for meta in metas]
    used = {meta[2] for meta in metas}
    if len(used) != len(bufs):
        raise ProtocolError(f"{len(bufs)} array frames but {len(used)} referenced")
    return Message(cmd=cmd, job=job, sender=sender, body=body, arrays=arrays)


def _array(meta: Any, bufs: list[memoryview], max_bytes: int) -> np.ndarray:
    if not (type(meta) is list and len(meta) == 4 and type(meta[1]) is list
            and type(meta[2]) is int and type(meta[3]) is int):
        raise ProtocolError(f"bad array description {str(meta)[:80]}")
    dtype_name, shape, index, offset = meta
    dtype = _BY_NAME.get(dtype_name) if type(dtype_name) is str else None
    if dtype is None:
        raise ProtocolError(f"dtype {str(dtype_name)[:32]!r} is not allowed")
    if len(shape) > MAX_NDIM:
        raise ProtocolError(f"bad shape {str(shape)[:80]}")
    count = 1
    for d in shape:
        if type(d) is not int or not 0 <= d <= max_bytes:
            raise ProtocolError(f"bad shape {str(shape)[:80]}")
        count *= d
    nbytes = count * dtype.itemsize
    if nbytes > max_bytes:
        raise ProtocolError(f"array of {nbytes} bytes exceeds the limit of {max_bytes}")
    if not 0 <= index < len(bufs):
        raise ProtocolError(f"array frame {index} does not exist ({len(bufs)} frames)")
    buf = bufs[index]
    if offset < 0 or offset + nbytes > buf.nbytes:
        raise ProtocolError(f"array declared {shape} {dtype_name} ({nbytes} bytes at {offset}) "
                            f"does not fit its frame of {buf.nbytes} bytes")
    if nbytes == 0:
        return np.zeros(shape, dtype=dtype)
    arr = np.frombuffer(buf, dtype=dtype, count=count, offset=offset)
    return arr if len(shape) == 1 else arr.reshape(shape)


def check_key(key: Any) -> int | str:
    """A key is an int or a short str (JSON keeps the type); raise ProtocolError otherwise."""
    if isinstance(key, bool) or not isinstance(key, (int, str)):
        raise ProtocolError(f"key {str(key)[:40]!r} is neither an int nor a str")
    if isinstance(key, str) and len(key) > 256:
        raise ProtocolError(f"key {key[:40]!r}... is longer than 256 characters")
    return key
