"""Same-host link framing: what the datagrams of :mod:`psnode.samehost.link` are.

One Unix SOCK_SEQPACKET datagram (at most :data:`MAX_DATAGRAM` bytes, at most :data:`MAX_FDS`
file descriptors) is one type byte, then:

* ``H`` :class:`Hello`, worker -> server: JSON ``{job, rank, pid, token, segs}`` and the
  worker's segments as file descriptors;
* ``W`` :class:`Accepted`, server -> worker: JSON ``{segs}`` and the server's segments;
  ``X`` :class:`Refused`: JSON ``{reason}``, then the server closes the connection;
* ``S`` :class:`Announce`, either way: JSON ``{segs}``, new segments, announced before any
  message refers to them;
* ``D`` DATA: u32 header length (little-endian), the data header (:mod:`psnode.protocol`'s
  binary header), then the inline payload (:func:`data_datagram`, :func:`data_header`).
  Array locations: 0 inline (frame 0: the payload), :data:`LOC_SENDER` a segment of the
  sender, :data:`LOC_RECEIVER` a segment of the receiver.

``segs`` lists one ``[index, size, writable]`` (:class:`Segment`) per descriptor of the
datagram, in order (writable: the receiver may write it: a worker's landing areas).  Parsing
checks every field and raises :class:`ProtocolError` naming it; what a field means (is this
rank a worker of the job? is the token right?) is the handshake's to check
(:mod:`psnode.samehost.handshake`).
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

from psnode.errors import ProtocolError

MAX_DATAGRAM = 64 * 1024
MAX_FDS = 64
HELLO, ACCEPTED, REFUSED, ANNOUNCE, DATA = b"H", b"W", b"X", b"S", b"D"
LOC_SENDER, LOC_RECEIVER = 1, 2      # (0: inline, psnode.protocol.codec.LOC_FRAME)
DATA_LEN = struct.Struct("<I")       # after the type byte of a DATA datagram: its header's length
DATA_START = 1 + DATA_LEN.size       # where a DATA datagram's header starts


def _json(data: bytes, what: str) -> dict[str, Any]:
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ProtocolError(f"{what} is not JSON") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"{what} is not a JSON object")
    return obj


def _datagram(kind: bytes, obj: dict[str, Any]) -> bytes:
    return kind + json.dumps(obj).encode()


@dataclass(frozen=True)
class Segment:
    """A shared-memory segment as announced: its ``index`` among its owner's segments, its
    ``size`` in bytes, and whether the receiver may write it."""

    index: int
    size: int
    writable: bool

    def to_body(self) -> list[Any]:
        return [self.index, self.size, self.writable]


def segments_of(raw: Any, n_fds: int, what: str) -> tuple[Segment, ...]:
    """The ``segs`` of a handshake or announcement that came with ``n_fds`` descriptors."""
    if not isinstance(raw, list) or len(raw) != n_fds:
        raise ProtocolError(f"{n_fds} segment descriptor(s) but {str(raw)[:60]} announced")
    out = []
    for s in raw:
        if not (isinstance(s, list) and len(s) == 3 and all(type(x) is int for x in s[:2])
                and type(s[2]) is bool and s[0] >= 0):
            raise ProtocolError(f"{what}: bad segment announcement {str(s)[:60]}")
        out.append(Segment(s[0], s[1], s[2]))
    return tuple(out)


def _segs(segs: tuple[Segment, ...]) -> list[list[Any]]:
    return [s.to_body() for s in segs]


@dataclass(frozen=True)
class Hello:
    """A worker asks to join: ``job``, its ``rank`` and ``pid``, its ``token`` (the hex proof of
    the job's secret, psnode.samehost.handshake.hello_label; None in a job without one) and its
    segments."""

    job: str
    rank: int
    pid: int
    token: str | None
    segs: tuple[Segment, ...]

    def encode(self) -> bytes:
        return _datagram(HELLO, {"job": self.job, "rank": self.rank, "pid": self.pid, "token": self.token,
                                 "segs": _segs(self.segs)})

    @classmethod
    def decode(cls, data: bytes, n_fds: int) -> Hello:
        """The HELLO ``data`` (after its type byte) that came with ``n_fds`` descriptors."""
        obj = _json(data, "hello")
        job, rank, pid, token = obj.get("job"), obj.get("rank"), obj.get("pid"), obj.get("token")
        if type(job) is not str:
            raise ProtocolError(f"hello: job must be a string, not {str(job)[:40]!r}")
        if type(rank) is not int:
            raise ProtocolError(f"hello: rank must be an integer, not {str(rank)[:20]!r}")
        if type(pid) is not int:
            raise ProtocolError(f"hello: pid must be an integer, not {str(pid)[:20]!r}")
        if token is not None and type(token) is not str:
            raise ProtocolError("hello: token must be a string")
        return cls(job, rank, pid, token, segments_of(obj.get("segs"), n_fds, "hello"))


@dataclass(frozen=True)
class Accepted:
    """The server admitted the worker: its segments."""

    segs: tuple[Segment, ...]

    def encode(self) -> bytes:
        return _datagram(ACCEPTED, {"segs": _segs(self.segs)})

    @classmethod
    def decode(cls, data: bytes, n_fds: int) -> Accepted:
        return cls(segments_of(_json(data, "welcome").get("segs"), n_fds, "welcome"))


@dataclass(frozen=True)
class Refused:
    """The server refused the worker, for ``reason``."""

    reason: str

    def encode(self) -> bytes:
        return _datagram(REFUSED, {"reason": self.reason})

    @classmethod
    def decode(cls, data: bytes) -> Refused:
        return cls(str(_json(data, "refusal").get("reason"))[:300])


@dataclass(frozen=True)
class Announce:
    """New segments of the sender."""

    segs: tuple[Segment, ...]

    def encode(self) -> bytes:
        return _datagram(ANNOUNCE, {"segs": _segs(self.segs)})

    @classmethod
    def decode(cls, data: bytes, n_fds: int) -> Announce:
        return cls(segments_of(_json(data, "segment announcement").get("segs"), n_fds, "segment announcement"))


def data_datagram(head: bytes, *payload: bytes) -> bytes:
    """A DATA datagram of the data header ``head`` and its inline payload."""
    return b"".join((DATA, DATA_LEN.pack(len(head)), head, *payload))


def data_header(data: bytes) -> int:
    """The header length of the DATA datagram ``data``; the header is
    ``data[DATA_START:DATA_START + length]``, the inline payload the rest."""
    if len(data) < DATA_START:
        raise ProtocolError("truncated data datagram")
    (hlen,) = DATA_LEN.unpack_from(data, 1)
    if DATA_START + hlen > len(data):
        raise ProtocolError("truncated data header")
    return int(hlen)


__all__ = ["ACCEPTED", "ANNOUNCE", "DATA", "DATA_LEN", "DATA_START", "HELLO", "LOC_RECEIVER", "LOC_SENDER",
           "MAX_DATAGRAM", "MAX_FDS", "REFUSED", "Accepted", "Announce", "Hello", "Refused", "Segment",
           "data_datagram", "data_header", "segments_of"]
