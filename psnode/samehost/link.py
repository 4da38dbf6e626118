"""The same-host data link: a Unix SOCK_SEQPACKET connection plus shared-memory segments.

A server listens on the abstract Unix address ``psnode.<job>.<host>.<port>`` (no file: it
vanishes with the process); a worker whose host is the server's connects, and both exchange
data messages (:mod:`psnode.protocol`'s binary header) as datagrams whose arrays lie in shared
memory (:mod:`psnode.samehost.segments`) or, when small, inline.  ZeroMQ stays for control, for the
scheduler, for operations with big answers (init, optimizer states) and between hosts.

The datagrams (HELLO, WELCOME, REFUSED, SEGMENTS, DATA) are defined in
:mod:`psnode.protocol.samehost`.  The worker's segments it announces as writable are its
landing areas for answers; the server's segments are read-only for workers.

The server admits a connection only from a process of its own user (``SO_PEERCRED``), of its
job, naming a worker rank of the job and, when the job has a secret (:mod:`psnode.net.security`),
proving it holds the job's token (:func:`psnode.samehost.handshake.check_hello`).  Who writes
which memory, so no locks are needed:

* a worker's **push slot** (its segment, read-only for the server) is written by the worker
  only before the push is sent and not again until a pull after that push returned (the server
  is done with it: the round completed);
* a worker's **landing area** (its segment, writable by the server) is named in one pull and
  written by the server only before it answers that pull; the worker reads it after the answer;
* a server's **value** (its segment, read-only for workers) is read in place by a worker
  after a sync pull's answer and before that worker's next push of the key: the value changes
  only when a round completes, which needs that next push (a worker holds back a push of a key
  while a pull of it is unanswered: psnode.worker.tracker).

Where an array lies is decided once, by the side that put it there: a worker's requests
(``KIND_DATA``) carry each array's place (``op.at``, written by the worker's data path when it
placed the array in a push slot or landing area: psnode.samehost.staging), sent as it is; an
array without a place travels inline when small, else over TCP.  A server's answers
(``KIND_REPLY``) are located here (its values in its arena, or the worker's landing area).

Sends never block: a datagram the socket cannot take waits in a backlog, flushed when the
socket is writable.  A peer that closes (exit, ``kill -9``) is noticed as end of file.
"""
from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from psnode.errors import ProtocolError
from psnode.protocol import DATA_VERSION, Message
from psnode.protocol.codec import (
    HEAD,
    KIND_DATA,
    KIND_REPLY,
    LOC_FRAME,
    decode_data,
    decode_single,
    encode_arrays,
    encode_placed,
    encode_record,
    encode_single,
)
from psnode.protocol.frames import contiguous
from psnode.protocol.samehost import (
    ANNOUNCE,
    DATA,
    DATA_START,
    LOC_RECEIVER,
    LOC_SENDER,
    MAX_DATAGRAM,
    MAX_FDS,
    Announce,
    Segment,
    data_datagram,
    data_header,
)
from psnode.samehost.segments import Arena, Mapped, address, map_segment

INLINE_BYTES = 4096           # arrays below this (and not in shared memory) travel inline
_ANCILLARY = socket.CMSG_SPACE(MAX_FDS * 4)
_CUT = int(socket.MSG_TRUNC | socket.MSG_CTRUNC)   # (plain ints: IntFlag operations cost microseconds)


class Link:
    """One end of a same-host connection (see the module docstring)."""

    def __init__(self, sock: socket.socket, peer: str, job: str, arenas: Sequence[Arena],
                 max_bytes: int, peer_writes: Sequence[Arena] = ()) -> None:
        self.sock = sock
        self.peer = peer                    # for messages: "worker 1 (pid 123)"
        self.job = job
        self.arenas = list(arenas)          # this side's segments (all told to the peer)
        self.peer_writes = {id(a) for a in peer_writes}   # arenas the peer may write
        self.max_bytes = max_bytes
        self.mapped: dict[int, Mapped] = {}
        self._bases: list[tuple[int, int, int]] = []      # (address, size, index) of peer segments
        self.told: set[int] = set()
        self.backlog: deque[tuple[bytes, list[int]]] = deque()
        self.send_lock = threading.RLock()   # senders: any thread (readers: one, see psnode.worker.samehost)
        self.up = True
        self.pid = 0                         # the peer's process (SO_PEERCRED), when known
        self.bytes_in = 0
        self.bytes_out = 0
        self._buf = bytearray(MAX_DATAGRAM)
        self._job_raw = job.encode()

    def fileno(self) -> int:
        return self.sock.fileno()

    # ------------------------------------------------------------ segments
    def unannounced(self) -> tuple[tuple[Segment, ...], list[int]]:
        """This side's segments not yet told to the peer, and their descriptors (now told)."""
        segs, fds = [], []
        for arena in self.arenas:
            for index, fd in list(arena.fds.items()):
                if index not in self.told:
                    self.told.add(index)
                    segs.append(Segment(index, arena.segments[index].size, id(arena) in self.peer_writes))
                    fds.append(fd)
        return tuple(segs), fds

    def add_segments(self, segs: Sequence[Segment], fds: list[int], writable_ok: bool) -> None:
        """Map the peer's announced segments.  Every fd is closed exactly once, either way: a
        second close would close whatever another thread (libzmq's I/O thread) opened under
        the freed number meanwhile."""
        rest = list(fds)
        try:
            if len(segs) != len(rest):
                raise ProtocolError(f"{self.peer} announced {len(segs)} segments with {len(rest)} descriptors")
            for s in segs:
                fd = rest.pop(0)     # map_segment closes it, whatever it finds
                if s.index in self.mapped:
                    os.close(fd)
                    raise ProtocolError(f"{self.peer} announced segment {s.index} twice")
                seg = map_segment(fd, s.index, s.size, s.writable and writable_ok, self.peer)
                self.mapped[s.index] = seg
                self._bases.append((address(seg.view), s.size, s.index))
        finally:
            for fd in rest:
                os.close(fd)

    # ------------------------------------------------------------ sending
    def send_raw(self, data: bytes, fds: Sequence[int] = ()) -> None:
        """Send one datagram, or queue it behind earlier ones (never blocks)."""
        if not self.up:
            return
        with self.send_lock:
            self.bytes_out += len(data)
            if self.backlog or not self._try(data, fds):
                self.backlog.append((data, list(fds)))

    def _try(self, data: bytes, fds: Sequence[int]) -> bool:
        try:
            if fds:
                socket.send_fds(self.sock, [data], list(fds))
            else:
                self.sock.send(data)
            return True
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            self.up = False
            return True

    def flush(self) -> bool:
        """Send what waits in the backlog; True once it is empty."""
        with self.send_lock:
            while self.backlog and self.up:
                data, fds = self.backlog[0]
                if not self._try(data, fds):
                    return False
                self.backlog.popleft()
            return not self.backlog

    def send_ops(self, kind: int, ops: Sequence[Any]) -> list[Any]:
        """Send ``ops`` in datagrams; returns those that cannot go this way (an array neither in
        shared memory nor small enough to travel inline), for the caller to send over TCP.
        ``KIND_DATA``: a worker's requests, their arrays' places on them (``op.at``);
        ``KIND_REPLY``: a server's answers, located here."""
        with self.send_lock:
            segs, fds = self.unannounced()
            if segs:
                self.send_raw(Announce(segs).encode(), fds)
            if len(ops) == 1 and self._send_single(kind, ops[0]):
                return []
            return self._send_ops(kind, ops)

    def _send_ops(self, kind: int, ops: Sequence[Any]) -> list[Any]:
        rest: list[Any] = []
        d = _Datagram(kind, self.job)
        for op in ops:
            record, arrays = encode_record(op, len(d.arrays))
            where = self._where(kind, op, arrays)
            inline = 0
            for arr, loc in zip(arrays, where, strict=True):
                if loc is None:
                    if arr.nbytes > INLINE_BYTES:
                        break
                    inline += arr.nbytes + 16
            else:
                if len(record) + inline + 24 * len(arrays) > MAX_DATAGRAM - 1024:
                    rest.append(op)   # (e.g. a flush listing thousands of keys)
                    continue
                if d.ops and d.size + len(record) + inline + 24 * len(arrays) > MAX_DATAGRAM:
                    self.send_raw(d.finish())
                    d = _Datagram(kind, self.job)
                    record, arrays = encode_record(op, 0)
                d.add(record, arrays, where)
                # counters: the data the peer reads, wherever it lies (not a landing area)
                shared = arrays[:-1] if getattr(op, "dest", None) is not None else arrays
                self.bytes_out += sum(a.nbytes for a, loc in zip(shared, where, strict=False) if loc is not None)
                continue
            rest.append(op)
        if d.ops:
            self.send_raw(d.finish())
        return rest

    def _send_single(self, kind: int, op: Any) -> bool:
        """Send ``op`` alone when its arrays all lie in shared memory (the common round's
        message, without the general batching); False: it is not of that form."""
        if kind == KIND_DATA:   # (a request: its arrays' places are on it, op.at)
            got = encode_placed(kind, self._job_raw, op, LOC_SENDER, MAX_DATAGRAM - 1024)
            if got is None:
                return False
            head, arrays = got
        else:
            record, arrays = encode_record(op, 0)
            where = [w for w in (self.locate(arr) for arr in arrays) if w is not None]
            if len(where) < len(arrays) or len(record) + 64 * len(arrays) > MAX_DATAGRAM - 1024:
                return False
            head = encode_single(kind, self._job_raw, record, arrays, where)
        self.send_raw(data_datagram(head))
        # counters: the data the peer reads, wherever it lies (not a landing area)
        shared = arrays[:-1] if _has_dest(op) else arrays
        for a in shared:
            self.bytes_out += a.nbytes
        return True

    def _where(self, kind: int, op: Any, arrays: list[np.ndarray]) -> list[Any]:
        """The location of each of ``op``'s arrays (None: send its bytes): a request's from its
        places (``op.at``: the landing area last, so an op without it reads the first ones), an
        answer's found by :meth:`locate`."""
        if kind != KIND_DATA:
            return [self.locate(arr) for arr in arrays]
        at = getattr(op, "at", None) or ()
        where: list[Any] = []
        for i in range(len(arrays)):
            a = at[i] if i < len(at) else None
            where.append(None if a is None else (LOC_SENDER, a[0], a[1]))
        return where

    def locate(self, arr: np.ndarray) -> tuple[int, int, int] | None:
        """Where an answer's array lies: this side's segments, or the peer's (a landing area)."""
        for arena in self.arenas:
            where = arena.locate(arr)
            if where is not None:
                return (LOC_SENDER, *where)
        if self._bases and arr.flags.c_contiguous:
            addr = arr.__array_interface__["data"][0]
            for base, size, index in self._bases:
                if base <= addr and addr + arr.nbytes <= base + size:
                    return (LOC_RECEIVER, index, addr - base)
        return None

    # ------------------------------------------------------------ receiving
    def recv(self, limit: int = 0) -> list[Message]:
        """Every data message waiting, or the first ``limit`` (then the caller polls again
        rather than paying a failed read to learn that nothing more waits); segment
        announcements are applied on the way; an end of file marks the link down.  Raises
        ProtocolError (naming the peer) for a bad one."""
        out: list[Message] = []
        while self.up and (not limit or len(out) < limit):
            try:
                n, anc, flags, _ = self.sock.recvmsg_into([self._buf], _ANCILLARY)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.up = False
                break
            fds = _fds(anc) if anc else _NO_FDS
            if n == 0:
                self.up = False
                break
            self.bytes_in += n
            if flags & _CUT:
                for fd in fds:
                    os.close(fd)
                raise ProtocolError(f"{self.peer} sent a datagram too big for this link")
            data = bytes(self._buf[:n])
            kind = data[:1]
            if kind == ANNOUNCE:
                try:
                    segs = Announce.decode(data[1:], len(fds)).segs
                except ProtocolError:
                    for fd in fds:
                        os.close(fd)
                    raise
                self.add_segments(segs, fds, writable_ok=True)
                continue
            for fd in fds:
                os.close(fd)
            if kind != DATA:
                raise ProtocolError(f"{self.peer} sent a datagram of unknown type {kind!r}")
            msg = self.decode(data)
            for op in msg.ops or ():   # counters: data read in place counts as received
                self.bytes_in += _payload(op)
            out.append(msg)
        return out

    def decode(self, data: bytes) -> Message:
        try:
            hlen = data_header(data)
        except ProtocolError as exc:
            raise ProtocolError(f"{self.peer}: {exc}") from None
        if DATA_START + hlen == len(data):   # no inline payload: most likely the common small form
            try:
                msg = decode_single(data, DATA_START, self.job, self._job_raw, self.max_bytes, self._resolve)
            except ProtocolError as exc:
                raise ProtocolError(f"{self.peer}: {exc}") from None
            except (struct.error, IndexError):
                raise ProtocolError(f"{self.peer}: data header is truncated") from None
            if msg is not None:
                return msg
        head, payload = data[DATA_START:DATA_START + hlen], memoryview(data)[DATA_START + hlen:]
        frames: list[Any] = [DATA_VERSION, head]
        if len(payload):
            frames.append(payload)
        try:
            return decode_data(frames, self.job, self.max_bytes, self._resolve)
        except ProtocolError as exc:
            raise ProtocolError(f"{self.peer}: {exc}") from None

    def _resolve(self, loc: int, index: int, offset: int, nbytes: int) -> memoryview:
        if loc == LOC_SENDER:
            seg = self.mapped.get(index)
            if seg is None:
                raise ProtocolError(f"segment {index} was never announced")
            return seg.buffer(offset, nbytes)
        if loc == LOC_RECEIVER:
            for arena in self.arenas:
                own = arena.segments.get(index)
                if own is not None:
                    return own.buffer(offset, nbytes)
            raise ProtocolError(f"segment {index} of this process does not exist")
        raise ProtocolError(f"array location {loc} is not known")

    def close(self) -> None:
        self.up = False
        with contextlib.suppress(OSError):
            self.sock.close()


_JOBS: dict[str, bytes] = {}


class _Datagram:
    """A data datagram being built: records, array descriptors, inline payload."""

    def __init__(self, kind: int, job: str) -> None:
        self.kind = kind
        self.job = _JOBS.get(job) or _JOBS.setdefault(job, job.encode())
        self.ops = 0
        self.records: list[bytes] = []
        self.arrays: list[np.ndarray] = []
        self.where: list[tuple[int, int, int]] = []
        self.payload: list[bytes] = []
        self.offset = 0
        self.size = 64 + len(self.job)

    def add(self, record: bytes, arrays: list[np.ndarray], where: list[tuple[int, int, int] | None]) -> None:
        self.ops += 1
        self.records.append(record)
        self.size += len(record)
        for arr, loc in zip(arrays, where, strict=True):
            if loc is None:
                arr = contiguous(arr)
                pad = -self.offset % 16
                if pad:
                    self.payload.append(bytes(pad))
                    self.offset += pad
                loc = (LOC_FRAME, 0, self.offset)
                self.payload.append(arr.tobytes())
                self.offset += arr.nbytes
                self.size += arr.nbytes + pad
            self.arrays.append(arr)
            self.where.append(loc)
            self.size += 24 + 8 * arr.ndim

    def finish(self) -> bytes:
        head = b"".join((HEAD.pack(self.kind, 0, self.ops, len(self.arrays), len(self.job)), self.job,
                         encode_arrays(self.arrays, self.where), *self.records))
        return data_datagram(head, *self.payload)


_CARRIES: dict[type, tuple[str, ...]] = {}
_DEST_FIELD: dict[type, bool] = {}


def _has_dest(op: Any) -> bool:
    """``op`` carries a landing area (its last array)."""
    has = _DEST_FIELD.get(type(op))
    if has is None:
        has = _DEST_FIELD[type(op)] = "dest" in getattr(type(op), "__slots__", ()) or hasattr(op, "dest")
    return has and op.dest is not None
_NO_FDS: list[int] = []


def _payload(op: Any) -> int:
    """Bytes of data an operation carries (not a landing area)."""
    names = _CARRIES.get(type(op))
    if names is None:
        names = _CARRIES[type(op)] = tuple(n for n in ("data", "rows", "value", "arrays") if hasattr(op, n))
    n = 0
    for name in names:
        a = getattr(op, name)
        if a is None:
            continue
        if name == "arrays":
            n += sum(x.nbytes for x in a)
        else:
            n += a.nbytes
    return n


def _fds(anc: list[tuple[int, int, bytes]]) -> list[int]:
    fds: list[int] = []
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(data) - len(data) % 4
            fds.extend(struct.unpack(f"{usable // 4}i", data[:usable]))
    return fds


__all__ = ["INLINE_BYTES", "KIND_DATA", "KIND_REPLY", "Link"]
