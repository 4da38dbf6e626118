"""psnode.scheduler.roster: the scheduler's indexes (counts, active workers, coalesced MEMBERSHIP)."""
from __future__ import annotations

from psnode.protocol.status import NodeState
from psnode.scheduler.roster import MEMBERSHIP_GAP, Roster, barrier_groups


def _roster(workers: int) -> Roster:
    r = Roster()
    for i in range(workers):
        r.joined("worker", b"w%d" % i)
        r.set_state(b"w%d" % i, i, NodeState.ALIVE)
    r.joined("server", b"s0")
    return r


def test_counts_and_active_ranks_follow_every_state_change() -> None:
    r = _roster(4)
    assert r.count == {"worker": 4, "server": 1}
    ranks = r.active_ranks()
    assert ranks == [0, 1, 2, 3] and r.active_ranks() is ranks     # cached until a change
    r.set_state(b"w2", 2, NodeState.FINISHED)
    r.set_state(b"w0", 0, NodeState.DEAD)
    assert r.active_ranks() == [1, 3]
    r.left("worker", b"w0")                                           # replaced by its restart
    r.joined("worker", b"w0'")
    r.set_state(b"w0'", 0, NodeState.ALIVE)
    assert r.active_ranks() == [0, 1, 3] and r.count["worker"] == 4
    assert not r.all_finished()
    for ident, rank in ((b"w0'", 0), (b"w1", 1), (b"w3", 3)):
        r.set_state(ident, rank, NodeState.FINISHED)
    assert r.all_finished() and r.active_ranks() == []


def test_membership_is_coalesced_and_always_the_full_list() -> None:
    r = _roster(3)
    assert r.take_membership(100.0) is None and r.membership_due() is None   # nothing asked
    r.set_state(b"w0", 0, NodeState.FINISHED)
    r.want_membership()
    r.set_state(b"w2", 2, NodeState.FINISHED)
    r.want_membership()
    assert r.take_membership(100.0) == [1]                           # two FINISHes, one message
    assert r.take_membership(100.0) is None
    r.set_state(b"w1", 1, NodeState.FINISHED)
    r.want_membership()                                              # within the gap: waits
    assert r.membership_due() == 100.0 + MEMBERSHIP_GAP
    assert r.take_membership(100.0 + MEMBERSHIP_GAP / 2) is None
    assert r.take_membership(100.0 + MEMBERSHIP_GAP) == []
    r.want_membership()
    assert r.take_membership(100.0 + MEMBERSHIP_GAP, force=True) == []   # forced: at once


def test_barrier_completes_when_every_active_worker_entered() -> None:
    r = _roster(3)
    entered = {b"w0": 1, b"w1": 1}
    assert not r.barrier_complete({}) and not r.barrier_complete(entered)
    entered[b"stale"] = 1                                            # a replaced worker's entry
    assert not r.barrier_complete(entered)                           # counts allow; subset says no
    entered[b"w2"] = 1
    assert r.barrier_complete(entered)
    r.set_state(b"w2", 2, NodeState.FINISHED)
    del entered[b"w2"]
    assert r.barrier_complete(entered)


def test_a_completed_barrier_answers_its_workers_by_number_and_skips_the_gone() -> None:
    nodes = {b"w0": 0, b"w1": 1, b"w2": 2}
    assert barrier_groups({b"w0": 4, b"gone": 4, b"w2": 4}, nodes) == {4: [b"w0", b"w2"]}
    # (a job rebuilt by a take-over: workers that completed different barriers, each told its own)
    assert barrier_groups({b"w0": 4, b"w1": 5, b"gone": 5, b"w2": 4}, nodes) == {4: [b"w0", b"w2"], 5: [b"w1"]}
    assert barrier_groups({b"gone": 3}, nodes) == {3: []}


def test_live_servers_follow_their_states() -> None:
    r = _roster(1)
    assert list(r.servers) == [b"s0"]                                # REGISTERED counts as live
    r.set_state(b"s0", 0, NodeState.ALIVE, "server")
    r.joined("server", b"s1")
    r.set_state(b"s1", 1, NodeState.DEAD, "server")
    assert list(r.servers) == [b"s0"] and r.active_ranks() == [0]   # servers are not workers
    r.left("server", b"s1")
    r.joined("server", b"s1'")
    r.set_state(b"s1'", 1, NodeState.ALIVE, "server")
    r.set_state(b"s0", 0, NodeState.EXITED, "server")
    assert list(r.servers) == [b"s1'"] and r.count["server"] == 2
