"""Joining a server's same-host link: the handshake and who may join (see psnode.samehost.link).

The server listens on the abstract Unix address ``psnode.<job>.<host>.<port>``; a worker
connects, sends HELLO with its segments, and gets WELCOME with the server's, or REFUSED with the
reason (the datagrams: :mod:`psnode.protocol.samehost`).  The server admits only a process of
its own user (``SO_PEERCRED``), of its job, naming a worker rank of the job that has no live
link already and, when the job has a secret (:mod:`psnode.net.security`), proving it holds the
job's token (an HMAC of the job id and the rank: :func:`hello_label`).  The worker, before it
sends anything, checks that the listening socket belongs to its own user: an abstract Unix
address has no permissions, so another user could have bound it first, and must never receive
the worker's segments.
"""
from __future__ import annotations

import contextlib
import os
import socket
import struct
import time
from collections.abc import Callable

from psnode.errors import ProtocolError
from psnode.net.security import Security
from psnode.protocol.samehost import (
    ACCEPTED,
    HELLO,
    MAX_DATAGRAM,
    MAX_FDS,
    REFUSED,
    Accepted,
    Hello,
    Refused,
)
from psnode.samehost.link import Link
from psnode.samehost.segments import Arena


def server_address(job: str, host: str, port: int) -> str:
    """The abstract Unix address of the server of ``job`` listening for TCP on ``host:port``."""
    return f"\0psnode.{job}.{host}.{port}"


def hello_label(job: str, rank: int) -> bytes:
    """What a worker's HELLO proves with the job's token (psnode.net.security.Security.proof)."""
    return f"psnode same-host hello {job} worker {rank}".encode()


def _peer_uid(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a connected Unix socket."""
    pid, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return int(pid), int(uid)


def _recv_one(sock: socket.socket, timeout: float) -> tuple[bytes, list[int]]:
    """One datagram within ``timeout`` seconds (blocking use: handshakes only)."""
    sock.settimeout(timeout)
    try:
        data, fds, flags, _ = socket.recv_fds(sock, MAX_DATAGRAM, MAX_FDS)
    finally:
        sock.setblocking(False)
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        for fd in fds:
            os.close(fd)
        raise ProtocolError("handshake datagram too big")
    return data, list(fds)


# ------------------------------------------------------------------ worker side
CONNECT_S = 2.0   # the longest a connect to a server's same-host address may take


class Opening:
    """A worker's handshake under way (:func:`begin`): HELLO sent on ``sock``, the server's
    answer not read yet; :func:`finish` reads it once ``sock`` is readable.  ``deadline``: when
    the worker stops waiting (monotonic seconds)."""

    def __init__(self, sock: socket.socket, link: Link, server: int, deadline: float) -> None:
        self.sock, self.link, self.server, self.deadline = sock, link, server, deadline

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        """Give the handshake up (the link's segments are the worker's own: kept)."""
        self.link.close()


def begin(job: str, rank: int, server: int, host: str, port: int, out: Arena, landing: Arena,
          max_bytes: int, security: Security, timeout: float = 2.0) -> Opening | None:
    """Start worker ``rank``'s handshake with server ``server``'s same-host link: connect, check
    who listens, send HELLO; None if there is none (another host, the server runs without it).
    Never waits for the server's loop (a server still restoring answers later; ``timeout``:
    how long its answer may take)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(min(timeout, CONNECT_S))   # (the listener's backlog takes it: no wait)
        sock.connect(server_address(job, host, port))
    except OSError:
        sock.close()
        return None
    pid, uid = _peer_uid(sock)
    if uid != os.geteuid():
        sock.close()
        raise ProtocolError(f"the same-host address of server {server} is held by process {pid} of "
                            f"uid {uid}, not by this job's user: not connecting")
    link = Link(sock, f"server {server}", job, [out, landing], max_bytes, peer_writes=[landing])
    try:
        segs, fds = link.unannounced()
        token = security.proof(hello_label(job, rank)).hex() if security.secured else None
        socket.send_fds(sock, [Hello(job, rank, os.getpid(), token, segs).encode()], fds)
    except (OSError, ProtocolError):
        link.close()
        raise
    return Opening(sock, link, server, time.monotonic() + timeout)


def finish(opening: Opening, timeout: float = 0.0) -> Link:
    """The link of a handshake :func:`begin` started, once the server answered (waiting up to
    ``timeout`` s for it); ProtocolError with the server's reason, OSError (timeout: no answer)."""
    link = opening.link
    try:
        data, fds = _recv_one(opening.sock, max(0.001, timeout))
        if data[:1] != ACCEPTED:
            for fd in fds:
                os.close(fd)
            if data[:1] == REFUSED:
                raise ProtocolError(f"server {opening.server} refused the same-host link: "
                                    f"{Refused.decode(data[1:]).reason}")
            raise ProtocolError(f"server {opening.server} answered the same-host handshake with {data[:1]!r}")
        try:
            accepted = Accepted.decode(data[1:], len(fds))
        except ProtocolError:
            for fd in fds:
                os.close(fd)
            raise
        link.add_segments(accepted.segs, fds, writable_ok=False)
    except (OSError, ProtocolError):
        link.close()
        raise
    return link


def connect(job: str, rank: int, server: int, host: str, port: int, out: Arena, landing: Arena,
            max_bytes: int, security: Security, timeout: float = 2.0) -> Link | None:
    """Connect worker ``rank`` to server ``server``'s same-host link, waiting for its answer
    (:func:`begin`, then :func:`finish`); None if there is none (another host, the server runs
    without it) or it refused (the reason is raised only when the server answered:
    ProtocolError)."""
    opening = begin(job, rank, server, host, port, out, landing, max_bytes, security, timeout)
    if opening is None:
        return None
    return finish(opening, max(0.01, opening.deadline - time.monotonic()))


# ------------------------------------------------------------------ server side
def listen(job: str, host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
    try:
        sock.bind(server_address(job, host, port))
        sock.listen(64)
    except OSError:
        sock.close()
        raise
    return sock


def check_hello(sock: socket.socket, hello: Hello, job: str, num_workers: int, security: Security) -> int:
    """Authenticate a worker's HELLO; returns its rank.  Raises ProtocolError with the reason."""
    pid, uid = _peer_uid(sock)
    if uid != os.geteuid():
        raise ProtocolError(f"process {pid} of uid {uid} is not of this job's user")
    if hello.job != job:
        raise ProtocolError(f"process {pid} is not of job {job}")
    rank = hello.rank
    if not 0 <= rank < num_workers:
        raise ProtocolError(f"process {pid} claims worker rank {rank} of a job of {num_workers}")
    if security.secured:
        try:
            proof = bytes.fromhex(hello.token) if hello.token is not None else b""
        except ValueError:
            proof = b""
        if not security.verify(hello_label(job, rank), proof):
            raise ProtocolError(f"process {pid} does not hold the secret of job {job}")
    return rank


def welcome(sock: socket.socket, job: str, num_workers: int, arena: Arena, max_bytes: int,
            security: Security, busy: Callable[[int], bool] = lambda rank: False) -> tuple[int, Link] | None:
    """Complete the handshake of an accepted (non-blocking) connection once its HELLO arrived:
    (worker rank, link), or None while it has not.  Raises ProtocolError (after telling the
    peer why) when it must be refused."""
    try:
        data, fds, flags, _ = socket.recv_fds(sock, MAX_DATAGRAM, MAX_FDS)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError as exc:
        raise ProtocolError(f"handshake failed: {exc}") from None
    fds = list(fds)
    try:
        if not data:
            raise ProtocolError("closed before its handshake")
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            raise ProtocolError("handshake datagram too big")
        if data[:1] != HELLO:
            raise ProtocolError(f"handshake of type {data[:1]!r}")
        hello = Hello.decode(data[1:], len(fds))
        rank = check_hello(sock, hello, job, num_workers, security)
        if busy(rank):
            raise ProtocolError(f"worker {rank} already has a same-host link (this is pid {hello.pid})")
        link = Link(sock, f"worker {rank} (pid {hello.pid})", job, [arena], max_bytes)
        link.pid = _peer_uid(sock)[0]
        fds, taken = [], fds
        link.add_segments(hello.segs, taken, writable_ok=True)   # (closes them either way)
    except ProtocolError as exc:
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):
            sock.send(Refused(str(exc)).encode())
        raise
    segs_out, fds_out = link.unannounced()
    socket.send_fds(sock, [Accepted(segs_out).encode()], fds_out)
    return rank, link


__all__ = ["Opening", "begin", "check_hello", "connect", "finish", "listen", "server_address", "welcome"]
