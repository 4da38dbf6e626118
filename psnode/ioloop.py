"""The worker's I/O thread: one poll loop over the scheduler link and the server channels.

:class:`IoLoop` holds everything the thread owns (transport, poller, scheduler link, one
channel per server, control requests awaiting answers) and does, each turn: heartbeat, poll,
scheduler messages (:meth:`IoLoop.on_scheduler`), server answers (fed to the tracker), control
requests, queued requests, retries.  Every socket is used only by this thread.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from psnode.config import NodeConfig
from psnode.errors import PeerLost, PSError
from psnode.link import SchedulerLink, lost_message
from psnode.protocol import Command, Message, Ok, Op
from psnode.tracker import Batches
from psnode.transport import Channel, CurveKeys, Poller, Transport

if TYPE_CHECKING:
    from psnode.worker import ControlRequest, Engine

log = logging.getLogger("psnode.worker")

BATCH_BYTES = 512 * 2**10      # fuse small requests up to this size per message
BATCH_OPS = 512


class IoLoop:
    """The state of the worker's I/O thread (see the module docstring)."""

    def __init__(self, engine: Engine) -> None:
        self.e = engine
        self.cfg: NodeConfig = engine.cfg
        self.t: Transport | None = None
        self.poller = Poller()
        self.link: SchedulerLink | None = None
        self.servers: list[Channel] = []
        self.ctrl: dict[tuple[Command, int], ControlRequest] = {}
        self.next_scan = 0.0
        self.next_ctrl = 0.0

    # ------------------------------------------------------------ for other threads
    def address(self, server: int) -> str:
        chans = self.servers
        return chans[server].address if server < len(chans) else f"server {server}"

    def bytes(self) -> tuple[int, int]:
        chans = list(self.servers)
        return sum(c.bytes_in for c in chans), sum(c.bytes_out for c in chans)

    # ------------------------------------------------------------ the loop
    def run(self) -> None:
        e = self.e
        keys = CurveKeys.load(self.cfg.key_file) if self.cfg.key_file else None
        self.t = Transport(self.cfg.job_id, "worker", self.cfg.max_message_bytes, keys)
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

    def turn(self, now: float) -> None:
        e, link = self.e, self.link
        assert link is not None
        link.tick(now)
        ready = self.poller.poll(link.timeout(now))
        if e.efd in ready:
            e.read_wake()
        if link.chan.sock in ready:
            while (msg := link.recv()) is not None:
                self.on_scheduler(msg)
        for i, ch in enumerate(self.servers):
            if ch.sock in ready:
                self.on_answers(i, ch)
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
    def on_scheduler(self, msg: Message) -> None:
        """Every message from the scheduler: WELCOME, barrier and finish answers, server
        changes, and the end of the job (raised as PeerLost)."""
        if msg.cmd is Command.WELCOME and not self.servers:
            self.welcome(msg.body)
        elif msg.cmd is Command.BARRIER_DONE:
            done = msg.body.get("n")
            for slot in [s for s in self.ctrl if s[0] is Command.BARRIER
                         and (not isinstance(done, int) or s[1] <= done)]:
                self.ctrl.pop(slot).future.set(Ok(0))
        elif msg.cmd is Command.FINISH_ACK and (Command.FINISH, 0) in self.ctrl:
            self.ctrl.pop((Command.FINISH, 0)).future.set(Ok(0))
        elif msg.cmd is Command.SERVERS:
            self.on_servers(msg.body)
        elif msg.cmd in (Command.PEER_LOST, Command.SHUTDOWN):
            raise PeerLost(f"job {self.cfg.job_id} ended: {lost_message(msg)}")

    def welcome(self, body: dict[str, Any]) -> None:
        e = self.e
        assert self.t is not None
        e.rank = int(body["rank"])
        e.restarts = int(body.get("restarts", 0))
        barriers = body.get("barriers", 0)
        e.barriers_before = barriers if isinstance(barriers, int) and barriers > 0 else 0
        self.t.sender = f"worker:{e.rank}"
        for _, host, port in body["servers"]:
            ch = self.t.dealer(host, int(port), f"w{e.rank}")
            self.servers.append(ch)
            self.poller.add(ch)
        e.welcome.set(Ok(0))

    def on_servers(self, body: dict[str, Any]) -> None:
        """A server is down (its requests wait) or was replaced (reconnect, resync, resend)."""
        e = self.e
        assert self.t is not None
        if isinstance(body.get("down"), int):
            with e.lock:
                e.tracker.down.add(body["down"])
            log.warning("worker %d: server %d is down; waiting for its replacement", e.rank, body["down"])
            return
        rank, book = body.get("restored"), body.get("servers")
        if not isinstance(rank, int) or not isinstance(book, list) or not 0 <= rank < len(self.servers):
            return
        row = next((r for r in book if isinstance(r, list) and len(r) == 3 and r[0] == rank), None)
        if row is None:
            return
        old = self.servers[rank]
        self.poller.remove(old)
        old.close()
        ch = self.t.dealer(str(row[1]), int(row[2]), f"w{e.rank}")
        ch.bytes_in, ch.bytes_out = old.bytes_in, old.bytes_out
        self.servers[rank] = ch
        self.poller.add(ch)
        with e.lock:
            batch = e.tracker.restored(rank, time.monotonic())
        log.warning("worker %d: server %d restarted at %s:%s; resending %d request(s)",
                    e.rank, rank, row[1], row[2], len(batch) - 1)
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
                req.body["n"] = e.barriers
            link.chan.send(req.cmd, req.body)
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
                self.link.chan.send(req.cmd, req.body)
                req.sent = now

    # ------------------------------------------------------------ servers
    def on_answers(self, server: int, ch: Channel) -> None:
        e = self.e
        while (got := ch.recv()) is not None:
            msg: Message = got[1]
            if msg.cmd is not Command.DATA_REPLY or msg.ops is None:
                continue
            now = time.monotonic()
            resend: Batches = {}
            with e.lock:
                for ans in msg.ops:
                    for s, ops in e.tracker.answered(server, ans, now).items():
                        resend.setdefault(s, []).extend(ops)
            if resend:
                self.send(resend)

    def send(self, batches: Batches) -> None:
        """Send each server its operations, fused into messages of at most BATCH_BYTES."""
        for server, ops in batches.items():
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
