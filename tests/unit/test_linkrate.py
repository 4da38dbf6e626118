"""No death by slowness: a request's deadline follows its bytes and the rate its link delivers,
and a worker gives a server up only when the server answers nothing at all (psnode.worker.linkrate)."""
from __future__ import annotations

import numpy as np

from psnode.errors import PeerLost
from psnode.protocol import Init, Ok, Pull, Push, PushPull
from psnode.worker.linkrate import RATE_FLOOR, RATE_GUESS, LinkMeter
from psnode.worker.tracker import Request, Tracker, settle

F = np.float32
MiB = 2**20


class Fut:
    def __init__(self) -> None:
        self.result = None
        self.error = None

    def set(self, ans) -> None:
        self.result = ans

    def fail(self, exc) -> None:
        self.error = exc


def _tracker() -> Tracker:
    return Tracker(2, retry_timeout=2.0, max_retries=2, address=lambda s: f"10.0.0.{s}:9000")


def _ops(batches, server: int) -> list:
    return batches.get(server, [])


def test_the_meter_measures_what_the_link_delivers() -> None:
    m = LinkMeter(1)
    assert m.rate(0) == RATE_GUESS
    mark, ahead = m.sent(0, 8 * MiB, 10.0)
    assert (mark, ahead) == (8 * MiB, 8 * MiB)
    mark2, ahead2 = m.sent(0, 4 * MiB, 10.0)
    assert (mark2, ahead2) == (12 * MiB, 12 * MiB)
    m.answered(0, mark, 12.0)                       # 8 MiB in 2 s
    assert m.rate(0) == 4 * MiB and m.links[0].backlog == 4 * MiB
    m.answered(0, mark2, 14.0)                      # 4 MiB more in 2 s: the mean of 4 and 2 MiB/s
    assert m.rate(0) == 3 * MiB and m.links[0].backlog == 0
    m.sent(0, 1 * MiB, 100.0)                       # idle since 14: the sample starts at 100
    m.answered(0, 13 * MiB, 100.5)
    assert m.rate(0) == (3 + 2) / 2 * MiB
    m.answered(0, 13 * MiB, 200.0)                  # an old mark: no sample, a sign of life
    assert m.heard_since(0, 200.0) and m.rate(0) == 2.5 * MiB
    m.sent(0, 64 * MiB, 300.0)
    m.answered(0, 77 * MiB, 1300.0)                 # 64 MiB in 1000 s: the floor
    assert m.rate(0) >= RATE_FLOOR


def test_a_big_request_is_resent_only_after_its_bytes_had_time_to_arrive() -> None:
    t = _tracker()
    fut = Fut()
    value = np.zeros(16 * MiB // 4, F)              # 16 MiB at the guessed 10 MiB/s: 1.6 s on the wire
    t.add(Request(0, Init("big", 0, "float32", value.shape, value=value), 0, fut))
    (op,) = t.take(0.0)[0]
    assert t.due(0.5) == ({}, [])                   # an init carrying data is not asked about (no copy)
    assert t.due(3.5) == ({}, [])                   # 2 s + 1.6 s
    again, warnings = t.due(3.7)
    assert [(o.id, o.re) for o in _ops(again, 0)] == [(op.id, True)] and warnings == []


def test_a_request_behind_others_waits_while_the_link_delivers_them() -> None:
    t = _tracker()
    pushes = [Request(0, PushPull("w", i, 1, np.zeros(4 * MiB // 4, F)), 4 * MiB, Fut()) for i in range(4)]
    for r in pushes:
        t.add(r)
    sent = t.take(0.0)[0]
    assert len(sent) == 4                           # 16 MiB queued at once; the last part is 16 MiB behind
    t.answered(0, Ok(sent[0].id, [np.zeros(4 * MiB // 4, F)]), 2.0)    # 4 MiB in 2 s: 2 MiB/s
    t.answered(0, Ok(sent[1].id, [np.zeros(4 * MiB // 4, F)]), 4.0)
    asked, _ = t.due(4.0)                          # (asked about once, as pulls: no data, not a retry)
    assert [o.id for o in _ops(asked, 0)] == [sent[2].id, sent[3].id] and t.retries == 0
    # 2 MiB/s since 4.0 with 4 (part 2) or 8 MiB (part 3) still on their way, and 4 MiB of answer
    assert t.due(9.9)[0] == {}
    again, _ = t.due(10.1)
    assert [(type(o).__name__, o.id, o.re) for o in _ops(again, 0)] == [("Pull", sent[2].id, True)]
    assert t.due(11.9)[0] == {}                     # (a push-pull goes again as its pull: its push is journaled)
    again, _ = t.due(12.1)
    assert [(type(o).__name__, o.id, o.re) for o in _ops(again, 0)] == [("Pull", sent[3].id, True)]


def test_a_server_that_answers_anything_is_never_given_up() -> None:
    """Its silence on one request is a lost copy or a slow round, not death: resent for ever
    (each resend quiet), while a server that answers nothing fails after max_retries."""
    t = _tracker()
    stuck, other = Fut(), Fut()
    t.add(Request(1, Pull("stuck", 0, 1), 0, stuck))
    t.take(0.0)
    now = 0.0
    for _ in range(10):
        t.add(Request(1, Push("p", 0, 1, np.ones(1, F)), 0, other))
        (push,) = t.take(now)[1]
        t.answered(1, Ok(push.id, []), now + 1.0)   # the server answers something every 2.1 s
        now += 2.1
        _, warnings = t.due(now)
        assert warnings == []
    settle(t.outcomes)
    assert stuck.error is None and t.retries >= 5
    silent = _tracker()
    fut = Fut()
    silent.add(Request(1, Pull("w", 0, 1), 0, fut))
    silent.take(0.0)
    for now in (2.0, 4.0, 6.0):
        silent.due(now)
    settle(silent.outcomes)
    assert isinstance(fut.error, PeerLost) and "without an answer of any kind" in str(fut.error)


def test_a_resent_pull_counts_no_bytes_and_a_replayed_push_counts_its_own() -> None:
    t = _tracker()
    t.add(Request(0, Pull("w", 0, 1), 8, Fut()))
    t.take(0.0)
    assert t.meter.links[0].sent == 0
    t.add(Request(0, Push("v", 0, 1, np.ones(256, F))))
    t.take(0.0)
    assert t.meter.links[0].sent == 1024
    t.restored(0, 1.0)                              # the journal's push again, and the pull
    assert t.meter.links[0].sent == 2048
