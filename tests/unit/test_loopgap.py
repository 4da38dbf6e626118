"""psnode.loopgap: the longest stretch of work between a loop's polls over the last window (the
time a loop waits for messages is no gap)."""
from __future__ import annotations

import pytest

from psnode.loopgap import WINDOW_S, LoopGap


def _turn(g: LoopGap, woke: float, idle: float) -> None:
    g.woke(woke)
    g.idle(idle)


def test_work_between_polls_counts_and_waiting_does_not() -> None:
    g = LoopGap()
    assert g.longest(5.0) == 0.0
    _turn(g, 0.0, 0.01)
    _turn(g, 1.0, 1.5)          # (0.99 s waiting for messages before it: no gap)
    _turn(g, 2.5, 2.51)
    assert g.longest(2.6) == pytest.approx(0.5)
    g.woke(3.0)
    assert g.longest(5.0) == pytest.approx(2.0)            # held right now: the gap in progress counts
    g.idle(5.0)
    assert g.longest(6.0) == pytest.approx(2.0) and abs(g.longest_us(6.0) - 2_000_000) <= 1


def test_old_gaps_leave_after_one_to_two_windows() -> None:
    g = LoopGap()
    _turn(g, 0.0, 1.0)                       # a 1 s gap in the first bucket
    t = 1.0
    while t < WINDOW_S + 1:
        t += 0.01
        _turn(g, t, t + 0.001)
    assert g.longest(t) == 1.0               # the bucket before still counts
    while t < 2 * WINDOW_S + 2:
        t += 0.01
        _turn(g, t, t + 0.001)
    assert g.longest(t) < 0.02


def test_a_loop_idle_for_two_windows_forgets_what_came_before() -> None:
    g = LoopGap()
    _turn(g, 0.0, 3.0)
    _turn(g, 3.0 + 2 * WINDOW_S + 1, 3.0 + 2 * WINDOW_S + 1.01)
    assert g.longest(3.0 + 2 * WINDOW_S + 1.01) == pytest.approx(0.01)
