"""A worker's connection to each server: TCP, or TCP plus this host's shared-memory link.

One connection object per server, made once when the link is made (:meth:`Connections.connect`,
after the WELCOME and after a server's restart: the one place a server is pointed at an
address), and "same host?" is answered there, once: a :class:`SameHostConnection` when the
server runs on this host and its link opened (psnode.samehost.link), else a
:class:`TcpConnection`.  The engine and the I/O thread talk to a server only through
:class:`ServerConnection` (``near``, ``send``, ``wait``, ``address``).  When a same-host link
closes, the I/O thread replaces its connection by the TCP connection inside it
(:meth:`Connections.link_down`); what was in flight is resent over TCP by the tracker.

Routing: a same-host connection sends data operations over its link, arrays in shared memory;
init and the optimizer's operations (``TCP_ONLY``), and what the link cannot carry, go over TCP.

Threads:

* the I/O thread makes, replaces and closes connections and is the only thread that touches a
  zmq channel (:meth:`TcpConnection.send_now`, :meth:`Connections.flush`);
* any thread may :meth:`~TcpConnection.send`: on a same-host link the calling thread writes
  the datagram itself (the link's send lock); a TCP send from another thread is queued in the
  connection's own outbox (its lock) and the I/O thread woken, which sends it on its next turn;
* any thread reads ``near``, ``address`` and the connection list (replaced item by item, never
  resized after the WELCOME); the thread waiting for a same-host answer reads the links itself
  (:meth:`SameHostConnection.wait`, through :class:`~psnode.worker.samehost.SameHostLinks`).
"""
from __future__ import annotations

import threading
from collections.abc import Callable, KeysView
from typing import Protocol

from psnode.config import NodeConfig
from psnode.errors import ProtocolError
from psnode.net.security import Security
from psnode.net.transport import Channel
from psnode.protocol import Command, GetStates, Init, LoadStates, Op, SetOptimizer, without_dest
from psnode.samehost import handshake as shmhandshake
from psnode.samehost.link import KIND_DATA, Link
from psnode.samehost.staging import NOWHERE, Places, Staging
from psnode.worker.futures import Future
from psnode.worker.samehost import SameHostLinks

BATCH_BYTES = 512 * 2**10      # fuse small requests up to this size per message
ALONE_BYTES = 64 * 2**10       # a request with this much data goes in a message of its own
BATCH_OPS = 512
TCP_ONLY = (Init, SetOptimizer, GetStates, LoadStates)   # rare, answers of any size


class ServerConnection(Protocol):
    """What the engine and the I/O thread need of one server's connection."""

    server: int

    @property
    def near(self) -> bool:
        """Reached over this host's shared-memory link (while it is up)."""
        ...

    @property
    def address(self) -> str:
        """The server's TCP address (for messages)."""
        ...

    @property
    def tcp(self) -> TcpConnection:
        """The TCP connection (itself, or the one a same-host connection holds)."""
        ...

    def send(self, ops: list[Op], io_thread: bool) -> None:
        """Send ``ops`` (any thread; ``io_thread``: the caller is the I/O thread)."""
        ...

    def wait(self, fut: Future, budget: float) -> None:
        """Wait up to ``budget`` seconds for ``fut`` (reading the link, if there is one)."""
        ...


class TcpConnection:
    """A server reached over TCP (ZeroMQ): see the module docstring for who calls what."""

    near = False

    def __init__(self, server: int, chan: Channel, wake: Callable[[], None]) -> None:
        self.server = server
        self.chan = chan                        # (I/O thread only)
        self._wake = wake                       # wakes the I/O thread
        self._lock = threading.Lock()           # guards the outbox
        self._outbox: list[list[Op]] = []       # sends other threads asked for
        self._successor: TcpConnection | None = None   # took over (the server moved): queue there
        self.pending = False                    # the outbox may hold something

    @property
    def address(self) -> str:
        return self.chan.address

    @property
    def tcp(self) -> TcpConnection:
        return self

    def send(self, ops: list[Op], io_thread: bool) -> None:
        """Send ``ops`` now (the I/O thread), or queue them for the I/O thread (another thread)."""
        if not ops:
            return
        ops = [without_dest(op) for op in ops]
        if io_thread:
            self.send_now(ops)
        else:
            self._queue(ops)

    def _queue(self, ops: list[Op]) -> None:
        with self._lock:
            successor = self._successor
            if successor is None:
                self._outbox.append(ops)
        if successor is not None:   # (a thread that held this connection while it was replaced)
            successor._queue(ops)
            return
        self.pending = True
        self._wake()

    def flush(self) -> None:
        """(I/O thread) Send what other threads queued."""
        self.pending = False
        with self._lock:
            outbox, self._outbox = self._outbox, []
        for ops in outbox:
            self.send_now(ops)

    def send_now(self, ops: list[Op]) -> None:
        """(I/O thread) Send ``ops`` over TCP, small ones fused into messages of about
        BATCH_BYTES; one of ALONE_BYTES or more alone (the server handles each message once it is
        whole: a big request fused with the next would wait for it)."""
        ch = self.chan
        start, size = 0, 0
        for i, op in enumerate(ops):
            n = _nbytes(op)
            if n >= ALONE_BYTES and i > start:   # what came before it leaves first
                ch.send(Command.DATA, ops=ops[start:i])
                start, size = i, 0
            size += n
            if size >= BATCH_BYTES or n >= ALONE_BYTES or i + 1 - start >= BATCH_OPS:
                ch.send(Command.DATA, ops=ops[start:i + 1])
                start, size = i + 1, 0
        if start < len(ops):
            ch.send(Command.DATA, ops=ops[start:])

    def wait(self, fut: Future, budget: float) -> None:
        fut._wait(budget)

    def take_over(self, old: TcpConnection) -> None:
        """(I/O thread) Replace ``old`` (the server moved): keep its byte counts and what it
        had queued, and what other threads still queue there."""
        self.chan.bytes_in, self.chan.bytes_out = old.chan.bytes_in, old.chan.bytes_out
        with old._lock:
            outbox, old._outbox = old._outbox, []
            old._successor = self
        if outbox:
            with self._lock:
                self._outbox[:0] = outbox
            self.pending = True


class SameHostConnection:
    """A server on this host: data over its shared-memory link, the rest over ``tcp``."""

    def __init__(self, tcp: TcpConnection, link: Link, links: SameHostLinks) -> None:
        self.server = tcp.server
        self._tcp = tcp
        self.link = link
        self._links = links                     # the readers of every link on this host

    @property
    def near(self) -> bool:
        return self.link.up

    @property
    def address(self) -> str:
        return self._tcp.address

    @property
    def tcp(self) -> TcpConnection:
        return self._tcp

    def send(self, ops: list[Op], io_thread: bool) -> None:
        if self.link.up:
            tcp: list[Op] = []
            data: list[Op] = []
            for op in ops:
                (tcp if isinstance(op, TCP_ONLY) else data).append(op)
            ops = tcp + self.link.send_ops(KIND_DATA, data) if data else tcp
        self._tcp.send(ops, io_thread)

    def wait(self, fut: Future, budget: float) -> None:
        if self.link.up:   # (asked each turn: the link may close)
            self._links.read_until(fut, budget)
        else:
            fut._wait(budget)


#: how long a replacement's same-host handshake may wait for its answer (it answers once it
#: restored its state: seconds for a big one; TCP serves it meanwhile)
OPEN_S = 60.0


class Connections:
    """The worker's connection to each server, indexed by server rank (see the module
    docstring); ``links`` reads the same-host links, ``staging`` is their shared memory."""

    def __init__(self, cfg: NodeConfig, links: SameHostLinks, wake: Callable[[], None]) -> None:
        self.cfg = cfg
        self.links = links
        self.staging: Staging | None = None     # set by the I/O thread before the first link
        self._wake = wake
        self._conns: list[ServerConnection] = []
        self.vacant: set[int] = set()          # servers without an address yet (vacate)
        self.places: Places = NOWHERE          # the servers near and their memory, as last connected
        self.on_places: Callable[[Places], None] | None = None   # told each new ``places``
        #: same-host handshakes under way (a replacement's: the server may still be restoring;
        #: its requests go over TCP meanwhile), by server; the I/O thread polls their sockets
        self.opening: dict[int, shmhandshake.Opening] = {}

    def __getitem__(self, server: int) -> ServerConnection:
        return self._conns[server]

    def __len__(self) -> int:
        return len(self._conns)

    @property
    def local(self) -> KeysView[int]:
        """The servers with a same-host link, up or closed and not taken down yet (a live view)."""
        return self.links.local

    def near(self) -> frozenset[int]:
        """The servers whose same-host link is up (any thread)."""
        return frozenset([c.server for c in self._conns if c.near])

    def is_near(self, server: int) -> bool:
        """``server`` is reached over this host's link (any thread)."""
        return 0 <= server < len(self._conns) and self._conns[server].near

    def address(self, server: int) -> str:
        conns = self._conns
        return conns[server].address if 0 <= server < len(conns) else f"server {server}"

    def tcp_bytes(self) -> tuple[int, int]:
        chans = [c.tcp.chan for c in self._conns]
        return sum(c.bytes_in for c in chans), sum(c.bytes_out for c in chans)

    # ------------------------------------------------------------ making and re-pointing
    def connect(self, server: int, host: str, port: int, chan: Channel, security: Security,
                wait: bool = True) -> ServerConnection:
        """(I/O thread) Point ``server`` at ``host:port`` over ``chan``: the one place a worker
        decides whether a server is on its host (and then opens its link).  A connection it
        replaces is dropped (its link taken down by the caller); its TCP counters and queue carry
        over.  ``wait`` False (a replacement, maybe still restoring): the link's handshake is
        only begun (``opening``; :meth:`opened` ends it) and the server is served over TCP
        until then: the I/O thread never waits for a server's loop."""
        self.vacant.discard(server)
        self.cancel(server)
        tcp = TcpConnection(server, chan, self._wake)
        if server < len(self._conns):
            tcp.take_over(self._conns[server].tcp)
        conn: ServerConnection = tcp
        if wait:
            link = self._open_link(server, host, port, security)
            if link is not None:
                self.links.add(server, link)
                conn = SameHostConnection(tcp, link, self.links)
        elif self.staging is not None and host == self.cfg.host:
            try:
                opening = shmhandshake.begin(self.cfg.job_id, self.links.rank, server, host, port, self.staging.out,
                                             self.staging.landing, self.cfg.max_message_bytes, security,
                                             timeout=OPEN_S)
            except (ProtocolError, OSError) as exc:
                self.links.log_no_link(server, exc)
            else:
                if opening is not None:
                    self.opening[server] = opening
        if server < len(self._conns):
            self._conns[server] = conn
        else:
            assert server == len(self._conns)
            self._conns.append(conn)
        self._publish()
        return conn

    def opened(self, server: int) -> bool:
        """(I/O thread) The server answered the handshake begun for it: its link is up from now
        on (True), or it is served over TCP (the reason logged)."""
        opening = self.opening.pop(server, None)
        if opening is None:
            return False
        try:
            link = shmhandshake.finish(opening)
        except (ProtocolError, OSError) as exc:
            self.links.log_no_link(server, exc)
            return False
        self.links.add(server, link)
        self._conns[server] = SameHostConnection(self._conns[server].tcp, link, self.links)
        self._publish()
        return True

    def expired(self, now: float) -> list[int]:
        """(I/O thread) Give up the handshakes past their deadline (served over TCP); their servers."""
        late = [s for s, o in self.opening.items() if now >= o.deadline]
        for server in late:
            self.opening.pop(server).close()
            self.links.log_no_link(server, TimeoutError("no answer to the handshake"))
        return late

    def cancel(self, server: int) -> None:
        """(I/O thread) Give up the handshake begun for ``server``, if any."""
        opening = self.opening.pop(server, None)
        if opening is not None:
            opening.close()

    def _publish(self) -> None:
        """(I/O thread) A server was connected or its link taken down: the places a call gets
        from now on (a link that closes before its server's is taken down: what is sent to it
        goes over TCP all the same)."""
        self.places = Places(self.near(), self.staging)
        if self.on_places is not None:
            self.on_places(self.places)

    def vacate(self, server: int, chan: Channel) -> None:
        """(I/O thread) ``server`` has no address yet (a server being replaced when this worker
        was welcomed): a connection over ``chan`` (not connected) holds its place, and nothing is
        sent to it until :meth:`connect` points it at its replacement."""
        self.connect(server, "", 0, chan, Security.insecure())
        self.vacant.add(server)

    def _open_link(self, server: int, host: str, port: int, security: Security) -> Link | None:
        staging = self.staging
        if staging is None or host != self.cfg.host:
            return None
        try:
            return shmhandshake.connect(self.cfg.job_id, self.links.rank, server, host, port, staging.out,
                                        staging.landing, self.cfg.max_message_bytes, security)
        except (ProtocolError, OSError) as exc:
            self.links.log_no_link(server, exc)
            return None

    def link_down(self, server: int) -> bool:
        """(I/O thread) Take down the same-host link to ``server``: it is served over TCP from
        now on; False when it had none."""
        self.cancel(server)
        if 0 <= server < len(self._conns):
            self._conns[server] = self._conns[server].tcp
        down = self.links.take_down(server)
        self._publish()
        return down

    # ------------------------------------------------------------ sending
    def send(self, batches: dict[int, list[Op]], io_thread: bool) -> None:
        """Send each server its operations (any thread); those to a vacant server are dropped
        (its requests wait in the tracker, resent when its replacement is announced)."""
        for server, ops in batches.items():
            if server not in self.vacant:
                self._conns[server].send(ops, io_thread)

    def flush(self) -> None:
        """(I/O thread) Send what other threads queued for TCP."""
        for conn in self._conns:
            tcp = conn.tcp
            if tcp.pending:
                tcp.flush()

    def wait(self, fut: Future, budget: float) -> None:
        """Wait up to ``budget`` seconds for ``fut`` (a server's or the scheduler's)."""
        conns = self._conns
        if 0 <= fut.server < len(conns):
            conns[fut.server].wait(fut, budget)
        else:
            fut._wait(budget)


def _nbytes(op: Op) -> int:
    data = getattr(op, "data", None)
    return 0 if data is None else int(data.nbytes)


__all__ = ["ALONE_BYTES", "BATCH_BYTES", "BATCH_OPS", "TCP_ONLY", "Connections", "SameHostConnection",
           "ServerConnection", "TcpConnection"]
