"""The pieces a same-host push crosses once each, without sockets: the tracker takes a call's
placed operations in one :meth:`Tracker.submit`, the journal answers whether a push asks as it
remembers it and publishes its release watermarks for the push slots, the notice says when the
user's thread has something to take, items reads a push's arrays in one call, and the codec
encodes a placed request in one call."""
from __future__ import annotations

import numpy as np
import pytest

from psnode.errors import DTypeMismatch, KeyNotInitialized, PeerLost, ShapeMismatch
from psnode.protocol import Failed, Ok, Pull, Push, PushPull
from psnode.protocol.codec import KIND_DATA, encode_placed, encode_record, encode_single
from psnode.protocol.samehost import LOC_SENDER, MAX_DATAGRAM
from psnode.samehost.staging import Staging
from psnode.worker import items
from psnode.worker.futures import Placed
from psnode.worker.journal import ASK_DEPTH, PushJournal
from psnode.worker.keys import KeyInfo
from psnode.worker.placement import Placer
from psnode.worker.state import EngineState
from psnode.worker.tracker import Tracker

F = np.float32


def _tracker() -> Tracker:
    return Tracker(2, retry_timeout=2.0, max_retries=2, address=lambda s: f"10.0.0.{s}:9000")


def test_submit_sends_a_lone_near_push_now_and_queues_the_rest() -> None:
    t = _tracker()
    near = Placed(0, PushPull("w", 0, 1, np.ones(4, F)), near=True, nbytes=16)
    far = Placed(1, Push("v", 0, 1, np.ones(4, F)), reply=False)
    sent = t.submit([near], 0.0, False, {0})
    assert sent == {0: [near.op]} and near.op.id > 0 and not t.queued
    assert near.future is not None and near.future.request.op is near.op and near.op.id in t.pending
    assert t.submit([far], 0.0, False, {0}) == {} and t.queued          # far: the I/O thread's take
    assert [op.key for op in t.take(0.0)[1]] == ["v"]
    held = Placed(0, Push("u", 0, 1, np.ones(4, F)), reply=False, near=True)
    assert t.submit([held], 0.0, True, {0}) == {} and t.queued         # a batch: sent when it ends
    assert t.take(0.0, {0}) == {0: [held.op]}


def test_submit_of_several_near_operations_takes_those_for_local_servers() -> None:
    t = _tracker()
    ops = [Placed(s, Push(f"k{s}", 0, 1, np.ones(2, F)), reply=False, near=True) for s in (0, 1)]
    sent = t.submit(ops, 0.0, False, {0})
    assert sent == {0: [ops[0].op]} and t.queued                       # server 1 is not local: it waits


def test_journal_remember_says_when_a_push_asks_and_releases_are_published() -> None:
    j = PushJournal()
    asks = [j.remember(0, Push("w", 0, q, np.ones(1, F))) for q in range(1, ASK_DEPTH + 1)]
    assert asks == [False] * (ASK_DEPTH - 1) + [True]
    assert j.releases == {} and j.released(("w", 0)) == 0
    j.settle(("w", 0), 5, 0)          # applied, not durable: still read by a restored server
    assert j.releases == {}
    j.settle(("w", 0), 0, 3)
    assert j.releases == {("w", 0): 3} == {("w", 0): j.released(("w", 0))}
    j.settle(("w", 0), 9, 9)
    assert j.releases[("w", 0)] == 9 and not j.remember(0, Push("w", 0, 33, np.ones(1, F)))


def test_push_slots_reuse_a_slot_once_the_journal_published_its_release() -> None:
    j = PushJournal()
    staging = Staging(f"t{np.random.default_rng().integers(1 << 30)}", 0, j.releases)
    try:
        got = staging.slot(("w", 0, 0), (4,), np.dtype(F), 1)
        assert got is not None
        j.remember(0, Push("w", 0, 1, got[0]))
        second = staging.slot(("w", 0, 0), (4,), np.dtype(F), 2)
        assert second is not None and second[1] != got[1]              # push 1 not released yet
        j.settle(("w", 0), 1, 1)
        third = staging.slot(("w", 0, 0), (4,), np.dtype(F), 3)
        assert third is not None and third[1] == got[1]                # push 1's slot again
    finally:
        staging.close()


def test_the_notice_is_up_while_the_user_thread_has_something_to_take() -> None:
    t = _tracker()
    st = EngineState(t)
    assert not t.notice.up and st.notice is t.notice
    fut = Placed(0, Push("w", 0, 1, np.ones(1, F)), reply=False, near=True)
    t.submit([fut], 0.0, False, {0})
    t.answered(0, Failed(fut.op.id, "ShapeMismatch", "bad", na=True), 0.1)   # a push nobody waits for
    assert t.notice.up and t.deferred
    st.lower()
    assert t.notice.up                                # its error is not taken yet
    assert isinstance(t.take_deferred(), ShapeMismatch)
    st.lower()
    assert not t.notice.up
    st.changes.append((1, (0, 1)))
    st.lower()
    assert t.notice.up
    st.changes.clear()
    st.leaving = True                                 # a request to leave stays
    st.lower()
    assert t.notice.up
    st.leaving = False
    st.fatal = PeerLost("gone")                       # and so does the job's failure
    st.lower()
    assert t.notice.up


def _infos() -> dict:
    placement = Placer(1, None, 0).place("w", (4,), 4)
    return {"w": KeyInfo((4,), np.dtype(F), False, placement)}


def test_gradients_reads_every_push_form_as_the_general_forms_do() -> None:
    infos = _infos()
    g = np.arange(4, dtype=F)
    (k, info, v), = items.gradients(infos, "w", g)
    assert (k, info, v) == ("w", infos["w"], g) and v is g             # as it is: no copy
    assert items.gradients(infos, ["w"], [g])[0][2] is g
    (_, _, summed), = items.gradients(infos, "w", [g, g])              # several devices: summed
    assert summed.tolist() == [0, 2, 4, 6]
    with pytest.raises(DTypeMismatch, match=r"convert it with .astype\(np.float32\)"):
        items.gradients(infos, "w", g.astype(np.float64))
    with pytest.raises(ShapeMismatch):
        items.gradients(infos, "w", np.zeros(5, F))
    with pytest.raises(KeyNotInitialized, match=r"key 'x' is not initialised: call kv.init\('x', value\) first"):
        items.gradients(infos, "x", g)


def test_encode_placed_writes_the_places_on_the_operation() -> None:
    data, dest = np.ones(8, F), np.zeros(8, F)
    op = PushPull("w", 0, 3, data, dest=dest, at=((0, 64), (1, 128)))
    op.id = 7
    head, arrays = encode_placed(KIND_DATA, b"job", op, LOC_SENDER, MAX_DATAGRAM - 1024)
    record, same = encode_record(op, 0)
    assert arrays == same == [data, dest]
    assert head == encode_single(KIND_DATA, b"job", record, arrays, [(LOC_SENDER, 0, 64), (LOC_SENDER, 1, 128)])
    assert encode_placed(KIND_DATA, b"job", PushPull("w", 0, 3, data, dest=dest, at=((0, 64), None)),
                         LOC_SENDER, MAX_DATAGRAM) is None                # the landing area has no place
    assert encode_placed(KIND_DATA, b"job", Push("w", 0, 3, data), LOC_SENDER, MAX_DATAGRAM) is None
    assert encode_placed(KIND_DATA, b"job", Pull("w", 0, 3, at=()), LOC_SENDER, MAX_DATAGRAM) is not None
    assert encode_placed(KIND_DATA, b"job", Push("w", 0, 3, data, at=((0, 0),)), LOC_SENDER, 10) is None


def test_ok_answers_settle_through_submit_as_through_add() -> None:
    t = _tracker()
    p = Placed(0, PushPull("w", 0, 1, np.ones(2, F)), near=True, nbytes=8)
    t.submit([p], 0.0, False, {0})
    t.answered(0, Ok(p.op.id, [np.ones(2, F)], seq=1), 0.1)
    outcomes, t.outcomes = t.outcomes, []
    assert outcomes == [(p.future, outcomes[0][1])] and t.journal.releases == {("w", 0): 1}
