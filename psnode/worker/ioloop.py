"""The worker's I/O thread: one poll loop over the scheduler link and the server channels.

:class:`IoLoop` holds everything the thread owns (transport, poller, scheduler link, one
connection per server: :class:`~psnode.worker.connection.Connections`, which it makes and
re-points, control requests awaiting answers) and the :class:`~psnode.worker.state.EngineState`
it shares with the user's thread.  Each turn:
heartbeat, poll, scheduler messages (:meth:`IoLoop.on_scheduler`), server answers (fed to the
tracker), control requests, queued requests, retries.  Every zmq socket is used only by this
thread.

Routing is each server's connection's (psnode.worker.connection).  When a same-host link
closes, its server is served over TCP (the tracker's retries resend what was in flight).

Same-host links skip the I/O thread: the user's thread sends its requests on them itself
(through the connection; TCP sends it queues in the connection's outbox), and the thread waiting
for an answer reads the links itself
(:meth:`~psnode.worker.samehost.SameHostLinks.read_until`), so a round costs no hand-over
between threads.  The I/O thread does not poll the links; each turn (at least every
``LINK_TURN`` seconds) it drains what nobody was waiting for, sends backlogs, and takes down
links that closed.

**No death by slowness**: the loop's turns stay short (each ticks ``gaps``, psnode.loopgap:
heartbeats carry the longest gap), and a server is given up only when it answers nothing at
all; a request's resend deadline follows its bytes and the rate its link delivers
(psnode.worker.linkrate, through the tracker).

When the job fails (a peer lost, the scheduler silent or gone) the loop fails every pending and
later request (:meth:`IoLoop.die`); if the user's thread does not come back to psnode within
``EXIT_GRACE`` seconds, the process exits with status 1 so no worker outlives its job.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable

from psnode import timeline
from psnode.config import NodeConfig
from psnode.errors import PeerLost, PSError
from psnode.loopgap import LoopGap
from psnode.net.link import SchedulerLink
from psnode.net.security import Security
from psnode.net.transport import Channel, Poller, Transport
from psnode.protocol import Command, Message, Ok
from psnode.protocol.control import (
    Barrier,
    BarrierDone,
    Control,
    Counters,
    JobEnd,
    Membership,
    Rejoin,
    Servers,
    Welcome,
)
from psnode.samehost import segments as shm
from psnode.samehost.staging import Staging
from psnode.worker.connection import BATCH_BYTES, BATCH_OPS, Connections
from psnode.worker.futures import ControlRequest
from psnode.worker.samehost import SameHostLinks
from psnode.worker.state import EngineState
from psnode.worker.tracker import ASK_AFTER, Batches, settle

log = logging.getLogger("psnode.worker")

LINK_TURN = 0.25               # the I/O thread's longest sleep while links exist
EXIT_GRACE = 5.0               # seconds the user's thread has to notice a failed job


class IoLoop:
    """The worker's I/O thread (see the module docstring); ``stats`` gives the counters each
    heartbeat carries."""

    def __init__(self, cfg: NodeConfig, state: EngineState, stats: Callable[[], Counters]) -> None:
        self.cfg = cfg
        self.state = state
        self.stats = stats
        self.links = SameHostLinks(cfg, self.answered, lambda: state.rank, lambda: state.fatal is not None)
        self.conns = Connections(cfg, self.links, state.wake)
        self.t: Transport | None = None
        self.poller = Poller()
        self.link: SchedulerLink | None = None
        self.ctrl: dict[tuple[Command, int], ControlRequest] = {}
        self.next_scan = 0.0
        self.next_ctrl = 0.0
        self.gaps = LoopGap()   # the longest gap between two turns (psnode.loopgap)

    # ------------------------------------------------------------ for other threads
    def bytes(self) -> tuple[int, int]:
        """Bytes read and written, over TCP and the same-host links."""
        tcp_in, tcp_out = self.conns.tcp_bytes()
        shm_in, shm_out = self.links.bytes()
        return tcp_in + shm_in, tcp_out + shm_out

    # ------------------------------------------------------------ the loop
    def run(self) -> None:
        e = self.state
        self.t = Transport(self.cfg.job_id, "worker", self.cfg.max_message_bytes, Security.load(self.cfg.key_file))
        try:
            self.link = SchedulerLink(self.t, self.cfg, "worker", 0, self.stats)
            self.link.report = self.rejoin_report
            self.poller.add(e.efd)
            self.poller.add(self.link.chan)
            while not e.closing:
                self.turn(time.monotonic())
        except PSError as exc:
            self.die(exc)
        except Exception as exc:  # noqa: BLE001 - never let the I/O thread vanish silently
            self.die(PSError(f"psnode I/O thread failed: {exc!r}"))
        finally:
            if self.link is not None:
                self.link.close()
            self.t.close(linger_ms=500 if e.fatal is None else 0)
            if e.fatal is None:
                e.fatal = PSError("this KVStore is closed")
            e.notice.up = True
            with e.lock:
                e.tracker.fail_all(e.fatal)
            self.settle()
            for req in self.ctrl.values():
                req.future.fail(e.fatal)
            for server in list(self.conns.opening):
                self.drop_opening(server)
            self.links.close()

    def turn(self, now: float) -> None:
        e, link = self.state, self.link
        assert link is not None
        link.tick(now)
        timeout = link.timeout(now)
        if e.tracker.pending and len(self.conns):   # (a pending request is scanned on time: asked about, resent)
            timeout = min(timeout, max(0.0, self.next_scan - now))
        if self.conns.opening:   # (a handshake's deadline)
            timeout = min(timeout, max(0.0, min(o.deadline for o in self.conns.opening.values()) - now))
        self.gaps.idle(time.monotonic())
        ready = self.poller.poll(min(timeout, LINK_TURN) if self.links.local else timeout)
        self.gaps.woke(time.monotonic())
        if self.conns.opening:
            self.tend_openings(ready)
        if e.efd in ready:
            self.read_wake()
        if link.chan.sock in ready:
            while (msg := link.recv()) is not None:
                self.on_scheduler(msg)
        for i in range(len(self.conns)):
            ch = self.conns[i].tcp.chan
            if ch.sock in ready:
                self.on_answers(i, ch)
        if self.links.local:
            for server in self.links.tend():
                self.link_down(server)
        self.conns.flush()
        if e.control_queue:
            self.send_control(now)
        if self.ctrl and now >= self.next_ctrl:
            self.next_ctrl = now + max(0.02, self.cfg.retry_timeout / 4)
            self.resend_control(now)
        if not len(self.conns):
            return
        if e.tracker.queued:
            with e.lock:
                batches = e.tracker.take(now)
            self.send(batches)
        if e.tracker.pending and now >= self.next_scan:
            self.next_scan = now + max(0.02, min(ASK_AFTER, self.cfg.retry_timeout / 4))
            with e.lock:
                before = e.tracker.retries
                batches, warnings = e.tracker.due(now)
                resent = e.tracker.retries - before
            if resent:   # (said at WARNING only for a last resend, by the tracker)
                log.debug("worker %d: %d request(s) got no answer in %.1f s; sending again", e.rank, resent,
                          self.cfg.retry_timeout)
            for text in warnings:
                log.warning("worker %d: %s", e.rank, text)
            self.send(batches)
        self.settle()

    def settle(self) -> None:
        """Resolve the futures the tracker decided on (outside the lock: callbacks copy data),
        and wake a thread reading the links: its answer may be among them."""
        e = self.state
        if e.tracker.outcomes:
            with e.lock:
                outcomes, e.tracker.outcomes = e.tracker.outcomes, []
            settle(outcomes)
            self.links.wake_readers()

    def read_wake(self) -> None:
        """Drain the eventfd, then re-arm: in the other order a submit between the two would
        leave ``woken`` set with the eventfd empty, and its wake-up would be lost."""
        e = self.state
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(e.efd)
        with e.lock:
            e.woken = False

    def die(self, exc: PSError) -> None:
        """The job failed: fail every request, now and later; exit if the user doesn't."""
        e = self.state
        e.fatal = exc
        e.notice.up = True
        e.welcome.fail(exc)
        with e.lock:
            e.tracker.fail_all(exc)
            for req in e.control_queue:
                req.future.fail(exc)
            e.control_queue.clear()
        self.settle()
        self.links.wake_readers(always=True)
        print(f"psnode worker {e.rank}: {exc}", file=sys.stderr, flush=True)
        threading.Thread(target=self._exit_later, daemon=True).start()

    def _exit_later(self) -> None:
        """A failed job must not leave this process running: exit if the user doesn't."""
        time.sleep(EXIT_GRACE)
        if not self.state.closing:
            print(f"psnode worker {self.state.rank}: exiting: the job failed", file=sys.stderr, flush=True)
            os._exit(1)

    # ------------------------------------------------------------ scheduler
    def on_scheduler(self, msg: Control) -> None:
        """Every message from the scheduler: WELCOME, barrier and finish answers, server
        changes, and the end of the job (raised as PeerLost)."""
        body = msg.body
        if isinstance(body, Welcome) and not len(self.conns):
            self.welcome(body)
        elif isinstance(body, Welcome):   # again (a restarted scheduler): what waits for it, again now
            self.resend_control(time.monotonic(), every=True)
        elif isinstance(body, BarrierDone):
            if body.members:   # (an elastic job's: the members when it completed, agreed by all)
                with self.state.lock:
                    self.state.agreed = (body.generation, tuple(body.members))
            for slot in [s for s in self.ctrl if s[0] is Command.BARRIER and s[1] <= body.n]:
                self.ctrl.pop(slot).future.set(Ok(0))
        elif isinstance(body, Membership):
            self.on_membership(body)
        elif msg.cmd is Command.FINISH_ACK and (Command.FINISH, 0) in self.ctrl:
            self.ctrl.pop((Command.FINISH, 0)).future.set(Ok(0))
        elif isinstance(body, Servers):
            self.on_servers(body)
        elif isinstance(body, JobEnd):   # PEER_LOST or SHUTDOWN
            raise PeerLost(f"job {self.cfg.job_id} ended: {body.reason}")

    def on_membership(self, body: Membership) -> None:
        """A membership change (or a request to leave): kept for the user's thread."""
        e = self.state
        with e.lock:
            if body.generation < e.generation:
                return
            if body.generation > e.generation or tuple(body.active) != e.members:
                e.changes.append((body.generation, tuple(body.active)))
                if timeline.current is not None:
                    timeline.current.instant("membership", generation=body.generation, workers=list(body.active))
            e.generation, e.members = body.generation, tuple(body.active)
            e.leaving = e.leaving or e.rank in body.leave
            if e.changes or e.leaving:
                e.notice.up = True

    def welcome(self, body: Welcome) -> None:
        e = self.state
        assert self.t is not None
        e.rank = body.rank
        e.restarts = body.restarts
        e.barriers_before = body.barriers
        e.joiner = body.joiner
        with e.lock:
            e.generation, e.members = body.generation, tuple(body.active)
        self.t.sender = f"worker:{e.rank}"
        if self.cfg.shm and shm.available():
            self.conns.staging = Staging(self.cfg.job_id, e.rank, e.tracker.journal.releases)
        book = {s.rank: s for s in body.servers}
        for rank in range(body.num_servers):
            s = book.get(rank)
            if s is not None:
                self.connect(rank, s.host, s.port)
            else:   # (being replaced: its requests wait for SERVERS restored)
                with e.lock:
                    e.tracker.down.add(rank)
                ch = self.t.dealer("", 0, f"w{e.rank}", connect=False)
                self.conns.vacate(rank, ch)
                self.poller.add(ch)
        e.welcome.set(Ok(0))

    def connect(self, server: int, host: str, port: int, wait: bool = True) -> None:
        """Point ``server`` at ``host:port`` (its connection: psnode.worker.connection; ``wait``
        False: its same-host handshake goes on in the turns, :meth:`tend_openings`)."""
        assert self.t is not None
        self.drop_opening(server)
        ch = self.t.dealer(host, port, f"w{self.state.rank}")
        self.conns.connect(server, host, port, ch, self.t.security, wait=wait)
        self.poller.add(ch)
        if server in self.conns.opening:
            self.poller.add(self.conns.opening[server].fileno())

    def drop_opening(self, server: int) -> None:
        """Give up the same-host handshake under way with ``server``, if any."""
        if server in self.conns.opening:
            self.poller.remove(self.conns.opening[server].fileno())
            self.conns.cancel(server)

    def tend_openings(self, ready: set) -> None:
        """The same-host handshakes under way: those answered end (the link is up, or TCP goes
        on), those past their deadline are given up."""
        now = time.monotonic()
        for server, opening in list(self.conns.opening.items()):
            fd = opening.fileno()
            if fd in ready or now >= opening.deadline:
                self.poller.remove(fd)
                if fd in ready:
                    self.conns.opened(server)
        self.conns.expired(now)

    def on_servers(self, body: Servers) -> None:
        """A server is down (its requests wait) or was replaced (reconnect, resend)."""
        e = self.state
        assert self.t is not None
        if body.down is not None:
            with e.lock:
                e.tracker.down.add(body.down)
            log.warning("worker %d: server %d is down; waiting for its replacement", e.rank, body.down)
            return
        rank = body.restored
        if rank is None or not 0 <= rank < len(self.conns):
            return
        row = body.address()
        old = self.conns[rank].tcp.chan
        self.poller.remove(old)
        old.close()
        self.link_down(rank)
        self.connect(rank, row.host, row.port, wait=False)   # (it may still be restoring: never wait for it)
        with e.lock:
            batch = e.tracker.restored(rank, time.monotonic())
        if timeline.current is not None:
            timeline.current.instant("failover", server=rank)
        log.warning("worker %d: server %d restarted at %s:%s; resending %d request(s)",
                    e.rank, rank, row.host, row.port, len(batch))
        self.send({rank: batch})

    def send_control(self, now: float) -> None:
        e, link = self.state, self.link
        assert link is not None
        with e.lock:
            queue = list(e.control_queue)
            e.control_queue.clear()
        for req in queue:
            if req.cmd is Command.BARRIER:
                e.barriers += 1
                req.body = Barrier(e.barriers)
                link.send_barrier(req.body.to_body())
            elif req.cmd is Command.FINISH:
                link.send_finish(req.body.to_body())
            else:
                link.chan.send(req.cmd, req.body.to_body())
            if req.cmd is Command.BYE:
                req.future.set(Ok(0))
            else:
                req.sent = now
                self.ctrl[req.slot] = req

    def resend_control(self, now: float, every: bool = False) -> None:
        """Send BARRIER/FINISH again when unanswered for ``retry_timeout`` (lost on the way, or
        still waiting: the scheduler answers a repeat and never counts it twice); ``every``: all
        of them now."""
        assert self.link is not None
        for req in self.ctrl.values():
            if every or now - req.sent >= self.cfg.retry_timeout:
                if req.cmd is Command.BARRIER:
                    self.link.send_barrier(req.body.to_body())
                else:
                    self.link.chan.send(req.cmd, req.body.to_body())
                req.sent = now

    def rejoin_report(self) -> Rejoin:
        """What this worker tells a restarted scheduler (psnode.scheduler.rebuild)."""
        e = self.state
        pending = [n for cmd, n in self.ctrl if cmd is Command.BARRIER]
        done = min(pending) - 1 if pending else e.barriers
        with e.lock:
            generation, members = e.generation, e.members
        return Rejoin(restarts=e.restarts, barriers=max(done, e.barriers_before), joiner=e.joiner,
                      generation=generation, active=tuple(members))

    # ------------------------------------------------------------ servers
    def link_down(self, server: int) -> None:
        """Take down the same-host link to ``server`` (if any): it is served over TCP."""
        self.drop_opening(server)
        if self.conns.link_down(server):
            e = self.state
            busy = (e.fatal is None and not e.closing   # (the job ending takes every link down)
                    and any(p.request.server == server for p in e.tracker.pending.values()))
            (log.warning if busy else log.info)(
                "worker %d: the same-host link to server %d closed; using TCP", e.rank, server)

    def on_answers(self, server: int, ch: Channel) -> None:
        while (got := ch.recv()) is not None:
            self.answered(server, got[1], io_thread=True)

    def answered(self, server: int, msg: Message, io_thread: bool) -> None:
        """Feed the answers of ``msg`` to the tracker, send what they release and resolve their
        futures (in the thread that read them: the I/O thread, or one reading the links)."""
        e = self.state
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
            if self.conns.local and tracker.queued:   # e.g. a push held back by this pull
                for s, ops in tracker.take(now, self.conns.local).items():
                    resend.setdefault(s, []).extend(ops)
            outcomes, tracker.outcomes = tracker.outcomes, []
        if resend:
            self.send(resend, io_thread)
        if outcomes:   # (as IoLoop.settle: outside the lock, callbacks copy data)
            settle(outcomes)
            if io_thread:
                self.links.wake_readers()

    def send(self, batches: Batches, io_thread: bool = True) -> None:
        """Send each server its operations, through its connection."""
        self.conns.send(batches, io_thread)


__all__ = ["BATCH_BYTES", "BATCH_OPS", "EXIT_GRACE", "IoLoop"]
