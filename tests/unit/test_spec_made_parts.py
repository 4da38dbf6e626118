"""A part the server computed from a fill spec (``ps_initializer``) is copied and checkpointed
whole as the spec plus the rows touched since it was made (psnode.server.keypart ``origin``,
psnode.server.checkpoint, psnode.server.image.Spread): the bytes follow the rows touched, not
the table's size, and what comes back is exactly the server's state (values, optimizer state,
rounds, pushes taken).  A dense round, a Python updater or loaded optimizer states make the
part whole again."""
from __future__ import annotations

import os

import numpy as np

from psnode.math import initializers as I
from psnode.protocol import Init, LoadStates, Push, SetOptimizer
from psnode.server import chain as disk
from psnode.server import checkpoint
from psnode.server.image import Image
from psnode.server.store import Store

PS = I.ps_initializer(I.Normal(1.0), seed=5)
F = np.float32
ROWS, DIM, WORKERS = 200_000, 8, 2


def _store(rows: int = ROWS, optimizer: str | None = "adagrad", sparse: bool = True) -> Store:
    s = Store(WORKERS)
    s.track_changes = True
    shape = (rows, DIM)
    s.handle(0, Init("emb", 0, "float32", shape, sparse=sparse, aggregation="sum", id=1, bare=True,
                     fill=PS.part(shape).to_json()))
    while s.filling.pending:
        s.fill_some()
    if optimizer:
        s.handle(0, SetOptimizer({"name": optimizer, "params": {"learning_rate": 0.5}}, id=2))
    return s


def _round(s: Store, q: int, rng: np.random.Generator, touch: int = 50) -> np.ndarray:
    rows = s.entries[("emb", 0)].value.shape[0]
    ids = []
    for w in range(WORKERS):
        ids.append(rng.choice(rows, touch, replace=False).astype(np.int64))
        s.handle(w, Push("emb", 0, q, np.full((touch, DIM), w + q, F), rows=ids[-1]))
    return np.unique(np.concatenate(ids))


def _assert_same(back: Store, s: Store) -> None:
    """``back`` holds exactly ``s``'s state: every value, optimizer state array, round, push count."""
    a, b = s.entries[("emb", 0)], back.entries[("emb", 0)]
    np.testing.assert_array_equal(b.value, a.value)
    assert (b.round, b.pushed) == (a.round, a.pushed)
    assert (a.state is None) == (b.state is None)
    if a.state is not None:
        assert sorted(a.state.arrays) == sorted(b.state.arrays) and a.state.t == b.state.t
        for name, arr in a.state.arrays.items():
            np.testing.assert_array_equal(b.state.arrays[name], arr, err_msg=name)


def test_a_whole_snapshot_is_the_spec_and_the_rows_touched_and_restores_exactly() -> None:
    rng = np.random.default_rng(1)
    s = _store()
    touched = np.unique(np.concatenate([_round(s, q, rng) for q in range(1, 6)]))
    meta, arrays = checkpoint.snapshot(s)
    (item,) = meta["index"]
    assert item["origin"]["spec"] == PS.part((ROWS, DIM)).to_json()
    np.testing.assert_array_equal(arrays["t0"], touched)
    value = s.entries[("emb", 0)].value
    assert sum(a.nbytes for a in arrays.values()) <= len(touched) * (8 + DIM * 4 * 2) + 64   # the rows, not 200 k
    back = Store(WORKERS)
    checkpoint.restore(back, meta, arrays, same_job=True)
    _assert_same(back, s)
    untouched = np.setdiff1d(np.arange(ROWS), touched)
    np.testing.assert_array_equal(back.entries[("emb", 0)].value[untouched],
                                  PS.values("emb", (ROWS, DIM))[untouched])
    assert not back.entries[("emb", 0)].state.arrays["history"][untouched].any()
    # the restored part goes on as spec-made: its next whole snapshot is as small
    _round(back, 6, np.random.default_rng(7))
    _round(s, 6, np.random.default_rng(7))
    _assert_same(back, s)
    meta2, arrays2 = checkpoint.snapshot(back)
    assert "origin" in meta2["index"][0] and sum(a.nbytes for a in arrays2.values()) < value.nbytes // 50


def test_an_image_of_a_spec_made_part_holds_the_rows_and_gives_the_exact_state_back() -> None:
    """A holder's (or a chain's) image: whole once, then the changes of each point."""
    rng = np.random.default_rng(2)
    s = _store()
    _round(s, 1, rng)
    image = Image(*checkpoint.snapshot(s))
    s.forget_changes()
    for q in range(2, 12):
        _round(s, q, rng)
        image.apply(*checkpoint.snapshot(s, changes_only=True))
        s.forget_changes()
        back = Store(WORKERS)
        checkpoint.restore(back, *image.whole(), same_job=True)
        _assert_same(back, s)
    spread = image.parts[("emb", 0)]["spread"]
    assert spread.used == int(np.count_nonzero(s.entries[("emb", 0)].ever)) <= 11 * WORKERS * 50
    held = sum(a.nbytes for a in spread.per_row.values())
    assert held < s.entries[("emb", 0)].value.nbytes // 20


def test_the_optimizer_set_after_points_were_taken_is_carried_as_rows_too() -> None:
    """A part copied before its optimizer state existed, then pushed with one: the image makes
    the state's rows (zero elsewhere), and the restored state equals the server's."""
    rng = np.random.default_rng(3)
    s = _store(optimizer=None)
    _round(s, 1, rng)
    image = Image(*checkpoint.snapshot(s))
    s.forget_changes()
    s.handle(0, SetOptimizer({"name": "adam", "params": {"learning_rate": 0.1}}, id=3))
    image.apply(*checkpoint.snapshot(s, changes_only=True))   # (the part whole: a new optimizer)
    s.forget_changes()
    _round(s, 2, rng)
    image.apply(*checkpoint.snapshot(s, changes_only=True))
    back = Store(WORKERS)
    checkpoint.restore(back, *image.whole(), same_job=True)
    _assert_same(back, s)


def test_a_chain_of_a_big_spec_made_table_writes_the_rows_touched_and_restores_exactly(tmp_path) -> None:
    """Its base is the spec and the rows touched; its deltas are not compacted into a new base
    before they hold a good part of the state (psnode.server.chain.COMPACT_FLOOR)."""
    rng = np.random.default_rng(4)
    s = _store(1_000_000)
    chain = disk.Chain(str(tmp_path), 0, "job")
    for q in range(1, 8):
        _round(s, q, rng)
        chain.point(s).result(30)
        s.forget_changes()
        s.mark_durable()
        assert chain._next is None   # (no compaction: the deltas outweigh the small base, not the state)
    chain.close()
    assert len(disk._deltas(str(tmp_path), 0)) >= 5
    on_disk = sum(os.path.getsize(os.path.join(tmp_path, f)) for f in os.listdir(tmp_path))
    table = 1_000_000 * DIM * 4 * 2   # (values and the AdaGrad state)
    assert on_disk < table // 100, on_disk
    back = Store(WORKERS)
    disk.load(str(tmp_path), 0, back, same_job=True)
    _assert_same(back, s)


def test_a_dense_round_or_loaded_states_make_the_part_whole_again() -> None:
    rng = np.random.default_rng(5)
    s = _store(rows=1000, sparse=False)
    s.handle(0, Push("emb", 0, 1, np.ones((1000, DIM), F)))
    s.handle(1, Push("emb", 0, 1, np.ones((1000, DIM), F)))
    assert s.entries[("emb", 0)].origin is None
    meta, arrays = checkpoint.snapshot(s)
    assert "origin" not in meta["index"][0] and arrays["v0"].shape == (1000, DIM)
    t = _store(rows=1000)
    _round(t, 1, rng)
    assert "origin" in checkpoint.snapshot(t)[0]["index"][0]
    entry = t.entries[("emb", 0)]
    (r,) = t.handle(0, LoadStates([("emb", 0, "history"), ("emb", 0, "t")],
                                  [np.full((1000, DIM), 2.0, F), np.array(3)], id=9))
    assert type(r.answer).__name__ == "Ok", r.answer
    assert entry.origin is None and "origin" not in checkpoint.snapshot(t)[0]["index"][0]
    back = Store(WORKERS)
    checkpoint.restore(back, *checkpoint.snapshot(t), same_job=True)
    _assert_same(back, t)


def test_a_table_touched_past_an_eighth_of_its_rows_goes_whole() -> None:
    """Past 1/8 of its rows touched, a part goes whole (read in place: its rows would be a copy
    on the loop), and the image and restore take it so."""
    rng = np.random.default_rng(6)
    s = _store(rows=1000)
    _round(s, 1, rng, touch=60)                  # (at most 120 rows: under 1/8)
    assert "origin" in checkpoint.snapshot(s)[0]["index"][0]
    image = Image(*checkpoint.snapshot(s))
    s.forget_changes()
    _round(s, 2, rng, touch=60)
    assert int(np.count_nonzero(s.entries[("emb", 0)].ever)) * 8 > 1000
    meta, arrays = checkpoint.snapshot(s)
    assert "origin" not in meta["index"][0] and arrays["v0"].shape == (1000, DIM)
    back = Store(WORKERS)
    checkpoint.restore(back, meta, arrays, same_job=True)
    _assert_same(back, s)
    image.apply(meta, arrays)                       # (the spread part replaced by the whole one)
    back = Store(WORKERS)
    checkpoint.restore(back, *image.whole(), same_job=True)
    _assert_same(back, s)
