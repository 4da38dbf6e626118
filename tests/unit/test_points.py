"""Durable points in the background (psnode.server.points): answers that need a point wait for
it, the others leave at once; a big key part is read in place by the point's writers and the
rounds copy it before they write it (copy on write), so what the point writes is the state at
its start, exactly."""
from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import numpy as np

from psnode.protocol import Init, Pull, Push, SetOptimizer
from psnode.server.points import PIN_BYTES, Points
from psnode.server.replies import Reply
from psnode.server.store import Store

F = np.float32
ROWS, DIM = 200_000, 4   # 3.2 MB: past PIN_BYTES


class Disk:
    """A checkpoint chain whose background writes complete when the test says."""

    def __init__(self) -> None:
        self.based = True
        self.written = 0
        self.appended: list[tuple[Future, dict[str, np.ndarray]]] = []

    def appendable(self, size: int) -> bool:
        return True

    def append(self, changes: Any, store: Store) -> Future:
        fut: Future = Future()
        self.appended.append((fut, changes[1]))
        return fut

    def close(self) -> None:
        pass


def _setup() -> tuple[Store, Points, Disk, list[Reply]]:
    store = Store(1, restartable=True)
    store.track_changes = True
    sent: list[Reply] = []
    points = Points(store, sent.extend, every=0, resend_after=1.0)
    disk = Disk()
    points.chain = disk  # type: ignore[assignment]
    points.reply(store.handle(0, SetOptimizer({"name": "adagrad", "params": {"learning_rate": 1.0}}, id=1)),
                 lambda: None)
    assert sent == [] and points.pending is not None   # (an optimizer set: its answer waits for the point)
    disk.appended[0][0].set_result(None)
    points.poll(lambda: None)
    assert [r.answer.id for r in sent] == [1] and points.pending is None
    return store, points, disk, sent


def test_a_new_big_part_is_written_in_place_and_copied_only_if_a_round_writes_it_meanwhile() -> None:
    store, points, disk, sent = _setup()
    assert ROWS * DIM * 4 > PIN_BYTES
    init = store.handle(0, Init("emb", 0, "float32", (ROWS, DIM), True, "sum", True, np.zeros((ROWS, DIM), F), id=2))
    points.reply(init, lambda: None)
    assert points.pending is not None and [r.answer.id for r in sent] == [1]   # (the init's answer waits)
    (fut, arrays), = disk.appended[-1:]
    entry = store.entries[("emb", 0)]
    written_value = next(a for a in arrays.values() if a is entry.value)         # read in place, not copied
    written_h = next(a for a in arrays.values() if a is entry.state.arrays["history"])
    # a round writes the part while the point is under way: it writes a copy
    store.handle(0, Push("emb", 0, 1, np.ones((2, DIM), F), rows=np.array([3, 7])))
    assert entry.value is not written_value and entry.state.arrays["history"] is not written_h
    assert not written_value.any() and not written_h.any()                         # the point's state, exactly
    assert entry.value[3].tolist() == [-1.0] * DIM
    pull = store.handle(0, Pull("emb", 0, 1, id=3, rows=np.array([3])))
    points.reply(pull, lambda: None)                                               # (reveals nothing new: leaves)
    assert [r.answer.id for r in sent] == [1, 3]
    fut.set_result(None)
    points.poll(lambda: None)
    assert points.pending is None and [r.answer.id for r in sent] == [1, 3, 2]
    # once the point is complete the part is written in place again
    value = entry.value
    store.handle(0, Push("emb", 0, 2, np.ones((1, DIM), F), rows=np.array([5])))
    assert entry.value is value


def test_an_answer_that_needs_a_later_point_waits_for_the_next_one() -> None:
    """While a point is under way, an init (it reveals a new key) waits; the next point begins
    as the first ends and releases it."""
    store, points, disk, sent = _setup()
    points.reply(store.handle(0, Init("a", 0, "float32", (2,), True, "average", False, np.zeros(2, F), id=2)),
                 lambda: None)
    points.reply(store.handle(0, Init("b", 0, "float32", (2,), True, "average", False, np.zeros(2, F), id=3)),
                 lambda: None)
    assert [r.answer.id for r in sent] == [1] and len(disk.appended) == 2
    disk.appended[1][0].set_result(None)
    points.poll(lambda: None)
    assert [r.answer.id for r in sent] == [1, 2] and len(disk.appended) == 3   # (b's point began)
    disk.appended[2][0].set_result(None)
    points.poll(lambda: None)
    assert [r.answer.id for r in sent] == [1, 2, 3] and points.pending is None
