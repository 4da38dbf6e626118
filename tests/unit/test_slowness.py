"""Whom the workers wait for (psnode.scheduler.slowness), without processes."""
from __future__ import annotations

import pytest

from psnode.protocol.control import WaitKind, WaitReport
from psnode.scheduler.slowness import PAIRS_MAX, Slowness, Stalls


def test_the_share_is_the_longest_wait_of_one_server_over_the_window() -> None:
    s = Slowness(window=30.0)
    for t in range(41):   # server 0 waited for worker 2 0.7 s of every second, server 1 for 0 a tenth
        s.server(0, [(2, 0.7 * t)], float(t))
        s.server(1, [(2, 0.6 * t), (0, 0.1 * t)], float(t))
    shares = s.shares(40.0)
    assert shares[2] == pytest.approx(0.7) and shares[0] == pytest.approx(0.1) and 1 not in shares
    assert s.totals() == {2: pytest.approx(28.0), 0: pytest.approx(4.0)}
    for t in range(41, 72):   # worker 2 catches up: nobody waits any more
        s.server(0, [(2, 28.0)], float(t))
        s.server(1, [(2, 24.0), (0, 4.0)], float(t))
    assert s.shares(71.0) == {}
    assert s.totals()[2] == pytest.approx(28.0)


def test_too_short_a_span_or_a_silent_source_counts_nothing() -> None:
    s = Slowness(window=30.0)
    s.server(0, [(1, 0.0)], 0.0)
    s.server(0, [(1, 4.0)], 4.0)
    assert s.shares(4.0) == {}                # 4 s of heartbeats: too soon to say
    s.server(0, [(1, 6.0)], 6.0)
    assert s.shares(6.0) == {1: pytest.approx(1.0)}
    assert s.shares(40.0) == {}               # nothing heard from server 0 for the whole window
    s.server(0, [(1, 0.5)], 41.0)             # a restarted server counts from 0 again: never negative
    s.server(0, [(1, 1.25)], 47.0)
    assert s.shares(47.0) == {1: pytest.approx(0.125)}


def test_a_barrier_credits_each_worker_with_the_wait_for_those_that_entered_after_it() -> None:
    s = Slowness(window=30.0)
    for r in range(3):
        s.heartbeat(r, 0.0)
    s.barrier({0: 1.0, 1: 2.0, 2: 10.0}, 10.0)
    assert s.totals() == {1: pytest.approx(1.0), 2: pytest.approx(9.0)}
    assert s.shares(10.0) == {1: pytest.approx(0.1), 2: pytest.approx(0.9)}
    s.forget(0)
    assert s.shares(10.0) == {2: pytest.approx(0.8)}


def test_a_stall_is_warned_of_once_naming_whom_it_waits_for() -> None:
    st = Stalls(30.0)
    pull = WaitReport(WaitKind.PULL, of="'w'", push=7, on=(2,), waited=29.0)
    assert st.check({0: pull, 1: None}, lambda n: []) == []
    pull = WaitReport(WaitKind.PULL, of="'w'", push=7, on=(2,), waited=31.2)
    assert st.check({0: pull, 1: None}, lambda n: []) == [
        "stall: worker 0 has waited 31 s in the pull of 'w' (push 7) for worker 2"]
    assert st.check({0: pull}, lambda n: []) == []            # once per wait
    barrier = WaitReport(WaitKind.BARRIER, n=3, waited=45.0)
    assert st.check({0: barrier, 1: barrier}, lambda n: [0, 1, 2, 3]) == [
        "stall: worker 0 has waited 45 s in barrier 3 for workers 1, 2, 3",
        "stall: worker 1 has waited 45 s in barrier 3 for workers 0, 2, 3"]
    assert Stalls(0.0).check({0: barrier}, lambda n: [1]) == []   # 0: never


def test_a_barrier_of_thousands_credits_only_its_first_entrant() -> None:
    """Above PAIRS_MAX workers every pair would cost W^2 per barrier: the first to enter, who
    waited the longest for each other worker, is credited alone."""
    s = Slowness(window=30.0)
    n = PAIRS_MAX + 1
    s.barrier({r: 1.0 + r for r in range(n)}, float(n))
    totals = s.totals()
    assert len(totals) == n - 1 and totals[n - 1] == pytest.approx(n - 1.0) and totals[1] == pytest.approx(1.0)
    assert set(s._credited) == {0}
