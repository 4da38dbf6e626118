"""The scheduler role: registration, ranks, address book, barriers, liveness, shutdown.

Life of a job as the scheduler sees it:

0. It binds its address (``PSNODE_SCHEDULER``); with ``PSNODE_ADDRESS_FILE`` set, a port found
   taken is replaced by a free one, and the address bound is written to that file for the
   launcher, which gives it to every other process.  ``python -m psnode`` binds it first thing,
   before loading pyzmq (:mod:`psnode.net.listen`), so the launcher waits for no import.
1. Every node sends REGISTER (role, host, port, pid, wished rank) and then heartbeats.  When
   ``num_workers`` workers and ``num_servers`` servers have registered, each gets WELCOME with
   its rank and the servers' addresses.  Ranks honour the wish (the launcher's rank), else the
   lowest free one.  Not complete within ``register_timeout``: everyone is told and the
   scheduler exits 1.
2. BARRIER completes when every active (not finished) worker has entered it.  Workers number
   their barriers and send BARRIER (and FINISH) again until answered: a repeat of a completed
   barrier (or of FINISH) is answered again, never counted twice.
3. A worker sends FINISH when done (``kv.close()`` or interpreter exit).  Servers are told the
   active set (MEMBERSHIP, the full list) so sync rounds go on over the workers still active:
   once per scheduler turn for all the FINISHes it handled, and before a BARRIER_DONE or the
   job's end (:mod:`psnode.scheduler.roster` keeps the indexes, so no message rescans the job).  When every
   worker has finished, servers get SHUTDOWN, answer BYE, and the scheduler exits 0.
4. Heartbeats come from each node, or batched per host by the host's relay (HEARTBEATS,
   psnode.net.relay): each entry is handled as its node's own HEARTBEAT (an entry without
   counters: the node's counters did not change), and the relay is answered once for the batch.
   A relay's BARRIERS (the barrier entries of its host's workers, together) are handled entry by
   entry as each worker's BARRIER; each worker is answered directly.
   A node silent for ``heartbeat_interval * heartbeat_liveness`` seconds is dead (checked every
   quarter heartbeat interval, 0.05 to 0.25 s: each check visits every node, so it runs on a
   clock, never once per message).  Everyone else
   gets PEER_LOST naming it (role, rank, host, pid, seconds silent) and the scheduler exits 1 --
   unless restarts are allowed (``max_restarts``; for a server, only when servers checkpoint):
   then the job waits up to ``register_timeout`` for a replacement registering with the same
   rank; meanwhile the node is RESTARTING, and a worker stays a member of the rounds (servers
   never complete a round without it: its replacement pushes); a worker so awaited that speaks
   again (it was stopped or starved, not dead) is taken back.  Workers are told a server is
   down (SERVERS ``down``: their requests to it wait) and, when its replacement registered, the
   new address book (SERVERS ``restored``): they reconnect and resend what the restored server
   may have missed (psnode.worker.journal).  The replacement's WELCOME says ``restore``: it loads its
   shard from the last checkpoint.
5. STATUS (from ``mxdist status``) is answered with the node table (:class:`psnode.protocol.status.NodeRow`
   objects: counters from the heartbeats, and the rate of rounds (servers) or pushes (workers)
   per second over the last heartbeats); STOP ends the job.
6. A job whose live workers all wait for each other (heartbeats say what each waits for) ends
   after the heartbeat timeout, the verdict naming the cycle (:mod:`psnode.scheduler.waitfor`;
   checked once a heartbeat interval).
   The same reports, and the barriers, say per worker how long the others waited for it
   (STATUS rows' ``waited_for``), and a wait longer than ``stall_warning`` is logged as a
   warning naming whom it waits for (:mod:`psnode.scheduler.slowness`).
7. Elastic membership (``min_workers`` / ``max_workers``, :mod:`psnode.scheduler.elastic`): a
   worker registering after the first generation (up to ``max_workers`` members) joins the
   running job with the launcher's rank (a rank in use is refused, naming it) and WELCOME
   ``joiner``; one registering before the first generation is complete waits for it.  LEAVE
   (``mxdist scale`` down) asks workers to leave at their next push (MEMBERSHIP ``leave`` to
   the workers: each flushes, FINISHes and exits 0).  LOST (the launcher saw a worker's
   process die for good), or a worker's heartbeats stopping in a job whose membership may
   change (``min_workers < num_workers`` or ``max_workers > num_workers``) and that will not
   restart it, removes it at once: the servers' open rounds complete over the rest.  Every
   such change bumps the generation and sends MEMBERSHIP (the full list) to servers and
   workers; anything a lost worker sends later is answered SHUTDOWN.  Fewer than
   ``min_workers`` live workers is the launcher's to judge: the scheduler goes on and reports
   the membership (STATUS).
8. When the job fails, the scheduler writes its verdict to its failure record
   (``PSNODE_ERROR_FILE``, :mod:`psnode.protocol.failure`): the node it blames (one that reported a
   failure, or one silent past the heartbeat timeout) and when that node failed or was last
   heard from, so the launcher names the root cause and not the processes it took down.
9. A standby scheduler (``standby``: at its own address on another host) waits idle until a
   node comes over to it (its scheduler silent for the heartbeat timeout: psnode.net.link),
   then takes the job over exactly as a restarted one does (below).  Idle, it announces itself
   to the scheduler it stands by for (``primary``; STANDBY, every heartbeat interval until
   acknowledged, then every ``ANNOUNCE_EVERY`` intervals), which tells each of its nodes
   (STANDBY) and names it in every WELCOME: so a standby the launcher starts after a failover,
   for the scheduler that took the job over, is where the nodes go when that one is lost too.
10. A scheduler the launcher restarted (``restart_count > 0``, same address; it is killed or
   crashed) rebuilds the job from the live nodes (:mod:`psnode.scheduler.rebuild`): it answers
   a node it does not know with REJOIN; each welcomed node registers again with its rank and
   what it knows; after every expected node reported, or the heartbeat timeout, it welcomes
   them again, tells the servers the membership, and handles what was held meanwhile (barriers,
   finishes, registrations of new nodes, requests of the launcher).  Workers send an unanswered
   BARRIER or FINISH again on their new WELCOME.  Data does not pass the scheduler: rounds go on
   meanwhile.  Expected nodes that did not report count as silent since the restart.
"""
from __future__ import annotations

import gc
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from psnode import timeline
from psnode.config import NodeConfig, Role
from psnode.errors import ProtocolError, PSError
from psnode.files import write_atomic
from psnode.loopgap import LoopGap
from psnode.net.security import Plane, Security
from psnode.net.transport import Poller, Transport
from psnode.protocol import Command, Message, failure
from psnode.protocol.control import (
    Barrier,
    BarrierDone,
    Beats,
    BeatsAck,
    Body,
    Bye,
    Counters,
    Entries,
    Heartbeat,
    JobEnd,
    Lost,
    Membership,
    Register,
    ScaleDown,
    ServerAddress,
    Servers,
    Standby,
    StatusAnswer,
    Stop,
    Welcome,
    decode_body,
)
from psnode.protocol.status import SLOW_SHARE, NodeRow, NodeState, excesses
from psnode.scheduler import client
from psnode.scheduler.elastic import ElasticRoster
from psnode.scheduler.rebuild import Rebuild, done_elsewhere
from psnode.scheduler.roster import Roster, barrier_groups
from psnode.scheduler.slowness import Slowness, Stalls
from psnode.scheduler.waitfor import Watch

log = logging.getLogger("psnode.scheduler")
#: nodes from which the job's state, once built, is kept out of the garbage collector's passes
KEEP_FROM = 256

ANNOUNCE_EVERY = 10   # heartbeat intervals between an idle standby's announcements, once acknowledged


@dataclass
class Node:
    role: str
    host: str
    port: int
    pid: int
    ident: bytes
    wish: int | None
    rank: int = -1
    replica: int = 0       # a server's replica keeper port (0: none; psnode.server.replicas)
    state: NodeState = NodeState.REGISTERED
    started: float = field(default_factory=time.monotonic)
    last_seen: float = field(default_factory=time.monotonic)
    stats: Counters = field(default_factory=Counters)
    restarts: int = 0
    welcomed: float = 0.0  # when it was last sent WELCOME
    acked: float = 0.0     # when its heartbeat was last answered
    barrier_done: int = 0  # number of this worker's last completed barrier
    joiner: bool = False   # joined the running job (after the first generation)
    rate: float | None = None  # rounds (servers) or pushes (workers) per second
    _sample: tuple[float, int] | None = None  # (time, count) of the last heartbeat's counter
    per_round: tuple[float, float] | None = None   # a server's bytes copied, checkpointed per round
    _moved: tuple[int, int, int] | None = None      # (rounds, copied, checkpointed) at the last sample

    @property
    def name(self) -> str:
        return f"{self.role} {self.rank} on {self.host} (pid {self.pid})"

    def identity(self) -> failure.Culprit:
        return failure.Culprit(self.role, self.rank, self.host, self.pid)

    def update_stats(self, stats: Counters, now: float) -> None:
        """Take a heartbeat's counters; the rate is over the last few seconds of heartbeats."""
        self.stats = stats
        count = stats.rounds if self.role == Role.SERVER else stats.pushes
        if self._sample is None:
            self._sample = (now, count)
            self._moved = (stats.rounds, stats.copied, stats.checkpointed)
        elif now - self._sample[0] >= 1.0:
            self.rate = max(0.0, (count - self._sample[1]) / (now - self._sample[0]))
            self._sample = (now, count)
            moved = (stats.rounds, stats.copied, stats.checkpointed)
            if self._moved is not None and moved[0] > self._moved[0]:
                rounds = moved[0] - self._moved[0]
                self.per_round = (max(0, moved[1] - self._moved[1]) / rounds,
                                  max(0, moved[2] - self._moved[2]) / rounds)
            if self._moved is None or moved[0] > self._moved[0]:
                self._moved = moved

    def row(self, now: float, **more: Any) -> NodeRow:
        """Its ``mxdist status`` row (``more``: fields only the scheduler's tables know)."""
        s = self.stats
        return NodeRow(
            role=self.role, rank=self.rank, host=self.host, port=self.port, pid=self.pid,
            state=self.state.value, heartbeat_age=round(now - self.last_seen, 3),
            uptime=round(now - self.started, 3), restarts=self.restarts, pushes=s.pushes,
            pulls=s.pulls, bytes_in=s.bytes_in, bytes_out=s.bytes_out, rounds=s.rounds,
            rate=None if self.rate is None else round(self.rate, 2), dropped=s.dropped,
            refused=s.refused, retries=s.retries, loop_gap=s.loop_gap_us / 1e6,
            **(self._big_state() if self.role == Role.SERVER else {}), **more)

    def _big_state(self) -> dict[str, Any]:
        s = self.stats
        per = self.per_round
        return {"state_bytes": s.state_bytes, "copied": s.copied, "checkpointed": s.checkpointed,
                "copied_per_round": None if per is None else round(per[0]),
                "checkpointed_per_round": None if per is None else round(per[1]),
                "lag": [list(t) for t in s.lag], "tables": [list(t) for t in s.tables] or None}


class NodeTable(dict[bytes, Node]):
    """The job's nodes by identity; :attr:`version` counts insertions and removals (the address
    book is cached by it: a re-WELCOME of thousands of nodes never rebuilds it)."""

    version = 0

    def __setitem__(self, key: bytes, value: Node) -> None:
        super().__setitem__(key, value)
        self.version += 1

    def __delitem__(self, key: bytes) -> None:
        super().__delitem__(key)
        self.version += 1


#: what only a node of the job sends (answered REJOIN by a restarted scheduler that does not know it)
_NODE_COMMANDS = frozenset({Command.HEARTBEAT, Command.BARRIER, Command.FINISH, Command.BYE})
#: states whose node's messages take no short cut through a relay's batch (:meth:`Scheduler._handle`)
_ASIDE = frozenset({NodeState.LOST, NodeState.RESTARTING})


def _keep(nodes: dict[bytes, Node]) -> None:
    """The job's state is built (its start, or a take-over): the garbage collector's full passes
    leave what exists now out (at 10,000 nodes a pass over it stalls the loop about 100 ms, a
    barrier or a heartbeat's answer with it); only what is made from now on is scanned."""
    if len(nodes) >= KEEP_FROM:
        gc.collect()
        gc.freeze()


class Scheduler:
    def __init__(self, cfg: NodeConfig, listen_fd: int | None = None) -> None:
        self.cfg = cfg
        self.t = Transport(cfg.job_id, Role.SCHEDULER.value, 2**20, Security.load(cfg.key_file))
        # a launcher that reads the address file lets a taken port be replaced by a free one
        self.chan, port = self.t.router(cfg.host, cfg.scheduler_port, Plane.CONTROL,
                                        elsewhere=cfg.address_file is not None, fd=listen_fd)
        if port != cfg.scheduler_port:
            log.warning("scheduler: port %s on %s was taken; listening at %s:%s",
                        cfg.scheduler_port, cfg.host, cfg.host, port)
            self.cfg = cfg = replace(cfg, scheduler_port=port)
        if cfg.address_file and listen_fd is None:
            write_atomic(cfg.address_file, f"{cfg.host}:{port}\n")
        self.nodes = NodeTable()
        self._booked: tuple[tuple[int, bool], tuple[ServerAddress, ...]] = ((-1, False), ())   # (key, book)
        self.started = False
        self.t0 = time.monotonic()
        self.barrier: dict[bytes, int] = {}  # worker ident -> the number of the barrier it entered
        self.barrier_since: dict[bytes, float] = {}  # worker ident -> when it entered it
        self.exit_code: int | None = None
        self.shutdown_deadline: float | None = None
        self.ending: tuple[Command, JobEnd] | None = None  # what _end told everyone
        self.waiting_replacement: dict[tuple[str, int], float] = {}  # (role, rank) -> deadline
        self.gaps = LoopGap()   # the longest gap between two turns of run()'s loop (psnode.loopgap)
        self.roster = Roster()  # counts per role, active workers, pending MEMBERSHIP (psnode.scheduler.roster)
        self.watch = Watch(cfg.dead_after)  # the workers' waits: wait-for cycles (psnode.scheduler.waitfor)
        self.slowness = Slowness()          # whom the workers wait for (psnode.scheduler.slowness)
        self.stalls = Stalls(cfg.stall_warning)
        self.elastic = ElasticRoster(cfg.workers_max)  # generation, joiners, leavers (psnode.scheduler.elastic)
        self.early: dict[bytes, Node] = {}  # joiners registered before the first generation was complete
        timeline.start(cfg.timeline, Role.SCHEDULER.value, None)
        # a restarted scheduler: the live nodes' reports, until the job is rebuilt (psnode.scheduler.rebuild)
        self.rebuild: Rebuild | None = Rebuild(cfg.num_servers) if self.rebuilds else None
        self.rebuild_by = self.t0 + cfg.dead_after
        # a standby waits, idle, until the first node comes (its scheduler silent): then it takes over
        self.active = not cfg.standby
        self.primary_seen_until = 0.0   # the primary answered: no need to ask again before this
        self.held: list[tuple[bytes, Message]] = []  # what arrived while rebuilding, handled after
        #: seconds between the liveness and wait checks (each visits every node; not every turn)
        self.check_every = max(0.05, min(0.25, cfg.heartbeat_interval / 4))
        self.relayed = 0                # heartbeats that came through hosts' relays (psnode.net.relay)
        self.relaying = False           # handling a relayed batch: its nodes are answered by their relay
        self.relayed_entries = 0        # barrier entries that came through hosts' relays
        self.standby_at = ""            # the standby that announced itself ("": none), told to the nodes
        self.announce_at = 0.0          # an idle standby announces itself to its primary from then on
        #: a node's heartbeats are answered at most this often: every other one where the timeout
        #: is 4 intervals or more (a node calls its scheduler silent only after the whole timeout
        #: without an answer, psnode.net.link), every one otherwise
        self.ack_every = 1.5 * cfg.heartbeat_interval if cfg.dead_after >= 4 * cfg.heartbeat_interval else 0.0
        # one handler per command: those any peer may send (a node, a standby, the CLI), and those
        # only a registered node of the job may send (_dispatch)
        self._from_anyone: dict[Command, Callable[[bytes, Node | None, Any], None]] = {
            Command.REGISTER: self._register_msg, Command.STATUS: self._status_msg,
            Command.LEAVE: self._leave_msg, Command.LOST: self._lost_msg, Command.STOP: self._stop_msg}
        self._from_members: dict[Command, Callable[[Node, Any], None]] = {
            Command.HEARTBEAT: self._heartbeat_msg, Command.BARRIER: self._barrier_msg,
            Command.FINISH: self._finish_msg, Command.BYE: self._bye_msg}

    @property
    def rebuilds(self) -> bool:
        """Does this scheduler take a running job over from its live nodes (restarted, or the standby)?"""
        return self.cfg.restart_count > 0 or self.cfg.standby

    def _primary_answers(self) -> bool:
        """Does the scheduler this standby stands by for still answer (asked at most once per
        heartbeat interval; 1 s to answer)?  Two schedulers must never each hold part of a job."""
        if self.cfg.primary is None:
            return False
        now = time.monotonic()
        if now < self.primary_seen_until:
            return True
        try:
            client.status(self.cfg.primary, self.cfg.job_id, key_file=self.cfg.key_file, timeout=1.0)
        except PSError:
            return False
        self.primary_seen_until = now + self.cfg.heartbeat_interval
        log.warning("standby scheduler: a node came over, but the scheduler at %s still answers: not taking over",
                    self.cfg.primary)
        return True

    def _take_over(self) -> None:
        """The standby's first node: the job's scheduler is gone; rebuild the job from the live
        nodes within the heartbeat timeout from now (psnode.scheduler.rebuild)."""
        self.active = True
        self.t0 = time.monotonic()
        self.rebuild_by = self.t0 + self.cfg.dead_after
        log.warning("standby scheduler at %s:%s: a node came over; taking the job %s over from its live nodes",
                    self.cfg.host, self.cfg.scheduler_port, self.cfg.job_id)

    def _announce(self, now: float) -> None:
        """An idle standby tells its primary where it waits (1 s at most: it serves no one yet)."""
        if self.active or self.cfg.primary is None or now < self.announce_at:
            return
        host = self.cfg.scheduler_host
        own = f"[{host}]:{self.cfg.scheduler_port}" if ":" in host else f"{host}:{self.cfg.scheduler_port}"
        told = client.announce_standby(self.cfg.primary, self.cfg.job_id, own, key_file=self.cfg.key_file,
                                       timeout=min(1.0, self.cfg.heartbeat_interval))
        self.announce_at = time.monotonic() + self.cfg.heartbeat_interval * (ANNOUNCE_EVERY if told else 1)

    def _on_standby(self, address: str) -> None:
        """A standby scheduler announced itself: every node of the job (and each one welcomed
        later) goes over to it when this scheduler is silent for the heartbeat timeout."""
        if address == self.standby_at:
            return
        self.standby_at = address
        log.warning("a standby scheduler waits at %s: the nodes go over to it if this scheduler is lost", address)
        for n in self.nodes.values():
            if n.pid and n.state in (NodeState.REGISTERED, NodeState.ALIVE, NodeState.FINISHED):
                self._send(n, Command.STANDBY, Standby(address))

    # ------------------------------------------------------------ helpers
    def _send(self, node: Node | bytes, cmd: Command, body: Body | None = None) -> None:
        ident = node.ident if isinstance(node, Node) else node
        self.chan.send(cmd, None if body is None else body.to_body(), to=ident)

    def _live(self, role: str | None = None) -> list[Node]:
        return [n for n in self.nodes.values()
                if n.state in (NodeState.REGISTERED, NodeState.ALIVE) and (role is None or n.role == role)]

    def _book(self) -> tuple[ServerAddress, ...]:
        """The servers' addresses (one missing since a scheduler restart has none yet); the same
        tuple while no node came or went (ranks are assigned once, at the start)."""
        key = (self.nodes.version, self.started)
        if self._booked[0] == key:
            return self._booked[1]
        servers = sorted((n for n in self.nodes.values() if n.role == Role.SERVER and n.port), key=lambda n: n.rank)
        book = tuple(ServerAddress(n.rank, n.host, n.port, n.replica) for n in servers)
        self._booked = (key, book)
        return book

    def _set_state(self, n: Node, state: NodeState) -> None:
        """Every state change goes through here (the roster's active workers follow)."""
        n.state = state
        self.roster.set_state(n.ident, n.rank, state, n.role)

    # ------------------------------------------------------------ registration
    def _on_register(self, ident: bytes, body: Register) -> None:
        if body.rejoin is not None:
            self._adopt(ident, body)
            return
        role = body.role
        node = Node(role=role, host=body.host, port=body.port, pid=body.pid, ident=ident, wish=body.rank,
                    replica=body.replica)
        if self.started:
            self._late_register(node)
            return
        limit = self.cfg.num_workers if role == Role.WORKER else self.cfg.num_servers
        if role == Role.WORKER and self.cfg.workers_max > limit and (
                self.roster.count[role] >= limit or (body.rank is not None and body.rank >= limit)):
            self.early[ident] = node   # a joiner: admitted once the first generation started
            return
        if self.roster.count[role] >= limit:
            self._send(ident, Command.SHUTDOWN, JobEnd(False, f"the job already has {limit} {role}s; "
                                                              f"this one (pid {node.pid}) is extra"))
            return
        self.nodes[ident] = node
        self.roster.joined(role, ident)
        if self.roster.count[Role.WORKER] == self.cfg.num_workers and \
                self.roster.count[Role.SERVER] == self.cfg.num_servers:
            self._start()

    def _assign(self, role: str) -> None:
        group = [n for n in self.nodes.values() if n.role == role]
        limit = len(group)
        taken: set[int] = set()
        for n in group:
            if n.wish is not None and 0 <= n.wish < limit and n.wish not in taken:
                n.rank = n.wish
                taken.add(n.rank)
        free = iter(r for r in range(limit) if r not in taken)
        for n in group:
            if n.rank < 0:
                n.rank = next(free)

    def _start(self) -> None:
        self._assign(Role.WORKER)
        self._assign(Role.SERVER)
        self.started = True
        book = self._book()
        for n in self.nodes.values():
            self._set_state(n, NodeState.ALIVE)
        active = tuple(self.roster.active_ranks())  # one tuple for every WELCOME
        for n in self.nodes.values():
            self._welcome(n, book, active=active)
        log.info("job %s started: %d workers, %d servers", self.cfg.job_id,
                 self.cfg.num_workers, self.cfg.num_servers)
        _keep(self.nodes)
        early, self.early = self.early, {}
        for n in early.values():
            self._join(n)

    def _welcome(self, n: Node, book: tuple[ServerAddress, ...], restore: bool = False,
                 active: tuple[int, ...] | None = None) -> None:
        ranks = tuple(self.roster.active_ranks()) if active is None else active
        e = self.elastic
        n.welcomed = time.monotonic()
        self._send(n, Command.WELCOME, Welcome(n.rank, book, os.getpid(), self.cfg.num_workers, self.cfg.num_servers,
                                               ranks, n.restarts, restore, n.barrier_done, e.generation,
                                               n.joiner, tuple(sorted(e.joiners)), self.standby_at))

    def _restartable(self, n: Node) -> bool:
        """May ``n`` be replaced instead of failing the job?  Servers only when their state
        outlives them (a checkpoint directory, or replicas)."""
        return self.started and n.restarts < self.cfg.max_restarts and (
            n.role == Role.WORKER or self.cfg.servers_restartable)

    def _late_register(self, node: Node) -> None:
        """A restarted node taking over its predecessor's rank (dead, or about to be), or a
        joiner (an elastic job's worker beyond the first generation)."""
        old = next((n for n in self.nodes.values() if n.role == node.role and n.rank == node.wish
                    and n.state in (NodeState.DEAD, NodeState.ALIVE, NodeState.RESTARTING)), None)
        allowed = old is not None and (
            (old.role, old.rank) in self.waiting_replacement or
            (old.state == NodeState.ALIVE and self._restartable(old)))
        if not allowed and node.role == Role.WORKER and self.cfg.workers_max > self.cfg.num_workers \
                and self.exit_code is None:
            self._join(node)
            return
        if not allowed or old is None:
            done = any(n.role == node.role and n.rank == node.wish and n.state == NodeState.FINISHED
                       for n in self.nodes.values())
            why = (f"{node.role} {node.wish} already finished (kv.close(), or its script ended, e.g. "
                   "with sys.exit) and cannot rejoin; to be restarted, a failing script must raise "
                   "(or crash) instead of calling sys.exit(n)") if done else "the job is already running"
            self._send(node.ident, Command.SHUTDOWN, JobEnd(False, f"{node.role} pid {node.pid} cannot join: {why}"))
            return
        self.waiting_replacement.pop((old.role, old.rank), None)
        del self.nodes[old.ident]
        self.roster.left(old.role, old.ident)
        node.rank, node.restarts = old.rank, old.restarts + 1
        if node.role == Role.WORKER:   # (waits for it before now were the failover's)
            if old.state != NodeState.RESTARTING:   # (its death not seen before: since it was last heard)
                self.slowness.lost(node.rank, old.last_seen)
            self.slowness.restarted(node.rank, time.monotonic())
        self.roster.joined(node.role, node.ident)
        self._set_state(node, NodeState.ALIVE)
        node.stats, node.barrier_done = old.stats, old.barrier_done  # a replay's barriers: answered
        self.nodes[node.ident] = node
        book = self._book()
        self._welcome(node, book, restore=node.role == Role.SERVER)
        if node.role == Role.SERVER:   # (the servers too: the replacement may hold their replicas)
            for n in self._live():
                if n is not node:
                    self._send(n, Command.SERVERS, Servers(restored=node.rank, servers=book))
        else:
            self.roster.want_membership()
        log.warning("%s %d rejoined (restart %d)", node.role, node.rank, node.restarts)

    def _join(self, node: Node) -> None:
        """Admit a joiner (psnode.scheduler.elastic) or refuse it, naming why."""
        members = {n.rank for n in self.nodes.values() if n.role == Role.WORKER
                   and n.state in (NodeState.ALIVE, NodeState.RESTARTING, NodeState.REGISTERED)}
        rank = self.elastic.admit(node.wish, members)
        if isinstance(rank, str):
            self._send(node.ident, Command.SHUTDOWN, JobEnd(False, f"worker pid {node.pid} cannot join: {rank}"))
            log.warning("refused a joiner (pid %d): %s", node.pid, rank)
            return
        for old in [n for n in self.nodes.values() if n.role == Role.WORKER and n.rank == rank]:
            del self.nodes[old.ident]   # a rank that left, finished or was lost, reused
            if old.state != NodeState.LOST:
                self.roster.left(Role.WORKER, old.ident)
        node.rank, node.joiner = rank, True
        self.nodes[node.ident] = node
        self.roster.joined(Role.WORKER, node.ident)
        self._set_state(node, NodeState.ALIVE)
        self.elastic.join(rank)
        self._membership_changed()
        self._welcome(node, self._book())
        log.warning("worker %d joined (pid %d on %s): generation %d, %d workers", rank, node.pid, node.host,
                    self.elastic.generation, len(self.roster.active))

    def _membership_changed(self) -> None:
        """Tell the servers (first) and the workers the new membership."""
        self.roster.want_membership()
        self._flush_membership(force=True)
        body = self._membership()
        if timeline.current is not None:
            timeline.current.instant("membership", generation=body.generation, workers=list(body.active))
        for w in self._live(Role.WORKER):
            self._send(w, Command.MEMBERSHIP, body)

    def _membership(self) -> Membership:
        e = self.elastic
        return Membership(tuple(self.roster.active_ranks()), e.generation, tuple(sorted(e.joiners)),
                          tuple(sorted(e.leaving)))

    def _on_leave(self, ranks: tuple[int, ...]) -> None:
        """LEAVE: these members leave at their next push (they FINISH; MEMBERSHIP tells them)."""
        if self.elastic.ask_leave(ranks, set(self.roster.active_ranks())):
            body = self._membership()
            for w in self._live(Role.WORKER):
                self._send(w, Command.MEMBERSHIP, body)
            log.warning("workers %s asked to leave", sorted(self.elastic.leaving))

    def _on_lost(self, rank: int, why: str) -> None:
        """Worker ``rank`` is gone for good: remove it from the membership at once."""
        n = next((n for n in self.nodes.values() if n.role == Role.WORKER and n.rank == rank and n.state in
                  (NodeState.ALIVE, NodeState.RESTARTING, NodeState.REGISTERED, NodeState.DEAD)), None)
        if n is None or not self.started or self.exit_code is not None:
            return
        self.waiting_replacement.pop((Role.WORKER, rank), None)
        self.roster.left(Role.WORKER, n.ident)
        n.state = NodeState.LOST
        self.barrier.pop(n.ident, None)
        self.elastic.gone(rank, "lost")
        log.warning("%s lost (%s): generation %d, %d workers left", n.name, why, self.elastic.generation,
                    len(self.roster.active))
        self._membership_changed()
        if self.roster.count[Role.WORKER] == 0:
            self._end(False, f"every worker was lost (the last: worker {rank}, {why})", Command.PEER_LOST)
            return
        self._check_barrier()
        if self.roster.all_finished():
            self._end(ok=True, reason="every worker finished")

    def _await_replacement(self, n: Node, why: str, died: float | None = None) -> None:
        """``n`` died (at ``died``; unknown: when it was last heard) and its launcher restarts
        it: its replacement is awaited."""
        self._set_state(n, NodeState.RESTARTING)   # (a worker stays a member of the rounds)
        self.waiting_replacement[(n.role, n.rank)] = time.monotonic() + self.cfg.register_timeout
        if n.role == Role.WORKER:   # (the servers' waits for it since it was last heard: the failover's)
            self.slowness.lost(n.rank, n.last_seen if died is None else died)
        log.warning("%s %s; waiting for its restart", n.name, why)
        if n.role == Role.SERVER:
            for w in self._live(Role.WORKER):
                self._send(w, Command.SERVERS, Servers(down=n.rank))

    def _take_back(self, node: Node) -> None:
        """A worker taken for silent, whose restart is awaited, speaks again: it was stopped or
        starved, not dead, and goes on as a member (it never left the rounds); no restart is
        awaited for it any more.  A replacement its launcher starts all the same takes its rank
        (:meth:`_late_register`).  A server stays awaited: its workers were told it is down."""
        if node.role != Role.WORKER or self.waiting_replacement.pop((node.role, node.rank), None) is None:
            return
        self._set_state(node, NodeState.ALIVE)
        self.slowness.returned(node.rank)
        log.warning("%s was taken for silent and speaks again (stopped or starved, not dead): it goes on, and "
                    "no restart is awaited for it", node.name)
        self._check_barrier()

    # ------------------------------------------------------------ restart (psnode.scheduler.rebuild)
    def _while_rebuilding(self, ident: bytes, msg: Message, body: Body) -> None:
        """A message before the job is rebuilt: reports are collected, heartbeats of the nodes
        heard from answered, a node not heard from asked to REJOIN, the rest held."""
        rb = self.rebuild
        assert rb is not None
        if isinstance(body, Register) and body.rejoin is not None:
            why = rb.rejoin(ident, body)
            if why is not None:
                self._send(ident, Command.SHUTDOWN, JobEnd(False, f"{body.role} pid {body.pid} cannot rejoin: {why}"))
        elif isinstance(body, Register):
            rb.fresh.setdefault(ident, body)
        elif rb.knows(ident) and isinstance(body, Heartbeat):
            if not self.relaying:
                self._send(ident, Command.HEARTBEAT_ACK)
        elif not rb.knows(ident) and msg.cmd in _NODE_COMMANDS:
            self._send(ident, Command.REJOIN)
        else:
            self.held.append((ident, msg))

    def _rebuilt(self) -> None:
        """The reports are in (or the heartbeat timeout passed): take the job over."""
        rb, self.rebuild = self.rebuild, None
        assert rb is not None
        if rb.started:
            plan = rb.plan()
            self.started = True
            self.elastic.generation, self.elastic.joiners = plan.generation, set(plan.joiners)
            for (role, rank), (ident, body) in rb.nodes.items():
                assert body.rejoin is not None
                node = Node(role=role, host=body.host, port=body.port, pid=body.pid, ident=ident, wish=rank,
                            rank=rank, replica=body.replica, restarts=body.rejoin.restarts,
                            barrier_done=body.rejoin.barriers,
                            joiner=body.rejoin.joiner and role == Role.WORKER)
                self.nodes[ident] = node
                self.roster.joined(role, ident)
                finished = role == Role.WORKER and rank in plan.finished
                self._set_state(node, NodeState.FINISHED if finished else NodeState.ALIVE)
            for role, rank in plan.missing:   # silent since the restart: the usual rules decide
                ident = f"?{role}-{rank}".encode()   # (no node's identity: what is sent there is dropped)
                node = Node(role=role, host="unknown", port=0, pid=0, ident=ident, wish=rank, rank=rank,
                            last_seen=self.t0, joiner=rank in plan.joiners)
                self.nodes[ident] = node
                self.roster.joined(role, ident)
                self._set_state(node, NodeState.ALIVE)
            book = self._book()
            for n in self._live():
                if n.pid:
                    self._welcome(n, book)
            self.roster.want_membership()
            self._flush_membership(force=True)
            log.warning("scheduler restart %d: job %s rebuilt from %d live nodes (generation %d, workers %s%s)",
                        self.cfg.restart_count, self.cfg.job_id, len(rb.nodes), plan.generation,
                        sorted(plan.members), f"; not heard from: {plan.missing}" if plan.missing else "")
            _keep(self.nodes)
        for ident, body in rb.fresh.items():
            if ident not in self.nodes:
                self._on_register(ident, body)
        held, self.held = self.held, []
        for ident, msg in held:
            self._dispatch(ident, msg)
        if self.started and self.exit_code is None:
            self._check_barrier()
            if self.roster.all_finished():
                self._end(ok=True, reason="every worker finished")

    def _adopt(self, ident: bytes, body: Register) -> None:
        """A node of the job registering again after the job was rebuilt (it was slow to hear of
        the restart): it takes the place kept for it, or its rank's place when none is."""
        assert body.rank is not None and body.rejoin is not None
        old = next((n for n in self.nodes.values() if n.role == body.role and n.rank == body.rank
                    and n.state in (NodeState.ALIVE, NodeState.REGISTERED, NodeState.RESTARTING)), None)
        if old is not None and old.pid:
            self._send(ident, Command.SHUTDOWN, JobEnd(False, f"{body.role} pid {body.pid} cannot rejoin: "
                                                              f"{old.name} holds rank {body.rank}"))
            return
        if old is not None:
            self.waiting_replacement.pop((old.role, old.rank), None)
            del self.nodes[old.ident]
            self.roster.left(old.role, old.ident)
        node = Node(role=body.role, host=body.host, port=body.port, pid=body.pid, ident=ident, wish=body.rank,
                    rank=body.rank, replica=body.replica, restarts=body.rejoin.restarts,
                    barrier_done=body.rejoin.barriers,
                    joiner=body.rejoin.joiner and body.role == Role.WORKER)
        self.nodes[ident] = node
        self.roster.joined(node.role, ident)
        self._set_state(node, NodeState.ALIVE)
        self._welcome(node, self._book())   # (a server serves where it did: the workers know it)
        self.roster.want_membership()
        log.warning("%s rejoined after the scheduler restart", node.name)

    # ------------------------------------------------------------ barrier / finish
    def _check_barrier(self) -> None:
        if self.roster.barrier_complete(self.barrier) and not self.waiting_replacement:
            self._flush_membership(force=True)  # the servers know who left before anyone goes on
            members = tuple(self.roster.active_ranks()) if self.cfg.elastic else ()
            nodes, entered = self.nodes, self.barrier
            for n, idents in barrier_groups(entered, nodes).items():   # (the answers first; one message each)
                self.chan.send_all(Command.BARRIER_DONE, BarrierDone(n, members, self.elastic.generation).to_body(),
                                   idents)
            for ident, n in entered.items():
                node = nodes.get(ident)
                if node is not None:
                    node.barrier_done = n
            self.slowness.barrier({nodes[i].rank: t for i, t in self.barrier_since.items() if i in nodes},
                                  time.monotonic())
            self.barrier_since.clear()
            entered.clear()

    def _flush_membership(self, force: bool = False) -> None:
        """Send MEMBERSHIP if asked for (``roster.want_membership``) and due (psnode.scheduler.roster)."""
        active = self.roster.take_membership(time.monotonic(), force)
        if active is not None:
            body = self._membership()
            for ident in self.roster.servers:
                self._send(ident, Command.MEMBERSHIP, body)

    def _on_finish(self, node: Node) -> None:
        self._set_state(node, NodeState.FINISHED)
        self._send(node, Command.FINISH_ACK)
        self.barrier.pop(node.ident, None)
        self.barrier_since.pop(node.ident, None)
        self.slowness.forget(node.rank)
        generation = self.elastic.generation
        self.elastic.gone(node.rank, "finished")
        if self.elastic.generation != generation:   # a leaver: everyone learns the new membership
            log.warning("%s left: generation %d, %d workers", node.name, self.elastic.generation,
                        len(self.roster.active))
            self._membership_changed()
        self.roster.want_membership()
        self._check_barrier()
        if self.roster.all_finished():
            self._end(ok=True, reason="every worker finished")

    def _end(self, ok: bool, reason: str, cmd: Command = Command.SHUTDOWN,
             node: NodeRow | None = None, culprit: Node | None = None,
             what: str | None = None, since: float | None = None) -> None:
        """End the job (once): tell every live node (``node``: the row of the node that failed).
        A failure also writes the verdict: the culprit, ``what`` happened to it, and ``since``
        (wall-clock) when it failed or was last heard from."""
        if self.exit_code is not None:
            return
        self._flush_membership(force=True)  # what the FINISHes before the end changed, as before
        if not ok:
            failure.write(self.cfg.error_file, "verdict", Role.SCHEDULER.value, None, self.cfg.host,
                          reason=what or reason, culprit=culprit.identity() if culprit else None, when=since)
        self.exit_code = 0 if ok else 1
        self.ending = (cmd, JobEnd(ok, reason, node))
        for n in self._live():
            self._send(n, *self.ending)
        self.shutdown_deadline = time.monotonic() + (5.0 if ok else 1.0)
        (log.info if ok else log.error)("job %s ending: %s", self.cfg.job_id, reason)

    # ------------------------------------------------------------ deadlocks
    def _check_waits(self, now: float) -> None:
        """Warn of a wait longer than ``stall_warning``; end the job when its live workers wait
        for each other in a cycle (psnode.scheduler.waitfor)."""
        if not self.started:
            return
        alive, worker = NodeState.ALIVE, Role.WORKER
        waits = {n.rank: n.stats.wait for n in self.nodes.values() if n.state is alive and n.role == worker}
        if not waits:
            return
        entered: dict[int, int] = {}   # (built on first use: a check runs once an interval over every node)

        def not_in_barrier(n: int) -> list[int]:
            if self.barrier and not entered:
                entered.update((self.nodes[i].rank, b) for i, b in self.barrier.items() if i in self.nodes)
            return [r for r in waits if entered.get(r, 0) < n]
        for line in self.stalls.check(waits, not_in_barrier):
            log.warning("%s", line)
        if self.waiting_replacement:
            self.watch.reset()
            return
        # (only a job whose every live worker waits can be deadlocked: the watch reads ``gone`` then)
        gone = {n.rank for n in self.nodes.values() if n.role == Role.WORKER and n.state in
                (NodeState.FINISHED, NodeState.EXITED, NodeState.LOST)} if None not in waits.values() else set()
        verdict = self.watch.check(now, waits, not_in_barrier, gone)
        if verdict is not None:
            self._end(False, verdict, Command.PEER_LOST, what=verdict, since=time.time())

    def _rows(self, now: float) -> tuple[NodeRow, ...]:
        """The STATUS table: a row per node, a worker's with how long the others waited for it."""
        shares, totals = self.slowness.shares(now), self.slowness.totals()
        late: dict[int, int] = {}   # worker -> its pushes dropped late, on every server (backup workers)
        for n in self.nodes.values():
            if n.role == Role.SERVER:
                for r, k in n.stats.late:
                    late[r] = late.get(r, 0) + k
        rows = []
        beyond = excesses(shares, {n.rank for n in self.nodes.values() if n.role == Role.WORKER})
        for n in sorted(self.nodes.values(), key=lambda n: (n.role, n.rank)):
            if n.role == Role.WORKER:
                share = shares.get(n.rank, 0.0)
                rows.append(n.row(now, waited_for=round(share, 3), waited_for_total=round(totals.get(n.rank, 0.0), 3),
                                  late=late.get(n.rank, 0),   # (one being replaced: the failover's)
                                  slow=n.state == NodeState.ALIVE and beyond[n.rank] >= SLOW_SHARE))
            else:
                rows.append(n.row(now))
        return tuple(rows)

    # ------------------------------------------------------------ liveness
    def _check_liveness(self, now: float) -> None:
        limit = self.cfg.dead_after
        if not self.started and now - self.t0 > self.cfg.register_timeout:
            w = self.roster.count[Role.WORKER]
            s = len(self.nodes) - w
            self._end(False, f"only {w} of {self.cfg.num_workers} workers and {s} of "
                             f"{self.cfg.num_servers} servers registered within "
                             f"{self.cfg.register_timeout:g} s")
            return
        for (role, rank), deadline in list(self.waiting_replacement.items()):
            if now > deadline:
                self._end(False, f"{role} {rank} was not restarted within {self.cfg.register_timeout:g} s",
                          Command.PEER_LOST)
                return
        heard = now - limit   # (heard from since: alive, whatever its state)
        for n in list(self.nodes.values()):
            if n.last_seen >= heard or n.state not in (NodeState.ALIVE, NodeState.REGISTERED):
                continue
            silent = now - n.last_seen
            if self._restartable(n) and self.exit_code is None:
                self._await_replacement(n, f"silent for {silent:.1f} s")
                continue
            if n.role == Role.WORKER and self.started and self.cfg.elastic and self.exit_code is None:
                self._on_lost(n.rank, f"silent for {silent:.1f} s")
                continue
            self._set_state(n, NodeState.DEAD)
            if self.exit_code is not None:
                continue
            what = f"stopped responding ({silent:.1f} s without a heartbeat)"
            self._end(False, f"{n.name} {what}", Command.PEER_LOST, n.row(now), culprit=n,
                      what=what, since=time.time() - silent)

    # ------------------------------------------------------------ main loop
    def _dispatch(self, ident: bytes, msg: Message) -> None:
        """Handle one message; a malformed body is logged and dropped."""
        cmd = msg.cmd
        try:
            body = decode_body(cmd, msg.body)
        except ProtocolError as exc:
            log.warning("dropped %s from %r: %s", cmd.value, ident, exc)
            return
        if isinstance(body, Beats):   # a host's relay: each entry as a HEARTBEAT from its node
            self.relayed += len(body.beats)
            self.relaying = True
            unknown = []   # (the relay answers the rest: as their own HEARTBEATs would be answered)
            try:
                now = time.monotonic()
                for node_ident, stats in body.beats:
                    node = self.nodes.get(node_ident)
                    if node is not None and self.active and self.rebuild is None and node.state not in _ASIDE:
                        node.last_seen = now   # (what _handle and _heartbeat_msg do, for the usual case)
                        self._took_beat(node, node.stats if stats is None else stats, now)
                        continue
                    self._handle(node_ident, Message(Command.HEARTBEAT, msg.job, msg.sender),
                                 Heartbeat(stats or Counters()))
                    if node is None and not (self.rebuild is not None and self.rebuild.knows(node_ident)):
                        unknown.append(node_ident)
            finally:
                self.relaying = False
            self._send(ident, Command.HEARTBEATS_ACK, BeatsAck(body.n, tuple(unknown)))
            return
        if isinstance(body, Entries):   # a host's relay: each entry as a BARRIER from its worker
            self.relayed_entries += len(body.entries)
            now, usual = time.monotonic(), self.active and self.rebuild is None and not self.rebuilds
            for node_ident, n in body.entries:
                node = self.nodes.get(node_ident)
                if usual and node is not None and node.role == Role.WORKER and node.state not in _ASIDE \
                        and n > node.barrier_done:   # (what _handle and _barrier_msg do, for the usual case)
                    node.last_seen = now
                    if self.barrier.get(node_ident) != n:
                        self.barrier_since[node_ident] = now
                    self.barrier[node_ident] = n
                    continue
                entry = Barrier(n)   # (its body too: held while a take-over rebuilds the job, it is decoded again)
                self._handle(node_ident, Message(Command.BARRIER, msg.job, msg.sender, entry.to_body()), entry)
            self._check_barrier()
            return
        self._handle(ident, msg, body)

    def _handle(self, ident: bytes, msg: Message, body: Body) -> None:
        """Handle one decoded message from ``ident``."""
        node = self.nodes.get(ident)
        if node is not None:
            node.last_seen = time.monotonic()
        cmd = msg.cmd
        if isinstance(body, Standby):
            self._send(ident, Command.STANDBY_ACK)
            self._on_standby(body.address)
            return
        if not self.active and (cmd in _NODE_COMMANDS or cmd is Command.REGISTER):
            if self._primary_answers():
                self._send(ident, Command.SHUTDOWN, JobEnd(False, (
                    f"this node is cut off from the scheduler at {self.cfg.primary}, which still runs (a "
                    "partition between them); the standby scheduler does not take the job over from it")))
                return
            self._take_over()
        if self.rebuild is not None and cmd is not Command.STATUS:
            self._while_rebuilding(ident, msg, body)
        elif node is None and self.rebuilds and cmd in _NODE_COMMANDS:
            self._send(ident, Command.REJOIN)   # a node of the job the restart has not heard from yet
        elif cmd in self._from_anyone:
            self._from_anyone[cmd](ident, node, body)
        elif node is None:
            log.debug("%s from an unregistered peer dropped", cmd.value)
        elif node.state == NodeState.LOST:   # removed from the job: it must not take part again
            self._send(node, Command.SHUTDOWN, JobEnd(False, f"{node.name} was removed from the job (lost)"))
        elif cmd in self._from_members:
            if node.state == NodeState.RESTARTING and cmd in _NODE_COMMANDS:
                self._take_back(node)
            self._from_members[cmd](node, body)

    # ------------------------------------------------ one handler per command
    # (a body's class follows from its command: psnode.protocol.control.BODIES)

    def _register_msg(self, ident: bytes, node: Node | None, body: Register) -> None:
        if node is None:
            self._on_register(ident, body)
        elif self.started and node.state == NodeState.ALIVE and \
                time.monotonic() - node.welcomed >= self.cfg.heartbeat_interval:   # its WELCOME was lost: again
            # (at most once per heartbeat interval: a node registers again with each heartbeat
            # until welcomed, and the start of thousands queues several of them per node; a
            # WELCOME lost on a cut connection is sent again within an interval)
            self._welcome(node, self._book(), restore=node.role == Role.SERVER and node.restarts > 0)

    def _status_msg(self, ident: bytes, node: Node | None, body: Any) -> None:
        now = time.monotonic()
        e = self.elastic
        self._send(ident, Command.STATUS_REPLY, StatusAnswer(
            self.cfg.job_id, round(now - self.t0, 3), self.started or bool(self.rebuild and self.rebuild.started),
            self.t.refused,  # connections the scheduler itself refused
            self._rows(now),
            e.generation, tuple(self.roster.active_ranks()), e.joined, e.left, e.lost,
            loop_gap=round(self.gaps.longest(now), 6), relayed=self.relayed,
            relayed_barriers=self.relayed_entries))

    def _leave_msg(self, ident: bytes, node: Node | None, body: ScaleDown) -> None:
        self._send(ident, Command.LEAVE_ACK)
        self._on_leave(body.ranks)

    def _lost_msg(self, ident: bytes, node: Node | None, body: Lost) -> None:
        self._send(ident, Command.LOST_ACK)
        if not body.restart:
            self._on_lost(body.rank, body.reason)
            return
        n = next((n for n in self.nodes.values() if n.role == Role.WORKER and n.rank == body.rank
                  and n.restarts == body.restarts and n.state in (NodeState.ALIVE, NodeState.REGISTERED)), None)
        if n is not None and self._restartable(n) and self.exit_code is None:
            self._await_replacement(n, f"died ({body.reason}), its launcher restarts it", died=time.monotonic())

    def _stop_msg(self, ident: bytes, node: Node | None, body: Stop) -> None:
        self._send(ident, Command.STOP_ACK)
        self._end(True, body.reason)  # a failed job stays failed

    def _heartbeat_msg(self, node: Node, body: Heartbeat) -> None:
        now = time.monotonic()
        self._took_beat(node, body.stats, now)
        if now - node.acked >= self.ack_every and not self.relaying:
            node.acked = now
            self._send(node, Command.HEARTBEAT_ACK)

    def _took_beat(self, node: Node, stats: Counters, now: float) -> None:
        """A heartbeat of ``node`` (direct or relayed) with its counters."""
        node.update_stats(stats, now)
        if node.role == Role.WORKER and node.rank >= 0:
            self.slowness.heartbeat(node.rank, now)
        elif node.role == Role.SERVER and node.rank >= 0:
            self.slowness.server(node.rank, stats.awaited, now, stats.waiting)

    def _barrier_msg(self, node: Node, body: Barrier) -> None:
        if node.role != Role.WORKER:
            return
        ident = node.ident
        n = node.barrier_done + 1 if body.n is None else body.n
        if n <= node.barrier_done:  # sent again: its answer was lost
            self._send(node, Command.BARRIER_DONE, BarrierDone(node.barrier_done))
            return
        if self.rebuilds and not node.joiner and done_elsewhere(n, (
                w.barrier_done for w in self.nodes.values() if w.role == Role.WORKER and not w.joiner)):
            node.barrier_done = n   # completed by the previous scheduler; its answer was lost
            members = tuple(self.roster.active_ranks()) if self.cfg.elastic else ()
            self._send(node, Command.BARRIER_DONE, BarrierDone(n, members, self.elastic.generation))
            return
        if self.barrier.get(ident) != n:
            self.barrier_since[ident] = time.monotonic()
        self.barrier[ident] = n
        self._check_barrier()

    def _finish_msg(self, node: Node, body: Any) -> None:
        if node.role != Role.WORKER:
            return
        if node.state == NodeState.FINISHED:
            self._send(node, Command.FINISH_ACK)  # sent again: its answer was lost
        else:
            self._on_finish(node)

    def _bye_msg(self, node: Node, body: Bye) -> None:
        if body.restart and self._restartable(node) and node.state == NodeState.ALIVE:
            # the launcher restarts it: wait, do not fail the job
            self._await_replacement(node, f"failed ({body.restart[:200]})")
            return
        self._set_state(node, NodeState.EXITED)
        if body.error and self.exit_code is None:
            what = f"failed: {body.error[:500]}"
            # the nodes and the log say who; what it raised is said once, by its own output
            self._end(False, f"{node.name} failed", Command.PEER_LOST, node.row(time.monotonic()),
                      culprit=node, what=what, since=time.time())

    def run(self, poller: Poller | None = None) -> int:
        """Serve the job to its end; its exit code.  ``poller``: what waits for messages (a
        simulation's, benchmarks/control/simulate.py; else one on the scheduler's socket)."""
        poller = Poller() if poller is None else poller
        poller.add(self.chan)
        tick = min(self.cfg.heartbeat_interval, 0.5)
        resend_at = next_check = next_waits = 0.0
        while True:
            due = self.roster.membership_due()
            self.gaps.idle(time.monotonic())
            ready = poller.poll(tick if due is None else min(tick, max(0.001, due - time.monotonic())))
            self.gaps.woke(time.monotonic())
            if ready:
                while (got := self.chan.recv(routed=True)) is not None:
                    try:
                        self._dispatch(got[0] or b"", got[1])
                    except Exception as exc:  # noqa: BLE001 - a bad message never kills the job
                        log.warning("dropped %s from %r: %r", got[1].cmd.value, got[0], exc)
            self._flush_membership()  # after the turn: for all the FINISHes it handled, once
            now = time.monotonic()
            self._announce(now)
            if self.rebuild is not None:
                if not self.active or (not self.rebuild.complete() and now < self.rebuild_by):
                    continue
                self._rebuilt()
            if self.exit_code is None:
                if now >= next_check:   # (each check visits every node: a few times a heartbeat interval)
                    next_check = now + self.check_every
                    self._check_liveness(now)
                    if self.exit_code is None and now >= next_waits:   # (waits change with heartbeats)
                        next_waits = now + self.cfg.heartbeat_interval
                        self._check_waits(now)
            elif not self._live(Role.SERVER) or (self.shutdown_deadline and now > self.shutdown_deadline):
                break
            elif self.ending is not None and now >= resend_at:
                resend_at = now + tick
                for n in self._live():  # until they answer BYE: the first one may have been lost
                    self._send(n, *self.ending)
        self.t.close(linger_ms=500)
        return self.exit_code or 0


def main(cfg: NodeConfig, listen_fd: int | None = None) -> int:
    """Run the scheduler (``listen_fd``: its socket, already listening at ``cfg``'s address)."""
    code = Scheduler(cfg, listen_fd).run()
    if code:
        print(f"psnode scheduler: job {cfg.job_id} failed", file=sys.stderr)
    return code


__all__ = ["Node", "NodeState", "Scheduler", "main"]
