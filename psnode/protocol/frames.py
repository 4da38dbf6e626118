"""The message envelope (see :mod:`psnode.protocol` for the wire spec): version tag, JSON
header for control messages, and raw array frames shared by both codecs."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import numpy as np

from psnode.errors import ProtocolError

VERSION = b"PSN1"        # control messages: JSON header
DATA_VERSION = b"PSD1"   # data messages: binary header (psnode.protocol.codec)
MAX_HEADER_BYTES = 16 * 2**20
MAX_NDIM = 32
PACK_BYTES = 65536  # arrays below this share one frame

#: dtypes allowed on the wire (no object, no structured dtypes); a dtype's code in binary
#: headers is its index in this tuple.
DTYPE_NAMES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
               "float16", "float32", "float64")
DTYPES = frozenset(DTYPE_NAMES)

NAMES = {np.dtype(n): n for n in DTYPES}   # dtype -> wire name (dtype.name is slow)
BY_NAME = {n: np.dtype(n) for n in DTYPES}
CODES = {np.dtype(n): i for i, n in enumerate(DTYPE_NAMES)}
BY_CODE = tuple(np.dtype(n) for n in DTYPE_NAMES)
_PAD = bytes(16)
# headers are plain trees of dicts, lists, strings and numbers: no cycle check needed (faster)
JSON_ENC = json.JSONEncoder(separators=(",", ":"), check_circular=False)
_JSON_DEC = json.JSONDecoder()


class Command(str, Enum):
    """What a message is; a control command's body: psnode.protocol.control (BODIES)."""

    # membership (node <-> scheduler)
    REGISTER = "register"          # node -> scheduler: a node joins
    WELCOME = "welcome"            # scheduler -> node: its rank and the address book
    HEARTBEAT = "heartbeat"        # node -> scheduler, with counters
    HEARTBEAT_ACK = "heartbeat_ack"
    HEARTBEATS = "heartbeats"      # a host's relay -> scheduler: the heartbeats of its nodes, batched
    HEARTBEATS_ACK = "heartbeats_ack"
    BARRIER = "barrier"            # worker -> scheduler (or to its host's relay)
    BARRIERS = "barriers"          # a host's relay -> scheduler: the barrier entries of its workers, together
    BARRIER_DONE = "barrier_done"
    FINISH = "finish"              # worker -> scheduler: this worker is done
    FINISH_ACK = "finish_ack"
    MEMBERSHIP = "membership"      # scheduler -> servers and workers: the active workers
    PEER_LOST = "peer_lost"        # scheduler -> all: a node died; the job ends
    SHUTDOWN = "shutdown"          # scheduler -> all: end now
    BYE = "bye"                    # node -> scheduler: leaving
    SERVERS = "servers"            # scheduler -> workers: a server is down or was replaced
    REJOIN = "rejoin"              # restarted scheduler -> node it does not know: register again
    STANDBY = "standby"            # standby -> scheduler: here I stand by; scheduler -> node: go there
    STANDBY_ACK = "standby_ack"    # scheduler -> standby: the nodes are told
    # control (mxdist status / stop -> scheduler)
    STATUS = "status"
    STATUS_REPLY = "status_reply"
    STOP = "stop"
    STOP_ACK = "stop_ack"
    LEAVE = "leave"                # -> scheduler: these workers leave at their next push
    LEAVE_ACK = "leave_ack"
    LOST = "lost"                  # -> scheduler: this worker's process died for good
    LOST_ACK = "lost_ack"
    # data (worker <-> server): binary headers, typed operations (psnode.protocol.ops)
    DATA = "data"
    DATA_REPLY = "data_reply"
    # replicas (server <-> another server's replica keeper: psnode.server.replicas)
    REPLICA_PUT = "replica_put"        # primary -> keeper: its whole state (arrays)
    REPLICA_ACK = "replica_ack"        # keeper -> primary: that state is held
    REPLICA_GET = "replica_get"        # replacement -> keeper: the state it holds of a rank
    REPLICA_STATE = "replica_state"    # keeper -> replacement: that state (arrays), or none


@dataclass
class Message:
    """A decoded message.  ``arrays`` are read-only views of the received frames; a data
    message (DATA, DATA_REPLY) carries its typed operations in ``ops`` instead."""

    cmd: Command
    job: str
    sender: str
    body: dict[str, Any] = field(default_factory=dict)
    arrays: list[np.ndarray] = field(default_factory=list)
    ops: list[Any] | None = None


def wire_name(arr: np.ndarray) -> str:
    name = NAMES.get(arr.dtype)
    if name is None:
        raise ProtocolError(f"dtype {arr.dtype} cannot be sent (allowed: {sorted(DTYPES)})")
    return name


def contiguous(arr: Any) -> np.ndarray:
    if type(arr) is not np.ndarray:
        arr = np.asarray(arr)
    if not arr.flags.c_contiguous:
        arr = arr.copy(order="C")  # (np.ascontiguousarray would make 0-d arrays 1-d)
    return arr


def pack(arrays: list[np.ndarray]) -> tuple[list[tuple[int, int]], list[Any]]:
    """Place C-contiguous ``arrays`` in frames: ``[(frame, offset)]`` per array and the frames.

    Arrays of at least PACK_BYTES travel as their own frame, without a copy.  Smaller ones are
    copied into one shared frame at 16-byte aligned offsets: one frame instead of hundreds when
    many small keys travel in one message.
    """
    where: list[tuple[int, int]] = []
    bufs: list[Any] = []
    small: list[Any] = []
    packed: list[int] = []     # indices in ``where`` that live in the shared frame
    size = 0
    for arr in arrays:
        nbytes = arr.nbytes
        if nbytes >= PACK_BYTES:
            where.append((len(bufs), 0))
            bufs.append(arr.reshape(-1).view(np.uint8))
            continue
        packed.append(len(where))
        where.append((0, size))
        if nbytes:
            small.append(arr.data if arr.ndim else arr.reshape(1).data)
        pad = -nbytes % 16
        if pad:
            small.append(_PAD[:pad])
        size += nbytes + pad
    if packed:
        frame = len(bufs)
        for i in packed:
            where[i] = (frame, where[i][1])
        bufs.append(b"".join(small))  # one copy of every small array
    return where, bufs


def encode_json(msg: Message) -> list[Any]:
    """Frames of a control message (JSON header)."""
    arrays = [contiguous(a) for a in msg.arrays]
    names = [wire_name(a) for a in arrays]
    where, bufs = pack(arrays)
    metas = [[n, list(a.shape), f, o] for n, a, (f, o) in zip(names, arrays, where, strict=True)]
    header = {"c": msg.cmd.value, "j": msg.job, "s": msg.sender, "b": msg.body, "a": metas}
    return [VERSION, JSON_ENC.encode(header).encode(), *bufs]


def buffer(frame: Any) -> memoryview:
    buf = getattr(frame, "buffer", None)
    return memoryview(frame) if buf is None else buf


def as_bytes(frame: Any) -> bytes:
    return frame if type(frame) is bytes else bytes(buffer(frame))


COMMANDS = {c.value: c for c in Command}


def parse_json(raw: bytes) -> Any:
    """json.loads(raw): the UTF-8 text directly when it is plain UTF-8 (json.loads of bytes
    guesses the encoding first, in Python); anything else goes the way of json.loads."""
    if raw[:1] in (b"{", b"["):
        try:
            return _JSON_DEC.decode(raw.decode())
        except ValueError:  # (UnicodeDecodeError too) e.g. UTF-16 text: json.loads decides
            pass
    return json.loads(raw)


def decode_json(frames: list[Any], job_id: str | None, max_bytes: int) -> Message:
    """Validate and decode a control message (version tag already checked)."""
    raw = as_bytes(frames[1])
    if len(raw) > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {len(raw)} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        header = parse_json(raw)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"header is not JSON: {str(exc)[:80]}") from None
    if not isinstance(header, dict):
        raise ProtocolError("header is not a JSON object")
    c = header.get("c")
    cmd = COMMANDS.get(c) if type(c) is str else None
    if cmd is None:
        raise ProtocolError(f"unknown command {str(header.get('c'))[:32]!r}")
    job, sender, body, metas = header.get("j"), header.get("s"), header.get("b"), header.get("a")
    if not isinstance(job, str) or not isinstance(sender, str) or not isinstance(body, dict):
        raise ProtocolError("header lacks a string job id, a string sender or an object body")
    if job_id is not None and job != job_id:
        raise ProtocolError(f"frame of job {job[:64]!r} (this is job {job_id!r})")
    if not isinstance(metas, list):
        raise ProtocolError("header has no array list")
    bufs = [buffer(f) for f in frames[2:]]
    arrays = []
    for meta in metas:
        if not (type(meta) is list and len(meta) == 4 and type(meta[1]) is list
                and type(meta[2]) is int and type(meta[3]) is int):
            raise ProtocolError(f"bad array description {str(meta)[:80]}")
        dtype = BY_NAME.get(meta[0]) if type(meta[0]) is str else None
        if dtype is None:
            raise ProtocolError(f"dtype {str(meta[0])[:32]!r} is not allowed")
        arrays.append(view(dtype, meta[1], meta[2], meta[3], bufs, max_bytes))
    used = {meta[2] for meta in metas}
    if len(used) != len(bufs):
        raise ProtocolError(f"{len(bufs)} array frames but {len(used)} referenced")
    return Message(cmd=cmd, job=job, sender=sender, body=body, arrays=arrays)


def view(dtype: np.dtype, shape: Any, index: int, offset: int, bufs: list[memoryview],
         max_bytes: int) -> np.ndarray:
    """The array ``shape`` of ``dtype`` at ``offset`` of frame ``index``, checked: a sane shape,
    within ``max_bytes``, and inside its frame."""
    if type(shape) not in (list, tuple) or len(shape) > MAX_NDIM:
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
        raise ProtocolError(f"array declared {list(shape)} {dtype.name} ({nbytes} bytes at {offset}) "
                            f"does not fit its frame of {buf.nbytes} bytes")
    if nbytes == 0:
        return np.zeros(shape, dtype=dtype)
    arr = np.frombuffer(buf, dtype=dtype, count=count, offset=offset)
    return arr if len(shape) == 1 else arr.reshape(shape)


def check_key(key: Any) -> int | str:
    """A key is an int (64-bit) or a short str (JSON keeps the type); raise ProtocolError otherwise."""
    if isinstance(key, bool) or not isinstance(key, (int, str)):
        raise ProtocolError(f"key {str(key)[:40]!r} is neither an int nor a str")
    if isinstance(key, str) and len(key) > 256:
        raise ProtocolError(f"key {key[:40]!r}... is longer than 256 characters")
    if isinstance(key, int) and not -2**63 <= key < 2**63:
        raise ProtocolError(f"key {key} does not fit in 64 bits")
    return key
