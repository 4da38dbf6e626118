"""The scheduler's wait-for graph (psnode.scheduler.waitfor), without processes."""
from __future__ import annotations

from dataclasses import replace

from psnode.protocol.control import WaitKind, WaitReport
from psnode.protocol.control import wait_report as parse
from psnode.scheduler.waitfor import Watch

PULL_W = WaitReport(WaitKind.PULL, of="'w'", push=2, on=(0,))
BARRIER = WaitReport(WaitKind.BARRIER, n=1)


def _settled(watch: Watch, waits, in_barrier=lambda n: [1], gone=frozenset()):
    assert watch.check(0.0, waits, in_barrier, set(gone)) is None     # first seen: not yet
    assert watch.check(4.9, waits, in_barrier, set(gone)) is None     # not for the whole timeout
    return watch.check(5.0, waits, in_barrier, set(gone))


def test_a_cycle_is_named_once_the_same_waits_held_for_the_timeout() -> None:
    verdict = _settled(Watch(5.0), {0: BARRIER, 1: PULL_W})
    assert verdict == ("deadlock: worker 0 waits in barrier 1 for worker 1; "
                       "worker 1 waits in the pull of 'w' (push 2) for worker 0")


def test_a_worker_computing_or_a_changing_wait_is_no_deadlock() -> None:
    assert _settled(Watch(5.0), {0: None, 1: PULL_W}) is None        # worker 0 computes
    w = Watch(5.0)
    w.check(0.0, {0: BARRIER, 1: PULL_W}, lambda n: [1], set())
    later = replace(PULL_W, push=3)                                    # worker 1 progressed
    assert w.check(6.0, {0: BARRIER, 1: later}, lambda n: [1], set()) is None
    assert _settled(Watch(5.0), {0: BARRIER, 1: PULL_W}, in_barrier=lambda n: []) is None  # barrier done


def test_waiting_for_a_finished_worker_is_a_deadlock_too_and_others_on_the_way_are_not_named() -> None:
    waits = {1: WaitReport(WaitKind.PULL, of="'a', 'b'", push=7, on=(0,)), 2: WaitReport(WaitKind.INIT, of="'w'", on=(1,))}
    verdict = _settled(Watch(5.0), waits, gone={0})
    assert verdict == "deadlock: worker 1 waits in the pull of 'a', 'b' (push 7) for worker 0, which has finished"
    cycle = {0: WaitReport(WaitKind.PULL, of="'x'", push=1, on=(1,)), 1: replace(PULL_W, on=(0,)),
             2: replace(PULL_W, on=(1,))}
    assert _settled(Watch(5.0), cycle) == ("deadlock: worker 0 waits in the pull of 'x' (push 1) for worker 1; "
                                           "worker 1 waits in the pull of 'w' (push 2) for worker 0")


def test_malformed_reports_are_ignored() -> None:
    for bad in (None, [1], {"what": "barrier"}, {"what": "barrier", "n": True}, {"what": "pull", "on": []},
                {"what": "pull", "of": "'w'", "on": ["0"]}, {"what": "sleep", "n": 1},
                {"what": "pull", "of": "x" * 400, "on": [1]}):
        assert parse(bad) is None, bad
    assert parse({"what": "pull", "of": "'w'", "push": 2, "on": [3, 0, 3]}) == \
        WaitReport(WaitKind.PULL, of="'w'", push=2, on=(0, 3))
    assert parse({"what": "barrier", "n": 1, "s": -1}) is None
    assert parse(BARRIER.to_body()) == BARRIER and parse(replace(PULL_W, waited=2.5).to_body()).waited == 2.5


def test_a_wait_that_only_grows_longer_is_the_same_wait() -> None:
    w = Watch(5.0)
    assert w.check(0.0, {0: BARRIER, 1: PULL_W}, lambda n: [1], set()) is None
    longer = {0: replace(BARRIER, waited=5.0), 1: replace(PULL_W, waited=5.0)}
    assert w.check(5.0, longer, lambda n: [1], set()) is not None


def test_workers_all_waiting_in_a_barrier_whose_entries_are_still_on_the_way_is_no_deadlock() -> None:
    """Each worker reports waiting in barrier 4, but the scheduler holds no entry of theirs yet
    (lost with a host's relay: each sends it again until answered): that barrier completes, it
    is no cycle; a worker in barrier 4 waiting for one in barrier 3 only still is."""
    in4 = WaitReport(WaitKind.BARRIER, n=4)
    assert _settled(Watch(5.0), {0: in4, 2: in4}, in_barrier=lambda n: [0, 2]) is None
    in3 = WaitReport(WaitKind.BARRIER, n=3)
    verdict = _settled(Watch(5.0), {0: in4, 1: PULL_W, 2: in3}, in_barrier=lambda n: [0, 1, 2])
    assert verdict is not None and verdict.startswith("deadlock: worker 0 waits in barrier 4 for worker 1"), verdict
