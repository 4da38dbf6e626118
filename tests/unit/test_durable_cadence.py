"""Pushes never wait for a durable point (psnode.worker.journal: bounded, without waiting).

A worker (the real :class:`psnode.worker.tracker.Tracker` and its journal) trains a row_sparse
part of a restartable server (the real :class:`psnode.server.store.Store` and
:class:`psnode.server.points.Points`) whose checkpoint writes complete only when the test says:

* while a point is under way, every step's pull is answered at once (the rounds go on), up to
  the journal's hard bound;
* the server begins that point on its own (``LAG``), and the first answer after it completes
  brings the new watermark: the journal forgets the pushes it holds;
* at the hard bound (``ASK_DEPTH``) the push asks, and its round's answers wait for a point:
  the journal never holds more, and once the disk catches up everything flows again;
* every value is exact (sgd, learning rate 1, every row pushed ``1`` per step).
"""
from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import numpy as np

from psnode.protocol import Init, Ok, Pull, Push, SetOptimizer
from psnode.server.points import LAG, Lag, Points
from psnode.server.replies import Reply
from psnode.server.store import Store
from psnode.worker.journal import ASK_DEPTH
from psnode.worker.tracker import Request, Tracker

F = np.float32
ROWS, DIM = 64, 4
KEY = ("emb", 0)


class Disk:
    """A checkpoint chain whose background writes complete when the test says."""

    def __init__(self) -> None:
        self.based = True
        self.written = 0
        self.appended: list[Future] = []

    def appendable(self, size: int) -> bool:
        return True

    def append(self, changes: Any, store: Store) -> Future:
        fut: Future = Future()
        self.appended.append(fut)
        return fut

    def land(self) -> None:
        for fut in self.appended:
            if not fut.done():
                fut.set_result(None)

    def close(self) -> None:
        pass


class Got:
    def __init__(self) -> None:
        self.answer: Ok | None = None

    def set(self, answer: Ok) -> None:
        self.answer = answer

    def fail(self, exc: BaseException) -> None:
        raise AssertionError(f"a request failed: {exc!r}")


class Job:
    def __init__(self) -> None:
        self.store = Store(1, restartable=True)
        self.store.track_changes = True
        self.sent: list[Reply] = []
        self.points = Points(self.store, self.sent.extend, every=0, resend_after=1.0)
        self.disk = Disk()
        self.points.chain = self.disk  # type: ignore[assignment]
        self.tracker = Tracker(1, retry_timeout=1e9, max_retries=10)
        for op in (SetOptimizer({"name": "sgd", "params": {"learning_rate": 1.0}}, id=1),
                   Init("emb", 0, "float32", (ROWS, DIM), True, "sum", True, np.zeros((ROWS, DIM), F), id=2)):
            self.points.reply(self.store.handle(0, op), self.pump)   # (each waits for a point)
            self.disk.land()
            self.points.poll(self.pump)
        assert [r.answer.id for r in self.sent] == [1, 2] and self.points.pending is None
        self.sent.clear()

    def pump(self) -> None:
        pass

    def land(self) -> None:
        self.disk.land()
        self.points.poll(self.pump)
        self.deliver()

    def deliver(self) -> None:
        replies, self.sent[:] = list(self.sent), []
        for r in replies:
            if r.answer.id in self.tracker.pending:
                assert not self.tracker.answered(0, r.answer, 0.0)
        outcomes, self.tracker.outcomes[:] = list(self.tracker.outcomes), []
        for fut, outcome in outcomes:
            assert not isinstance(outcome, BaseException), outcome
            fut.set(outcome)

    def step(self, t: int) -> Got:
        """Push ``1`` to every row (push ``t``), then pull them after it."""
        rows = np.arange(ROWS)
        self.tracker.add(Request(0, Push("emb", 0, t, np.ones((ROWS, DIM), F), rows=rows)))
        got = Got()
        self.tracker.add(Request(0, Pull("emb", 0, t, rows=rows), ROWS * DIM * 4, got))
        for op in self.tracker.take(0.0).get(0, []):
            self.points.reply(self.store.handle(0, op), self.pump)
        self.deliver()
        return got

    def depth(self) -> int:
        return self.tracker.journal.depth_of(KEY)[0]


def _exact(got: Got, t: int) -> None:
    assert got.answer is not None, f"the pull after push {t} waits"
    assert np.array_equal(got.answer.arrays[0], np.full((ROWS, DIM), -t, F)), f"push {t}"


def test_pushes_keep_flowing_while_a_durable_point_is_under_way() -> None:
    job = Job()
    assert LAG < ASK_DEPTH
    for t in range(1, ASK_DEPTH):
        _exact(job.step(t), t)   # (the disk never lands: a point is under way from push LAG on)
        assert job.depth() == t
        assert (job.points.pending is not None) == (t >= LAG)
    assert len(job.disk.appended) == 3   # (the optimizer's point, the init's, the one begun at LAG)


def test_the_server_makes_points_on_its_own_and_the_next_answer_brings_the_watermark() -> None:
    job = Job()
    for t in range(1, LAG + 2):
        _exact(job.step(t), t)
    assert job.points.pending is not None and job.depth() == LAG + 1
    job.land()   # the point begun at LAG completes; one push past what it holds: none begins
    assert job.points.pending is None and len(job.disk.appended) == 3
    t = LAG + 2
    _exact(job.step(t), t)
    assert job.depth() == t - LAG   # (that answer's watermark: the point's pushes are forgotten)
    for t in range(LAG + 3, 2 * LAG):
        _exact(job.step(t), t)
        assert job.points.pending is None, f"a point begun at push {t}, {t - LAG} past the last"
    _exact(job.step(2 * LAG), 2 * LAG)   # LAG pushes past the last point: the next begins
    assert job.points.pending is not None and len(job.disk.appended) == 4
    job.land()
    _exact(job.step(2 * LAG + 1), 2 * LAG + 1)
    assert job.depth() == 1


def test_pushes_past_the_point_under_way_begin_the_next_as_it_completes() -> None:
    job = Job()
    job.points.lags = Lag(pushes=4)
    for t in range(1, 8):   # (the point begun at push 4 is under way: 3 pushes past it)
        _exact(job.step(t), t)
    assert len(job.disk.appended) == 3 and not job.points.wanted
    _exact(job.step(8), 8)   # 4 past it: the next is wanted
    assert job.points.wanted
    job.land()
    assert job.points.pending is not None and len(job.disk.appended) == 4   # (begun at once)
    job.land()
    _exact(job.step(9), 9)
    assert job.depth() == 1


def test_the_journal_asks_at_its_hard_bound_and_stays_there() -> None:
    job = Job()
    for t in range(1, ASK_DEPTH):
        _exact(job.step(t), t)
    got = job.step(ASK_DEPTH)   # the push that reaches the bound asks: its round waits for a point
    assert got.answer is None and job.depth() == ASK_DEPTH
    job.land()                  # (the point under way completes; the one the ask needs begins)
    assert got.answer is None
    job.land()
    _exact(got, ASK_DEPTH)
    assert job.depth() == 0     # (that answer's watermark covers every push)
    for t in range(ASK_DEPTH + 1, ASK_DEPTH + 4):
        _exact(job.step(t), t)
    assert job.depth() == 3


class _Part:
    """A key part as the lag reads it: the durable watermark per worker, its value, dense or not."""

    def __init__(self, nbytes: int, sparse: bool = False) -> None:
        self.durable: dict[int, int] = {}
        self.value = np.zeros(nbytes // 4, F)
        self.sparse = sparse


def _answers(parts: list[_Part], worker: int, seq: int) -> list[Reply]:
    return [Reply(worker, Ok(i, seq=seq), holder=p) for i, p in enumerate(parts)]  # type: ignore[arg-type]


def test_a_point_is_due_once_a_workers_dense_parts_lag_past_the_bytes_bound_whatever_their_number():
    from psnode.server.points import LAG_BYTES, Lag
    lag = Lag()
    mib = 1 << 20
    parts = [_Part(mib) for _ in range(8)]           # a dense model of 8 parts of 1 MiB
    behind = LAG_BYTES // (len(parts) * mib)          # pushes behind each, under LAG_BYTES together
    assert 0 < behind < LAG
    assert not lag.over(_answers(parts, 0, behind - 1), True)   # under the bound together
    assert not lag.over(_answers(parts, 1, behind - 1), True)   # (another worker's lag is its own)
    assert lag.over(_answers(parts, 0, behind), True)           # 8 parts x 1 MiB x behind = the bound
    lag.clear()                                                 # a point completed
    for p in parts:
        p.durable[0] = behind
    assert not lag.over(_answers(parts, 0, behind + 1), True)
    assert not lag.over(_answers(parts, 0, 10**6), False)        # a server that cannot restart: never


def test_a_sparse_part_lags_by_pushes_only():
    from psnode.server.points import Lag
    lag = Lag()
    table = _Part(1 << 30, sparse=True)   # a 1 GiB table, its pushes a few rows each
    assert not lag.over(_answers([table], 0, LAG - 1), True)
    assert lag.over(_answers([table], 0, LAG), True)
