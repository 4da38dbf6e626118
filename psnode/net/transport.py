"""Sockets: the only module that imports zmq.

A :class:`Channel` wraps one ZeroMQ socket and speaks :mod:`psnode.protocol`: ``send`` encodes
(arrays as zero-copy frames), ``recv`` decodes and *drops* anything malformed or foreign,
logging why; it never raises for bad input.  A channel, like its socket, belongs to the thread
that created it.

Security (:mod:`psnode.net.security` says what each mode protects): a :class:`Transport` holds the
job's :class:`Security`; each socket gets the mechanism of its mode and plane (NULL, PLAIN or
CURVE).  A ZAP handler admits only peers with the job's credential -- CURVE: the job's public
key; PLAIN: the password for this server's address derived from the job's token -- so a peer
without it is refused at connect time, before any of its messages reach the role's code.  In
the ``authenticated`` mode a data link's server shows its own proof in the handshake metadata
and the worker's channel drops every message from a peer without it (a process that took a
dead server's port).  Refused handshakes and dropped unproven messages are counted
(``Transport.refused``).  Sockets bind only to the configured address, never a wildcard.

Exit: zero-copy sends use pyzmq's garbage collector, which refuses to start once its atexit
callback ran.  It is imported with this module, so that callback is registered before any
store's ``close`` at exit (``psnode.kv``) and runs after it (atexit runs last-in first-out).
"""
from __future__ import annotations

import contextlib
import errno
import hmac
import logging
import os
import random
import secrets
import struct
import threading
from typing import Any

import zmq
import zmq.utils.garbage  # (its atexit callback first: the docstring, Exit)
from zmq.utils import z85

from psnode.errors import ConfigError, ProtocolError
from psnode.net.security import TOKEN_BYTES, Mechanism, Mode, Plane, Security, mechanism
from psnode.protocol import PACK_BYTES, Message, decode, encode

log = logging.getLogger("psnode.transport")

_HWM = 0  # unbounded queues: flow control is done by the roles
# plain ints: pyzmq's enum flags cost microseconds per operation on the hot path
_NOBLOCK, _SNDMORE, _RCVMORE = int(zmq.NOBLOCK), int(zmq.SNDMORE), int(zmq.RCVMORE)
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)


class Sent:
    """Trackers of one message's zero-copy frames: ``done`` once zmq released them all."""

    __slots__ = ("_trackers",)

    def __init__(self, trackers: list[Any]) -> None:
        self._trackers = trackers

    @property
    def done(self) -> bool:
        return all(t.done for t in self._trackers)


def new_security(mode: Mode) -> Security:
    """A fresh secret for one job: 32 random token bytes and a new CURVE key pair."""
    if mode is Mode.INSECURE:
        return Security.insecure()
    public, secret = zmq.curve_keypair()
    return Security(mode, secrets.token_bytes(TOKEN_BYTES), public, secret)


_DOMAIN = {Plane.CONTROL: b"psnode-control", Plane.DATA: b"psnode-data"}  # data: + b" host:port"
_AUTH = int(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
# which side of a refused handshake sees which event is a race (each hangs up once it knows),
# so a handshake cut short counts too; the transport's own closing does not (Transport.close)
_FAILED = {int(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL): "the handshake was cut short (the peer hung up)",
           int(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL): "the peer used another security mechanism or key than this job's",
           _AUTH: "the authenticator refused the peer's credential"}
_WATCHED = sum(_FAILED) | int(zmq.EVENT_MONITOR_STOPPED)
_LOGGED = 20  # refusals logged one by one; then one line in a thousand
_PROOF = "X-Psnode-Proof"


class _Guard(threading.Thread):
    """A transport's security thread: the ZAP handler (admits the job's peers, refuses the
    rest) and the watcher of every secured socket's handshakes (``refused`` counts those
    that failed: a wrong or missing credential or mechanism, or cut short by the peer)."""

    def __init__(self, ctx: zmq.Context, security: Security) -> None:
        super().__init__(name="psnode-zap", daemon=True)
        self._ctx = ctx
        self._security = security
        self._curve_key = z85.decode(security.curve_public)
        self.refused = 0
        self.ready = threading.Event()
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._lock = threading.Lock()
        self._pending: list[tuple[str, bool, threading.Event]] = []
        self._count = 0
        self._zap_refused = 0
        self.closing = False   # set by Transport.close: failures from then on are its own doing

    def watch(self, sock: zmq.Socket, server: bool) -> None:
        """Count ``sock``'s failed handshakes (called by the socket's own thread); ``server``:
        its peers are checked by the ZAP handler (which logged them already)."""
        with self._lock:
            self._count += 1
            endpoint = f"inproc://psnode-guard-{id(self)}-{self._count}"
        sock.monitor(endpoint, _WATCHED)
        attached = threading.Event()
        with self._lock:
            self._pending.append((endpoint, server, attached))
        os.eventfd_write(self._efd, 1)
        attached.wait(5)

    def run(self) -> None:
        zap = self._ctx.socket(zmq.REP)
        zap.linger = 0
        monitors: dict[zmq.Socket, bool] = {}   # monitor -> whether it watches a server socket
        try:
            zap.bind("inproc://zeromq.zap.01")
            self.ready.set()
            poller = zmq.Poller()
            poller.register(zap, zmq.POLLIN)
            poller.register(self._efd, zmq.POLLIN)
            while True:
                ready = dict(poller.poll())
                if self._efd in ready:
                    os.eventfd_read(self._efd)
                    with self._lock:
                        pending, self._pending = self._pending, []
                    for endpoint, server, attached in pending:
                        mon = self._ctx.socket(zmq.PAIR)
                        mon.linger = 0
                        mon.connect(endpoint)
                        poller.register(mon, zmq.POLLIN)
                        monitors[mon] = server
                        attached.set()
                if zap in ready:
                    self._answer(zap)
                for mon in [m for m in monitors if m in ready]:
                    if not self._event(mon, monitors[mon]):
                        poller.unregister(mon)
                        mon.close()
                        del monitors[mon]
        except zmq.ZMQError:  # ETERM: the transport is closing
            return
        finally:
            self.ready.set()
            for sock in (zap, *monitors):  # closed by the thread that owns them
                sock.close()
            os.close(self._efd)

    def _answer(self, zap: zmq.Socket) -> None:
        frames = zap.recv_multipart()
        if len(frames) < 6:   # (libzmq always sends 6 or more; answer anyway: REP must reply)
            frames += [b""] * (6 - len(frames))
        version, request_id, domain, address, _identity, mechanism = frames[:6]
        ok = self._admits(domain, mechanism, frames[6:])
        if not ok:
            self._zap_refused += 1
            if self._zap_refused <= _LOGGED or self._zap_refused % 1000 == 0:
                log.warning("refused a %s connection from %s: no credential of this job (%d so far)",
                            mechanism.decode(errors="replace"), address.decode(errors="replace"),
                            self._zap_refused)
        zap.send_multipart([version, request_id, b"200" if ok else b"400",
                            b"OK" if ok else b"not a peer of this job", b"", b""])

    def _admits(self, domain: bytes, mech: bytes, creds: list[bytes]) -> bool:
        """Whether a ZAP request carries this job's credential for the socket (its domain:
        the plane, and for a data router its address)."""
        plane, _, address = domain.partition(b" ")
        if plane == _DOMAIN[Plane.CONTROL] and not address:
            want = mechanism(self._security.mode, Plane.CONTROL)
        elif plane == _DOMAIN[Plane.DATA] and address:
            want = mechanism(self._security.mode, Plane.DATA)
        else:
            return False
        if mech != want.value.encode():
            return False
        if want is Mechanism.CURVE:
            return len(creds) == 1 and hmac.compare_digest(creds[0], self._curve_key)
        if want is Mechanism.PLAIN and len(creds) == 2:   # user name: the address the peer dialled
            return (creds[0] == address
                    and hmac.compare_digest(creds[1], self._security.client_password(address.decode())))
        return False

    def _event(self, mon: zmq.Socket, server: bool) -> bool:
        """Handle one monitor event; False once the socket's monitoring stopped."""
        frames = mon.recv_multipart()
        if len(frames[0]) < 6:
            return True
        event, _value = struct.unpack("=hi", frames[0][:6])
        if event == zmq.EVENT_MONITOR_STOPPED:
            return False
        reason = _FAILED.get(event)
        if reason is not None and not self.closing:
            self.refused += 1
            if (self.refused <= _LOGGED or self.refused % 1000 == 0) and not (server and event == _AUTH):
                where = frames[1].decode(errors="replace") if len(frames) > 1 else "?"
                log.warning("refused a connection at %s: %s (%d so far)", where, reason, self.refused)
        return True


class Transport:
    """A zmq context plus the job's identity and security, shared by a role.

    ``security`` (:class:`psnode.net.security.Security`) decides each socket's mechanism by its
    plane (:func:`psnode.net.security.mechanism`); ``refused`` counts connections refused at the
    handshake plus messages a data link dropped because the sender could not prove it is the
    job's server."""

    def __init__(self, job_id: str, sender: str, max_bytes: int, security: Security | None = None) -> None:
        self.job_id = job_id
        self.sender = sender
        self.max_bytes = max_bytes
        self.security = security or Security.insecure()
        self.ctx = zmq.Context()
        self.dropped = 0
        self.unproven = 0   # messages from a data peer without the job's server proof
        self._guard: _Guard | None = None
        self._socks: list[zmq.Socket] = []

    @property
    def refused(self) -> int:
        return self.unproven + (0 if self._guard is None else self._guard.refused)

    def _socket(self, kind: int) -> zmq.Socket:
        sock = self.ctx.socket(kind)
        self._socks.append(sock)
        sock.linger = 0
        sock.sndhwm = _HWM
        sock.rcvhwm = _HWM
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_bytes + 2**20)
        return sock

    def _guarded(self) -> _Guard:
        if self._guard is None:  # the authenticator, started before the first secured socket
            self._guard = _Guard(self.ctx, self.security)
            self._guard.start()
            self._guard.ready.wait(5)
        return self._guard

    def router(self, host: str, port: int, plane: Plane = Plane.DATA,
               elsewhere: bool = False, fd: int | None = None) -> tuple[Channel, int]:
        """A ROUTER bound to ``host:port`` (port 0: a free one in 20000-59999) serving ``plane``;
        returns it and the port.  ``elsewhere``: a ``port`` found taken is replaced by a free one
        (the caller tells its peers where it is).  ``fd``: a socket already listening on
        ``host:port`` (:func:`psnode.net.listen.listen_early`), which the ROUTER takes over."""
        mech = mechanism(self.security.mode, plane)
        tries = [port] if port else []
        if not port or elsewhere:
            tries += [p for p in random.sample(range(20000, 60000), 200) if p != port]
        for n, p in enumerate(tries, 1):
            address = f"{host}:{p}"
            sock = self._socket(zmq.ROUTER)
            sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
            if mech is not Mechanism.NULL:
                self._guarded()
                sock.zap_domain = _DOMAIN[plane] + (b" " + address.encode() if plane is Plane.DATA else b"")
            if mech is Mechanism.CURVE:
                sock.curve_server = True
                sock.curve_secretkey = self.security.curve_secret
            elif mech is Mechanism.PLAIN:
                sock.plain_server = True
                sock.setsockopt(zmq.METADATA, f"{_PROOF}:".encode() + self.security.server_proof(address))
            if fd is not None:
                sock.setsockopt(zmq.USE_FD, fd)
            try:
                sock.bind(f"tcp://{_bracket(host)}:{p}")
            except zmq.ZMQError as exc:
                self._socks.remove(sock)
                sock.close()
                if (port and not elsewhere) or exc.errno != errno.EADDRINUSE or n == len(tries):
                    raise ConfigError(f"cannot bind {host}:{port or 'any port'}: {exc}") from None
                continue
            if mech is not Mechanism.NULL:
                self._guarded().watch(sock, server=True)
            return Channel(self, sock, address), p
        raise AssertionError("unreachable")

    def local_router(self, endpoint: str) -> Channel | None:
        """A ROUTER of the control plane bound to ``endpoint``, an address on this host only
        (``ipc://@name``: an abstract unix socket, per network namespace); None when another
        process holds it."""
        mech = mechanism(self.security.mode, Plane.CONTROL)
        sock = self._socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        if mech is not Mechanism.NULL:
            self._guarded()
            sock.zap_domain = _DOMAIN[Plane.CONTROL]
            sock.curve_server = True
            sock.curve_secretkey = self.security.curve_secret
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as exc:
            self._socks.remove(sock)
            sock.close()
            if exc.errno == errno.EADDRINUSE:
                return None
            raise ConfigError(f"cannot bind {endpoint}: {exc}") from None
        if mech is not Mechanism.NULL:
            self._guarded().watch(sock, server=True)
        return Channel(self, sock, endpoint)

    def local_dealer(self, endpoint: str, identity: str) -> Channel:
        """A DEALER of the control plane connected to ``endpoint`` (a :meth:`local_router`)."""
        sock = self._socket(zmq.DEALER)
        sock.identity = identity.encode()
        sock.setsockopt(zmq.IMMEDIATE, 0)
        if mechanism(self.security.mode, Plane.CONTROL) is Mechanism.CURVE:
            sock.curve_serverkey = self.security.curve_public
            sock.curve_publickey = self.security.curve_public
            sock.curve_secretkey = self.security.curve_secret
            self._guarded().watch(sock, server=False)
        sock.connect(endpoint)
        return Channel(self, sock, endpoint)

    def dealer(self, host: str, port: int, identity: str, plane: Plane = Plane.DATA, connect: bool = True) -> Channel:
        """A DEALER connected to ``host:port`` (a router of ``plane``) with a routing identity
        (``connect`` False: set up for it, not connected: nothing may be sent on it)."""
        sock = self._socket(zmq.DEALER)
        sock.identity = identity.encode()
        sock.setsockopt(zmq.IMMEDIATE, 0)
        address = f"{host}:{port}"
        mech = mechanism(self.security.mode, plane)
        proof = None
        if mech is Mechanism.CURVE:
            sock.curve_serverkey = self.security.curve_public
            sock.curve_publickey = self.security.curve_public
            sock.curve_secretkey = self.security.curve_secret
        elif mech is Mechanism.PLAIN:
            sock.plain_username = address.encode()
            sock.plain_password = self.security.client_password(address)
            proof = self.security.server_proof(address).decode()
        if mech is not Mechanism.NULL:
            self._guarded().watch(sock, server=False)
        if connect:
            sock.connect(f"tcp://{_bracket(host)}:{port}")
        return Channel(self, sock, address if connect else "", proof)

    def close(self, linger_ms: int = 0) -> None:
        """Close every socket; wait up to ``linger_ms`` for queued messages to leave."""
        if self._guard is None:
            self.ctx.destroy(linger=linger_ms)
            return
        # ctx.destroy() would close the guard thread's sockets from this thread (libzmq aborts:
        # "pfd.revents & POLLIN"); close ours, then term(): the guard gets ETERM and closes its own
        self._guard.closing = True
        for sock in list(self._socks):
            if not sock.closed:
                sock.close(linger=linger_ms)
        self.ctx.term()
        self._guard.join(5)


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class Channel:
    """One socket; send and receive psnode messages on it."""

    def __init__(self, transport: Transport, sock: zmq.Socket, address: str = "",
                 proof: str | None = None) -> None:
        self.t = transport
        self.sock = sock
        self.address = address  # host:port bound or connected to
        self.bytes_in = 0
        self.bytes_out = 0
        self._proof = proof     # the server proof every message must carry (authenticated data links)
        self._bare: dict[Any, list[Any]] = {}   # command -> the frames of its message without a body

    def repoint(self, host: str, port: int) -> None:
        """A DEALER of the control plane (CURVE or NULL: nothing in it names the address) leaves
        its peer for ``host:port``; the socket stays the same (pollers keep it), what was queued
        for the old peer is dropped."""
        old = self.address
        if old:
            old_host, _, old_port = old.rpartition(":")
            with contextlib.suppress(zmq.ZMQError):
                self.sock.disconnect(f"tcp://{_bracket(old_host)}:{old_port}")
        self.sock.connect(f"tcp://{_bracket(host)}:{port}")
        self.address = f"{host}:{port}"

    def send(self, cmd: Any, body: dict[str, Any] | None = None, arrays: list[Any] | None = None,
             to: bytes | None = None, track: bool = False, ops: list[Any] | None = None) -> Any:
        """Send a message (a data message when ``ops`` are given: typed operations, see
        psnode.protocol).  Frames of PACK_BYTES or more go without a copy; with ``track``
        the result tells when zmq is done reading them (they must not change before)."""
        frames = self.frames(cmd, body, arrays, ops)
        if to is not None:
            frames.insert(0, to)
        sock, last = self.sock, len(frames) - 1
        trackers = []
        try:
            for i, frame in enumerate(frames):
                flags = 0 if i == last else _SNDMORE
                size = len(frame) if isinstance(frame, bytes) else frame.nbytes
                self.bytes_out += size
                if size < PACK_BYTES:
                    sock.send(frame, flags, copy=True)
                elif track:
                    trackers.append(sock.send(frame, flags, copy=False, track=True))
                else:
                    sock.send(frame, flags, copy=False)
        except zmq.ZMQError as exc:  # e.g. EHOSTUNREACH: peer gone; liveness will tell
            log.debug("send failed: %s", exc)
        return Sent(trackers) if track else None

    def send_all(self, cmd: Any, body: dict[str, Any] | None, idents: list[bytes]) -> None:
        """Send one control message (no arrays) to each of ``idents`` on this ROUTER, encoded once."""
        frames = [bytes(f) for f in self.frames(cmd, body)]   # (control frames: small, copied)
        head, tail, sock = frames[:-1], frames[-1], self.sock
        for ident in idents:   # (a control message to every worker: the frames' loop unrolled)
            try:
                sock.send(ident, _SNDMORE)
                for frame in head:
                    sock.send(frame, _SNDMORE)
                sock.send(tail)
            except zmq.ZMQError as exc:
                log.debug("send failed: %s", exc)
        self.bytes_out += sum(map(len, frames)) * len(idents) + sum(map(len, idents))

    def send_frames(self, frames: list[Any]) -> None:
        """Send encoded frames as one message (small ones: copied; a lost peer: liveness tells)."""
        sock, last = self.sock, len(frames) - 1
        try:
            for i, frame in enumerate(frames):
                size = len(frame) if isinstance(frame, bytes) else frame.nbytes
                self.bytes_out += size
                sock.send(frame, 0 if i == last else _SNDMORE, copy=size < PACK_BYTES)
        except zmq.ZMQError as exc:
            log.debug("send failed: %s", exc)

    def frames(self, cmd: Any, body: dict[str, Any] | None = None, arrays: list[Any] | None = None,
               ops: list[Any] | None = None) -> list[Any]:
        """The frames of a message from this channel (a message without body, arrays or ops,
        such as the scheduler's HEARTBEAT_ACK to each node every second, is encoded once)."""
        if not body and not arrays and ops is None:
            bare = self._bare.get(cmd)
            if bare is None:
                bare = self._bare[cmd] = encode(Message(cmd=cmd, job=self.t.job_id, sender=self.t.sender))
            return list(bare)
        return encode(Message(cmd=cmd, job=self.t.job_id, sender=self.t.sender,
                              body=body or {}, arrays=arrays or [], ops=ops))

    def recv(self, routed: bool = False) -> tuple[bytes | None, Message] | None:
        """Receive one message if one is waiting; None if none, or if it was dropped."""
        sock = self.sock
        if not int(sock.get(_EVENTS)) & _POLLIN:
            return None
        try:
            if self._proof is not None:
                first = sock.recv(_NOBLOCK, copy=False)
                if not self._proven(first):
                    return None
                head = [first.bytes]
            else:
                head = [sock.recv(_NOBLOCK)]
            small = 3 if routed else 2          # identity, version, header: copied
            frames: list[Any] = []
            while sock.get(_RCVMORE):
                if len(head) < small:
                    head.append(sock.recv())
                else:
                    frames.append(sock.recv(copy=False))
        except zmq.Again:
            return None
        ident = head.pop(0) if routed else None
        frames[:0] = head
        self.bytes_in += sum(len(f) for f in frames)
        try:
            return ident, decode(frames, self.t.job_id, self.t.max_bytes)
        except Exception as exc:  # noqa: BLE001 - ProtocolError, or a decoder bug: never fatal
            self.t.dropped += 1
            reason = exc if isinstance(exc, ProtocolError) else repr(exc)[:200]
            log.warning("dropped a message from %r: %s", ident, reason)
            return None

    def _proven(self, first: Any) -> bool:
        """Whether a message (its first frame) came from a peer that proved it is the job's
        server; if not, the rest of it is read and dropped, and counted as refused."""
        try:
            proof = first.get(_PROOF)
        except zmq.ZMQError:   # no such property: the peer sent no proof
            proof = ""
        if isinstance(proof, str) and hmac.compare_digest(proof, self._proof or ""):
            return True
        while self.sock.get(_RCVMORE):
            self.sock.recv()
        self.t.unproven += 1
        if self.t.unproven <= _LOGGED or self.t.unproven % 1000 == 0:
            log.warning("dropped a message on the data link to %s: its sender is not this job's "
                        "server (no proof in its handshake)", self.address)
        return False

    def close(self) -> None:
        self.sock.close(linger=0)


class Poller:
    """Waits on channels and raw file descriptors (e.g. an eventfd)."""

    def __init__(self) -> None:
        self._poller = zmq.Poller()

    def add(self, what: Channel | int) -> None:
        self._poller.register(what.sock if isinstance(what, Channel) else what, zmq.POLLIN)

    def remove(self, what: Channel | int) -> None:
        self._poller.unregister(what.sock if isinstance(what, Channel) else what)

    def watch(self, fd: int, write: bool) -> None:
        """Wake up when raw ``fd`` is writable too (``write``), or only when it is readable."""
        self._poller.modify(fd, zmq.POLLIN | (zmq.POLLOUT if write else 0))

    def poll(self, timeout: float) -> set[Any]:
        """Ready sockets/fds within ``timeout`` seconds (sockets as zmq sockets)."""
        return {s for s, _ in self._poller.poll(max(0, int(timeout * 1000)))}
