"""Whom the others waited for, as one server saw it: per worker, the seconds during which a key
part of this server waited for that worker alone (pure: the clock is injected).

A wait is credited to the worker whose push ends it, over the interval it was the only one
awaited:

* a sync round (psnode.server.rounds, psnode.server.buckets): from the push that left the
  round lacking one worker's push to that worker's push, which completes it (with backup
  workers a round never waits for one worker alone: nothing is credited);
* a dist_ssp part: from the moment a pull parked on the staleness bound to the push that let
  it through (psnode.server.staleness).

Intervals of many key parts overlap; each worker's credits end in time order, so
:meth:`Awaited.credit` counts their union with one comparison (``seconds[x]`` grows by at most
the wall time that passed): O(1) per completed round, no message of its own (the server's
heartbeat carries the totals, psnode.protocol.control.Counters.awaited).

A wait in progress counts too (:meth:`Awaited.totals`, what the heartbeat carries, with the
open part apart: :meth:`Awaited.waiting`): each open wait names the worker it waits for
(:meth:`opened`, found once per wait: the one worker the round lacks, or the slowest gating a
dist_ssp pull), so a worker that stalls is named while the others still wait for it;
:meth:`closed` ends it (with :meth:`credit`, or without, when a worker's loss ended it).  A
server does not know a worker died: the scheduler, which does, counts an open wait for a dead
worker only up to its death (psnode.scheduler.slowness).

Only time the worker was actually awaited counts: a worker (a replacement after a restart, or
a worker that joined) is credited only from its first init on this server (:meth:`rejoined`);
a stall waiting for a replacement to start is the failover's (``failover``), and a round
completed because a worker left is credited to nobody.

Late pushes (backup workers, psnode.server.rounds): ``late[x]``, the pushes of ``x`` that came
after their round had completed without them, dropped (each counts once per key part).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Awaited:
    """Per worker, seconds the others waited for it alone at this server, and its late pushes."""

    clock: Callable[[], float] = time.monotonic
    seconds: dict[int, float] = field(default_factory=dict)
    late: dict[int, int] = field(default_factory=dict)
    failover: float = 0.0                                      # seconds of waits for replacements
    _until: dict[int, float] = field(default_factory=dict)     # worker -> end of its last credit
    _since: dict[int, float] = field(default_factory=dict)     # worker -> its last (re)init here
    _open: dict[int, list[float]] = field(default_factory=dict)  # worker -> [open waits, first start]

    def now(self) -> float:
        return self.clock()

    def credit(self, worker: int, since: float) -> None:
        """A push of ``worker`` ended, now, a wait for it alone that began at ``since``."""
        now = self.clock()
        born = self._since.get(worker, 0.0)
        if born > since:
            self.failover += min(now, born) - since
        start = max(since, born, self._until.get(worker, 0.0))
        if now > start:
            self.seconds[worker] = self.seconds.get(worker, 0.0) + (now - start)
            self._until[worker] = now

    def opened(self, worker: int, since: float) -> None:
        """A wait for ``worker`` alone began at ``since`` (it is counted until :meth:`closed`)."""
        o = self._open.get(worker)
        if o is None:
            self._open[worker] = [1.0, since]
        else:
            o[0] += 1

    def closed(self, worker: int) -> None:
        """A wait :meth:`opened` for ``worker`` ended (credited, or not, by the caller)."""
        o = self._open.get(worker)
        if o is not None:
            o[0] -= 1
            if o[0] <= 0:
                del self._open[worker]

    def waiting(self) -> dict[int, float]:
        """Per worker with a wait in progress, the seconds of it not credited yet (from its
        first open wait, past what was credited and its last init here)."""
        now = self.clock()
        out: dict[int, float] = {}
        for x, (_, first) in self._open.items():
            start = max(first, self._until.get(x, 0.0), self._since.get(x, 0.0))
            if now > start:
                out[x] = now - start
        return out

    def totals(self) -> dict[int, float]:
        """``seconds`` with the waits in progress (:meth:`waiting`)."""
        out = dict(self.seconds)
        for x, s in self.waiting().items():
            out[x] = out.get(x, 0.0) + s
        return out

    def rejoined(self, worker: int) -> None:
        """``worker`` initialised a key here: waits for it before this are not its own (its
        predecessor's failure, its start)."""
        self._since[worker] = self.clock()

    def dropped(self, worker: int) -> None:
        """A push of ``worker`` came after its round completed without it (backup workers)."""
        self.late[worker] = self.late.get(worker, 0) + 1


__all__ = ["Awaited"]
