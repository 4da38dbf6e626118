"""The worker's request tracker, without sockets: order, window, retries, notices, restores."""
from __future__ import annotations

import numpy as np
import pytest

from psnode.errors import DataLost, KeyNotInitialized, PeerLost, ShapeMismatch
from psnode.protocol import Failed, Flush, Missing, Ok, Pull, Push, PushPull, Wait, bucket_key
from psnode.protocol.control import WaitKind, WaitReport
from psnode.worker.journal import ASK_DEPTH
from psnode.worker.tracker import QUIET, Request, Tracker, settle

F = np.float32


class Fut:
    def __init__(self) -> None:
        self.result = None
        self.error = None

    def set(self, ans) -> None:
        self.result = ans

    def fail(self, exc) -> None:
        self.error = exc


def _tracker(**kw) -> Tracker:
    kw.setdefault("retry_timeout", 2.0)
    kw.setdefault("max_retries", 2)
    return Tracker(2, address=lambda s: f"10.0.0.{s}:9000", **kw)


def _settle(t: Tracker) -> None:
    outcomes, t.outcomes = t.outcomes, []
    settle(outcomes)


def test_queued_requests_leave_by_priority_within_the_window() -> None:
    t = _tracker(window_bytes=100)
    futs = {}
    for name, prio, nbytes in (("a", 0, 60), ("b", 5, 60), ("c", -1, 10), ("d", 5, 30)):
        futs[name] = Fut()
        t.add(Request(0, Pull(name, 0, 0), nbytes, futs[name], prio))
    t.add(Request(1, Push("p", 0, 1, np.ones(2, F)), 0, None, -9))      # pushes never wait
    sent = t.take(0.0)
    assert [op.key for op in sent[0]] == ["b", "d", "c"] and [op.key for op in sent[1]] == ["p"]
    assert t.inflight == [100, 0] and t.queued                        # "a" waits for the window
    ids = [op.id for op in sent[0]]
    assert len(set(ids)) == 3 and t.take(0.0) == {}
    t.answered(0, Ok(ids[0], [np.zeros(1, F)]), 0.1)
    assert [op.key for op in t.take(0.2)[0]] == ["a"]
    _settle(t)
    assert futs["b"].result.id == ids[0] and futs["a"].result is None


def test_far_window_holds_remote_pushpulls_only() -> None:
    """far_window (sliced arrays): two 256-byte slices unanswered per remote server; a near
    server keeps window_bytes."""
    t = _tracker(far_window=512, near=lambda s: s == 1)
    for server in (0, 1):
        for i in range(4):
            t.add(Request(server, PushPull("w", 2 * i + server, 1, np.ones(64, F)), 256, Fut()))
    sent = t.take(0.0)
    assert [op.part for op in sent[0]] == [0, 2] and [op.part for op in sent[1]] == [1, 3, 5, 7]
    assert t.inflight == [512, 1024] and t.queued
    t.answered(0, Ok(sent[0][0].id, [np.ones(64, F)]), 0.1)
    assert [op.part for op in t.take(0.2)[0]] == [4]
    _settle(t)


def test_unanswered_requests_are_resent_then_fail_naming_the_server() -> None:
    t = _tracker()
    fut = Fut()
    t.add(Request(1, Pull("w", 0, 3), 8, fut))   # (its 8 answer bytes add microseconds to each deadline)
    (op,) = t.take(0.0)[1]
    asked, warnings = t.due(1.0)   # (once, after ASK_AFTER: whom does it wait for?  Not a retry)
    assert [(o.id, o.re) for o in asked[1]] == [(op.id, True)] and warnings == [] and t.retries == 0
    assert t.due(1.5) == ({}, [])
    again, warnings = t.due(2.001)
    assert [(o.id, o.re) for o in again[1]] == [(op.id, True)] and not op.re
    assert warnings == []                                 # a busy server: resent quietly
    again, warnings = t.due(4.002)
    assert [(o.id, o.re) for o in again[1]] == [(op.id, True)]
    assert warnings == ["1 request(s) to server 1 got no answer in 4.0 s; sending a last time (then the job "
                        "fails: the server is dead or unreachable)"]
    assert t.due(6.003) == ({}, []) and t.retries == 2
    _settle(t)
    assert isinstance(fut.error, PeerLost)
    assert "server 1 at 10.0.0.1:9000 did not answer the pull of key 'w'" in str(fut.error)
    assert "after 2 resends over 6.0 s" in str(fut.error) and t.inflight == [0, 0]


def test_wait_is_a_sign_of_life_and_a_gap_resends_the_push() -> None:
    t = _tracker()
    t.add(Request(0, Push("w", 0, 1, np.ones(1, F))))
    t.add(Request(0, Push("w", 0, 2, np.ones(1, F))))
    fut = Fut()
    t.add(Request(0, Pull("w", 0, 2), 4, fut))
    pull = t.take(0.0)[0][-1]
    t.due(2.0)                                           # resent once: tries 1
    assert t.answered(0, Wait(pull.id, 0, [1]), 2.5) == {}
    assert t.pending[pull.id].tries == 0 and t.pending[pull.id].blockers == [1]
    again = t.answered(0, Wait(pull.id, 2), 3.0)         # push 2 never arrived
    assert [(op.key, op.seq, op.re) for op in again[0]] == [("w", 2, True)]
    again, warnings = t.due(4.0)                         # the clock restarted at 3.0: only a check
    assert [type(op).__name__ for op in again[0]] == ["Flush"] and not warnings
    lost = t.answered(0, Wait(pull.id, 1), 5.5)          # push 1: the journal still has it
    assert [op.seq for op in lost[0]] == [1]
    t.answered(0, Ok(pull.id, [np.ones(1, F)], seq=1), 6.0)   # applied up to 2, durable up to 1
    assert t.journal.check_list(0) == [("w", 0, [2])] and t.journal.rounds == 2
    assert t.journal.released(("w", 0)) == 1


def test_pushes_stay_until_durable_and_a_gap_the_journal_forgot_fails_with_data_lost() -> None:
    t = _tracker()
    for q in (1, 2):
        t.add(Request(0, Push("w", 0, q, np.ones(1, F))))
    first = Request(0, Pull("w", 0, 1), 4, Fut())
    t.add(first)
    t.take(0.0)
    t.answered(0, Ok(first.op.id, [np.ones(1, F)], seq=1), 0.5)  # the server's checkpoint holds push 1
    assert t.journal.check_list(0) == [("w", 0, [2])]
    fut = Fut()
    t.add(Request(0, Pull("w", 0, 2), 4, fut))
    (again,) = t.take(1.0)[0]
    assert t.answered(0, Wait(again.id, 1), 2.0) == {}      # ... and then it lacks it
    _settle(t)
    assert isinstance(fut.error, DataLost) and "needs push 1 of key 'w' again" in str(fut.error)
    assert "exists nowhere" in str(fut.error) and not t.pending and t.inflight == [0, 0]


def test_a_part_holding_ask_depth_pushes_asks_for_the_next_ones_answer() -> None:
    t = _tracker()
    for q in range(1, ASK_DEPTH + 1):
        t.add(Request(0, Push("w", 0, q, np.ones(1, F))))
    sent = t.take(0.0)[0]
    assert [op.na for op in sent] == [True] * (ASK_DEPTH - 1) + [False]
    asked = sent[-1]
    assert t.pending[asked.id].request.future is QUIET
    t.answered(0, Ok(asked.id, seq=ASK_DEPTH - 1), 0.5)    # durable up to the one before it
    assert t.journal.check_list(0) == [("w", 0, [ASK_DEPTH])] and not t.pending
    t.add(Request(0, Push("w", 0, ASK_DEPTH + 1, np.ones(1, F))))
    assert t.take(1.0)[0][0].na                            # (the journal is short again)


def test_a_flush_names_lost_pushes_which_go_again_before_the_flush() -> None:
    t = _tracker()
    for q in (1, 2):
        t.add(Request(0, Push("w", 0, q, np.full(1, q, F))))
    fut = Fut()
    t.add(Request(0, Flush(), 0, fut, -100))
    flush = t.take(0.0)[0][-1]
    assert flush.check == [("w", 0, [1, 2])]
    again = t.answered(0, Missing(flush.id, [("w", 0, [2])]), 1.0)
    assert [(type(op).__name__, getattr(op, "seq", None), op.re) for op in again[0]] == \
        [("Push", 2, True), ("Flush", None, True)]
    assert t.retries == 1
    t.answered(0, Ok(flush.id), 1.1)
    _settle(t)
    assert fut.result == Ok(flush.id)


def test_failures_resolve_futures_and_push_failures_are_deferred() -> None:
    t = _tracker()
    fut = Fut()
    t.add(Request(0, Pull("x", 0, 0), 4, fut))
    t.add(Request(0, Push("y", 0, 1, np.ones(1, F))))
    pull, push = t.take(0.0)[0]
    t.answered(0, Failed(pull.id, "KeyNotInitialized", "key 'x' is not initialised"), 0.1)
    t.answered(0, Failed(push.id, "ShapeMismatch", "key 'x' holds float32[2]", na=True), 0.1)
    t.answered(0, Failed(999, "Nonsense", "ignored: nobody asked"), 0.1)
    _settle(t)
    assert isinstance(fut.error, KeyNotInitialized) and str(fut.error).startswith("server 0: key 'x'")
    err = t.take_deferred()
    assert isinstance(err, ShapeMismatch) and t.take_deferred() is None


def test_restored_server_gets_the_journal_and_pending_again() -> None:
    t = _tracker()
    t.add(Request(1, Push("w", 1, 1, np.ones(1, F))))
    fut = Fut()
    t.add(Request(1, PushPull("v", 0, 1, np.ones(1, F)), 4, fut))
    t.add(Request(0, Pull("other", 0, 0), 4, Fut()))
    t.take(0.0)
    t.down.add(1)
    assert 1 not in {op_server for op_server in t.due(9.0)[0]}     # down: no retries meanwhile
    batch = t.restored(1, 10.0)
    assert [(type(op).__name__, op.re) for op in batch] == [("Push", True), ("PushPull", True), ("Pull", True)]
    assert 1 not in t.down and t.pending[batch[-1].id].sent == 10.0   # (its push is in the batch already)


def test_a_bucket_gap_resends_the_members_pushes_and_a_bucket_answer_settles_them() -> None:
    t = _tracker()
    b = (bucket_key(0), 0)
    t.add(Request(0, Push(b[0], 0, 1, np.ones(3, F))))
    for k in ("a", "c"):                                    # step 2 pushed key by key
        t.add(Request(0, Push(k, 0, 2, np.ones(1, F)), guard=b))
    fut = Fut()
    t.add(Request(0, Pull(b[0], 0, 2), 12, fut, label="keys 'a', 'c'"))
    pull = t.take(0.0)[0][-1]
    again = t.answered(0, Wait(pull.id, 2), 1.0)           # the bucket lacks push 2 of some member
    assert sorted((op.key, op.seq) for op in again[0]) == [("a", 2), ("c", 2)]
    t.answered(0, Ok(pull.id, [np.ones(3, F)], seq=2), 2.0)
    assert t.journal.check_list(0) == []


def test_a_wait_is_reported_only_once_a_check_found_nothing_lost() -> None:
    t = _tracker()
    t.add(Request(0, Push("w", 0, 1, np.ones(1, F))))
    fut = Fut()
    req = Request(0, Pull("w", 0, 1), 4, fut, label="key 'w'")
    t.add(req)
    t.take(0.0)
    again, _ = t.due(2.0)
    t.answered(0, Wait(req.op.id, 0, [1, 3]), 2.1)        # parked: waits for workers 1 and 3
    assert t.blocked(req, rank=3) is None                  # (push 1 not known to have arrived)
    again, _ = t.due(4.2)
    (check,) = [op for op in again[0] if isinstance(op, Flush)]
    assert not check.durable and check.check == [("w", 0, [1])]
    t.answered(0, Ok(check.id), 4.3)
    assert t.blocked(req, rank=3) == WaitReport(WaitKind.PULL, of="'w'", push=1, on=(1,))
    assert req.blockers == (1, 3)                          # (whom the worker's wait is credited to)


def test_counters_for_heartbeats_and_fail_all() -> None:
    t = _tracker()
    futs = [Fut(), Fut()]
    t.add(Request(0, Push("w", 0, 1, np.ones(1, F))))
    t.add(Request(0, Pull("w", 0, 1), 4, futs[0]))
    t.take(0.0)
    t.add(Request(0, Pull("w", 0, 1), 4, futs[1]))
    assert (t.pushes, t.pulls) == (1, 1)
    t.fail_all(PeerLost("gone"))
    _settle(t)
    assert all(isinstance(f.error, PeerLost) for f in futs) and not t.pending and not t.queued


@pytest.mark.parametrize("op,text", [(Pull("w", 0, 1), "pull of key 'w'"), (Flush(), "flush")])
def test_describe_names_the_operation(op, text) -> None:
    from psnode.worker.tracker import describe
    assert describe(op) == text


def test_a_parked_pull_is_asked_about_quietly_and_its_long_wait_is_reported_once() -> None:
    t = _tracker(max_retries=1)
    t.add(Request(0, Pull("w", 0, 4), 4, Fut()))
    (pull,) = t.take(0.0)[0]
    t.answered(0, Wait(pull.id, 0, [1]), 1.0)            # parked: waits for worker 1
    warned = []
    for now in range(3, 70, 2):                          # never fails: every Wait is a sign of life
        again, warnings = t.due(float(now))
        warned.extend(warnings)
        for op in again.get(0, []):
            t.answered(0, Wait(op.id, 0, [1]), now + 0.5)
    assert pull.id in t.pending and len(warned) == 1
    assert warned[0].startswith("the pull of key 'w' has waited 31 s for worker(s) [1] to push it")
    assert "kv.num_pushes" in warned[0]


def test_a_push_waits_while_a_pull_of_its_key_part_is_unanswered() -> None:
    t = _tracker()
    t.add(Request(0, Pull("w", 0, 1), 4, Fut()))
    (pull,) = t.take(0.0)[0]
    t.add(Request(0, Push("w", 0, 2, np.ones(1, F))))         # (another thread's push)
    t.add(Request(0, Push("v", 0, 1, np.ones(1, F))))         # another key goes at once
    assert [op.key for op in t.take(0.1)[0]] == ["v"]
    t.answered(0, Ok(pull.id, [np.ones(1, F)]), 0.2)
    assert [(op.key, op.seq) for op in t.take(0.3)[0]] == [("w", 2)] and not t.reading


def test_a_pull_overtaking_its_own_push_never_holds_it() -> None:
    t = _tracker()
    t.add(Request(0, Push("w", 0, 1, np.ones(1, F)), priority=-5))
    t.add(Request(0, Pull("w", 0, 1), 4, Fut(), priority=9))  # leaves first, waits for the push
    assert [type(op).__name__ for op in t.take(0.0)[0]] == ["Pull", "Push"]


def test_add_now_is_add_then_take() -> None:
    """``add_now`` (one request straight through) leaves exactly what ``add`` then ``take``
    would: sent when nothing waits, held behind the window, behind an unanswered pull of its
    key part, or behind requests already queued (which then leave first, by priority)."""
    def both(setup, req_of) -> tuple[object, object]:
        out = []
        for now in (True, False):
            t = _tracker(window_bytes=100)
            setup(t)
            req = req_of()
            got = t.add_now(req, 0.0) if now else (t.add(req), t.take(0.0))[1]
            out.append((sorted((s, [(type(o).__name__, o.key, o.id) for o in ops]) for s, ops in got.items()),
                        t.inflight, t.queued, sorted(t.pending), t.pushes, t.pulls))
        return out[0], out[1]

    def nothing(t: Tracker) -> None:
        pass

    def full_window(t: Tracker) -> None:
        t.add(Request(0, Pull("big", 0, 0), 90, Fut()))
        t.take(0.0)

    def reading(t: Tracker) -> None:
        t.add(Request(0, Pull("k", 0, 1), 8, Fut()))
        t.take(0.0)

    def queued(t: Tracker) -> None:
        full_window(t)
        t.add(Request(0, Pull("later", 0, 0), 50, Fut(), 3))

    cases = [(nothing, lambda: Request(0, PushPull("k", 0, 1, np.ones(2, F)), 8, Fut(), auto=True)),
             (nothing, lambda: Request(1, Push("k", 0, 1, np.ones(2, F)), 0, None)),
             (full_window, lambda: Request(0, Pull("k", 0, 0), 50, Fut())),
             (reading, lambda: Request(0, Push("k", 0, 2, np.ones(2, F)), 0, None)),
             (reading, lambda: Request(1, Push("k", 0, 2, np.ones(2, F)), 0, None)),
             (queued, lambda: Request(1, Pull("k", 0, 0), 8, Fut(), 5))]
    for setup, req_of in cases:
        a, b = both(setup, req_of)
        assert a == b, (setup.__name__, a, b)


def test_a_server_given_up_for_replaced_that_answers_again_is_retried_not_failed() -> None:
    """A replaceable server silent past its retries (busy: e.g. waiting for a dead holder of its
    replicas) is waited for without retries; its next answer is a sign of life: its other
    requests get their retries again and no PeerLost comes ``replaceable`` s after the give-up."""
    t = _tracker(replaceable=10.0)
    first, second = Fut(), Fut()
    t.add(Request(0, Pull("a", 0, 1), 8, first))
    t.add(Request(0, Pull("b", 0, 1), 8, second))
    sent = t.take(0.0)[0]
    ids = {op.key: op.id for op in sent}
    t.due(2.001)
    t.due(4.002)
    assert t.due(6.003)[1] == ["server 0 at 10.0.0.0:9000 did not answer; waiting up to 10 s for its replacement"]
    assert 0 in t.down and t.due(8.0) == ({}, [])                   # no retries while given up
    t.answered(0, Ok(ids["a"], [np.zeros(1, F)]), 9.0)             # it was only busy
    assert 0 not in t.down and t.unanswered == {}
    retries = t.retries
    asked, _ = t.due(9.5)                                          # "b" asked about (not a retry)
    assert [(op.key, op.re) for op in asked[0]] == [("b", True)] and t.retries == retries
    assert t.due(10.5) == ({}, [])                                 # "b"'s clock restarted at 9.0
    again, _ = t.due(11.001)
    assert [(op.key, op.re) for op in again[0]] == [("b", True)] and t.retries == retries + 1
    t.due(13.002)
    t.due(20.0)                                                    # past 0 + 10 s: not failed
    _settle(t)
    assert first.result is not None and second.error is None and t.pending
