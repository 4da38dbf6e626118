"""psnode.loopgap: the longest gap between two turns of a loop over the last window."""
from __future__ import annotations

import pytest

from psnode.loopgap import WINDOW_S, LoopGap


def test_the_longest_gap_of_the_last_window_and_the_one_in_progress() -> None:
    g = LoopGap()
    assert g.longest(5.0) == 0.0
    for t in (0.0, 0.01, 0.02, 0.52, 0.53):
        g.tick(t)
    assert g.longest(0.53) == pytest.approx(0.5)
    assert g.longest(2.53) == pytest.approx(2.0)            # held right now: the gap in progress counts
    g.tick(2.53)
    assert g.longest(2.54) == pytest.approx(2.0) and abs(g.longest_us(2.54) - 2_000_000) <= 1


def test_old_gaps_leave_after_one_to_two_windows() -> None:
    g = LoopGap()
    g.tick(0.0)
    g.tick(1.0)                              # a 1 s gap in the first bucket
    t = 1.0
    while t < WINDOW_S + 1:
        t += 0.01
        g.tick(t)
    assert g.longest(t) == 1.0               # the bucket before still counts
    while t < 2 * WINDOW_S + 2:
        t += 0.01
        g.tick(t)
    assert g.longest(t) < 0.02


def test_a_loop_silent_for_two_windows_forgets_what_came_before() -> None:
    g = LoopGap()
    g.tick(0.0)
    g.tick(3.0)
    g.tick(3.0 + 2 * WINDOW_S + 1)           # the gap itself is the longest, the 3 s is gone
    assert g.longest(3.0 + 2 * WINDOW_S + 1) == 2 * WINDOW_S + 1
    g.tick(3.0 + 2 * WINDOW_S + 1.01)
    assert g.longest(3.0 + 2 * WINDOW_S + 1.01) == 2 * WINDOW_S + 1
