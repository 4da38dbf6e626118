"""The scheduler's wait-for graph (psnode.scheduler.waitfor), without processes."""
from __future__ import annotations

from psnode.protocol.control import wait_report as parse
from psnode.scheduler.waitfor import Watch

PULL_W = {"what": "pull", "of": "'w'", "push": 2, "on": [0]}
BARRIER = {"what": "barrier", "n": 1}


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
    later = dict(PULL_W, push=3)                                       # worker 1 progressed
    assert w.check(6.0, {0: BARRIER, 1: later}, lambda n: [1], set()) is None
    assert _settled(Watch(5.0), {0: BARRIER, 1: PULL_W}, in_barrier=lambda n: []) is None  # barrier done


def test_waiting_for_a_finished_worker_is_a_deadlock_too_and_others_on_the_way_are_not_named() -> None:
    waits = {1: {"what": "pull", "of": "'a', 'b'", "push": 7, "on": [0]},
             2: {"what": "init", "of": "'w'", "push": 0, "on": [1]}}
    verdict = _settled(Watch(5.0), waits, gone={0})
    assert verdict == "deadlock: worker 1 waits in the pull of 'a', 'b' (push 7) for worker 0, which has finished"
    cycle = {0: {"what": "pull", "of": "'x'", "push": 1, "on": [1]}, 1: dict(PULL_W, on=[0]),
             2: dict(PULL_W, on=[1])}
    assert _settled(Watch(5.0), cycle) == ("deadlock: worker 0 waits in the pull of 'x' (push 1) for worker 1; "
                                           "worker 1 waits in the pull of 'w' (push 2) for worker 0")


def test_malformed_reports_are_ignored() -> None:
    for bad in (None, [1], {"what": "barrier"}, {"what": "barrier", "n": True}, {"what": "pull", "on": []},
                {"what": "pull", "of": "'w'", "on": ["0"]}, {"what": "sleep", "n": 1},
                {"what": "pull", "of": "x" * 400, "on": [1]}):
        assert parse(bad) is None, bad
    assert parse({"what": "pull", "of": "'w'", "push": 2, "on": [3, 0, 3]}) == \
        {"what": "pull", "of": "'w'", "push": 2, "on": [0, 3]}
