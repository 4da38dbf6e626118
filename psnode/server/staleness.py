"""Bounded staleness (``dist_ssp``, stale synchronous parallel): the clocks and the bound (pure).

A worker's **clock** on a key part is the number of its pushes the part has applied without a
gap (``Entry.pushed``): push ``t`` is the gradient of its step ``t``.  The **floor** of a part is
the lowest clock among the workers that gate it (the active members that take part there:
psnode.server.rounds.Rules.gating).  With staleness ``s`` the pull a worker sends after its
push ``t`` is answered once

* its own push ``t`` was applied (every pull sees its own pushes), and
* the floor is at least ``t - s``: the value holds every gating worker's pushes 1..t-s.

So a worker waits only when it would otherwise run more than ``s`` clocks ahead of the slowest
gating worker; ``s = 0`` waits for every worker's push ``t`` (the values of dist_sync's rounds:
psnode.worker.kvstore routes ``s = 0`` to those rounds), and a large ``s`` never waits (dist_async).
Pushes are applied as they arrive, each on its own (the optimizer steps once per push).

A worker that joins the running job starts at the clock the part's gating workers reached
(:func:`join_clock`), so it never holds the others back by its missing past.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

#: the staleness of a key part that is not bounded (dist_sync's rounds, or dist_async)
UNBOUNDED = -1
#: the largest staleness a store takes (more is dist_async in all but name)
MAX_STALENESS = 1 << 20


def check_staleness(s: object, where: str) -> int:
    """``s`` as a staleness (an int in 0..MAX_STALENESS); ValueError naming ``where`` otherwise."""
    if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s <= MAX_STALENESS:
        raise ValueError(f"{where}: staleness must be an int in 0..{MAX_STALENESS}, not {s!r}")
    return s


def floor(pushed: Mapping[int, int], gating: Iterable[int]) -> int | None:
    """The lowest clock among the ``gating`` workers (``pushed``: worker -> clock, 0 when absent);
    None when no worker gates (nothing to wait for)."""
    return min((pushed.get(w, 0) for w in gating), default=None)


def ready(after: int, staleness: int, own: int, low: int | None) -> bool:
    """May a pull after push ``after`` of a worker whose clock is ``own`` be answered when the
    floor is ``low`` (None: no worker gates)?"""
    return own >= after and (low is None or low >= after - staleness)


def blockers(pushed: Mapping[int, int], gating: Iterable[int], after: int, staleness: int) -> list[int]:
    """The gating workers a pull after push ``after`` waits for (their clock is below ``after - s``)."""
    return sorted(w for w in gating if pushed.get(w, 0) < after - staleness)


def join_clock(pushed: Mapping[int, int], gating: Iterable[int]) -> int:
    """The clock a joiner of a bounded part starts from: the highest among the gating workers
    (a joiner behind them would hold every one of them back until it caught up)."""
    return max((pushed.get(w, 0) for w in gating), default=0)


__all__ = ["MAX_STALENESS", "UNBOUNDED", "blockers", "check_staleness", "floor", "join_clock", "ready"]
