"""The server role: one poll loop over the workers' ROUTER and the scheduler link.

A server binds its ROUTER to the configured host (never a wildcard), registers with the
scheduler, and serves DATA messages through :class:`psnode.server.store.Store`.  Workers
connect with the routing identity ``w<rank>``.  Malformed messages and operations are answered
with an error or dropped, never fatal.  The loop ends when the scheduler says SHUTDOWN (exit 0,
after a final checkpoint if configured), PEER_LOST, or goes silent (exit 1).

A server restarted inside its job (``mxdist launch --max-restarts`` with ``--checkpoint-dir``)
gets WELCOME with ``restore``: it loads its last checkpoint -- exactly the state it had when
that was written (psnode.server.checkpoint) -- and serves at once; the workers resend what it may have
missed (every push their journals hold, every unanswered request; duplicates are applied once).
Such a server is *restartable*: it writes a checkpoint at the start, and before any reply that
would tell a worker something the last one lacks (:meth:`Store.release`: a new key, the count a
restarted worker resumes from, a flush, every ``checkpoint_rounds`` completed rounds), so the
exactly-once invariant of psnode.worker.journal holds across its restarts.

**Nothing long on the loop** (psnode.loopgap): no copy, checkpoint, restore, fill or export may
hold the loop for more than about 100 ms, so heartbeats and replies keep flowing while big state
moves; each turn ticks ``gaps``, and every heartbeat carries the longest gap of the last window
with the state's size and the bytes copied and checkpointed (``mxdist status``).
"""
from __future__ import annotations

import gc
import logging
import sys
import time
from typing import Any

from psnode import timeline
from psnode.config import NodeConfig
from psnode.errors import ConfigError, PeerLost, PSError
from psnode.loopgap import LoopGap
from psnode.net.link import SchedulerLink
from psnode.net.security import Security
from psnode.net.transport import Poller, Transport
from psnode.protocol import Command, Message, failure
from psnode.protocol.control import (
    Bye,
    Control,
    Counters,
    JobEnd,
    Membership,
    Rejoin,
    ServerAddress,
    Servers,
    Welcome,
)
from psnode.samehost import segments as shm
from psnode.server import chain as disk
from psnode.server import checkpoint
from psnode.server.points import Points
from psnode.server.replicas import EPOCH_BITS, Keeper, Replicator, fetch
from psnode.server.replies import Reply
from psnode.server.routes import Routes
from psnode.server.samehost import SameHost
from psnode.server.store import Store

log = logging.getLogger("psnode.server")


LINK_BURST = 8    # rounds of link messages handled between two full polls
POINT_POLL_S = 0.001   # the longest poll while a durable point completes in the background


class Server:
    def __init__(self, cfg: NodeConfig) -> None:
        self.cfg = cfg
        self.t = Transport(cfg.job_id, "server", cfg.max_message_bytes, Security.load(cfg.key_file))
        self.chan, self.port = self.t.router(cfg.host, cfg.port)
        self.poller = Poller()
        self.routes = Routes(self.chan)   # (a worker's is TCP until self.local admits its link)
        self.local: SameHost | None = None
        if cfg.shm and shm.available():
            try:
                self.local = SameHost(cfg.job_id, cfg.host, self.port, cfg.workers_max,
                                      cfg.max_message_bytes, self.poller, self.t.security, self.routes)
            except OSError as exc:
                log.warning("no same-host data link (%s); workers on this host use TCP", exc)
        arena = self.local.arena if self.local is not None else None
        self.store = Store(cfg.num_workers, check_finite=cfg.skip_nonfinite,
                           alloc=arena.array if arena else None, adopt=arena.adopt if arena else None,
                           restartable=cfg.servers_restartable)
        #: holds the other servers' copies (psnode.server.replicas); sends this one's: replicator
        self.keeper = (Keeper(cfg, self.t.security)
                       if cfg.replicas > 1 and cfg.num_servers > 1 and cfg.servers_restartable else None)
        if self.keeper is not None:
            if cfg.restart_count:   # (a replacement restores first: its link is for that)
                self.keeper.hold()
            self.keeper.start()
        # (copies and checkpoints carry what changed since the last durable point)
        self.store.track_changes = self.keeper is not None or bool(cfg.checkpoint_dir)
        self.replicator: Replicator | None = None
        #: when answers may leave, and the checkpoints and copies behind them
        self.points = Points(self.store, self._send, cfg.checkpoint_rounds, cfg.dead_after)
        self.book: tuple[ServerAddress, ...] = ()
        self.recopy = False                   # a holder was replaced: copy the state to it
        self.deferred: list[Control] = []     # scheduler messages that came during a copy
        self.link = SchedulerLink(self.t, cfg, "server", self.port, self._stats,
                                  replica=self.keeper.port if self.keeper is not None else 0)
        self.link.report = self._rejoin_report
        self.rank = -1
        self.next_checkpoint = float("inf")
        self.gaps = LoopGap()                 # the longest gap between two turns of run()'s loop (psnode.loopgap)

    def _stats(self) -> Counters:
        local_in, local_out = self.local.bytes if self.local is not None else (0, 0)
        dropped = self.t.dropped + (self.local.dropped if self.local is not None else 0)
        rep = self.replicator
        awaited = self.store.key_rounds.awaited   # (whom the others waited for: psnode.server.awaited)
        return Counters(pushes=self.store.pushes, pulls=self.store.pulls, bytes_in=self.chan.bytes_in + local_in,
                        bytes_out=self.chan.bytes_out + local_out, rounds=self.store.rounds, dropped=dropped,
                        refused=self.t.refused, awaited=tuple(sorted(awaited.totals().items())),
                        waiting=tuple(sorted(awaited.waiting().items())),
                        late=tuple(sorted(awaited.late.items())), state_bytes=self.store.state_bytes(),
                        copied=rep.copied if rep is not None else 0, checkpointed=self.points.written,
                        loop_gap_us=self.gaps.longest_us(time.monotonic()),
                        lag=self._lag(), tables=self.store.table_counts())

    def _lag(self) -> tuple[tuple[int, ...], ...]:
        """Per holder of this server's replicas, how many copies it is behind the latest one
        (one that never acknowledged any: every copy this server made), and while it gets the
        state whole in chunks, the bytes of it acknowledged and the copy's bytes."""
        rep = self.replicator
        if rep is None:
            return ()
        made = rep.seq & ((1 << EPOCH_BITS) - 1)
        whole = rep.progress()
        return tuple((h, rep.seq - rep.have[h] if h in rep.have else made, *whole.get(h, ())) for h in rep.ranks)

    def _rejoin_report(self) -> Rejoin:
        """What this server tells a restarted scheduler (psnode.scheduler.rebuild): the membership
        as the last MEMBERSHIP said."""
        rules = self.store.rules
        return Rejoin(restarts=self.cfg.restart_count, generation=rules.generation,
                      active=tuple(sorted(rules.active)), joined=tuple(sorted(rules.joiners)))

    # ------------------------------------------------------------ data
    def _on_data(self, ident: bytes, msg: Message) -> None:
        if msg.cmd is not Command.DATA or not ident.startswith(b"w") or not ident[1:].isdigit():
            log.warning("dropped %s from %r: not a worker data message", msg.cmd.value, ident)
            return
        worker = int(ident[1:])
        if worker >= self.cfg.workers_max:
            self.t.dropped += 1
            log.warning("dropped data from %r: no such worker in a job of %d", ident, self.cfg.workers_max)
            return
        if msg.ops is None:
            self.t.dropped += 1
            log.warning("dropped data message from %r: not a binary data message", ident)
            return
        self._on_ops(worker, msg.ops)

    def _on_ops(self, worker: int, ops: list[Any]) -> None:
        replies: list[Reply] = []
        for op in ops:
            replies.extend(self.store.handle(worker, op))
        while self.store.events:
            log.warning("%s", self.store.events.pop(0))
        self._reply(replies)

    def _reply(self, replies: list[Reply]) -> None:
        """Send replies, after the durable point they need (psnode.server.points)."""
        self.points.reply(replies, self._pump)

    # ------------------------------------------------------------ restore
    def _restore(self) -> None:
        """Load this rank's state: the newest copy its replicas hold, else its last checkpoint
        (either is the state this server had when it was made)."""
        if self.keeper is not None:
            cfg = self.cfg
            got = fetch(self.t, self.rank, self.book, cfg.num_servers, cfg.replicas, self._pump,
                        timeout=cfg.dead_after + 10.0)
            parts = checkpoint.restore(self.store, got.meta, got.arrays, same_job=True, pump=self._pump)
            log.warning("server %d restored %d key parts from its replica on server %d; serving again",
                        self.rank, parts, got.holder)
            if self.replicator is not None:   # (the holders of that very copy get only what changes)
                self.replicator.adopt(got.seq, got.holders)
            self.recopy = True   # (a copy numbered as this process's: whole to a holder with an older one)
            return
        where = self.cfg.checkpoint_dir
        if not where:
            raise ConfigError(f"server {self.rank} was restarted, but the job has no checkpoint "
                              "directory to restore its shard from (mxdist launch --checkpoint-dir)")
        try:
            parts, chain, last = disk.load(where, self.rank, self.store, same_job=True, pump=self._pump)
            self.points.chain = disk.Chain(where, self.rank, self.cfg.job_id, last, based=chain == self.cfg.job_id)
        except ConfigError as exc:
            raise ConfigError(f"server {self.rank} was restarted but cannot restore its shard: {exc}; "
                              "every server that may be restarted writes one when it starts, so the "
                              "checkpoint directory must be where the job's servers can all write") from None
        log.warning("server %d restored %d key parts from %s; serving again", self.rank, parts,
                    checkpoint.path_for(where, self.rank))

    def _send(self, replies: list[Reply]) -> None:
        """Each worker's replies through its route (psnode.server.routes: over its same-host
        link when it has one)."""
        by_worker: dict[int, list[Reply]] = {}
        for r in replies:
            by_worker.setdefault(r.worker, []).append(r)
        for worker, group in by_worker.items():
            self.routes.to(worker).send(group)

    # ------------------------------------------------------------ scheduler
    def _membership(self, body: Membership) -> None:
        """The active workers (MEMBERSHIP, always the full list): rounds waiting only for
        leavers complete.  The same set again changes nothing and costs no pass over the keys."""
        active, rules = set(body.active), self.store.rules
        if active != rules.active or body.generation != rules.generation or set(body.joined) != rules.joiners:
            self._reply(self.store.set_membership(active, body.generation, set(body.joined)))

    def _take_book(self, book: tuple[ServerAddress, ...]) -> None:
        """The servers' addresses: a replaced holder gets this server's state (``recopy``)."""
        self.book = book
        if self.replicator is not None and self.replicator.repoint(book):
            self.recopy = True

    def _pump(self) -> None:
        """The scheduler link while a copy or a restore waits: heartbeats, address book changes;
        the rest waits in ``deferred`` (a failed job ends the wait: PeerLost)."""
        self.link.tick(time.monotonic())
        while (m := self.link.recv()) is not None:
            if isinstance(m.body, Servers) and m.body.restored is not None:
                self._take_book(m.body.servers)
            elif isinstance(m.body, JobEnd) and not (m.cmd is Command.SHUTDOWN and m.body.ok):
                raise PeerLost(m.body.reason)
            else:
                self.deferred.append(m)

    def _on_scheduler(self, msg: Control) -> int | None:
        body = msg.body
        if isinstance(body, Welcome) and self.rank >= 0:
            self._take_book(body.servers)  # a repeat, or a scheduler that took the job over
        elif isinstance(body, Welcome):
            self.rank = body.rank
            self.t.sender = f"server:{self.rank}"
            if self.keeper is not None:
                self.replicator = self.points.replicator = Replicator(
                    self.t, self.rank, self.cfg.num_servers, self.cfg.replicas,
                    restart_count=max(body.restarts, self.cfg.restart_count))
            self._take_book(body.servers)
            self.recopy = False
            if self.cfg.checkpoint_dir:   # (a restore below continues the chain it loads)
                self.points.chain = disk.Chain(self.cfg.checkpoint_dir, self.rank, self.cfg.job_id)
            if timeline.start(self.cfg.timeline, "server", self.rank, self.cfg.restart_count) is not None:
                rounds, fused = self.store.key_rounds, self.store.fused   # (a key's round; a bucket's)
                rounds._apply = timeline.traced(rounds._apply, "apply")  # type: ignore[method-assign]
                fused._complete = timeline.traced(fused._complete, "apply")  # type: ignore[method-assign]
            if body.restore:
                self.store.active = set(body.active)
                self.store.rules.joiners, self.store.rules.generation = set(body.joined), body.generation
                self._restore()
            else:
                self._reply(self.store.set_membership(set(body.active), body.generation, set(body.joined)))
                if self.cfg.checkpoint_dir and self.cfg.resume:
                    disk.load(self.cfg.checkpoint_dir, self.rank, self.store)
                if self.store.restartable:   # (a restart before any other checkpoint restores this)
                    self._checkpoint()
            if self.keeper is not None:   # (restored: whole copies are taken again)
                self.keeper.free()
            if self.cfg.checkpoint_dir and self.cfg.checkpoint_interval > 0:
                self.next_checkpoint = time.monotonic() + self.cfg.checkpoint_interval
        elif isinstance(body, Membership):
            self._membership(body)
        elif isinstance(body, Servers) and body.restored is not None:
            self._take_book(body.servers)
        elif isinstance(body, JobEnd) and msg.cmd is Command.SHUTDOWN and body.ok:
            self._checkpoint(final=True)
            self.link.chan.send(Command.BYE, Bye().to_body())
            return 0
        elif isinstance(body, JobEnd):   # SHUTDOWN (failed) or PEER_LOST
            raise PeerLost(body.reason)
        return None

    def _checkpoint(self, final: bool = False) -> None:
        """Make this server's state durable now, the loop waiting (psnode.server.points: on disk
        with ``--checkpoint-dir`` and, but at the job's end (``final``), at every holder of its
        replicas); only then are its pushes durable (psnode.server.store)."""
        if self.rank < 0:
            return
        start = time.time_ns()
        self.points.point(self._pump, final)
        if timeline.current is not None:
            timeline.current.span("replicate" if self.replicator is not None and not final else "checkpoint", start)

    # ------------------------------------------------------------ loop
    def run(self) -> int:
        poller = self.poller
        poller.add(self.chan)
        poller.add(self.link.chan)
        sched_sock = self.link.chan.sock
        try:
            while True:
                now = time.monotonic()
                self.link.tick(now)
                if now >= self.next_checkpoint:
                    self._checkpoint()
                    self.next_checkpoint = now + self.cfg.checkpoint_interval
                filling = bool(self.store.filling.pending)   # (parts to compute: psnode.server.fills)
                evicting = self.store.evict_due()            # (rows to evict: psnode.server.dynparts)
                busy = self.points.pending is not None       # (a durable point in the background)
                self.gaps.idle(time.monotonic())
                ready = poller.poll(0 if filling or evicting or self.deferred else
                                    min(POINT_POLL_S, self.link.timeout(now)) if busy else self.link.timeout(now))
                self.gaps.woke(time.monotonic())
                if busy:
                    self.points.poll(self._pump)
                while self.deferred:
                    code = self._on_scheduler(self.deferred.pop(0))
                    if code is not None:
                        return code
                if sched_sock in ready:
                    while (m := self.link.recv()) is not None:
                        code = self._on_scheduler(m)
                        if code is not None:
                            return code
                if self.recopy and self.rank >= 0:
                    self.recopy = False
                    self.points.now(self._pump)
                if self.chan.sock in ready and self.rank >= 0:
                    for _ in range(64):  # bounded, so heartbeats keep flowing
                        got = self.chan.recv(routed=True)
                        if got is None:
                            break
                        self._on_data(got[0] or b"", got[1])
                if self.local is not None and ready and self.rank >= 0:
                    for _ in range(LINK_BURST):   # then the full poll again: heartbeats, TCP
                        msgs = self.local.on_ready(ready)
                        for worker, msg in msgs:
                            if msg.ops is not None:
                                self._on_ops(worker, msg.ops)   # (an admitted link: no checks to make)
                            else:
                                self._on_data(b"w%d" % worker, msg)
                        if not msgs or not (ready := self.local.waiting()):
                            break
                if filling and self.rank >= 0:
                    self._reply(self.store.fill_some())
                if evicting:
                    self.store.evict_some()
        except PeerLost as exc:
            failure.write(self.cfg.error_file, "job_ended", "server", self.rank, self.cfg.host, exc=exc)
            print(f"psnode server {self.rank}: {exc}", file=sys.stderr, flush=True)
            return 1
        except ConfigError as exc:  # e.g. nothing to restore from: the job fails, naming it
            self.link.fail(str(exc))
            print(f"psnode server {self.rank}: {exc}", file=sys.stderr, flush=True)
            return 1
        except Exception as exc:  # a bug: tell the scheduler now rather than go silent
            restart = bool(self.cfg.checkpoint_dir) and self.cfg.restart_count < self.cfg.max_restarts
            self.link.fail(f"server {self.rank} failed: {type(exc).__name__}: {exc}", restart=restart)
            raise
        finally:
            if self.local is not None:
                self.local.close()
            if self.replicator is not None:
                self.replicator.close()
            self.points.close()
            if self.keeper is not None:
                self.keeper.close()
            self.link.close()
            self.t.close(linger_ms=200)


def main(cfg: NodeConfig) -> int:
    try:
        server = Server(cfg)
        # a server's garbage is acyclic and short-lived (freed by reference counts): collect
        # rarely, and never re-scan what start-up made
        gc.freeze()
        gc.set_threshold(50_000, 50, 100)
        return server.run()
    except PSError as exc:
        print(f"psnode server: {exc}", file=sys.stderr, flush=True)
        return 1


__all__ = ["Server", "main"]
