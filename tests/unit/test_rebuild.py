"""psnode.scheduler.rebuild: what a restarted scheduler makes of the live nodes' reports, and
the REGISTER a rejoining node sends (psnode.protocol.control.Rejoin)."""
from __future__ import annotations

import pytest

from psnode.errors import ProtocolError
from psnode.protocol.control import Register, Rejoin
from psnode.scheduler.rebuild import Rebuild, done_elsewhere


def server(rank: int, active: tuple[int, ...], generation: int = 0, joined: tuple[int, ...] = ()) -> Register:
    return Register("server", "127.0.0.1", 9000 + rank, 100 + rank, rank,
                    Rejoin(generation=generation, active=active, joined=joined))


def worker(rank: int, barriers: int = 0, generation: int = 0, joiner: bool = False, restarts: int = 0) -> Register:
    return Register("worker", "127.0.0.1", 0, 200 + rank, rank,
                    Rejoin(restarts=restarts, barriers=barriers, joiner=joiner, generation=generation))


def test_complete_when_every_server_and_every_member_reported() -> None:
    rb = Rebuild(num_servers=2)
    assert not rb.started and not rb.complete()
    assert rb.rejoin(b"s0", server(0, (0, 1, 2))) is None
    assert rb.rejoin(b"w0", worker(0)) is None
    assert rb.rejoin(b"w1", worker(1)) is None
    assert rb.started and not rb.complete()        # server 1 and worker 2 not yet
    assert rb.rejoin(b"s1", server(1, (0, 1, 2))) is None
    assert not rb.complete()
    assert rb.rejoin(b"w2", worker(2, barriers=4)) is None
    assert rb.complete()
    plan = rb.plan()
    assert plan.members == {0, 1, 2} and plan.finished == set() and plan.missing == ()
    assert plan.generation == 0 and plan.joiners == set()


def test_members_are_the_servers_latest_view_and_the_rest_is_missing_or_finished() -> None:
    rb = Rebuild(num_servers=2)
    rb.rejoin(b"s0", server(0, (0, 1, 2, 3)))
    rb.rejoin(b"s1", server(1, (0, 2, 3)))         # heard of worker 1's finish; server 0 not yet
    rb.rejoin(b"w1", worker(1))                    # its FINISH was handled, not acknowledged
    rb.rejoin(b"w2", worker(2))
    assert not rb.complete()                       # workers 0 and 3 are members: expected
    plan = rb.plan()
    assert plan.members == {0, 2, 3}
    assert plan.finished == {1}
    assert plan.missing == (("worker", 0), ("worker", 3))


def test_generation_joiners_and_a_joiner_the_servers_had_not_heard_of() -> None:
    rb = Rebuild(num_servers=1)
    rb.rejoin(b"s0", server(0, (0, 1, 4), generation=3, joined=(4,)))
    rb.rejoin(b"w0", worker(0, generation=3))
    rb.rejoin(b"w1", worker(1, generation=3))
    rb.rejoin(b"w4", worker(4, generation=3, joiner=True))
    rb.rejoin(b"w5", worker(5, generation=4, joiner=True))   # joined; the servers were not told yet
    assert rb.complete()
    plan = rb.plan()
    assert plan.members == {0, 1, 4, 5} and plan.finished == set()
    assert plan.generation == 4 and plan.joiners == {4, 5}


def test_a_missing_server_is_missing_and_without_servers_the_workers_are_the_members() -> None:
    rb = Rebuild(num_servers=2)
    rb.rejoin(b"w0", worker(0))
    rb.rejoin(b"w1", worker(1))
    assert not rb.complete()
    plan = rb.plan()
    assert plan.members == {0, 1}
    assert plan.missing == (("server", 0), ("server", 1))


def test_a_rank_rejoins_once_and_fresh_registrations_are_known() -> None:
    rb = Rebuild(num_servers=1)
    assert rb.rejoin(b"w0", worker(0)) is None
    assert rb.rejoin(b"w0", worker(0, barriers=1)) is None     # the same node again: its latest report
    assert rb.rejoin(b"other", worker(0)) == "worker 0 already rejoined (pid 200)"
    rb.fresh[b"new"] = Register("worker", "127.0.0.1", 0, 300, 3)
    assert rb.knows(b"w0") and rb.knows(b"new") and not rb.knows(b"other")


def test_a_barrier_another_first_generation_worker_completed_is_done() -> None:
    assert done_elsewhere(3, [2, 3])
    assert not done_elsewhere(3, [2, 2])
    assert not done_elsewhere(1, [])


def test_register_with_rejoin_round_trips_and_needs_a_rank() -> None:
    body = worker(2, barriers=5, generation=1, joiner=True, restarts=2)
    assert Register.from_body(body.to_body()) == body
    plain = Register("worker", "h", 0, 7, None)
    assert "rejoin" not in plain.to_body() and Register.from_body(plain.to_body()) == plain
    bad = dict(body.to_body(), rank=None)
    with pytest.raises(ProtocolError, match="a rejoining node must give its rank"):
        Register.from_body(bad)
    with pytest.raises(ProtocolError, match="register: rejoin: barriers"):
        Register.from_body(dict(body.to_body(), rejoin={"barriers": -1}))
