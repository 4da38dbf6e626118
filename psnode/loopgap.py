"""The longest gap between two turns of a role's loop, over the last window (pure: callers give the time).

**The rule it measures**: no copy, checkpoint, restore, fill or export may hold a server's,
a scheduler's or a worker's I/O loop for more than about 100 ms, so heartbeats and answers keep
flowing while big state moves and no process is ever taken for dead because of its own work.
Each loop tells its :class:`LoopGap` when its poll returns and before it polls again; every heartbeat carries
:meth:`LoopGap.longest` (``Counters.loop_gap_us``), and ``mxdist status`` shows it per process
(the scheduler's own in its STATUS answer).

The window: gaps are kept in two buckets of ``WINDOW_S`` seconds (the current one and the one
before), so the value covers the last ``WINDOW_S`` to ``2 * WINDOW_S`` seconds; the gap in
progress (a loop held right now, seen from a heartbeat sent meanwhile) counts too.
"""
from __future__ import annotations

WINDOW_S = 10.0


class LoopGap:
    """One loop's gaps (see the module docstring): the loop calls :meth:`woke` when its poll
    returns and :meth:`idle` before it polls again; a gap is the work between the two (the
    time it waits for messages is not one)."""

    __slots__ = ("_current", "_previous", "_start", "_woke")

    def __init__(self) -> None:
        self._woke: float | None = None    # when the loop last woke (None: it waits)
        self._start: float | None = None   # when the current bucket began
        self._current = 0.0                # the longest gap in the current bucket
        self._previous = 0.0               # ... in the bucket before it

    def woke(self, now: float) -> None:
        """The loop's poll returned at ``now``."""
        self._woke = now
        if self._start is None:
            self._start = now
        elif now - self._start >= WINDOW_S:   # a new bucket (the one before: empty when over a window ago)
            self._previous = self._current if now - self._start < 2 * WINDOW_S else 0.0
            self._current, self._start = 0.0, now

    def idle(self, now: float) -> None:
        """The loop is about to poll at ``now``: the work since it woke was a gap."""
        if self._woke is not None:
            self._current = max(self._current, now - self._woke)
        self._woke = None

    def longest(self, now: float) -> float:
        """The longest gap in the last window, seconds (the gap in progress included)."""
        held = 0.0 if self._woke is None else max(0.0, now - self._woke)
        return max(self._current, self._previous, held)

    def longest_us(self, now: float) -> int:
        return int(self.longest(now) * 1e6)


__all__ = ["WINDOW_S", "LoopGap"]
