"""Sockets: the only module that imports zmq.

A :class:`Channel` wraps one ZeroMQ socket and speaks :mod:`psnode.protocol`: ``send`` encodes
(arrays as zero-copy frames), ``recv`` decodes and *drops* anything malformed or foreign,
logging why; it never raises for bad input.  A channel, like its socket, belongs to the thread
that created it.

Security: with a :class:`CurveKeys` every socket uses CURVE (encryption + authentication).  All
nodes of a job share one key pair made by the launcher; a ZAP handler admits only peers that
present the job's public key, so a peer without it is refused before any of its messages reach
the role's code.  Sockets bind only to the configured address, never a wildcard.
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

import zmq
from zmq.utils import z85

from psnode.errors import ConfigError, ProtocolError
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


@dataclass(frozen=True)
class CurveKeys:
    """The job's CURVE key pair (Z85 text, 40 characters each)."""

    public: bytes
    secret: bytes

    @classmethod
    def generate(cls) -> CurveKeys:
        public, secret = zmq.curve_keypair()
        return cls(public=public, secret=secret)

    @classmethod
    def load(cls, path: str) -> CurveKeys:
        """Read a key file written by :meth:`save`; refuse one others can read."""
        try:
            st = os.stat(path)
            if st.st_mode & 0o077:
                raise ConfigError(f"key file {path} is readable by others (chmod 600 {path})")
            with open(path, "rb") as fh:
                lines = fh.read().split()
        except OSError as exc:
            raise ConfigError(f"cannot read key file {path}: {exc.strerror}") from None
        if len(lines) != 2 or any(len(x) != 40 for x in lines):
            raise ConfigError(f"key file {path} does not hold a CURVE key pair")
        return cls(public=lines[0], secret=lines[1])

    def save(self, path: str) -> None:
        """Write the pair to ``path`` with mode 0600 (created, never widened)."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(self.public + b"\n" + self.secret + b"\n")


class _ZapHandler(threading.Thread):
    """Admits CURVE clients presenting the job's public key; logs and refuses the rest."""

    def __init__(self, ctx: zmq.Context, allowed: bytes) -> None:
        super().__init__(name="psnode-zap", daemon=True)
        self._ctx = ctx
        self._allowed = z85.decode(allowed)
        self.refused = 0
        self._ready = threading.Event()

    def run(self) -> None:
        sock = self._ctx.socket(zmq.REP)
        sock.linger = 0
        try:
            sock.bind("inproc://zeromq.zap.01")
        finally:
            self._ready.set()
        try:
            while True:
                try:
                    frames = sock.recv_multipart()
                except zmq.ZMQError:  # ETERM: the transport is closing
                    return
                version, request_id, _domain, address, _identity, mechanism = frames[:6]
                creds = frames[6:]
                ok = mechanism == b"CURVE" and len(creds) == 1 and creds[0] == self._allowed
                if not ok:
                    self.refused += 1
                    log.warning("refused %s connection from %s: not a key of this job",
                                mechanism.decode(errors="replace"), address.decode(errors="replace"))
                try:
                    sock.send_multipart([version, request_id, b"200" if ok else b"400",
                                         b"OK" if ok else b"not a key of this job", b"", b""])
                except zmq.ZMQError:  # ETERM while answering: closing
                    return
        finally:
            sock.close()  # by the thread that owns it (ctx.destroy from another thread aborts)


class Transport:
    """A zmq context plus the job's identity and security settings, shared by a role."""

    def __init__(self, job_id: str, sender: str, max_bytes: int, keys: CurveKeys | None) -> None:
        self.job_id = job_id
        self.sender = sender
        self.max_bytes = max_bytes
        self.keys = keys
        self.ctx = zmq.Context()
        self.dropped = 0
        self._zap: _ZapHandler | None = None
        self._socks: list[zmq.Socket] = []

    @property
    def refused(self) -> int:
        return 0 if self._zap is None else self._zap.refused

    def _socket(self, kind: int) -> zmq.Socket:
        sock = self.ctx.socket(kind)
        self._socks.append(sock)
        sock.linger = 0
        sock.sndhwm = _HWM
        sock.rcvhwm = _HWM
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_bytes + 2**20)
        return sock

    def router(self, host: str, port: int) -> tuple[Channel, int]:
        """A ROUTER bound to ``host:port`` (port 0: a free one); returns it and the port."""
        sock = self._socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        if self.keys is not None:
            if self._zap is None:  # the authenticator, started before the first bind
                self._zap = _ZapHandler(self.ctx, self.keys.public)
                self._zap.start()
                self._zap._ready.wait(5)
            sock.curve_server = True
            sock.curve_secretkey = self.keys.secret
            sock.zap_domain = b"psnode"
        try:
            if port == 0:
                port = sock.bind_to_random_port(f"tcp://{_bracket(host)}", 20000, 60000, 200)
            else:
                sock.bind(f"tcp://{_bracket(host)}:{port}")
        except zmq.ZMQError as exc:
            sock.close()
            raise ConfigError(f"cannot bind {host}:{port}: {exc}") from None
        return Channel(self, sock, f"{host}:{port}"), port

    def dealer(self, host: str, port: int, identity: str) -> Channel:
        """A DEALER connected to ``host:port`` with a routing identity."""
        sock = self._socket(zmq.DEALER)
        sock.identity = identity.encode()
        sock.setsockopt(zmq.IMMEDIATE, 0)
        if self.keys is not None:
            sock.curve_serverkey = self.keys.public
            sock.curve_publickey = self.keys.public
            sock.curve_secretkey = self.keys.secret
        sock.connect(f"tcp://{_bracket(host)}:{port}")
        return Channel(self, sock, f"{host}:{port}")

    def close(self, linger_ms: int = 0) -> None:
        """Close every socket; wait up to ``linger_ms`` for queued messages to leave."""
        if self._zap is None:
            self.ctx.destroy(linger=linger_ms)
            return
        # ctx.destroy() would close the ZAP thread's socket from this thread (libzmq aborts:
        # "pfd.revents & POLLIN"); close ours, then term(): the ZAP thread gets ETERM and closes its own
        for sock in list(self._socks):
            if not sock.closed:
                sock.close(linger=linger_ms)
        self.ctx.term()
        self._zap.join(5)


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class Channel:
    """One socket; send and receive psnode messages on it."""

    def __init__(self, transport: Transport, sock: zmq.Socket, address: str = "") -> None:
        self.t = transport
        self.sock = sock
        self.address = address  # host:port bound or connected to
        self.bytes_in = 0
        self.bytes_out = 0

    def send(self, cmd: Any, body: dict[str, Any] | None = None, arrays: list[Any] | None = None,
             to: bytes | None = None, track: bool = False, ops: list[Any] | None = None) -> Any:
        """Send a message (a data message when ``ops`` are given: typed operations, see
        psnode.protocol).  Frames of PACK_BYTES or more go without a copy; with ``track``
        the result tells when zmq is done reading them (they must not change before)."""
        msg = Message(cmd=cmd, job=self.t.job_id, sender=self.t.sender,
                      body=body or {}, arrays=arrays or [], ops=ops)
        frames = encode(msg)
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

    def recv(self, routed: bool = False) -> tuple[bytes | None, Message] | None:
        """Receive one message if one is waiting; None if none, or if it was dropped."""
        sock = self.sock
        if not int(sock.get(_EVENTS)) & _POLLIN:
            return None
        try:
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
