"""Who the others wait for: per worker, how long the other workers waited for it (pure).

Two sources, both in seconds:

* each server's heartbeat says, per worker, how long its key parts waited for that worker
  alone, every wait however short (``Counters.awaited``, psnode.server.awaited: a sync round
  from the moment it lacked only that worker's push, a dist_ssp pull from the moment it parked
  on the bound, to the push that ended it; a replacement is credited only from its first init,
  a round completed by a worker's loss to nobody): :meth:`Slowness.server`; a server does not
  know a worker died, so of a wait still in progress (``Counters.waiting``) for a worker the
  scheduler took for dead (:meth:`Slowness.lost`), only the part before its death counts until
  its replacement's own wait begins: the rest is the failover's;
* barriers, which the scheduler sees itself: when a barrier completes, each worker waited for
  each worker that entered after it, from its own entry (or that worker's registration, for a
  replacement: :meth:`Slowness.restarted`) to that worker's: :meth:`Slowness.barrier` (in a
  barrier of more than :data:`PAIRS_MAX` workers, only the first to enter, who waited the
  longest for each other one, is credited: every pair would cost W^2 time and memory per
  barrier, 10^8 at 10,000 workers).

From them, per worker ``x``:

* :meth:`Slowness.shares`: over the last ``window`` seconds (:data:`WINDOW`), the largest
  fraction of that time one server (or one other worker, at barriers) spent waiting for ``x``
  alone (0..1);
* :meth:`Slowness.totals`: the most seconds one server (or one other worker) waited for ``x``
  over the job.

:class:`Stalls` turns the workers' wait reports into one warning per wait longer than a
threshold, naming whom it waits for.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from psnode.protocol.control import WaitKind, WaitReport
from psnode.protocol.status import SLOW_WINDOW as WINDOW
from psnode.scheduler.waitfor import describe

#: seconds of a source's reports before its share counts (over fewer, one hiccup of a worker on
#: a busy machine, a preemption of a few hundred milliseconds, passes for a pattern)
MIN_SPAN = 5.0
PAIRS_MAX = 256      # workers in a barrier up to which every pair is credited

Totals = dict[int, float]   # worker -> seconds waited for it
Samples = deque[tuple[float, Totals]]


@dataclass
class Slowness:
    """The waits of a job's workers for each other (see the module docstring)."""

    window: float = WINDOW
    _credited: dict[int, Totals] = field(default_factory=dict)   # observer -> barrier waits
    _samples: dict[int, Samples] = field(default_factory=dict)   # observer -> its barrier totals
    _servers: dict[int, Samples] = field(default_factory=dict)   # server -> its ``awaited`` totals
    _born: dict[int, float] = field(default_factory=dict)        # worker -> its last registration
    _lost: dict[int, float] = field(default_factory=dict)        # worker -> when it was last taken for dead

    def server(self, rank: int, awaited: Iterable[tuple[int, float]], now: float,
               waiting: Iterable[tuple[int, float]] = ()) -> None:
        """Server ``rank``'s heartbeat at ``now``: its totals (``Counters.awaited``), of which
        ``waiting`` (``Counters.waiting``) are waits still in progress."""
        totals = dict(awaited)
        for x, open_s in waiting:
            death = self._lost.get(x)
            if death is None or x not in totals:
                continue
            start, born = now - open_s, self._born.get(x, death)
            if born > death and start >= born:
                continue   # (the replacement's own wait)
            totals[x] = max(0.0, totals[x] - (open_s - max(0.0, min(now, death) - start)))
        self._add(self._servers.setdefault(rank, deque()), now, totals)

    def heartbeat(self, observer: int, now: float) -> None:
        """Worker ``observer``'s heartbeat at ``now``: its barrier waits so far are sampled."""
        self._add(self._samples.setdefault(observer, deque()), now, dict(self._credited.get(observer, {})))

    def restarted(self, worker: int, now: float) -> None:
        """A replacement of ``worker`` registered at ``now``: barrier waits for it count from
        then (the time before is the failover's)."""
        self._born[worker] = now

    def lost(self, worker: int, now: float) -> None:
        """``worker`` was taken for dead at ``now`` and its replacement is awaited: a server's
        wait for it from then on is the failover's."""
        self._lost[worker] = now

    def returned(self, worker: int) -> None:
        """``worker``, taken for dead, speaks again (it was stopped or starved): every wait for
        it was its own."""
        self._lost.pop(worker, None)

    def barrier(self, entered: Mapping[int, float], now: float) -> None:
        """A barrier completed at ``now``: ``entered`` says when each worker entered it."""
        if len(entered) > PAIRS_MAX:
            entered_first = min(entered.items(), key=lambda item: item[1])
            observers: Mapping[int, float] = dict([entered_first])
        else:
            observers = entered
        for o, t_o in observers.items():
            credit = self._credited.setdefault(o, {})
            for x, t_x in entered.items():
                start = max(t_o, self._born.get(x, t_o))
                if x != o and t_x > start:
                    credit[x] = credit.get(x, 0.0) + (t_x - start)
        for o in observers:
            self.heartbeat(o, now)

    def forget(self, worker: int) -> None:
        """``worker`` left the job: it waits no more (what others waited for it stays)."""
        self._samples.pop(worker, None)

    def _add(self, q: Samples, now: float, totals: Totals) -> None:
        if q and totals and any(s < q[-1][1].get(x, 0.0) for x, s in totals.items()):
            q.clear()   # (a restarted server counts from 0 again)
        q.append((now, totals))
        while len(q) >= 3 and q[1][0] <= now - self.window:   # (one sample at or before the window stays)
            q.popleft()

    def shares(self, now: float) -> dict[int, float]:
        """Per worker, the largest share of the last ``window`` seconds one source spent
        waiting for it (workers nobody waited for are left out)."""
        out: dict[int, float] = {}
        for q in [*self._samples.values(), *self._servers.values()]:
            t_last, last = q[-1]
            if now - t_last > self.window:
                continue
            t_base, base = q[0]
            for t, totals in q:
                if t > now - self.window:
                    break
                t_base, base = t, totals
            span = t_last - t_base
            if span < MIN_SPAN:
                continue
            for x, s in last.items():
                share = min(1.0, max(0.0, s - base.get(x, 0.0)) / span)
                if share > out.get(x, 0.0):
                    out[x] = share
        return out

    def totals(self) -> dict[int, float]:
        """Per worker, the most seconds one source waited for it over the job."""
        out: dict[int, float] = {}
        sources = [*self._credited.values(), *(q[-1][1] for q in self._servers.values() if q)]
        for totals in sources:
            for x, s in totals.items():
                out[x] = max(out.get(x, 0.0), s)
        return out


@dataclass
class Stalls:
    """One warning per wait of a worker that lasts ``threshold`` seconds (0: none)."""

    threshold: float
    _warned: set[tuple[int, tuple[str, int, str, int]]] = field(default_factory=set)

    def check(self, waits: Mapping[int, WaitReport | None], in_barrier: Callable[[int], list[int]]) -> list[str]:
        """The new warnings: ``waits``, every live worker's last report; ``in_barrier(n)``: the
        workers not in barrier ``n`` yet."""
        if self.threshold <= 0:
            return []
        out = []
        current = set()
        for r, w in sorted((r, w) for r, w in waits.items() if w is not None):
            key = (r, w.episode)
            current.add(key)
            if w.waited < self.threshold or key in self._warned:
                continue
            on = [x for x in (in_barrier(w.n) if w.what is WaitKind.BARRIER else w.on) if x != r]
            if not on:
                continue
            self._warned.add(key)
            whom = f"worker {on[0]}" if len(on) == 1 else "workers " + ", ".join(map(str, on))
            out.append(f"stall: worker {r} has waited {w.waited:.0f} s in {describe(w)} for {whom}")
        self._warned &= current   # (a wait that ended may be warned about again next time)
        return out


__all__ = ["MIN_SPAN", "PAIRS_MAX", "WINDOW", "Slowness", "Stalls"]
