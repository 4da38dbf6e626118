"""Bounded staleness (dist_ssp): the clock and bound rules (psnode.server.staleness) and a store
that keeps them (psnode.server.store: pure, driven op by op)."""
from __future__ import annotations

import numpy as np
import pytest

from psnode import kv as kv_mod
from psnode.errors import ConfigError, ProtocolError
from psnode.math import optimizers as optimizer
from psnode.protocol import Failed, Init, Join, Ok, Pull, Push, SetOptimizer, Wait
from psnode.server import checkpoint
from psnode.server import staleness as bound
from psnode.server.store import Store

W = 3


# ------------------------------------------------------------------ the pure rules
def test_floor_is_the_slowest_gating_clock() -> None:
    assert bound.floor({0: 5, 1: 2, 2: 7}, {0, 1, 2}) == 2
    assert bound.floor({0: 5, 2: 7}, {0, 1, 2}) == 0            # (no push yet: clock 0)
    assert bound.floor({0: 5, 1: 2, 2: 7}, {0, 2}) == 5         # (1 left: it no longer gates)
    assert bound.floor({0: 5}, set()) is None


@pytest.mark.parametrize("after,s,own,low,want", [
    (4, 0, 4, 4, True), (4, 0, 4, 3, False),                   # s = 0: every worker's push 4
    (4, 1, 4, 3, True), (4, 1, 4, 2, False),
    (4, 3, 4, 1, True), (4, 3, 4, 0, False),
    (4, 3, 3, 4, False),                                         # its own push 4 not applied yet
    (4, 2, 4, None, True),                                       # nobody gates
    (1, 3, 1, 0, True),                                          # the first steps never wait
])
def test_ready(after: int, s: int, own: int, low: int | None, want: bool) -> None:
    assert bound.ready(after, s, own, low) is want


def test_blockers_and_join_clock() -> None:
    pushed = {0: 9, 1: 4, 2: 6}
    assert bound.blockers(pushed, {0, 1, 2}, 9, 3) == [1]
    assert bound.blockers(pushed, {0, 1, 2}, 9, 2) == [1, 2]
    assert bound.blockers(pushed, {0, 1, 2}, 9, 5) == []
    assert bound.join_clock(pushed, {0, 1, 2}) == 9 and bound.join_clock({}, set()) == 0


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2", None, bound.MAX_STALENESS + 1])
def test_check_staleness_names_the_value(bad: object) -> None:
    with pytest.raises(ValueError, match=r"kv.create\('dist_ssp'\): staleness must be an int"):
        bound.check_staleness(bad, "kv.create('dist_ssp')")


# ------------------------------------------------------------------ the store
def ssp_store(s: int, opt: str | None = "sgd") -> Store:
    """A store of W workers holding 'w' (8 float64 zeros) as a dist_ssp part of staleness s;
    with ``opt`` SGD at lr 1 (a push of -g adds g to the value)."""
    store = Store(W)
    if opt:
        assert isinstance(store.handle(0, SetOptimizer(optimizer.create("sgd", learning_rate=1.0).to_spec(),
                                                       id=1))[0].answer, Ok)
    out = store.handle(0, Init("w", 0, "float64", (3 * 8,), sync=False, value=np.zeros(3 * 8), id=2,
                               staleness=s))
    assert isinstance(out[0].answer, Ok)
    return store


def push(store: Store, w: int, t: int) -> list:
    """Push t of worker w: a one-hot at (w, t) (slot w * 8 + t - 1)."""
    g = np.zeros(3 * 8)
    g[w * 8 + t - 1] = -1.0
    return store.handle(w, Push("w", 0, t, g, id=100 * w + t))


def pull(store: Store, w: int, after: int, rid: int, re: bool = False) -> list:
    return store.handle(w, Pull("w", 0, after, id=rid, re=re))


def answered(replies: list, w: int, rid: int) -> np.ndarray | None:
    for r in replies:
        if r.worker == w and isinstance(r.answer, Ok) and r.answer.id == rid:
            return np.array(r.answer.arrays[0])
    return None


def clocks(value: np.ndarray) -> list[int]:
    """Per worker, how many of its pushes the value holds (a prefix, checked)."""
    out = []
    for w in range(W):
        row = value[w * 8:(w + 1) * 8]
        n = int(row.sum())
        assert (row[:n] == 1).all() and (row[n:] == 0).all(), row
        out.append(n)
    return out


def test_pull_waits_for_the_slowest_within_the_bound() -> None:
    store = ssp_store(2)
    for t in (1, 2, 3):            # worker 0 runs ahead; 1 and 2 pushed once
        push(store, 0, t)
    push(store, 1, 1)
    push(store, 2, 1)
    assert clocks(answered(pull(store, 0, 3, 7), 0, 7)) == [3, 1, 1]   # 3 - 2 <= 1: at once
    push(store, 0, 4)
    assert pull(store, 0, 4, 8) == []                                  # floor 1 < 4 - 2: parked
    resent = pull(store, 0, 4, 8, re=True)
    assert [type(r.answer) for r in resent] == [Wait] and resent[0].answer.blockers == [1, 2]
    assert push(store, 1, 2) == []                                     # 2 still at 1
    value = answered(push(store, 2, 2), 0, 8)                          # floor 2: answered
    assert value is not None and clocks(value) == [4, 2, 2]


def test_staleness_zero_on_async_apply_waits_for_every_push() -> None:
    store = ssp_store(0)
    push(store, 0, 1)
    assert pull(store, 0, 1, 7) == []
    push(store, 1, 1)
    got = push(store, 2, 1)
    assert clocks(answered(got, 0, 7)) == [1, 1, 1]


def test_a_worker_that_leaves_no_longer_gates() -> None:
    store = ssp_store(1)
    for t in (1, 2, 3):
        push(store, 0, t)
        push(store, 1, t)
    assert pull(store, 0, 3, 7) == []                                  # 2 has not pushed
    out = store.set_active({0, 1})
    assert clocks(answered(out, 0, 7)) == [3, 3, 0]


def test_duplicate_push_is_applied_once_and_out_of_order_counts_when_contiguous() -> None:
    store = ssp_store(1)
    push(store, 1, 1), push(store, 2, 1)
    push(store, 0, 2)                     # ahead of a gap: applied, clock stays 0
    push(store, 0, 2)                     # duplicate
    assert store.entries[("w", 0)].pushed.get(0, 0) == 0
    push(store, 0, 1)
    assert store.entries[("w", 0)].pushed[0] == 2
    assert clocks(answered(pull(store, 0, 2, 7), 0, 7)) == [2, 1, 1]


def test_joiner_starts_at_the_highest_clock() -> None:
    store = ssp_store(1)
    for t in (1, 2, 3):
        push(store, 0, t)
    push(store, 1, 1)
    store.set_membership({0, 1, 2}, 1, {2})          # 2 joins: it gates nothing before its JOIN
    out = store.handle(2, Init("w", 0, "float64", (24,), sync=False, id=9, join=True, staleness=1))
    assert out[0].answer.seq == 3                     # the highest clock
    ok = store.handle(2, Join("w", 0, 5, 1, id=10))
    assert ok[0].answer.seq == 5 and store.entries[("w", 0)].pushed[2] == 4


@pytest.mark.parametrize("bare", [False, True])
def test_a_worker_of_another_kind_is_refused_by_name(bare: bool) -> None:
    """Also a worker with no array to take the value (``bare``: a row_sparse table's)."""
    store = ssp_store(2)
    for s, sync, words in [(1, False, "dist_ssp staleness=1"), (-1, False, "dist_async"),
                           (-1, True, "dist_sync")]:
        out = store.handle(1, Init("w", 0, "float64", (24,), sync=sync, id=5, staleness=s, bare=bare))
        ans = out[0].answer
        assert isinstance(ans, Failed) and ans.kind == "ConfigError", ans
        assert "created by a dist_ssp staleness=2 store" in ans.message and words in ans.message


def test_checkpoint_keeps_the_bound() -> None:
    store = ssp_store(3)
    push(store, 0, 1)
    meta, arrays = checkpoint.snapshot(store)
    back = Store(W)
    checkpoint.restore(back, meta, arrays, same_job=True)
    assert back.entries[("w", 0)].staleness == 3 and back.entries[("w", 0)].pushed == {0: 1}


def test_init_wire_carries_the_staleness() -> None:
    op = Init("w", 0, "float32", (4,), sync=False, staleness=3, id=1)
    flags, part, seq, key, arrays, extra = op.wire()
    assert extra is not None and extra["staleness"] == 3
    assert Init.unwire(flags, part, 1, seq, key, arrays, extra).staleness == 3
    with pytest.raises(ProtocolError, match="async key parts only"):
        Init.unwire(flags | 4, part, 1, seq, key, arrays, extra)
    with pytest.raises(ProtocolError, match="staleness"):
        Init.unwire(flags, part, 1, seq, key, arrays, dict(extra, staleness="3"))


@pytest.mark.parametrize("args,words", [
    (("dist_ssp",), "needs a bound: kv.create('dist_ssp', staleness=s)"),
    (("dist_ssp", None, "average", -1), "staleness must be an int in 0..1048576, not -1"),
    (("dist_sync", None, "average", 2), "staleness=2 is for kv.create('dist_ssp', staleness=s)"),
    (("local", None, "average", 0), "a 'local' store has no staleness bound"),
])
def test_create_refuses_a_bad_staleness(args: tuple, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        kv_mod.create(*args)
    assert words in str(err.value)
