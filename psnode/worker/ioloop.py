"""The worker's I/O thread: one poll loop over the scheduler link and the server channels.

:class:`IoLoop` holds everything the thread owns (transport, poller, scheduler link, one
channel per server, a same-host link per server on this host, control requests awaiting
answers) and does, each turn: heartbeat, poll, scheduler messages
(:meth:`IoLoop.on_scheduler`), server answers (fed to the tracker), control requests, queued
requests, retries.  Every socket is used only by this thread.

Routing (:meth:`IoLoop.send`): to a server with a same-host link (psnode.samehost.link) data
operations go over it, arrays in shared memory; init and the optimizer's operations, anything
the link cannot carry, and everything to other servers go over TCP.  When a link closes, its
server is served over TCP (the tracker's retries resend what was in flight).

Same-host links skip the I/O thread: the user's thread sends its requests on them itself
(:meth:`psnode.worker.engine.Engine.submit`), and the thread waiting for an answer reads the links
itself (:mod:`psnode.worker.samehost`; one reader at a time, the engine's ``reader`` lock), so a round
costs no hand-over between threads.  The I/O thread does not poll the links; each turn (at
least every ``LINK_TURN`` seconds) it drains what nobody was waiting for, sends backlogs, and
takes down links that closed.
"""
from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

from psnode.config import NodeConfig
from psnode.errors import PeerLost, PSError
from psnode.net.link import SchedulerLink
from psnode.net.security import Security
from psnode.net.transport import Channel, Poller, Transport
from psnode.protocol import Command, GetStates, Init, LoadStates, Message, Ok, Op, SetOptimizer, without_dest
from psnode.protocol.control import Barrier, BarrierDone, Control, JobEnd, Servers, Welcome
from psnode.samehost import segments as shm
from psnode.samehost.link import KIND_DATA, Link
from psnode.samehost.staging import Staging
from psnode.worker.samehost import SameHostLinks
from psnode.worker.tracker import Batches, settle

if TYPE_CHECKING:
    from psnode.worker.engine import ControlRequest, Engine

log = logging.getLogger("psnode.worker")

BATCH_BYTES = 512 * 2**10      # fuse small requests up to this size per message
BATCH_OPS = 512
TCP_ONLY = (Init, SetOptimizer, GetStates, LoadStates)   # rare, answers of any size
LINK_TURN = 0.25               # the I/O thread's longest sleep while links exist


class IoLoop(SameHostLinks):
    """The state of the worker's I/O thread (see the module docstring)."""

    def __init__(self, engine: Engine) -> None:
        self.e = engine
        self.cfg: NodeConfig = engine.cfg
        self.t: Transport | None = None
        self.poller = Poller()
        self.link: SchedulerLink | None = None
        self.servers: list[Channel] = []
        self.links: list[Link | None] = []
        self.local: set[int] = set()      # servers whose link is up
        self.outbox: list[tuple[int, list[Op]]] = []   # TCP sends other threads asked for
        self._links_version = 0                                  # changes when a link comes or goes
        self._poll_key = -1                                      # the version the reader's poll set is of
        self._poll: Any = None
        self._poll_links: dict[int, tuple[int, Link]] = {}
        self.ctrl: dict[tuple[Command, int], ControlRequest] = {}
        self.next_scan = 0.0
        self.next_ctrl = 0.0

    # ------------------------------------------------------------ for other threads
    def address(self, server: int) -> str:
        chans = self.servers
        return chans[server].address if server < len(chans) else f"server {server}"

    def bytes(self) -> tuple[int, int]:
        chans: list[Any] = [*self.servers, *(x for x in self.links if x is not None)]
        return sum(c.bytes_in for c in chans), sum(c.bytes_out for c in chans)

    def same_host(self, server: int) -> bool:
        if server not in self.local:
            return False
        link = self.links[server]
        return link is not None and link.up

    # ------------------------------------------------------------ the loop
    def run(self) -> None:
        e = self.e
        self.t = Transport(self.cfg.job_id, "worker", self.cfg.max_message_bytes, Security.load(self.cfg.key_file))
        try:
            self.link = SchedulerLink(self.t, self.cfg, "worker", 0, lambda: e.stats)
            self.poller.add(e.efd)
            self.poller.add(self.link.chan)
            while not e.closing:
                self.turn(time.monotonic())
        except PSError as exc:
            e.die(exc)
        except Exception as exc:  # noqa: BLE001 - never let the I/O thread vanish silently
            e.die(PSError(f"psnode I/O thread failed: {exc!r}"))
        finally:
            self.t.close(linger_ms=500 if e.fatal is None else 0)
            if e.fatal is None:
                e.fatal = PSError("this KVStore is closed")
            with e.lock:
                e.tracker.fail_all(e.fatal)
            e.settle()
            for req in self.ctrl.values():
                req.future.fail(e.fatal)
            for i in range(len(self.links)):
                if self.links[i] is not None:
                    self.links[i].close()  # type: ignore[union-attr]

    def turn(self, now: float) -> None:
        e, link = self.e, self.link
        assert link is not None
        link.tick(now)
        timeout = link.timeout(now)
        ready = self.poller.poll(min(timeout, LINK_TURN) if self.local else timeout)
        if e.efd in ready:
            e.read_wake()
        if link.chan.sock in ready:
            while (msg := link.recv()) is not None:
                self.on_scheduler(msg)
        for i, ch in enumerate(self.servers):
            if ch.sock in ready:
                self.on_answers(i, ch)
        if self.local:
            self.tend_links()
        if self.outbox:
            with e.lock:
                outbox, self.outbox = self.outbox, []
            for server, ops in outbox:
                self.send_tcp(server, ops)
        if e.control_queue:
            self.send_control(now)
        if self.ctrl and now >= self.next_ctrl:
            self.next_ctrl = now + max(0.02, self.cfg.retry_timeout / 4)
            self.resend_control(now)
        if not self.servers:
            return
        if e.tracker.queued:
            with e.lock:
                batches = e.tracker.take(now)
            self.send(batches)
        if e.tracker.pending and now >= self.next_scan:
            self.next_scan = now + max(0.02, self.cfg.retry_timeout / 4)
            with e.lock:
                batches, warnings = e.tracker.due(now)
            for text in warnings:
                log.warning("worker %d: %s", e.rank, text)
            self.send(batches)
        e.settle()

    # ------------------------------------------------------------ scheduler
    def on_scheduler(self, msg: Control) -> None:
        """Every message from the scheduler: WELCOME, barrier and finish answers, server
        changes, and the end of the job (raised as PeerLost)."""
        body = msg.body
        if isinstance(body, Welcome) and not self.servers:
            self.welcome(body)
        elif isinstance(body, BarrierDone):
            for slot in [s for s in self.ctrl if s[0] is Command.BARRIER and s[1] <= body.n]:
                self.ctrl.pop(slot).future.set(Ok(0))
        elif msg.cmd is Command.FINISH_ACK and (Command.FINISH, 0) in self.ctrl:
            self.ctrl.pop((Command.FINISH, 0)).future.set(Ok(0))
        elif isinstance(body, Servers):
            self.on_servers(body)
        elif isinstance(body, JobEnd):   # PEER_LOST or SHUTDOWN
            raise PeerLost(f"job {self.cfg.job_id} ended: {body.reason}")

    def welcome(self, body: Welcome) -> None:
        e = self.e
        assert self.t is not None
        e.rank = body.rank
        e.restarts = body.restarts
        e.barriers_before = body.barriers
        self.t.sender = f"worker:{e.rank}"
        for s in body.servers:
            ch = self.t.dealer(s.host, s.port, f"w{e.rank}")
            self.servers.append(ch)
            self.poller.add(ch)
            self.links.append(None)
        if self.cfg.shm and shm.available():
            e.staging = Staging(self.cfg.job_id, e.rank, e.tracker.journal.released)
            for i, s in enumerate(body.servers):
                self.connect(i, s.host, s.port)
        e.welcome.set(Ok(0))

    def on_servers(self, body: Servers) -> None:
        """A server is down (its requests wait) or was replaced (reconnect, resend)."""
        e = self.e
        assert self.t is not None
        if body.down is not None:
            with e.lock:
                e.tracker.down.add(body.down)
            log.warning("worker %d: server %d is down; waiting for its replacement", e.rank, body.down)
            return
        rank = body.restored
        if rank is None or not 0 <= rank < len(self.servers):
            return
        row = body.address()
        old = self.servers[rank]
        self.poller.remove(old)
        old.close()
        ch = self.t.dealer(row.host, row.port, f"w{e.rank}")
        ch.bytes_in, ch.bytes_out = old.bytes_in, old.bytes_out
        self.servers[rank] = ch
        self.poller.add(ch)
        self.link_down(rank)
        self.connect(rank, row.host, row.port)
        with e.lock:
            batch = e.tracker.restored(rank, time.monotonic())
        log.warning("worker %d: server %d restarted at %s:%s; resending %d request(s)",
                    e.rank, rank, row.host, row.port, len(batch))
        self.send({rank: batch})

    def send_control(self, now: float) -> None:
        e, link = self.e, self.link
        assert link is not None
        with e.lock:
            queue = list(e.control_queue)
            e.control_queue.clear()
        for req in queue:
            if req.cmd is Command.BARRIER:
                e.barriers += 1
                req.body = Barrier(e.barriers)
            link.chan.send(req.cmd, req.body.to_body())
            if req.cmd is Command.BYE:
                req.future.set(Ok(0))
            else:
                req.sent = now
                self.ctrl[req.slot] = req

    def resend_control(self, now: float) -> None:
        """Send BARRIER/FINISH again when unanswered for ``retry_timeout`` (lost on the way, or
        still waiting: the scheduler answers a repeat and never counts it twice)."""
        assert self.link is not None
        for req in self.ctrl.values():
            if now - req.sent >= self.cfg.retry_timeout:
                self.link.chan.send(req.cmd, req.body.to_body())
                req.sent = now

    # ------------------------------------------------------------ servers
    def on_answers(self, server: int, ch: Channel) -> None:
        while (got := ch.recv()) is not None:
            self.answered(server, got[1], io_thread=True)

    def answered(self, server: int, msg: Message, io_thread: bool) -> None:
        e = self.e
        if msg.cmd is not Command.DATA_REPLY or msg.ops is None:
            return
        now = time.monotonic()
        resend: Batches = {}
        tracker = e.tracker
        with e.lock:
            for ans in msg.ops:
                again = tracker.answered(server, ans, now)
                for s, ops in again.items() if again else ():
                    resend.setdefault(s, []).extend(ops)
            if self.local and tracker.queued:   # e.g. a push held back by this pull
                for s, ops in tracker.take(now, self.local).items():
                    resend.setdefault(s, []).extend(ops)
            outcomes, tracker.outcomes = tracker.outcomes, []
        if resend:
            self.send(resend, io_thread)
        if outcomes:   # (as Engine.settle: outside the lock, callbacks copy data)
            settle(outcomes)
            if io_thread and e.readers:
                os.eventfd_write(e.notify, 1)

    def send(self, batches: Batches, io_thread: bool = True) -> None:
        """Send each server its operations (see the module docstring for the route); TCP
        sends of other threads go through the I/O thread (it owns the zmq sockets)."""
        for server, ops in batches.items():
            link = self.links[server] if server < len(self.links) else None
            if link is not None and link.up:
                tcp = [op for op in ops if isinstance(op, TCP_ONLY)]
                rest = link.send_ops(KIND_DATA, [op for op in ops if not isinstance(op, TCP_ONLY)])
                ops = tcp + rest
            if not ops:
                continue
            ops = [without_dest(op) for op in ops]
            if io_thread:
                self.send_tcp(server, ops)
            else:
                with self.e.lock:
                    self.outbox.append((server, ops))
                os.eventfd_write(self.e.efd, 1)

    def send_tcp(self, server: int, ops: list[Op]) -> None:
        """Send ``ops`` to ``server`` over TCP, fused into messages of at most BATCH_BYTES."""
        if ops:
            ch = self.servers[server]
            start, size = 0, 0
            for i, op in enumerate(ops):
                size += _nbytes(op)
                if size >= BATCH_BYTES or i + 1 - start >= BATCH_OPS:
                    ch.send(Command.DATA, ops=ops[start:i + 1])
                    start, size = i + 1, 0
            if start < len(ops):
                ch.send(Command.DATA, ops=ops[start:])


def _nbytes(op: Op) -> int:
    data = getattr(op, "data", None)
    return 0 if data is None else int(data.nbytes)


__all__ = ["BATCH_BYTES", "BATCH_OPS", "IoLoop"]
