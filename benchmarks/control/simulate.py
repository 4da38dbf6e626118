"""The real scheduler at 100, 1,000 and 10,000 workers, its nodes simulated, on this machine.

    python benchmarks/control/simulate.py                          # 100, 1000, 10000 workers
    python benchmarks/control/simulate.py --workers 1000 --json /tmp/sim.json
    python benchmarks/control/simulate.py --workers 10000 --no-relay   # every node heartbeats directly

psnode's scheduler (:class:`psnode.scheduler.loop.Scheduler`, its own ``run`` loop, its socket
bound on 127.0.0.1) serves a job of W workers and W/10 servers, 8 processes to a simulated host,
in real time.  The nodes are simulated in the same process: each message a node would send is
encoded with psnode's codec and handed to the scheduler's receive, which decodes it as it decodes
a frame from its socket; what the scheduler sends to a node is encoded as it would be and handed
to the simulated node (:class:`SimChannel`).  The nodes act inside the scheduler's wait
(:class:`SimPoller`), and every :data:`TURN` seconds while it takes messages in: heartbeats
every interval at a random phase, REGISTER again until welcomed, BARRIER when the scenario says,
BYE on SHUTDOWN.  Heartbeats go through one relay per
simulated host (:class:`psnode.net.relay.Relay`, the state machine a host's relay runs): each
node's heartbeat is handed to its host's relay, which hands the scheduler one HEARTBEATS batch
per interval (at a random phase) and takes its answer; a worker's BARRIER goes to its host's
relay too, which hands the scheduler the host's entries together (BARRIERS) once every worker of
the host it knows entered, or after its hold; with ``--no-relay`` each node sends its own
HEARTBEAT and BARRIER.  A relay's own loss is its host's (the fall back of a node whose relay died is
tested with real processes: tests/cluster/test_heartbeat_relay.py).  ``mxdist status``'s question comes
from another process over the scheduler's real socket.  What the scheduler sends to a simulated
node also goes through its real socket (zmq drops it: no peer holds that identity), so its
per-message cost counts.  Left out: the nodes' processes, zmq's cost of receiving.

The scenario (seeded, :func:`scenario`): every node starts (registers) within ``--spread``
seconds; the job starts; an idle window (heartbeats only); ``status`` three times; barriers;
then faults: a silent worker, a lost host (8 processes at once), each replaced by a new
process as the launcher would, and a partition of two hosts shorter than the heartbeat timeout;
a last barrier; STOP.  Invariants, asserted at every turn (:class:`World`): no node the
simulation keeps alive is ever called silent (no false death), every silenced node is called so
within twice the heartbeat timeout, each barrier is answered to each worker once, and the last
one to every worker of the job (its replacements included).

Figures: time from the first REGISTER to the last WELCOME (the job's start) and the slowest
node's time from its start to its WELCOME; the scheduler's CPU share in the idle window (its
thread's CPU time outside the simulation); barrier latency, from the moment the last worker
enters (its BARRIER sent, to its relay or the scheduler) to the last BARRIER_DONE sent, on the
scheduler's clock (:meth:`World.arrived`: the scheduler as a single-core queue, each message
taken at its arrival or when the scheduler's CPU time so far is spent, whichever is later; the
simulated nodes share its thread here and run on their own hosts in a job), the wall time as
well, and the messages carrying a barrier's entries to the scheduler; time to detect a silent node and a lost
host (every one of its 8); the status answer (the round trip of ``psnode.launcher.status`` from another process, and the
scheduler's CPU per STATUS); memory (the scheduler's state after the start, and this process's
peak RSS).
"""
from __future__ import annotations

import argparse
import gc
import heapq
import json
import logging
import os
import platform
import random
import resource
import socket
import subprocess
import sys
import threading
import time
import types
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from psnode.config import NodeConfig, Role  # noqa: E402
from psnode.net.relay import BARRIER_HOLD, BARRIER_WAIT, Relay  # noqa: E402
from psnode.net.transport import Poller  # noqa: E402
from psnode.protocol import Command, Message, decode, encode  # noqa: E402
from psnode.protocol.control import Barrier, BeatsAck, Bye, Counters, Heartbeat, Register, Stop  # noqa: E402
from psnode.protocol.status import NodeState  # noqa: E402
from psnode.scheduler.loop import Scheduler  # noqa: E402

PER_HOST = 8          # processes per simulated host
TURN = 0.002          # seconds between the nodes' turns while the scheduler takes messages in
SERVER_EVERY = 10     # one server per this many workers
JOB = "sim-job"
_MAX = 2**30


class SimulationError(AssertionError):
    """An invariant broke, or a step did not happen within its bound."""


@dataclass
class SimConfig:
    workers: int
    heartbeat: float = 1.0          # seconds between heartbeats
    liveness: int = 5               # missed heartbeats before a node is dead
    spread: float = 2.0             # seconds over which the nodes start
    idle: float = 5.0               # seconds of the idle window
    barriers: int = 5
    barrier_spread: float = 0.05    # seconds over which the workers enter a barrier
    status_queries: int = 3
    faults: bool = True
    relay: bool = True              # heartbeats through one relay per host (False: each node's own)
    seed: int = 1
    step_timeout: float = 300.0     # the most any step of the scenario may take

    @property
    def servers(self) -> int:
        return max(1, self.workers // SERVER_EVERY)

    @property
    def dead_after(self) -> float:
        return self.heartbeat * self.liveness


@dataclass
class SimNode:
    """One simulated process."""

    ident: bytes
    role: str
    rank: int
    host: int
    start: float = 0.0
    alive: bool = True             # False: silenced (its process or host lost) for good
    muted_until: float = 0.0       # partitioned: sends nothing before then
    welcomed: float | None = None
    barrier_done: int = 0
    replaced: bool = False
    frames: dict[str, list[Any]] = field(default_factory=dict)


def _frames(cmd: Command, body: dict[str, Any]) -> list[Any]:
    return encode(Message(cmd=cmd, job=JOB, sender="sim", body=body))


class World:
    """The simulated nodes, what they send and receive, the scenario and its invariants."""

    def __init__(self, cfg: SimConfig, sched: Scheduler) -> None:
        self.cfg = cfg
        self.sched = sched
        self.rng = random.Random(cfg.seed)
        self.nodes: dict[bytes, SimNode] = {}
        self.inbox: deque[tuple[bytes, list[Any], float]] = deque()   # to the scheduler: (ident, frames, when)
        self.events: list[tuple[float, int, str, bytes, int]] = []    # (when, seq, kind, ident, arg)
        self.seq = 0
        self.sim_cpu = 0.0           # this thread's CPU time spent simulating (not the scheduler's)
        self.polling: float | None = None   # this thread's CPU time when the current wait began (None: not in one)
        self.next_turn = 0.0         # when the nodes act next while the scheduler works through its queue
        self.hosts = 0
        self.first_register: float | None = None
        self.last_welcome: float = 0.0
        self.barrier_entered: dict[int, float] = {}      # barrier -> when its last worker entered it
        self.barrier_answered_at: dict[int, float] = {}  # barrier -> its last answer, on the scheduler's clock
        self.clock = 0.0             # the scheduler's clock: when its work so far ends (see arrived)
        self.clock_cpu = 0.0         # the scheduler's CPU time when the clock was last set
        self.sent_at = 0.0           # the scheduler's clock at the send being handed to the nodes
        self.barrier_msgs: dict[int, int] = {}           # barrier -> messages with its entries handed over
        self.barrier_answered: dict[int, float] = {}     # barrier -> when its last BARRIER_DONE was sent
        self.answers: dict[tuple[bytes, int], int] = {}  # (worker, barrier) -> BARRIER_DONEs sent
        self.answered: dict[int, int] = {}               # barrier -> workers answered (once each)
        self.silenced: dict[bytes, float] = {}           # ident -> when it went silent
        self.detected: dict[bytes, float] = {}           # ident -> when the scheduler called it silent
        self.status: list[float] = []
        self.status_cpu: list[float] = []
        self.results: dict[str, Any] = {}
        self.violations: list[str] = []
        self.steps: Generator[Callable[[float], bool], None, None] = scenario(self)
        self.waiting: Callable[[float], bool] = lambda now: True
        self.step_deadline = time.monotonic() + cfg.step_timeout
        self.step_name = "start"
        self.done = False
        self._next_check = 0.0
        self.relays: dict[int, Relay] = {}               # host -> its relay
        self.relay_idents: dict[bytes, int] = {}         # a relay's identity -> its host
        self.handed = 0                                  # messages handed to the scheduler

    # -- the nodes -----------------------------------------------------------------------
    def add_node(self, role: str, rank: int, host: int, start: float, tag: str = "") -> SimNode:
        ident = f"{role}-{rank}{tag}-{len(self.nodes)}".encode()
        n = SimNode(ident, role, rank, host, start)
        port = 20000 + rank if role == Role.SERVER else 0
        n.frames["register"] = _frames(Command.REGISTER, Register(role, f"10.{host >> 16 & 255}.{host >> 8 & 255}."
                                                                        f"{host & 255}", port, 1000 + len(self.nodes),
                                                                  rank).to_body())
        n.frames["heartbeat"] = _frames(Command.HEARTBEAT, Heartbeat(Counters()).to_body())
        self.nodes[ident] = n
        self.at(start, "start", ident)
        if self.cfg.relay and host not in self.relays:
            self.relays[host] = Relay(self.cfg.heartbeat)
            relay = f"relay-{host}".encode()
            self.relay_idents[relay] = host
            self.at(start + self.rng.uniform(0, self.cfg.heartbeat), "relay", relay, host)
        return n

    def at(self, when: float, kind: str, ident: bytes, arg: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.events, (when, self.seq, kind, ident, arg))

    def hand(self, n: SimNode, frames: list[Any], now: float) -> None:
        self.inbox.append((n.ident, frames, now))
        self.handed += 1

    def beat(self, n: SimNode, now: float) -> None:
        """``n``'s heartbeat: to its host's relay, or to the scheduler."""
        if self.cfg.relay:
            self.relays[n.host].beat(n.ident, Counters(), now)
        else:
            self.hand(n, n.frames["heartbeat"], now)

    def enter(self, n: SimNode, b: int, now: float) -> None:
        """``n`` enters barrier ``b`` at ``now`` (its relay's clock): through its host's relay,
        or directly.  The latency counts from when the simulation acts it out (with the
        simulation's CPU time then: what is subtracted is measured from the same moment)."""
        self.barrier_entered[b] = max(self.barrier_entered.get(b, now), now)
        if not self.cfg.relay:
            self.hand(n, _frames(Command.BARRIER, Barrier(b).to_body()), now)
            self.barrier_msgs[b] = self.barrier_msgs.get(b, 0) + 1
            return
        relay = self.relays[n.host]
        first = relay.held_since is None
        relay.enter(n.ident, b, now)
        self.release(n.host, now)
        if first:   # (when the entries held go at the latest: the first barrier's hold, else the wait)
            for due in (BARRIER_HOLD, BARRIER_WAIT * self.cfg.heartbeat):
                self.at(now + due, "hold", f"relay-{n.host}".encode(), n.host)

    def release(self, host: int, now: float) -> None:
        """The barrier entries host ``host``'s relay sends now, if any."""
        entries = self.relays[host].barrier_entries(now)
        if entries is not None:
            self.inbox.append((f"relay-{host}".encode(), _frames(Command.BARRIERS, entries.to_body()), now))
            self.handed += 1
            for b in {n for _, n in entries.entries}:
                self.barrier_msgs[b] = self.barrier_msgs.get(b, 0) + 1

    def relay_answered(self, ident: bytes, body: dict[str, Any] | None) -> None:
        """The scheduler answered a relay's batch (the relay answers its nodes)."""
        if body is not None:
            ack = BeatsAck.from_body(body)
            self.relays[self.relay_idents[ident]].acked(ack.n, ack.unknown)

    def fire(self, now: float) -> None:
        """Every event due by ``now``: what the nodes send then."""
        while self.events and self.events[0][0] <= now:
            when, _, kind, ident, arg = heapq.heappop(self.events)
            if kind == "relay":
                batch = self.relays[arg].batch(when)
                if batch is not None:
                    self.inbox.append((ident, _frames(Command.HEARTBEATS, batch.to_body()), when))
                    self.handed += 1
                self.at(when + self.cfg.heartbeat, "relay", ident, arg)
                continue
            if kind == "hold":   # (a relay acts on its own host's clock: at the event's time)
                self.release(arg, when)
                continue
            n = self.nodes[ident]
            if not n.alive:
                continue
            if kind == "start":
                if self.first_register is None:
                    self.first_register = now
                self.hand(n, n.frames["register"], now)
                self.beat(n, now)
                self.at(when + self.cfg.heartbeat, "beat", ident)
            elif kind == "beat":
                if now >= n.muted_until:
                    if n.welcomed is None:
                        self.hand(n, n.frames["register"], now)
                    self.beat(n, now)
                self.at(when + self.cfg.heartbeat, "beat", ident)
            elif kind == "barrier" and now >= n.muted_until:
                self.enter(n, arg, when)

    def received(self, ident: bytes, cmd: Command, body: dict[str, Any] | None, now: float) -> None:
        """What the scheduler sent to simulated node ``ident`` (already encoded as on the wire)."""
        n = self.nodes[ident]
        if not n.alive:
            return
        if cmd is Command.WELCOME:
            assert body is not None
            if n.welcomed is None:
                n.welcomed = now
                self.last_welcome = max(self.last_welcome, now)
            n.barrier_done = max(n.barrier_done, int(body.get("barriers", 0)))
        elif cmd is Command.BARRIER_DONE:
            assert body is not None
            b = int(body["n"])
            key = (ident, b)
            self.answers[key] = self.answers.get(key, 0) + 1
            if self.answers[key] == 1:
                self.answered[b] = self.answered.get(b, 0) + 1
            if self.answers[key] > 1:
                self.violations.append(f"{ident.decode()} got BARRIER_DONE {b} {self.answers[key]} times")
            n.barrier_done = max(n.barrier_done, b)
            self.barrier_answered[b] = now
            self.barrier_answered_at[b] = self.sent_at
        elif cmd in (Command.SHUTDOWN, Command.PEER_LOST):
            if n.role == Role.SERVER:
                self.hand(n, _frames(Command.BYE, Bye().to_body()), now)
            n.alive = False

    # -- invariants ----------------------------------------------------------------------
    def check(self, now: float) -> None:
        """No false death; every silenced node called silent within its bound."""
        if now < self._next_check:
            return
        self._next_check = now + 0.1
        bound = 2 * self.cfg.dead_after   # (the goal: a lost host named within twice the timeout)
        for node in self.sched.nodes.values():
            n = self.nodes.get(node.ident)
            if n is None or node.state in (NodeState.REGISTERED, NodeState.ALIVE, NodeState.FINISHED):
                continue
            if n.ident in self.silenced:
                self.detected.setdefault(n.ident, now)
            elif n.alive and not self.done:
                self.violations.append(f"false death: {node.name} is {node.state.value} but lives")
        for ident, when in self.silenced.items():
            if ident not in self.detected and now - when > bound:
                self.violations.append(f"{ident.decode()} silent {now - when:.1f} s and not called so "
                                       f"(bound {bound:.1f} s)")
                self.detected[ident] = now
        if self.violations:
            raise SimulationError("; ".join(self.violations[:5]))

    # -- the scenario's steps --------------------------------------------------------------
    def advance(self, now: float) -> None:
        self.fire(now)
        self.check(now)
        while not self.done and self.waiting(now):
            try:
                self.waiting = next(self.steps)
            except StopIteration:
                self.done = True
                self.inbox.append((b"control", _frames(Command.STOP, Stop("simulation over").to_body()), now))
                return
            self.step_deadline = now + self.cfg.step_timeout
        if not self.done and now > self.step_deadline:
            raise SimulationError(f"step {self.step_name!r} did not complete within {self.cfg.step_timeout:g} s")

    def next_event(self) -> float:
        return self.events[0][0] if self.events else float("inf")

    def workers(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.role == Role.WORKER and n.alive]

    def arrived(self, when: float) -> None:
        """The scheduler takes a message that arrived at ``when``: its clock, as a single-core
        queue, goes on from its work so far (every CPU second of the scheduler's since the last
        message) or from the arrival, whichever is later."""
        cpu = self.cpu()
        self.clock = max(self.clock + cpu - self.clock_cpu, when)
        self.clock_cpu = cpu

    def scheduler_clock(self) -> float:
        """Now on the scheduler's clock (:meth:`arrived`)."""
        return self.clock + self.cpu() - self.clock_cpu

    def cpu(self) -> float:
        """The scheduler's CPU time so far: this thread's, less the simulation's."""
        return time.thread_time() - self.sim_cpu

    def simulated(self) -> float:
        """The simulation's CPU time so far (the wait in progress included)."""
        return self.sim_cpu + (0.0 if self.polling is None else time.thread_time() - self.polling)


class SimChannel:
    """The scheduler's channel: simulated nodes' messages first (decoded as frames from the
    socket are), then the real socket's; what goes to a simulated node is encoded and handed
    over, the rest is sent on the socket."""

    def __init__(self, real: Any, world: World) -> None:
        self.real = real
        self.world = world
        self.sock = real.sock

    def recv(self, routed: bool = False) -> tuple[bytes | None, Message] | None:
        w = self.world
        now = time.monotonic()
        if now >= w.next_turn:   # (the nodes act while the scheduler works through its queue too)
            t0 = w.polling = time.thread_time()
            try:
                w.advance(now)
            finally:
                w.sim_cpu += time.thread_time() - t0
                w.polling = None
            w.next_turn = now + TURN
        inbox = w.inbox
        if inbox:
            ident, frames, when = inbox.popleft()
            w.arrived(when)
            return ident, decode(list(frames), JOB, _MAX)
        return self.real.recv(routed)

    def send(self, cmd: Any, body: dict[str, Any] | None = None, arrays: Any = None, to: bytes | None = None,
             **kw: Any) -> Any:
        w = self.world
        if to is not None and to in w.nodes:
            self.real.send(cmd, body, arrays, to=to, **kw)   # (its cost: zmq drops it)
            w.sent_at = w.scheduler_clock()
            t0 = time.thread_time()   # (the node's handling: the simulation's CPU time)
            w.received(to, cmd, body, time.monotonic())
            w.sim_cpu += time.thread_time() - t0
            return None
        if to is not None and to in w.relay_idents:
            self.real.send(cmd, body, arrays, to=to, **kw)
            t0 = time.thread_time()
            w.relay_answered(to, body)
            w.sim_cpu += time.thread_time() - t0
            return None
        return self.real.send(cmd, body, arrays, to=to, **kw)

    def send_all(self, cmd: Any, body: dict[str, Any] | None, idents: list[bytes]) -> None:
        self.real.send_all(cmd, body, idents)   # (every one on the socket: its cost; zmq drops the simulated)
        w = self.world
        w.sent_at = w.scheduler_clock()
        t0 = time.thread_time()   # (the nodes' handling: the simulation's CPU time)
        now = time.monotonic()
        for ident in idents:
            if ident in w.nodes:
                w.received(ident, cmd, body, now)
        w.sim_cpu += time.thread_time() - t0

    def close(self) -> None:
        self.real.close()


class SimPoller:
    """The scheduler's wait: the simulated world acts here (its CPU time is the simulation's)."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.inner = Poller()

    def add(self, chan: Any) -> None:
        self.inner.add(chan.real if isinstance(chan, SimChannel) else chan)

    def poll(self, timeout: float) -> set[Any]:
        """As a socket's poll: back when a message waits (a simulated node's or a real one) or
        ``timeout`` has passed, never in between (the simulation's own events, such as a node
        going silent, happen inside the wait)."""
        w = self.world
        t0 = w.polling = time.thread_time()
        end = time.monotonic() + timeout
        try:
            while True:
                now = time.monotonic()
                w.advance(now)
                if w.inbox:
                    return {1}
                if now >= end:
                    return set()
                if self.inner.poll(max(0.0, min(end, w.next_event()) - now)):
                    return {1}
        finally:
            w.sim_cpu += time.thread_time() - t0
            w.polling = None


def wait_until(w: World, name: str, pred: Callable[[float], bool]) -> Callable[[float], bool]:
    w.step_name = name
    return pred


def scenario(w: World) -> Generator[Callable[[float], bool], None, None]:
    """The steps (module docstring); each yields what it waits for."""
    cfg, rng = w.cfg, w.rng
    t0 = time.monotonic()
    procs = [(Role.SERVER.value, r) for r in range(cfg.servers)] + [(Role.WORKER.value, r) for r in range(cfg.workers)]
    rng.shuffle(procs)
    for i, (role, rank) in enumerate(procs):
        w.add_node(role, rank, i // PER_HOST, t0 + rng.uniform(0, cfg.spread))
    w.hosts = (len(procs) + PER_HOST - 1) // PER_HOST
    yield wait_until(w, "registration", lambda now: all(n.welcomed is not None for n in w.nodes.values()))
    assert w.first_register is not None
    w.results.update(start_s=w.last_welcome - w.first_register,
                     slowest_welcome_s=max(n.welcomed - n.start for n in w.nodes.values() if n.welcomed))
    w.results["scheduler_state_mb"] = deep_size(w.sched, skip=(w.sched.t, w.sched.chan)) / 2**20
    settle = time.monotonic() + cfg.heartbeat
    yield wait_until(w, "settle", lambda now: now >= settle)
    cpu0, t_idle, handed = w.cpu(), time.monotonic(), w.handed
    yield wait_until(w, "idle", lambda now: now >= t_idle + cfg.idle)
    w.results["cpu_idle_share"] = (w.cpu() - cpu0) / (time.monotonic() - t_idle)
    w.results["idle_msgs_per_s"] = (w.handed - handed) / (time.monotonic() - t_idle)
    if cfg.status_queries:
        cpu0 = w.cpu()
        asker = threading.Thread(target=ask_status, args=(w, cfg.status_queries), daemon=True)
        asker.start()
        yield wait_until(w, "status", lambda now: not asker.is_alive())
        if len(w.status) != cfg.status_queries:
            raise SimulationError(f"status answered {len(w.status)} of {cfg.status_queries} questions")
        w.results["status_s"] = max(w.status)
    latencies = []
    for b in range(1, cfg.barriers + 1):
        latencies.append((yield from barrier(w, b)))
    if latencies:
        w.results["barrier_ms"] = 1e3 * sorted(t for t, _ in latencies)[len(latencies) // 2]
        w.results["barrier_max_ms"] = 1e3 * max(t for t, _ in latencies)
        w.results["barrier_wall_ms"] = 1e3 * sorted(t for _, t in latencies)[len(latencies) // 2]
        msgs = sorted(w.barrier_msgs[b] for b in range(1, cfg.barriers + 1))
        w.results["barrier_msgs"] = msgs[len(msgs) // 2]
    if not cfg.faults:
        return
    # a silent worker, replaced
    lone = rng.choice(w.workers())
    yield from lose(w, [lone], "a silent worker")
    w.results["detect_node_s"] = w.detected[lone.ident] - w.silenced[lone.ident]
    # a lost host (its 8 processes at once), each replaced on a new host
    host = rng.choice(sorted({n.host for n in w.nodes.values() if n.alive and n.host != lone.host}))
    gone = [n for n in w.nodes.values() if n.host == host and n.alive]
    yield from lose(w, gone, "a lost host")
    w.results["detect_host_s"] = max(w.detected[n.ident] for n in gone) - min(w.silenced[n.ident] for n in gone)
    # a partition of two hosts, shorter than the heartbeat timeout: nobody is called silent
    cut = rng.sample(sorted({n.host for n in w.nodes.values() if n.alive}), 2)
    until = time.monotonic() + 0.6 * cfg.dead_after
    for n in w.nodes.values():
        if n.host in cut and n.alive:
            n.muted_until = until
    healed = until + cfg.dead_after
    yield wait_until(w, "partition", lambda now: now >= healed)
    b = cfg.barriers + 1
    yield from barrier(w, b)
    members = w.workers()
    if len(members) != cfg.workers or any((n.ident, b) not in w.answers for n in members):
        raise SimulationError(f"barrier {b}: {len(members)} workers live, "
                              f"{sum((n.ident, b) in w.answers for n in members)} answered")
    w.results["barriers_answered"] = sum(1 for (_, k) in w.answers if k == b)


def barrier(w: World, b: int) -> Generator[Callable[[float], bool], None, tuple[float, float]]:
    """Every live worker enters barrier ``b`` within ``barrier_spread`` seconds; the latency from the last
    worker's entry to the last BARRIER_DONE sent, on the scheduler's clock (:meth:`World.arrived`),
    and on the wall clock."""
    now = time.monotonic()
    live = w.workers()
    for n in live:
        w.at(now + w.rng.uniform(0, w.cfg.barrier_spread), "barrier", n.ident, b)
    # (counted first: the wait is checked at every turn of the scheduler's loop)
    yield wait_until(w, f"barrier {b}", lambda t: w.answered.get(b, 0) >= len(live)
                     and all(n.barrier_done >= b for n in live))
    return w.barrier_answered_at[b] - w.barrier_entered[b], w.barrier_answered[b] - w.barrier_entered[b]


def lose(w: World, lost: list[SimNode], what: str) -> Generator[Callable[[float], bool], None, None]:
    """Silence ``lost`` at once; once the scheduler called each silent, start its replacement
    (same rank, a new process on a new host) as the launcher would; wait for their WELCOMEs."""
    now = time.monotonic()
    for n in lost:
        n.alive = False
        w.silenced[n.ident] = now
    yield wait_until(w, f"{what}: detected", lambda t: all(n.ident in w.detected for n in lost))
    w.hosts += 1
    fresh = [w.add_node(n.role, n.rank, w.hosts, time.monotonic(), tag="r") for n in lost]
    for old in lost:
        old.replaced = True
    yield wait_until(w, f"{what}: replaced", lambda t: all(n.welcomed is not None for n in fresh))


def ask_status(w: World, times: int) -> None:
    """``psnode.launcher.status`` from another process, ``times`` times: each round trip."""
    code = ("import sys, time, json; from psnode import launcher as door\n"
            "out = []\n"
            f"for _ in range({times}):\n"
            "    t = time.perf_counter(); a = door.status(sys.argv[1], sys.argv[2], timeout=60.0)\n"
            "    json.dumps([r.__dict__ if hasattr(r, '__dict__') else str(r) for r in a.nodes], default=str)\n"
            "    out.append([time.perf_counter() - t, len(a.nodes)])\n"
            "print(json.dumps(out))\n")
    address = f"{w.sched.cfg.scheduler_host}:{w.sched.cfg.scheduler_port}"
    res = subprocess.run([sys.executable, "-c", code, address, JOB], capture_output=True, text=True, timeout=300,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if res.returncode == 0:
        w.status.extend(t for t, _ in json.loads(res.stdout))
    else:
        print(res.stderr[-2000:], file=sys.stderr)


def deep_size(obj: Any, skip: tuple[Any, ...] = ()) -> int:
    """Bytes held by ``obj`` and what it references (each object once; ``skip`` left out)."""
    seen = {id(s) for s in skip}
    todo, total = [obj], 0
    while todo:
        o = todo.pop()
        if id(o) in seen or isinstance(o, (type, types.ModuleType, types.FunctionType, types.MethodType,
                                           threading.Thread, logging.Logger)):
            continue
        seen.add(id(o))
        total += sys.getsizeof(o)
        if isinstance(o, dict):
            todo.extend(o.keys())
            todo.extend(o.values())
        elif isinstance(o, (list, tuple, set, frozenset, deque)):
            todo.extend(o)
        elif hasattr(o, "__dict__") and not isinstance(o, (str, bytes, int, float)):
            todo.append(vars(o))
        elif hasattr(o, "__slots__"):
            todo.extend(getattr(o, s) for s in o.__slots__ if hasattr(o, s))
    return total


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def simulate(cfg: SimConfig) -> dict[str, Any]:
    """Run the scenario at ``cfg``'s size; its figures (raises SimulationError when an invariant
    broke or a step took too long)."""
    node = NodeConfig(role=Role.SCHEDULER, scheduler_host="127.0.0.1", scheduler_port=free_port(),
                      num_workers=cfg.workers, num_servers=cfg.servers, job_id=JOB, host="127.0.0.1",
                      heartbeat_interval=cfg.heartbeat, heartbeat_liveness=cfg.liveness, register_timeout=600.0,
                      max_restarts=1000, replicas=2, stall_warning=3600.0)
    sched = Scheduler(node)
    world = World(cfg, sched)
    sched.chan = SimChannel(sched.chan, world)   # type: ignore[assignment]
    t0 = time.monotonic()
    try:
        code = sched.run(SimPoller(world))
    finally:
        gc.unfreeze()   # (the scheduler froze what lived at the job's start: this process goes on)
    if not world.done:
        raise SimulationError(f"the scheduler ended (exit {code}) in step {world.step_name!r}")
    out = {"workers": cfg.workers, "servers": cfg.servers, "hosts": world.hosts, "relay": cfg.relay,
           "heartbeat_s": cfg.heartbeat,
           "dead_after_s": cfg.dead_after, **world.results, "wall_s": time.monotonic() - t0,
           "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "relayed": sched.relayed,
           "exit": code}
    return out


COLUMNS = (("workers", "workers", "d"), ("servers", "servers", "d"), ("hosts", "hosts", "d"),
           ("relay", "relay", "s"), ("idle_msgs_per_s", "messages/s idle", ".0f"),
           ("start_s", "first REGISTER to job start s", ".2f"),
           ("slowest_welcome_s", "slowest start to WELCOME s", ".2f"),
           ("cpu_idle_share", "scheduler CPU idle %", ".1%"), ("barrier_ms", "barrier ms", ".1f"),
           ("barrier_max_ms", "barrier max ms", ".1f"),
           ("barrier_wall_ms", "barrier wall ms", ".1f"),
           ("barrier_msgs", "messages per barrier", "d"), ("detect_node_s", "silent node detected s", ".2f"),
           ("detect_host_s", "lost host detected s", ".2f"), ("status_s", "status answer s", ".2f"),
           ("scheduler_state_mb", "scheduler state MiB", ".1f"), ("peak_rss_mb", "peak RSS MiB", ".0f"))


def table(results: list[dict[str, Any]]) -> str:
    head = "| " + " | ".join(title for _, title, _ in COLUMNS) + " |"
    rows = [head, "|" + "---|" * len(COLUMNS)]
    for r in results:
        cells = []
        for key, _, spec in COLUMNS:
            v = r.get(key)
            v = ("yes" if v else "no") if spec == "s" else v
            cells.append("-" if v is None else (f"{100 * v:.1f}%" if spec == ".1%" else format(v, spec)))
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", default="100,1000,10000", help="job sizes in workers (default 100,1000,10000)")
    ap.add_argument("--heartbeat", type=float, default=1.0)
    ap.add_argument("--spread", type=float, default=2.0, help="seconds over which the nodes start")
    ap.add_argument("--idle", type=float, default=5.0)
    ap.add_argument("--barriers", type=int, default=5)
    ap.add_argument("--barrier-spread", type=float, default=0.05,
                    help="seconds over which the workers enter a barrier (default 0.05)")
    ap.add_argument("--no-faults", action="store_true")
    ap.add_argument("--no-relay", action="store_true", help="every node heartbeats the scheduler directly")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args(argv)
    logging.getLogger("psnode").setLevel(logging.ERROR)   # (the replaced nodes' warnings, by the thousand)
    print(f"control plane simulation: {platform.python_version()} on {os.cpu_count()} cpu(s)", flush=True)
    results = []
    for w in (int(x) for x in a.workers.split(",")):
        cfg = SimConfig(w, heartbeat=a.heartbeat, spread=a.spread, idle=a.idle, barriers=a.barriers,
                        barrier_spread=a.barrier_spread, faults=not a.no_faults, relay=not a.no_relay, seed=a.seed)
        got = simulate(cfg)
        print(json.dumps(got), flush=True)
        results.append(got)
    print(table(results))
    if a.json:
        Path(a.json).write_text(json.dumps({"argv": sys.argv, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
