"""Keys whose values the servers compute (psnode.server.fills, psnode.server.store): pure, no
processes.  The parts of S servers put together equal the key computed at once, for any S; a
part exists (and its inits are answered) only when its fill completed; bare answers carry no
value; a bad spec is answered, never raised; checkpoints keep the values."""
from __future__ import annotations

import numpy as np
import pytest

from psnode.math import initializers as I
from psnode.math import optimizers as optimizer
from psnode.protocol import Failed, Init, Ok, Pull, Push, SetOptimizer, Wait
from psnode.server import chain as disk
from psnode.server.store import Store
from psnode.worker.placement import Placer

PS = I.ps_initializer(I.Normal(0.1), seed=11)


def _fill_op(key, part, shape, start, whole, *, id=1, sparse=True, ps=PS, dtype="float32") -> Init:
    return Init(key, part, dtype, shape, sparse=sparse, id=id, fill=ps.part(whole, start).to_json(), bare=True)


def _server_parts(num_servers: int, shape: tuple[int, int], bound: int = 10) -> list[np.ndarray]:
    """Each server's part of a row_sparse key (as the workers place it), computed by its store."""
    placement = Placer(num_servers, bound).place("emb", shape, 4, by_rows=True)
    out = []
    for p in placement.parts:
        store = Store(1)
        rows = p.hi - p.lo
        assert store.handle(0, _fill_op("emb", p.index, (rows, shape[1]), p.lo * shape[1], shape)) == []
        assert ("emb", p.index) not in store.entries and store.filling.pending   # not a key yet
        replies = []
        while store.filling.pending:
            replies += store.fill_some(7)     # (a few elements a step: pieces of rows)
        (r,) = replies
        assert isinstance(r.answer, Ok) and r.answer.arrays == [] and r.entry is None   # bare
        out.append(store.entries[("emb", p.index)].value.copy())
    return out


@pytest.mark.parametrize("servers", [1, 2, 3, 5])
def test_parts_of_any_number_of_servers_make_the_same_key(servers: int) -> None:
    shape = (23, 6)
    parts = _server_parts(servers, shape)
    assert len(parts) == servers
    whole = np.concatenate(parts)
    assert whole.dtype == np.float32
    assert np.array_equal(whole, PS.values("emb", shape))
    assert np.array_equal(whole, np.concatenate(_server_parts(1, shape)))


def test_dense_key_split_over_flat_elements() -> None:
    """A dense key split over servers by flat elements: each part starts mid-row."""
    shape = (7, 5)
    ps = I.ps_initializer(I.Xavier(), seed=2)
    placement = Placer(3, 10).place("w", shape, 4)
    flat = []
    for p in placement.parts:
        store = Store(1)
        store.handle(0, _fill_op("w", p.index, (p.hi - p.lo,), p.lo, shape, sparse=False, ps=ps))
        store.fill_some(-1)
        flat.append(store.entries[("w", p.index)].value)
    assert [p.lo for p in placement.parts] == [0, 12, 24]
    assert np.array_equal(np.concatenate(flat).reshape(shape), ps.values("w", shape))


def test_inits_wait_for_the_fill_and_resends_hear_wait() -> None:
    s = Store(3)
    shape = (40, 4)
    assert s.handle(1, Init("emb", 0, "float32", shape, sparse=True, id=5, bare=True)) == []   # before rank 0
    assert s.handle(0, _fill_op("emb", 0, shape, 0, shape, id=9)) == []
    assert s.handle(2, Init("emb", 0, "float32", shape, sparse=True, id=6, bare=True)) == []
    resent = _fill_op("emb", 0, shape, 0, shape, id=9)
    resent.re = True
    again = s.handle(0, resent)        # (rank 0's init sent again while its part is computed)
    assert [type(r.answer) for r in again] == [Wait] and again[0].answer.id == 9
    (w,) = s.handle(2, Init("emb", 0, "float32", shape, sparse=True, id=6, re=True, bare=True))
    assert isinstance(w.answer, Wait)
    assert s.handle(0, Pull("emb", 0, 0, np.array([1]), id=10))[0].answer.kind == "KeyNotInitialized"
    replies = s.fill_some(100)       # 100 of 160 elements: not done
    assert replies == [] and ("emb", 0) not in s.entries
    replies = s.fill_some(100)
    assert sorted((r.worker, r.answer.id) for r in replies) == [(0, 9), (1, 5), (2, 6)]
    assert all(isinstance(r.answer, Ok) and r.answer.arrays == [] for r in replies)
    (late,) = s.handle(1, Init("emb", 0, "float32", shape, sparse=True, id=7, bare=True))
    assert isinstance(late.answer, Ok) and late.answer.arrays == []
    (full,) = s.handle(1, Init("emb", 0, "float32", shape, sparse=True, id=8))   # not bare: the value
    assert np.array_equal(full.answer.arrays[0], PS.values("emb", shape))
    (bad,) = s.handle(1, Init("emb", 0, "float32", (41, 4), sparse=True, id=11, bare=True))
    assert isinstance(bad.answer, Failed) and bad.answer.kind == "ShapeMismatch"


def test_filled_keys_train_and_checkpoint_like_any_key(tmp_path) -> None:
    s = Store(1)
    s.handle(0, SetOptimizer(optimizer.create("adagrad", learning_rate=0.5).to_spec()))
    shape = (10, 3)
    s.handle(0, _fill_op("emb", 0, shape, 0, shape))
    s.fill_some(-1)
    entry = s.entries[("emb", 0)]
    assert entry.state is not None and entry.sparse
    g = np.ones((2, 3), np.float32)
    s.handle(0, Push("emb", 0, 1, g, np.array([4, 1]), id=2))
    want = PS.values("emb", shape)
    ref = optimizer.create("adagrad", learning_rate=0.5)
    st = ref.create_state(want)
    ref.update_rows(want, np.array([1, 4]), g, st)
    assert np.array_equal(entry.value, want)
    disk.Chain(str(tmp_path), 0, "job").point(s, whole=True).result()
    back = Store(1)
    disk.load(str(tmp_path), 0, back, same_job=True)
    assert np.array_equal(back.entries[("emb", 0)].value, want) and back.entries[("emb", 0)].round == 1
    (r,) = back.handle(0, Init("emb", 0, "float32", shape, sparse=True, id=3, bare=True, fill=PS.part(shape).to_json()))
    assert isinstance(r.answer, Ok) and r.answer.seq == 1 and not back.filling.pending   # kept, not computed again


@pytest.mark.parametrize("op,kind,words", [
    (Init("k", 0, "float32", (4,), id=1, bare=True, fill={"init": {"name": "pickle", "params": {}}, "seed": 0,
                                                          "shape": [4], "start": 0}), "ConfigError", ["pickle"]),
    (Init("k", 0, "int32", (4,), id=1, bare=True, fill=PS.part((4,)).to_json()), "ConfigError", ["int32"]),
    (Init("k", 0, "float32", (4,), id=1, bare=True, fill=PS.part((6,), start=3).to_json()), "ShapeMismatch",
     ["outside"]),
    (Init("k", 0, "float32", (4,), id=1, bucket=2, bare=True, fill=PS.part((4,)).to_json()), "ProtocolError",
     ["no value"]),
])
def test_bad_fill_requests_are_answered(op: Init, kind: str, words: list[str]) -> None:
    s = Store(1)
    (r,) = s.handle(0, op)
    assert isinstance(r.answer, Failed) and r.answer.kind == kind
    assert all(w in r.answer.message for w in words), r.answer.message
    assert not s.filling.pending and not s.entries


def test_a_big_init_array_is_copied_in_steps_and_answered_once_whole() -> None:
    """An init whose array passes COPY_IN_STEPS is copied in a step at a time (the server's loop
    turns between steps); the part exists, and every init is answered, once it is whole: the
    values are rank 0's exactly, a resent init is told to wait, another worker's init waits too."""
    from psnode.server.store import COPY_IN_STEPS
    rows = COPY_IN_STEPS // (4 * 16) + 1000
    value = np.arange(rows * 16, dtype=np.float32).reshape(rows, 16)
    s = Store(2)
    assert s.handle(0, Init("big", 0, "float32", value.shape, sparse=True, value=value, id=1)) == []
    assert ("big", 0) not in s.entries
    (wait,) = s.handle(0, Init("big", 0, "float32", value.shape, sparse=True, value=value, id=1, re=True))
    assert isinstance(wait.answer, Wait)
    assert s.handle(1, Init("big", 0, "float32", value.shape, sparse=True, id=5)) == []
    steps, replies = 0, []
    while s.filling.pending:
        replies += s.fill_some()
        steps += 1
    assert steps > 1
    assert sorted((r.worker, r.answer.id) for r in replies) == [(0, 1), (1, 5)]
    assert np.array_equal(s.entries[("big", 0)].value, value)


@pytest.mark.parametrize("big", [False, True])
def test_an_init_from_a_worker_with_nowhere_to_put_the_value_is_answered_without_it(big: bool) -> None:
    """Workers that keep no copy of a key (a row_sparse table) init it ``bare``, rank 0 with its
    array: the key is rank 0's array exactly, and no answer carries the table back or holds it
    from being written in place, the answers of a part not yet durable (held for the server's
    next durable point) and a resent init's included; a round then writes rows of the table in
    place (no copy of it)."""
    from psnode.server.store import COPY_IN_STEPS
    rows = (COPY_IN_STEPS // (4 * 16) + 1000) if big else 50
    value = np.arange(rows * 16, dtype=np.float32).reshape(rows, 16)
    s = Store(2, restartable=True)
    replies = s.handle(0, Init("emb", 0, "float32", value.shape, sparse=True, value=value, id=1, bare=True))
    replies += s.handle(1, Init("emb", 0, "float32", value.shape, sparse=True, id=5, bare=True))
    while s.filling.pending:
        replies += s.fill_some()
    replies += s.handle(1, Init("emb", 0, "float32", value.shape, sparse=True, id=5, bare=True, re=True))
    entry = s.entries[("emb", 0)]
    assert np.array_equal(entry.value, value)
    assert sorted((r.worker, r.answer.id) for r in replies) == [(0, 1), (1, 5), (1, 5)]
    assert all(isinstance(r.answer, Ok) and r.answer.arrays == [] and r.entry is None for r in replies)
    assert s.must_persist and not entry.value_sends    # (held for the point: nothing reads the table)
    table = entry.value
    for w in (0, 1):
        s.handle(w, Push("emb", 0, 1, np.ones((2, 16), np.float32), rows=np.array([3, 7])))
    assert entry.value is table                          # (written in place)
    assert (table[[3, 7]] == 1.0).all() and np.array_equal(table[4], value[4])   # (the mean of the two pushes)
