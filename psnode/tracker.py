"""A worker's requests from submission to answer (pure: no sockets, no threads, no clocks).

The engine (:mod:`psnode.worker`) feeds it requests, answers and the time; the tracker decides
what to send, what to send again, and which request fails, and resolves futures:

* **ids and order**: every request gets an id; queued requests leave in priority order (higher
  first, then submission order) within a window of bytes in flight per server
  (``window_bytes``: pulls wait; pushes never do, so nothing deadlocks); a push of a key part
  waits while a pull of that key part is unanswered (a same-host worker may read the value in
  place until its next push: psnode.shmlink);
* **pending**: a request that expects an answer is kept whole until answered, so it can be sent
  again; a push goes into the :class:`~psnode.journal.PushJournal` instead;
* **retry** (:meth:`due`): a request unanswered for ``retry_timeout`` is sent again marked
  resent; after ``max_retries`` resends without a sign of life it fails with PeerLost naming
  the server; requests to a server the scheduler reports down wait without retries;
* **answers** (:meth:`answered`): Ok and Failed resolve the future (a pull's Ok confirms the
  pushes before it); Wait is a sign of life (the clock restarts) and, with a ``gap``, the push
  it names is sent again from the journal, or the pull fails when the journal no longer has
  it; Missing (a flush found pushes never received) sends those pushes, then the flush again;
* **restored servers** (:meth:`restored`): a resync, the journal's pushes and every unanswered
  request, again.

Futures are duck-typed (``set(answer)``, ``fail(exc)``) and never resolved inside the tracker:
outcomes collect in :attr:`Tracker.outcomes` for the caller to apply with :func:`settle` once
it released its lock (a future's callback may copy megabytes).
"""
from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from psnode.errors import PeerLost, PSError, from_kind
from psnode.journal import PushJournal
from psnode.protocol import (
    Answer,
    Failed,
    Flush,
    Missing,
    Op,
    Pull,
    Push,
    PushPull,
    Resync,
    Wait,
    resent,
)

WINDOW_BYTES = 64 * 2**20      # bytes of answers in flight per server before pulls wait
JOURNAL_DEPTH = 2              # unconfirmed pushes kept per key part for resending
SLOW_NOTICE = 30.0             # seconds a parked request waits before the worker says for whom

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
    auto: bool = False       # a push's answer asked for in advance (psnode.kvstore): not a pull


@dataclass(slots=True)
class Pending:
    """A sent request waiting for its answer."""

    request: Request
    sent: float              # when it was last sent
    since: float = 0.0       # when it was first sent
    tries: int = 0           # resends since the last sign of life
    parked: bool = False     # the server answered Wait: it holds the request
    noticed: bool = False    # the long wait was reported
    blockers: list[int] = field(default_factory=list)  # workers a parked pull waits for


def describe(op: Op, label: str = "", auto: bool = False) -> str:
    name = "pull" if auto else type(op).__name__.lower()   # (the pull waits for a push's answer)
    if label:
        return f"{name} of {label}"
    key = getattr(op, "key", None)
    return name if key is None or isinstance(op, (Flush, Resync)) else f"{name} of key {key!r}"


class Tracker:
    """Requests of one worker to its servers (see the module docstring)."""

    def __init__(self, num_servers: int, retry_timeout: float, max_retries: int,
                 window_bytes: int = WINDOW_BYTES, journal_depth: int = JOURNAL_DEPTH,
                 address: Callable[[int], str] = str) -> None:
        self.retry_timeout = retry_timeout
        self.max_retries = max_retries
        self.window_bytes = window_bytes
        self.address = address               # server -> "host:port", for messages
        self.journal = PushJournal(journal_depth)
        self.pending: dict[int, Pending] = {}
        self.inflight = [0] * num_servers
        self.down: set[int] = set()          # servers being replaced: no retries meanwhile
        self.deferred: list[PSError] = []    # errors of pushes nobody waits for
        self.retries = 0                     # requests sent again (lost messages)
        self.pushes = 0
        self.pulls = 0
        self.outcomes: list[tuple[Any, Any]] = []   # (future, Ok or exception) to settle
        self.reading: dict[tuple[Any, int], list[int]] = {}   # key part -> orders of unanswered pulls
        self._queue: list[tuple[int, int, Request]] = []
        self._ids = itertools.count(1)
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

    def add_now(self, req: Request, now: float) -> Batches:
        """``add`` then ``take(now)`` (any server), in one step: what :meth:`take` would
        return after :meth:`add`."""
        if self._queue:
            self.add(req)
            return self.take(now)
        req.op.id = next(self._ids)
        req.order = next(self._order)
        s = req.server
        if (req.nbytes and self.inflight[s] > 0 and self.inflight[s] + req.nbytes > self.window_bytes) or \
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
            if req.nbytes and self.inflight[s] > 0 and self.inflight[s] + req.nbytes > self.window_bytes:
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
        if isinstance(op, (Push, PushPull)):
            self.journal.remember(req.server, op)
            self.pushes += req.keys
        if isinstance(op, (Pull, PushPull)) and not req.auto:
            self.pulls += req.keys
            if req.future is not None:
                self.reading.setdefault(_guard(req), []).append(req.order)
        elif isinstance(op, Flush):
            op.check = self.journal.check_list(req.server)
        if req.future is not None:
            self.pending[op.id] = Pending(req, now, now)
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
            if isinstance(ans, Failed) and ans.na:  # a push failed: raised by the next call
                self.deferred.append(from_kind(ans.kind, f"server {server}: {ans.message}"))
            return {}  # (or a second answer to a request sent again)
        req = entry.request
        self.inflight[req.server] -= req.nbytes
        self._unread(req)
        if isinstance(ans, Failed):
            self.outcomes.append((req.future, from_kind(ans.kind, f"server {server}: {ans.message}")))
            return {}
        op = req.op
        if isinstance(op, Pull):
            self.journal.confirm((op.key, op.part), op.after)
        elif isinstance(op, PushPull):
            self.journal.confirm((op.key, op.part), op.seq)
        self.outcomes.append((req.future, ans))
        return {}

    def _notice(self, server: int, ans: Wait | Missing, now: float) -> Batches:
        entry = self.pending.get(ans.id)
        if entry is None:
            return {}
        entry.sent, entry.tries = now, 0
        req = entry.request
        op = req.op
        if isinstance(ans, Wait):
            entry.blockers, entry.parked = ans.blockers, True
            if not ans.gap or not isinstance(op, (Pull, PushPull)):
                return {}
            key = (op.key, op.part)
            if self.journal.holds(key, ans.gap):
                self.retries += 1
                return {server: [resent(p) for p in self.journal.replay(server, {key: {ans.gap}})]}
            self._drop(ans.id, PeerLost(
                f"push {ans.gap} of key {op.key!r} to server {server} was lost and can no longer be "
                f"sent again (more than {self.journal.depth} pushes of that key without a pull in "
                "between)"))
            return {}
        wanted = {(k, p): set(seqs) for k, p, seqs in ans.missing}
        batch: list[Op] = [resent(p) for p in self.journal.replay(server, wanted)]
        self.retries += len(batch)
        if isinstance(op, Flush):
            op.check = self.journal.check_list(server)
        batch.append(resent(op))
        return {server: batch}

    def _drop(self, rid: int, exc: PSError) -> None:
        entry = self.pending.pop(rid)
        self.inflight[entry.request.server] -= entry.request.nbytes
        self._unread(entry.request)
        self.outcomes.append((entry.request.future, exc))

    # ------------------------------------------------------------ time
    def due(self, now: float) -> tuple[Batches, list[str]]:
        """Requests unanswered for ``retry_timeout``: sent again, or failed after
        ``max_retries`` resends.  Returns what to send and the warnings: one per server resent
        requests without a sign of life went to, and one per request parked for SLOW_NOTICE
        seconds, naming the workers its round waits for."""
        limit = self.retry_timeout
        out: Batches = {}
        lost: dict[int, int] = {}
        warnings = []
        for rid, p in list(self.pending.items()):
            req = p.request
            if p.parked and p.blockers and not p.noticed and now - p.since >= SLOW_NOTICE:
                p.noticed = True
                what = describe(req.op, req.label, req.auto)
                warnings.append(f"the {what} has waited {now - p.since:.0f} s for worker(s) {p.blockers} to push "
                                "it (every worker must push a key as often as the others; a restarted worker "
                                "that skips steps must resume from kv.num_pushes)")
            if req.server in self.down or now - p.sent < limit:
                continue
            if p.tries >= self.max_retries:
                self._drop(rid, PeerLost(
                    f"server {req.server} at {self.address(req.server)} did not answer the "
                    f"{describe(req.op, req.label, req.auto)} (request {rid}) after {p.tries} resends over "
                    f"{p.tries * limit + limit:.1f} s; the server is dead or unreachable from this worker"))
                continue
            p.tries += 1
            p.sent = now
            # a pull goes again alone: if it waits for a push of ours the server never got, the
            # server's Wait names that gap and only that push is sent again
            out.setdefault(req.server, []).append(resent(req.op))
            self.retries += 1
            if not p.parked:   # (a parked request is asked about again, quietly)
                lost[req.server] = lost.get(req.server, 0) + 1
        for server, n in lost.items():
            warnings.append(f"{n} request(s) to server {server} got no answer in {limit:.1f} s; sending again")
        return out, warnings

    # ------------------------------------------------------------ restored servers
    def restored(self, server: int, now: float) -> list[Op]:
        """A replacement of ``server`` serves again: resync, then the journal's pushes and every
        unanswered request to it, in that order."""
        self.down.discard(server)
        batch: list[Op] = [Resync(self.journal.resync_parts(server))]
        batch.extend(resent(p) for p in self.journal.replay(server))
        for rid in sorted(self.pending):
            p = self.pending[rid]
            if p.request.server == server:
                p.sent, p.tries = now, 0
                batch.append(resent(p.request.op))
        return batch

    # ------------------------------------------------------------ failure
    def fail_all(self, exc: BaseException) -> None:
        """Fail every pending and queued request (the job failed or the engine closed)."""
        for p in self.pending.values():
            self.outcomes.append((p.request.future, exc))
        self.pending.clear()
        self.reading.clear()
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


def settle(outcomes: list[tuple[Any, Any]]) -> None:
    """Resolve each future with its answer, or fail it with its exception."""
    for fut, outcome in outcomes:
        if isinstance(outcome, BaseException):
            fut.fail(outcome)
        else:
            fut.set(outcome)


__all__ = ["JOURNAL_DEPTH", "WINDOW_BYTES", "Batches", "Pending", "Request", "Tracker", "describe", "settle"]
