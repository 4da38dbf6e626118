"""The exactly-once invariant (psnode.worker.journal) where it lives, under a simulated network and
clock: thousands of seeded kill points, no processes.

Three simulated workers (the real :class:`psnode.worker.tracker.Tracker` and its journal) train
against two simulated servers (the real :class:`psnode.server.store.Store`, checkpointed with
the real :func:`psnode.server.checkpoint.snapshot` and restored with :func:`psnode.server.checkpoint.restore`
through JSON, as from a file, before the replies that need it: :meth:`Store.release`).  Keys:
a bucket of two small keys (psnode.server.buckets), a key split over both servers, a plain key.  Each
step a worker pushes every key (the bucket whole or key by key, a push alone or as a
pushpull, chosen at random) and pulls it; plain SGD with learning rate 1, so a push applied
twice or never changes the value, which every pull checks exactly.

The network delays, reorders, duplicates and drops messages; a killed server loses what was in
flight to it and comes back from its last checkpoint (workers are told: psnode.worker.ioloop's
``restored``); a killed worker's in-flight messages may still arrive, answers to it reach its
replacement (same identity), which resumes from the counts its servers answer at init, as
``kv.num_pushes`` does (what the dead worker sent arrives, or not, before its replacement
starts, as it would seconds later).  Every run must end with every worker done, every pull exact, and the
servers' values those of the uninterrupted run.
"""
from __future__ import annotations

import json
import random
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from psnode.errors import PSError
from psnode.math.optimizers import create as create_optimizer
from psnode.protocol import Failed, Flush, Init, Ok, Pull, Push, PushPull, SetOptimizer, Wait, bucket_key
from psnode.server import chain as disk
from psnode.server import checkpoint, replicas
from psnode.server.image import Image
from psnode.server.points import Points
from psnode.server.store import Store
from psnode.worker.tracker import Request, Tracker

W, S = 3, 2
STEPS = 8
BKEY = bucket_key(0)
# key -> (size, [(server, part, lo, hi)], bucket offset or None)
KEYS: dict[str, tuple[int, list[tuple[int, int, int, int]], int | None]] = {
    "a": (2, [(0, 0, 0, 2)], 0),
    "b": (3, [(0, 0, 0, 3)], 2),
    "big": (8, [(0, 0, 0, 4), (1, 1, 4, 8)], None),
    "c": (3, [(1, 0, 0, 3)], None),
}
MEMBERS = ("a", "b")
SPEC = create_optimizer("sgd", learning_rate=1.0).to_spec()
#: the workers' journals' hard bound (psnode.worker.journal: ASK_DEPTH), small enough for STEPS to
#: reach it; with background points past the lag that begins a point on the server's own
#: (psnode.server.points: LAG): both the server's own points and the asks run
DEPTH, BACKGROUND_DEPTH, BACKGROUND_LAG = 4, 5, 3


def pattern(key: str) -> np.ndarray:
    return (np.arange(KEYS[key][0]) % 3 + len(key)).astype(np.float32)


def grad(key: str, rank: int, step: int) -> np.ndarray:
    return np.float32((rank + 1) * step) + pattern(key)


def want(key: str, step: int) -> np.ndarray:
    """SGD with learning rate 1 on the mean gradient 2 t + pattern (W = 3), t = 1..step."""
    return -(np.float32(step * (step + 1)) + np.float32(step) * pattern(key))


class Fut:
    def __init__(self, on_ok: Any) -> None:
        self.on_ok = on_ok

    def set(self, ans: Ok) -> None:
        self.on_ok(ans)

    def fail(self, exc: BaseException) -> None:
        raise AssertionError(f"a request failed: {exc!r}")


@dataclass(eq=False)
class Msg:
    to: tuple[str, int]          # ("server", s) or ("worker", w)
    frm: int                     # the other end's rank
    items: list[Any]
    incarnation: int             # the sender's (a worker's) life, for answers to it
    at: float


class Torn(Exception):
    """The server dies in the middle of a copy to its replicas (a fault point)."""


class SimChain:
    """A checkpoint chain on a simulated disk for :class:`psnode.server.points.Points`: a point
    taken while the loop waits lands at once (whole); a background point's changes land when the
    simulation says (:meth:`land`, or the server's pump while it waits for one); a kill loses
    those not landed.  The disk (``image``) survives the server."""

    def __init__(self) -> None:
        self.image: Image | None = None
        self.based = False
        self.written = 0
        self.writes: list[tuple[Future, tuple[dict[str, Any], dict[str, np.ndarray]]]] = []

    def appendable(self, size: int) -> bool:
        return self.based

    def append(self, changes: Any, store: Store) -> Future:
        fut: Future = Future()
        meta, arrays = changes
        self.writes.append((fut, (json.loads(json.dumps(meta)), {k: np.array(a) for k, a in arrays.items()})))
        return fut

    def point(self, store: Store) -> Future:
        self.land()
        meta, arrays = checkpoint.snapshot(store)
        self.image = Image(json.loads(json.dumps(meta)), {k: np.array(a, copy=True) for k, a in arrays.items()})
        self.based = True
        fut: Future = Future()
        fut.set_result(None)
        return fut

    @staticmethod
    def wait(fut: Future, pump: Any) -> None:
        disk.wait(fut, pump)

    def land(self, count: int | None = None) -> None:
        """The oldest ``count`` background writes reach the disk (None: all)."""
        while self.writes and (count is None or count > 0):
            fut, changes = self.writes.pop(0)
            assert self.image is not None
            self.image.apply(*changes)
            fut.set_result(None)
            count = None if count is None else count - 1

    def lose(self) -> None:
        """The server died: writes not landed never will."""
        self.writes.clear()

    def close(self) -> None:
        pass


class SimServer:
    """A server: the store, its last checkpoint (as from disk) and the release policy.  With
    ``peers`` (replicated: psnode.server.replicas) its checkpoint is a copy to its holders'
    keepers (``held``, lost with the holder), packed and unpacked as on the wire, and a restart
    takes the newest copy a holder keeps; ``torn`` makes the next copy die before
    (``"before"``) or after (``"after"``) its holder got it, and before the store marks it."""

    def __init__(self, rank: int, every: int, peers: list[SimServer] | None = None, background: bool = False) -> None:
        self.rank, self.every, self.peers = rank, every, peers
        self.store = Store(W, restartable=True)
        # ``background``: durable points through psnode.server.points on a SimChain, their
        # writes landing later (answers that need them wait; others leave at once)
        self.chain = SimChain() if background else None
        self.outbox: list[Any] = []
        self.points: Points | None = None
        if self.chain is not None:
            self._new_points()
            self.store.track_changes = True
            self.points.point(self.chain.land)   # type: ignore[union-attr]  (a restartable server's first)
        self.saved: tuple[dict[str, Any], dict[str, np.ndarray]] | None = None
        self.held: dict[int, tuple[int, list[np.ndarray]]] = {}   # the keeper's memory
        self.seq = 0
        self.torn: str | None = None
        self.checkpoints = 0
        if peers is None and self.chain is None:
            self.checkpoint()      # (psnode.server.loop: a restartable server writes one at start)

    def _new_points(self) -> None:
        self.points = Points(self.store, self.outbox.extend, self.every, resend_after=1.0)
        self.points.lags.pushes = BACKGROUND_LAG
        self.points.chain = self.chain  # type: ignore[assignment]

    def checkpoint(self) -> None:
        meta, arrays = checkpoint.snapshot(self.store)
        if self.peers is None:
            self.saved = (json.loads(json.dumps(meta)), {k: np.array(v, copy=True) for k, v in arrays.items()})
        else:
            self.seq += 1
            packed = [np.array(a, copy=True) for a in replicas.pack_state(meta, arrays)]
            if self.torn == "before":
                raise Torn
            for h in replicas.holders(self.rank, S, 2):
                self.peers[h].held[self.rank] = (self.seq, packed)
            if self.torn == "after":
                raise Torn
        self.store.mark_durable()
        self.checkpoints += 1

    def handle(self, worker: int, ops: list[Any]) -> list[Any]:
        replies = []
        for op in ops:
            replies.extend(self.store.handle(worker, op))
        if self.points is not None:
            assert self.chain is not None
            self.points.reply(replies, self.chain.land)
            return self.sent()
        return self.store.release(replies, self.every, self.checkpoint)

    def sent(self) -> list[Any]:
        out, self.outbox[:] = list(self.outbox), []
        return out

    def restart(self) -> None:
        self.store = Store(W, restartable=True)
        self.torn = None
        if self.chain is not None:
            self.chain.lose()
            self._new_points()
            assert self.chain.image is not None
            meta, arrays = self.chain.image.whole()
            checkpoint.restore(self.store, json.loads(json.dumps(meta)), dict(arrays), same_job=True)
            self.store.track_changes = True
            return
        if self.peers is None:
            assert self.saved is not None
            meta, arrays = self.saved
        else:
            self.held = {}   # (what this server's keeper held died with it)
            copies = [self.peers[h].held[self.rank] for h in replicas.holders(self.rank, S, 2)
                      if self.rank in self.peers[h].held]
            assert copies, f"server {self.rank}: no replica holds its state"
            meta, arrays = replicas.unpack_state(max(copies, key=lambda c: c[0])[1])
        checkpoint.restore(self.store, json.loads(json.dumps(meta)), arrays, same_job=True)


@dataclass
class SimWorker:
    rank: int
    incarnation: int
    rng: random.Random
    tracker: Tracker = field(init=False)
    counts: dict[tuple[str, int], int] = field(default_factory=dict)
    done: dict[str, int] = field(default_factory=dict)
    step: int = 0
    waiting: int = 0
    phase: str = "init"
    tally: list[int] = field(default_factory=lambda: [0])   # checked pulls, shared by every life
    depth: int = DEPTH

    def __post_init__(self) -> None:
        self.tracker = Tracker(S, retry_timeout=1.0, max_retries=10**6, first_id=1 + self.incarnation * 10**6)
        self.tracker.journal.depth = self.depth

    # the script ------------------------------------------------------------------------------
    def start(self, now: float) -> None:
        for s in range(S):
            self._ask(s, SetOptimizer(SPEC), lambda ans: None)
        for key, (size, parts, offset) in KEYS.items():
            for server, part, lo, hi in parts:
                op = Init(key, part, "float32", (hi - lo,), sync=True)
                if offset is not None:
                    op.bucket, op.offset = 0, offset
                if self.rank == 0:
                    op.value = np.zeros(hi - lo, np.float32)
                self._ask(server, op, lambda ans, k=key, p=part: self.counts.__setitem__((k, p), ans.seq))

    def _ask(self, server: int, op: Any, on_ok: Any, label: str = "") -> None:
        self.waiting += 1

        def done(ans: Ok) -> None:
            self.waiting -= 1
            on_ok(ans)
        self.tracker.add(Request(server, op, 0, Fut(done), label=label, guard=_guard(op)))

    def _tell(self, server: int, op: Any) -> None:
        self.tracker.add(Request(server, op, 0, None, guard=_guard(op)))

    def advance(self) -> None:
        """The next step of the script once nothing is awaited."""
        if self.waiting or self.phase == "finished":
            return
        if self.phase == "init":   # (resume: kv.num_pushes, a split key by its lowest part)
            for key, (_, parts, _) in KEYS.items():
                self.done[key] = min(self.counts[(key, p)] for _, p, _, _ in parts)
            self.step = min(self.done.values())
            self.phase = "train"
        if self.phase == "flush":
            self.phase = "finished"
            return
        if self.step >= STEPS:
            for s in range(S):
                self._ask(s, Flush(), lambda ans: None)
            self.phase = "flush"
            return
        self.step += 1
        self._push_and_pull(self.step)

    def _push_and_pull(self, t: int) -> None:
        """Push what this rank has not pushed of step ``t``, then pull every key after ``t``
        (a key a resumed life's servers had taken more of is not waited for: with sparse
        checkpoints a server may have lost a dead predecessor's pushes that another kept)."""
        rng = self.rng
        need = [k for k in MEMBERS if t > self.done[k]]
        if len(need) == 2 and rng.random() < 0.7:   # the bucket whole
            data = np.concatenate([grad(k, self.rank, t) for k in MEMBERS])
            if rng.random() < 0.5:
                self._ask(0, PushPull(BKEY, 0, t, data), self._checker(list(MEMBERS), t), "keys 'a', 'b'")
            else:
                self._tell(0, Push(BKEY, 0, t, data))
                self._ask(0, Pull(BKEY, 0, t), self._checker(list(MEMBERS), t), "keys 'a', 'b'")
        else:
            for k in need:
                self._tell(0, Push(k, 0, t, grad(k, self.rank, t)))
            for k in MEMBERS:
                self._ask(0, Pull(k, 0, t), self._checker([k], t))
        for key in ("big", "c"):
            _, parts, _ = KEYS[key]
            for server, part, lo, hi in parts:
                g = grad(key, self.rank, t)[lo:hi]
                if t > self.done[key] and rng.random() < 0.4:
                    self._ask(server, PushPull(key, part, t, g), self._checker([key], t, lo, hi, part))
                    continue
                if t > self.done[key]:
                    self._tell(server, Push(key, part, t, g))
                self._ask(server, Pull(key, part, t), self._checker([key], t, lo, hi, part))

    def _checker(self, keys: list[str], step: int, lo: int = 0, hi: int | None = None, part: int = 0) -> Any:
        """Each key's value (``[lo:hi]`` of a split key's ``part``) must be exactly that after
        round ``step`` -- or, for a part its servers had taken more pushes of when this life
        started (a split key resumes at its least advanced part), after a round up to that."""
        def check(ans: Ok) -> None:
            got = ans.arrays[0].reshape(-1)
            at = 0
            for k in keys:
                n = len(want(k, step)[lo:hi])
                mine, at = got[at:at + n], at + n
                last = max(step, self.counts.get((k, part), 0))
                ok = any(np.array_equal(mine, want(k, r)[lo:hi]) for r in range(step, last + 1))
                assert ok, (f"worker {self.rank} (life {self.incarnation}) step {step} key {k!r}[{lo}:{hi}]: "
                            f"{mine} is not the value after round {step}" + (f"..{last}" if last > step else ""))
            self.tally[0] += 1
        return check


class Sim:
    """The network, the clock and the fault schedule of one seeded run."""

    def __init__(self, seed: int, every: int, kills: int, replicated: bool = False, background: bool = False) -> None:
        self.rng = random.Random(seed)
        self.now = 0.0
        self.replicated = replicated
        peers: list[SimServer] = []
        self.servers = [SimServer(s, every, peers if replicated else None, background) for s in range(S)]
        peers.extend(self.servers)
        for server in self.servers if replicated else ():
            server.checkpoint()    # (the first copy, once every keeper is up)
        self.lives = [0] * W
        self.checked = [0]
        self.depth = BACKGROUND_DEPTH if background else DEPTH
        self.workers = [SimWorker(w, 0, random.Random(self.rng.random()), tally=self.checked, depth=self.depth)
                        for w in range(W)]
        self.flight: list[Msg] = []
        self.kills_left = kills
        self.kill_log: list[str] = []
        self.down_until: dict[int, float] = {}
        for w in self.workers:
            w.start(self.now)

    def send(self, w: SimWorker, batches: dict[int, list[Any]]) -> None:
        for server, ops in batches.items():
            if not ops:
                continue
            if server in self.down_until:   # (its address is gone until the replacement is announced)
                continue
            self.flight.append(Msg(("server", server), w.rank, list(ops), w.incarnation, self.now + self._delay()))

    def _delay(self) -> float:
        return self.rng.expovariate(20.0)

    def pump(self, w: SimWorker) -> None:
        self.send(w, w.tracker.take(self.now))
        for fut, outcome in w.tracker.outcomes:
            if isinstance(outcome, BaseException):
                raise AssertionError(f"worker {w.rank}: {outcome!r}")
            fut.set(outcome)
        w.tracker.outcomes.clear()
        if w.tracker.deferred:
            raise AssertionError(f"worker {w.rank}: {w.tracker.deferred[0]!r}")
        w.advance()
        self.send(w, w.tracker.take(self.now))

    def deliver(self, msg: Msg) -> None:
        kind, rank = msg.to
        if kind == "server":
            try:
                replies = self.servers[rank].handle(msg.frm, msg.items)
            except Torn:
                self.kill_log.append(f"{self.now:.2f} server {rank} in a copy")
                self._kill_server(rank)
                return
            self._answer(rank, replies)
        else:
            w = self.workers[rank]
            if w.phase == "finished":
                return
            for ans in msg.items:
                again = w.tracker.answered(msg.frm, ans, self.now)
                self.send(w, again)
            self.pump(w)

    def _answer(self, rank: int, replies: list[Any]) -> None:
        by: dict[int, list[Any]] = {}
        for r in replies:
            by.setdefault(r.worker, []).append(r.answer)
        for w, answers in by.items():
            # (copies: the store's values change under a reply still in flight)
            answers = [_copy(a) for a in answers]
            self.flight.append(Msg(("worker", w), rank, answers, self.lives[w], self.now + self._delay()))

    def _land(self) -> None:
        """Background points: some writes reach the disk; the points that completed release their answers."""
        for server in self.servers:
            if server.chain is None or server.rank in self.down_until:
                continue
            if server.chain.writes and self.rng.random() < 0.1:
                server.chain.land(1)
            assert server.points is not None
            server.points.poll(server.chain.land)
            self._answer(server.rank, server.sent())

    def _copy(self, server: SimServer) -> None:
        try:
            server.checkpoint()
        except Torn:
            self.kill_log.append(f"{self.now:.2f} server {server.rank} in a copy")
            self._kill_server(server.rank)

    def _kill_server(self, rank: int) -> None:
        self.flight = [m for m in self.flight if m.to != ("server", rank) and (m.frm != rank or m.to[0] != "worker"
                                                                             or self.rng.random() < 0.5)]
        self.servers[rank].restart()
        for other in self.servers:
            other.torn = None      # (one host at a time: no other fault while this one is replaced)
        self.down_until[rank] = self.now + self.rng.uniform(0.0, 3.0)
        for w in self.workers:
            w.tracker.down.add(rank)

    def kill(self) -> None:
        alive = [("worker", w.rank) for w in self.workers if w.phase not in ("finished", "flush")]
        # (replicated: one host at a time -- none while a server is being replaced)
        alive += [("server", s) for s in range(S) if s not in self.down_until
                  and not (self.replicated and self.down_until)]
        if not alive:
            return
        kind, rank = self.rng.choice(alive)
        if kind == "server" and self.replicated and self.rng.random() < 0.5:
            self.servers[rank].torn = self.rng.choice(("before", "after"))   # dies in its next copy
            self.kill_log.append(f"{self.now:.2f} server {rank} armed {self.servers[rank].torn}")
            return
        self.kill_log.append(f"{self.now:.2f} {kind} {rank}")
        if kind == "server":
            self._kill_server(rank)
        else:
            # what it sent may still arrive (before its replacement, seconds later, starts);
            # answers to it reach its replacement (the same identity)
            self.flight = [m for m in self.flight if m.to != ("worker", rank) or self.rng.random() < 0.5]
            for m in [m for m in self.flight if m.to[0] == "server" and m.frm == rank]:
                self.flight.remove(m)
                if self.rng.random() < 0.5:
                    self.deliver(m)
            self.lives[rank] += 1
            new = SimWorker(rank, self.lives[rank], random.Random(self.rng.random()), tally=self.checked,
                            depth=self.depth)
            self.workers[rank] = new
            new.start(self.now)
            self.pump(new)

    def run(self) -> None:
        for w in self.workers:
            self.pump(w)
        next_kill = self.rng.uniform(0.05, 1.0)
        for _ in range(200_000):
            if all(w.phase == "finished" for w in self.workers):
                return
            self.now += 0.01
            for s, until in list(self.down_until.items()):
                if self.now >= until:
                    del self.down_until[s]
                    for w in self.workers:
                        self.send(w, {s: w.tracker.restored(s, self.now)})
                    if self.replicated:   # (the replacement holds no copies: its primaries copy again)
                        for primary in self.servers:
                            if primary.rank == s or s in replicas.holders(primary.rank, S, 2):
                                self._copy(primary)
            if self.kills_left and self.now >= next_kill:
                self.kills_left -= 1
                next_kill = self.now + self.rng.uniform(0.05, 1.5)
                self.kill()
            self._land()
            for w in self.workers:
                batches, _ = w.tracker.due(self.now)
                self.send(w, batches)
            due = [m for m in self.flight if m.at <= self.now]
            self.rng.shuffle(due)
            for m in due:
                if m not in self.flight:
                    continue                       # (dropped by a server's death meanwhile)
                self.flight.remove(m)
                r = self.rng.random()
                if r < 0.03:
                    continue                       # lost
                if r < 0.05:
                    self.flight.append(Msg(m.to, m.frm, m.items, m.incarnation, self.now + self._delay()))
                self.deliver(m)
        raise AssertionError("the job hung")


def _guard(op: Any) -> Any:
    """A bucket member's requests name their bucket (as psnode.worker.datapath does)."""
    return (BKEY, 0) if getattr(op, "key", None) in MEMBERS else None


def _copy(ans: Any) -> Any:
    if isinstance(ans, Ok):
        return Ok(ans.id, [np.array(a, copy=True) for a in ans.arrays], ans.seq, ans.names)
    assert isinstance(ans, (Wait, Failed)) or hasattr(ans, "missing"), ans
    if isinstance(ans, Failed):
        raise AssertionError(f"a server refused a request: {ans.kind}: {ans.message}")
    return ans


def _check_final(sim: Sim) -> None:
    for key, (_, parts, _) in KEYS.items():
        for server, part, lo, hi in parts:
            store = sim.servers[server].store
            store.fused.split_all()
            value = store.entries[(key, part)].value.reshape(-1)
            assert np.array_equal(value, want(key, STEPS)[lo:hi]), (key, part, value)


@pytest.mark.parametrize("every", [1, 3, 0])
def test_every_push_is_applied_exactly_once_across_random_kills(every: int) -> None:
    """120 seeded runs per checkpoint cadence, 6 kills each (about 2000 kill points in all)."""
    killed = 0
    for seed in range(120):
        sim = Sim(seed * 7 + every, every, kills=6)
        try:
            sim.run()
            _check_final(sim)
        except (AssertionError, PSError) as exc:
            raise AssertionError(f"seed {seed * 7 + every}, every={every}, kills {sim.kill_log}: {exc}") from exc
        killed += len(sim.kill_log)
        assert sim.checked[0] >= W * STEPS   # (each pull after a push of each step checked)
    assert killed >= 120 * 5


@pytest.mark.parametrize("every", [1, 0])
def test_every_push_is_applied_exactly_once_with_replicas_across_random_kills(every: int) -> None:
    """Replicated servers (K = 2, no disk): 100 seeded runs per cadence, 6 faults each -- a kill,
    or a death in the middle of a copy to the replica, before or after the holder got it --
    one host at a time; every replacement restores the newest copy its holder keeps."""
    torn = 0
    for seed in range(100):
        sim = Sim(seed * 11 + every, every, kills=6, replicated=True)
        try:
            sim.run()
            _check_final(sim)
        except (AssertionError, PSError) as exc:
            raise AssertionError(f"seed {seed * 11 + every}, every={every}, faults {sim.kill_log}: {exc}") from exc
        torn += sum("in a copy" in k for k in sim.kill_log)
        assert sim.checked[0] >= W * STEPS
    assert torn >= 50


def test_a_journal_stays_bounded_when_the_server_checkpoints_only_when_asked() -> None:
    """every=0: no checkpoint by rounds; journals never hold more than their bound of pushes of a key
    part for long: the push that reaches it asks, and the server checkpoints for it."""
    sim = Sim(11, 0, kills=0)
    deepest = 0
    original = SimWorker.advance

    def advance(self: SimWorker) -> None:
        nonlocal deepest
        for part in self.tracker.journal._parts.values():
            deepest = max(deepest, len(part.pushes))
        original(self)
    SimWorker.advance = advance  # type: ignore[method-assign]
    try:
        sim.run()
    finally:
        SimWorker.advance = original  # type: ignore[method-assign]
    assert 1 < deepest <= DEPTH + 1
    assert all(s.checkpoints > 1 for s in sim.servers)


@pytest.mark.parametrize("every", [1, 0])
def test_every_push_is_applied_exactly_once_with_points_in_the_background(every: int) -> None:
    """Durable points taken in the background (psnode.server.points on a simulated disk whose
    writes land at random later ticks): answers that need a point wait for it while the others
    leave with older watermarks, and a kill loses every write not landed.  100 seeded runs per
    cadence, 6 kills each."""
    killed = 0
    for seed in range(100):
        sim = Sim(seed * 13 + every, every, kills=6, background=True)
        try:
            sim.run()
            _check_final(sim)
        except (AssertionError, PSError) as exc:
            raise AssertionError(f"seed {seed * 13 + every}, every={every}, kills {sim.kill_log}: {exc}") from exc
        killed += len(sim.kill_log)
        assert sim.checked[0] >= W * STEPS
    assert killed >= 100 * 5
