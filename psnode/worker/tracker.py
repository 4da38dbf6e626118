"""A worker's requests from submission to answer (pure: no sockets, no threads, no clocks).

The engine and its I/O loop (:mod:`psnode.worker.engine`, :mod:`psnode.worker.ioloop`) feed it
requests, answers and the time; the tracker decides what to send, what to send again, and which
request fails, and resolves futures:

* **ids and order**: every request gets an id (counting from ``first_id``: a worker starts at a
  random point, so its ids never meet those of a predecessor of its rank, whose answers may
  still reach it: they are ignored); queued requests leave in priority order (higher
  first, then submission order) within a window of bytes in flight per server
  (``window_bytes``: pulls wait; pushes never do, so nothing deadlocks; ``far_window`` bytes,
  when set, for servers not ``near``: sliced arrays keep workers in step on a server, whose
  answer to a part waits for every worker's push of it); a push of a key part
  waits while a pull of that key part is unanswered (a same-host worker may read the value in
  place until its next push: psnode.samehost.link);
* **pending**: a request that expects an answer is kept whole until answered, so it can be sent
  again; a push goes into the :class:`~psnode.worker.journal.PushJournal` instead (until durable:
  the exactly-once invariant is stated there); pushes never wait for durability: a
  restartable server makes its durable points in the background and the answers to later
  pulls bring the watermark, and only a push that finds its key part's journal at the hard
  bound (``ASK_DEPTH`` pushes or ``ASK_BYTES``) asks for an answer that waits for a point (a
  push alone: a quiet answer nobody waits for, though the server's round waits with it; a
  push-pull: its pull's answer);
* **asking** (:meth:`due`): a pull (or init) unanswered for ``ASK_AFTER`` seconds is sent
  again once, marked resent (a push-pull as its pull alone), only to ask the server what it
  waits for: a server holding it for other workers' pushes answers Wait naming them
  (``Request.blockers``: whom its timeline names, psnode.worker.engine), else it
  answers the pull (a second answer is ignored);
* **retry** (:meth:`due`): a request unanswered for ``retry_timeout`` is sent again marked
  resent; after ``max_retries`` resends without a sign of life it fails with PeerLost naming
  the server; requests to a server the scheduler reports down wait without retries, and so do
  those to a server that may be replaced (``replaceable``: servers restart inside the job) and
  stopped answering, for at most ``replaceable`` seconds (the scheduler, or its standby, decides
  within its heartbeat timeout and announces the replacement); an answer from such a server
  shows it was only busy, and its requests get their retries again;
* **answers** (:meth:`answered`): Ok and Failed resolve the future (a pull's Ok confirms the
  pushes before it and brings their durable watermark; a flush's Ok makes the pushes it listed
  durable); Wait is a sign of life (the clock restarts) and, with a ``gap``, the push it names
  is sent again from the journal, or the pull fails with DataLost when the journal no longer
  has it; Missing (a flush found pushes never received) sends those pushes, then the flush again
  (unless that server refused a push of this worker: the flush fails with that refusal, since
  a refused push never arrives);
* **restored servers** (:meth:`restored`): the journal's pushes and every unanswered request,
  again.

Futures are duck-typed (``set(answer)``, ``fail(exc)``) and never resolved inside the tracker:
outcomes collect in :attr:`Tracker.outcomes` for the caller to apply with :func:`settle` once
it released its lock (a future's callback may copy megabytes).
"""
from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from psnode.errors import DataLost, PeerLost, PSError, from_kind
from psnode.protocol import (
    Answer,
    Failed,
    Flush,
    Init,
    Missing,
    Ok,
    Op,
    Pull,
    Push,
    PushPull,
    Wait,
    bucket_of,
    resent,
)
from psnode.protocol.control import WaitKind, WaitReport
from psnode.worker.futures import Notice, Placed
from psnode.worker.journal import PushJournal
from psnode.worker.linkrate import LinkMeter

WINDOW_BYTES = 64 * 2**20      # bytes of answers in flight per server before pulls wait
SLICE_WINDOW = 2               # with PSNODE_SLICE_BYTES: the window is this many slices
SLOW_NOTICE = 30.0             # seconds a parked request waits before the worker says for whom
ASK_AFTER = 0.2                # seconds a pull waits before the worker asks its server for whom

Batches = dict[int, list[Op]]  # server -> operations to send, in order


@dataclass(slots=True)
class Request:
    """One operation for one server, as submitted."""

    server: int
    op: Op
    nbytes: int = 0          # bytes its answer brings back (pulls), counted against the window
    future: Any = None       # None: a push sent without wanting an answer
    priority: int = 0
    order: int = 0           # submission order (set by the tracker)
    guard: Any = None        # what a push must not overtake a pull of (default: its key part)
    keys: int = 1            # key parts it stands for (a bucket's members), for the counters
    label: str = ""          # what it is about, for messages (default: its key)
    auto: bool = False       # a push's answer asked for in advance (psnode.worker.datapath): not a pull
    blockers: tuple[int, ...] = ()   # the workers its server last said it waits for (Wait)


@dataclass(slots=True)
class Pending:
    """A sent request waiting for its answer."""

    request: Request
    sent: float              # when it was last sent
    since: float = 0.0       # when it was first sent
    tries: int = 0           # resends since the last sign of life
    parked: bool = False     # the server answered Wait: it holds the request
    noticed: bool = False    # the long wait was reported
    asked: bool = False      # sent again once to learn what it waits for (ASK_AFTER)
    blockers: list[int] = field(default_factory=list)  # workers a parked pull waits for
    mark: int = 0            # its link's bytes sent up to its last copy (psnode.worker.linkrate)
    ahead: int = 0           # the link's backlog when its last copy left, its own bytes included


def describe(op: Op, label: str = "", auto: bool = False) -> str:
    name = "pull" if auto else type(op).__name__.lower()   # (the pull waits for a push's answer)
    return name if isinstance(op, Flush) or getattr(op, "key", None) is None else f"{name} of {about(op, label)}"


def about(op: Any, label: str = "") -> str:
    """What ``op`` is about, for messages: ``key 'w'``, ``key 'big' part 1``, or a bucket's
    label (its user keys: never the bucket's internal key)."""
    if label:
        return label
    if bucket_of(op.key) is not None:
        return "a bucket of small keys"
    return f"key {op.key!r}" + (f" part {op.part}" if op.part else "")


class _Quiet:
    """The future of a push that asks for its answer only to learn its durability."""

    __slots__ = ()

    def set(self, answer: Any) -> None:
        pass

    def fail(self, exc: BaseException) -> None:
        pass


QUIET = _Quiet()


class Tracker:
    """Requests of one worker to its servers (see the module docstring)."""

    def __init__(self, num_servers: int, retry_timeout: float, max_retries: int,
                 window_bytes: int = WINDOW_BYTES, address: Callable[[int], str] = str, first_id: int = 1,
                 far_window: int = 0, near: Callable[[int], bool] = lambda server: False,
                 replaceable: float = 0.0, notice: Notice | None = None) -> None:
        self.retry_timeout = retry_timeout
        #: raised when a push nobody waits for fails (its error waits in ``deferred``)
        self.notice = Notice() if notice is None else notice
        #: seconds a server that stopped answering is waited for as being replaced (0: it is dead)
        self.replaceable = replaceable
        self.unanswered: dict[int, float] = {}   # server -> when this worker gave it up for replaced
        self.max_retries = max_retries
        self.window_bytes = window_bytes
        self.far_window = far_window         # 0: window_bytes for every server
        self.near = near                     # server -> reached over this host's link
        self.address = address               # server -> "host:port", for messages
        self.journal = PushJournal()
        self.meter = LinkMeter(num_servers)   # bytes and rate of each server's link: deadlines, liveness
        self.pending: dict[int, Pending] = {}
        self.inflight = [0] * num_servers
        self.down: set[int] = set()          # servers being replaced: no retries meanwhile
        self.deferred: list[PSError] = []    # errors of pushes nobody waits for
        self.refused: dict[int, PSError] = {}   # server -> its first refusal of a push nobody waits for
        self.retries = 0                     # requests sent again (lost messages)
        self.pushes = 0
        self.pulls = 0
        self.outcomes: list[tuple[Any, Any]] = []   # (future, Ok or exception) to settle
        self.reading: dict[tuple[Any, int], list[int]] = {}   # key part -> orders of unanswered pulls
        self.members: dict[Any, set[Any]] = {}   # a bucket's key part -> its members' (seen as guards)
        self._checking: dict[int, int] = {}      # server -> request id of its check in flight (_check)
        self._checked: dict[int, float] = {}     # server -> when the last check was sent
        self._verified: dict[int, float] = {}    # server -> when the last check found nothing lost was sent
        self._queue: list[tuple[int, int, Request]] = []
        self._ids = itertools.count(first_id)
        self._order = itertools.count()

    # ------------------------------------------------------------ submission
    def add(self, req: Request) -> None:
        """Queue ``req``; its op gets a fresh id."""
        req.op.id = next(self._ids)
        req.order = next(self._order)
        heapq.heappush(self._queue, (-req.priority, req.order, req))

    @property
    def queued(self) -> bool:
        return bool(self._queue)

    def _window(self, server: int) -> int:
        return self.far_window if self.far_window and not self.near(server) else self.window_bytes

    def submit(self, placed: Sequence[Placed], now: float, hold: bool, local: Collection[int]) -> Batches:
        """The operations of one hand-off (psnode.worker.engine.Engine.send), each queued as a
        request (its future learns it): returns those for ``near`` servers to send now, unless
        ``hold`` (a batch: they wait for :meth:`take`), as :meth:`take` would give them (one
        alone as :meth:`add_now`; several: to the servers in ``local``).  The far ones wait
        for the I/O thread's :meth:`take`."""
        near: list[Request] = []
        for p in placed:
            fut = p.future
            req = Request(p.server, p.op, p.nbytes, fut, p.priority, 0, p.guard, p.keys, p.label, p.auto)
            if fut is not None:
                fut.request = req
            if p.near:
                near.append(req)
            else:
                self.add(req)
        if not near:
            return {}
        if not hold and len(near) == 1:
            return self.add_now(near[0], now)
        for req in near:
            self.add(req)
        return {} if hold else self.take(now, local)

    def add_now(self, req: Request, now: float) -> Batches:
        """``add`` then ``take(now)`` (any server), in one step: what :meth:`take` would
        return after :meth:`add`."""
        if self._queue:
            self.add(req)
            return self.take(now)
        req.op.id = next(self._ids)
        req.order = next(self._order)
        s = req.server
        if (req.nbytes and self.inflight[s] > 0 and self.inflight[s] + req.nbytes > self._window(s)) or \
                (self.reading and isinstance(req.op, (Push, PushPull)) and self._behind_a_pull(req)):
            heapq.heappush(self._queue, (-req.priority, req.order, req))
            return {}
        self.inflight[s] += req.nbytes
        return {s: [self._sent(req, now)]}

    def take(self, now: float, only: Any = None) -> Batches:
        """The queued requests the window admits, in priority order, per server (only those to
        servers in ``only``, when given); they are now pending (or journaled, for pushes)."""
        out: Batches = {}
        held = []
        while self._queue:
            item = heapq.heappop(self._queue)
            req = item[2]
            s = req.server
            if only is not None and s not in only:
                held.append(item)
                continue
            if req.nbytes and self.inflight[s] > 0 and self.inflight[s] + req.nbytes > self._window(s):
                held.append(item)
                continue
            if isinstance(req.op, (Push, PushPull)) and self._behind_a_pull(req):
                held.append(item)
                continue
            self.inflight[s] += req.nbytes
            out.setdefault(s, []).append(self._sent(req, now))
        for item in held:
            heapq.heappush(self._queue, item)
        return out

    def _sent(self, req: Request, now: float) -> Op:
        op = req.op
        if req.guard is not None:   # (a bucket member: its bucket's pulls settle it too)
            group = self.members.get(req.guard)
            if group is None:
                group = self.members[req.guard] = set()
            group.add((op.key, op.part))  # type: ignore[union-attr]
        if isinstance(op, (Push, PushPull)):
            asks = self.journal.remember(req.server, op)
            self.pushes += req.keys
            if asks and type(op) is Push and op.na:
                op.na = False   # (its answer brings the durable watermark: psnode.worker.journal)
                if req.future is None:
                    req.future = QUIET
            elif asks and type(op) is PushPull:
                op.durable = True
        if isinstance(op, (Pull, PushPull)) and not req.auto:
            self.pulls += req.keys
            if req.future is not None:
                self.reading.setdefault(_guard(req), []).append(req.order)
        elif isinstance(op, Flush):
            op.check = self.journal.check_list(req.server)
        mark, ahead = self.meter.sent(req.server, payload(op), now)
        if req.future is not None:
            self.pending[op.id] = Pending(req, now, now, mark=mark, ahead=ahead)
        return op

    def _behind_a_pull(self, req: Request) -> bool:
        """A push submitted after a pull of its key part that is still unanswered (a push
        submitted before it never waits: that pull may be waiting for it)."""
        orders = self.reading.get(_guard(req))
        return orders is not None and min(orders) < req.order

    def protect(self, guards: list[Any], on: bool) -> None:
        """While a thread reads answers of ``guards`` in place, later pushes of them wait."""
        for g in guards:
            if on:
                self.reading.setdefault(g, []).append(-1)
                continue
            orders = self.reading.get(g)   # (fail_all may have cleared it meanwhile)
            if orders and -1 in orders:
                orders.remove(-1)
                if not orders:
                    del self.reading[g]

    def _unread(self, req: Request) -> None:
        op = req.op
        if isinstance(op, (Pull, PushPull)) and not req.auto:
            kp = _guard(req)
            orders = self.reading.get(kp)
            if orders and req.order in orders:
                orders.remove(req.order)
                if not orders:
                    del self.reading[kp]

    # ------------------------------------------------------------ answers
    def answered(self, server: int, ans: Answer, now: float) -> Batches:
        """Handle one answer from ``server``; returns what must be sent again."""
        if isinstance(ans, (Wait, Missing)):
            return self._notice(server, ans, now)
        entry = self.pending.pop(ans.id, None)
        if entry is None:
            self.meter.heard(server, now)
            if isinstance(ans, Failed) and ans.na:  # a push failed: raised by the next call
                exc = from_kind(ans.kind, f"server {server}: {ans.message}")
                self.deferred.append(exc)
                self.refused.setdefault(server, exc)
                self.notice.up = True
            return {}  # (or a second answer to a request sent again)
        self._alive(server, now)
        self.meter.answered(server, entry.mark, now)
        req = entry.request
        self.inflight[req.server] -= req.nbytes
        self._unread(req)
        if isinstance(ans, Failed):
            self.outcomes.append((req.future, from_kind(ans.kind, f"server {server}: {ans.message}")))
            return {}
        op = req.op
        if type(ans) is Ok:
            if isinstance(op, (Pull, PushPull)):
                after = op.after if isinstance(op, Pull) else op.seq
                self.journal.settle((op.key, op.part), after, ans.seq)
                if self.members and (op.key, op.part) in self.members:   # (a bucket: each member)
                    for m in self.members[(op.key, op.part)]:
                        self.journal.settle(m, after, ans.seq)
            elif isinstance(op, Push):
                self.journal.settle((op.key, op.part), 0, ans.seq)
            elif isinstance(op, Flush):
                if op.durable:
                    for k, p, seqs in op.check:
                        self.journal.settle((k, p), 0, max(seqs))
                if self._checking.get(server) == op.id:
                    del self._checking[server]
                    self._verified[server] = entry.since
        self.outcomes.append((req.future, ans))
        return {}

    def _alive(self, server: int, now: float) -> None:
        """``server`` answered: if this worker gave it up for replaced, it was only busy (e.g.
        waiting for a holder of its replicas), so its requests get their retries again."""
        if self.unanswered.pop(server, None) is None:
            return
        self.down.discard(server)
        for p in self.pending.values():
            if p.request.server == server:
                p.sent, p.tries = now, 0

    def _notice(self, server: int, ans: Wait | Missing, now: float) -> Batches:
        entry = self.pending.get(ans.id)
        if entry is None:
            self.meter.heard(server, now)
            return {}
        self._alive(server, now)
        self.meter.answered(server, entry.mark, now)
        entry.sent, entry.tries = now, 0
        req = entry.request
        op = req.op
        if isinstance(ans, Wait):
            entry.blockers, entry.parked = ans.blockers, True
            if ans.blockers:
                req.blockers = tuple(ans.blockers)
            if not ans.gap or not isinstance(op, (Pull, PushPull)):
                return {}
            # a bucket's push q is push q of every member, sent whole or member by member
            keys = self._related(req)
            again = self._copies(server, [resent(p) for p in self.journal.replay(server, {k: {ans.gap} for k in keys})],
                                 now)
            if again:
                self.retries += len(again)
                return {server: again}
            self._drop(ans.id, DataLost(
                f"server {server} needs push {ans.gap} of {about(op, req.label)} again, but that push exists "
                "nowhere any more: the server reported it durable (in its checkpoint), and the checkpoint "
                f"it restarted from lacks it; the job cannot go on exactly (was the checkpoint directory "
                "changed, or written by another job?)"))
            return {}
        refused = self.refused.get(server)
        if refused is not None:   # a refused push is refused again: it never arrives, the flush never ends
            self._drop(ans.id, type(refused)(f"{refused} (a push the server refused is never applied: it lacks "
                                             f"{sum(len(q) for _, _, q in ans.missing)} of this worker's pushes)"))
            return {}
        wanted = {(k, p): set(seqs) for k, p, seqs in ans.missing}
        batch: list[Op] = self._copies(server, [resent(p) for p in self.journal.replay(server, wanted)], now)
        self.retries += len(batch)
        if isinstance(op, Flush):
            op.check = self.journal.check_list(server)
        batch.append(self._again(entry, now))
        return {server: batch}

    def _copies(self, server: int, ops: list[Op], now: float) -> list[Op]:
        """``ops`` go to ``server`` again: their bytes count on its link."""
        for op in ops:
            self.meter.sent(server, payload(op), now)
        return ops

    def _again(self, p: Pending, now: float) -> Op:
        """A copy of the pending request ``p``, sent now: its clock and mark follow it.  A
        push-pull goes again as its pull alone (its push is in the journal: a server that lacks
        it answers Wait naming it, and only then is it sent again)."""
        op = p.request.op
        again = Pull(op.key, op.part, op.seq, id=op.id, re=True) if type(op) is PushPull else resent(op)
        p.sent = now
        p.mark, p.ahead = self.meter.sent(p.request.server, payload(again), now)
        return again

    def _related(self, req: Request) -> list[Any]:
        """The key parts whose journals may hold a push of ``req``'s key part: its own, and a
        bucket's members, or a member's bucket."""
        op = req.op
        own = (op.key, op.part)  # type: ignore[union-attr]
        guard = _guard(req)
        return [own, *self.members.get(own, ())] + ([guard] if guard != own else [])

    def _drop(self, rid: int, exc: PSError) -> None:
        entry = self.pending.pop(rid)
        self.inflight[entry.request.server] -= entry.request.nbytes
        self._unread(entry.request)
        if self._checking.get(entry.request.server) == rid:
            del self._checking[entry.request.server]
        if entry.request.future is QUIET:   # (nobody waits for it: raised by the next call)
            self.deferred.append(exc)
            self.notice.up = True
        else:
            self.outcomes.append((entry.request.future, exc))

    # ------------------------------------------------------------ time
    def due(self, now: float) -> tuple[Batches, list[str]]:
        """Requests unanswered for ``retry_timeout``: sent again, or failed after
        ``max_retries`` resends.  Returns what to send and the warnings: one per server whose
        requests went out for the last time without a sign of life (earlier resends are counted
        in ``retries``, not said), and one per request parked for SLOW_NOTICE seconds, naming the
        workers its round waits for."""
        limit = self.retry_timeout
        out: Batches = {}
        lost: dict[int, int] = {}
        warnings = []
        parked = False
        for rid, p in list(self.pending.items()):
            req = p.request
            parked = parked or (p.parked and now - p.since >= limit)
            if p.parked and p.blockers and not p.noticed and now - p.since >= SLOW_NOTICE:
                p.noticed = True
                what = describe(req.op, req.label, req.auto)
                warnings.append(f"the {what} has waited {now - p.since:.0f} s for worker(s) {p.blockers} to push "
                                "it (every worker must push a key as often as the others; a restarted worker "
                                "that skips steps must resume from kv.num_pushes)")
            gave_up = self.unanswered.get(req.server)
            if gave_up is not None and now - gave_up > self.replaceable:
                self._drop(rid, PeerLost(
                    f"server {req.server} at {self.address(req.server)} did not answer the "
                    f"{describe(req.op, req.label, req.auto)} (request {rid}), and no replacement was announced "
                    f"within {self.replaceable:g} s; the server is dead or unreachable from this worker"))
                continue
            if req.server in self.down or now < self.meter.due(req.server, p.sent, p.mark, p.ahead, req.nbytes, limit):
                op = req.op
                if not p.asked and not p.parked and now - p.since >= ASK_AFTER and req.future is not None \
                        and isinstance(op, (Pull, PushPull, Init)) and req.server not in self.down \
                        and not (isinstance(op, Init) and op.value is not None):   # (an ask carries no data)
                    p.asked = True   # (not a retry: the request is not thought lost; a push-pull asks
                    # with its pull alone: its data is not sent again)
                    ask = Pull(op.key, op.part, op.seq, id=op.id, re=True) if isinstance(op, PushPull) else resent(op)
                    out.setdefault(req.server, []).append(ask)
                continue
            if self.meter.heard_since(req.server, p.sent):
                p.tries = 0   # (the server answers: alive, only slow, or this copy was lost)
            if p.tries >= self.max_retries and self.replaceable:
                # (a server that may be replaced: the scheduler decides, within its heartbeat
                # timeout, and announces the replacement; its own silence fails this worker)
                self.down.add(req.server)
                if req.server not in self.unanswered:
                    self.unanswered[req.server] = now
                    warnings.append(f"server {req.server} at {self.address(req.server)} did not answer; waiting up "
                                    f"to {self.replaceable:g} s for its replacement")
                continue
            if p.tries >= self.max_retries:
                self._drop(rid, PeerLost(
                    f"server {req.server} at {self.address(req.server)} did not answer the "
                    f"{describe(req.op, req.label, req.auto)} (request {rid}) after {p.tries} resends over "
                    f"{now - p.since:.1f} s without an answer of any kind; the server is dead or unreachable from "
                    "this worker"))
                continue
            p.tries += 1
            # a pull goes again alone: if it waits for a push of ours the server never got, the
            # server's Wait names that gap and only that push is sent again
            out.setdefault(req.server, []).append(self._again(p, now))
            self.retries += 1
            # (a parked request is asked about again quietly; a busy server may take a resend
            # or two to answer: said once a request is sent for the last time)
            if not p.parked and p.tries == self.max_retries:
                lost[req.server] = lost.get(req.server, 0) + 1
        for server, n in lost.items():
            warnings.append(f"{n} request(s) to server {server} got no answer in {self.max_retries * limit:.1f} s; "
                            "sending a last time (then the job fails: the server is dead or unreachable)")
        if parked:
            self._check(now, out)
        return out, warnings

    def _check(self, now: float, out: Batches) -> None:
        """While a request waits for other workers, ask each server this worker's journal holds
        pushes for whether it got them all (a quiet flush, at most one per ``retry_timeout``):
        a push lost on the way would otherwise leave the others waiting for it while this
        worker waits for them.  A check answered Ok *verifies* the server (:meth:`blocked`)."""
        for server in self.journal.servers():
            if server in self.down or server in self._checking or now - self._checked.get(server, -1e9) < \
                    self.retry_timeout:
                continue
            req = Request(server, Flush(durable=False), future=QUIET)
            req.op.id = next(self._ids)
            req.order = next(self._order)
            self._checking[server] = req.op.id
            self._checked[server] = now
            out.setdefault(server, []).append(self._sent(req, now))

    def blocked(self, req: Request | None, rank: int) -> WaitReport | None:
        """What the request ``req`` (the one the user's thread waits for) waits on, when that is
        other workers and every push this worker sent has been verified to have arrived since
        it was sent (so a lost push cannot pass for a wait-for cycle): a pull's (or init's)
        :class:`~psnode.protocol.control.WaitReport` (``waited`` left 0); None otherwise."""
        if req is None:
            return None
        p = self.pending.get(req.op.id)  # type: ignore[union-attr]
        if p is None or not p.parked:
            return None
        on = [w for w in p.blockers if w != rank]
        if not on or any(self._verified.get(s, -1.0) < p.since for s in self.journal.servers()):
            return None
        op = p.request.op
        kind = WaitKind.INIT if isinstance(op, Init) else WaitKind.PULL
        of = about(op, p.request.label).removeprefix("keys ").removeprefix("key ")
        push = (op.after if isinstance(op, Pull) else op.seq) if isinstance(op, (Pull, PushPull)) else 0
        return WaitReport(kind, of=of, push=push, on=tuple(sorted(set(on))))

    # ------------------------------------------------------------ restored servers
    def restored(self, server: int, now: float) -> list[Op]:
        """A replacement of ``server`` serves again (restored from its checkpoint): the
        journal's pushes and every unanswered request to it, in that order."""
        self.down.discard(server)
        self.unanswered.pop(server, None)
        batch: list[Op] = self._copies(server, [resent(p) for p in self.journal.replay(server)], now)
        for rid in sorted(self.pending):
            p = self.pending[rid]
            if p.request.server == server:
                p.tries = 0
                batch.append(self._again(p, now))
        return batch

    # ------------------------------------------------------------ failure
    def fail_all(self, exc: BaseException) -> None:
        """Fail every pending and queued request (the job failed or the engine closed)."""
        for p in self.pending.values():
            self.outcomes.append((p.request.future, exc))
        self.pending.clear()
        self.reading.clear()
        self._checking.clear()
        for *_, req in self._queue:
            if req.future is not None:
                self.outcomes.append((req.future, exc))
        self._queue.clear()

    def take_deferred(self) -> PSError | None:
        """The first error of a push nobody waited for (then forgotten), if any."""
        if not self.deferred:
            return None
        first, self.deferred = self.deferred[0], []
        return first


def _guard(req: Request) -> Any:
    op = req.op
    return req.guard if req.guard is not None else (op.key, op.part)  # type: ignore[union-attr]


def payload(op: Op) -> int:
    """The bytes of arrays ``op`` carries to its server (what its link must deliver)."""
    n = 0
    for name in ("data", "value", "rows"):
        arr = getattr(op, name, None)
        if arr is not None:
            n += int(arr.nbytes)
    return n


def settle(outcomes: list[tuple[Any, Any]]) -> None:
    """Resolve each future with its answer, or fail it with its exception."""
    for fut, outcome in outcomes:
        if isinstance(outcome, BaseException):
            fut.fail(outcome)
        else:
            fut.set(outcome)


__all__ = ["ASK_AFTER", "QUIET", "SLICE_WINDOW", "WINDOW_BYTES", "Batches", "Pending", "Request", "Tracker", "about",
           "describe", "settle"]
