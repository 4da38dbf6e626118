"""A server's copies follow the rows touched (psnode.server.image, psnode.server.checkpoint's
snapshot of changes): a holder that applies each durable point's changes to the whole state it
had holds exactly the server's state, and a change carries only the rows its rounds touched."""
from __future__ import annotations

import numpy as np
import pytest

from psnode.protocol import Init, Push, SetOptimizer
from psnode.server import checkpoint
from psnode.server.image import Image, NotApplicable, nbytes
from psnode.server.store import Store

F = np.float32
ROWS, DIM, WORKERS = 50_000, 4, 2


def _store(optimizer: str) -> Store:
    s = Store(WORKERS)
    s.track_changes = True
    s.handle(0, Init("emb", 0, "float32", (ROWS, DIM), True, "sum", True, np.zeros((ROWS, DIM), F)))
    s.handle(0, Init("w", 0, "float32", (3,), True, "average", False, np.zeros(3, F)))
    s.handle(0, SetOptimizer({"name": optimizer, "params": {"learning_rate": 1.0}}, id=1))
    return s


def _round(s: Store, q: int, rng: np.random.Generator) -> set[int]:
    """Round ``q``: each worker pushes the dense key and 1..20 random rows of the table; the rows touched."""
    touched: set[int] = set()
    for w in range(WORKERS):
        rows = rng.choice(ROWS, int(rng.integers(1, 21)), replace=False).astype(np.int64)
        touched.update(rows.tolist())
        s.handle(w, Push("emb", 0, q, np.full((len(rows), DIM), w + q, F), rows=rows))
        s.handle(w, Push("w", 0, q, np.full(3, w + 1, F)))
    return touched


def _assert_same(image: Image, s: Store) -> None:
    meta, arrays = image.whole()
    ref_meta, ref = checkpoint.snapshot(s)
    assert meta == ref_meta
    assert sorted(arrays) == sorted(ref)
    for name, arr in ref.items():
        np.testing.assert_array_equal(arrays[name], arr, err_msg=name)


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "adam"])
def test_changes_applied_in_order_give_the_servers_state_exactly(optimizer: str) -> None:
    """30 rounds, a durable point every 1-3 rounds: the image brought forward by each point's
    changes equals the store's whole snapshot, and each change carries the touched rows (value
    and per-row state) plus the dense key, far below the table's size."""
    rng = np.random.default_rng(3)
    s = _store(optimizer)
    image = Image(*checkpoint.snapshot(s))
    s.forget_changes()
    q, table = 0, ROWS * DIM * 4
    while q < 30:
        touched: set[int] = set()
        for _ in range(int(rng.integers(1, 4))):
            q += 1
            touched |= _round(s, q, rng)
        meta, arrays = checkpoint.snapshot(s, changes_only=True)
        item = next(it for it in meta["index"] if it["key"] == "emb")
        assert item["changes"] == "rows"
        i = meta["index"].index(item)
        assert sorted(arrays[f"k{i}"].tolist()) == sorted(touched)
        per_row = 1 + (0 if optimizer == "sgd" else 1 if optimizer == "adagrad" else 2)
        assert nbytes(arrays) < len(touched) * (8 + 4 * DIM * per_row) + 1024 < table // 100
        image.apply(meta, arrays)
        s.forget_changes()
        _assert_same(image, s)


def test_changes_to_a_part_the_image_lacks_are_refused_and_change_nothing() -> None:
    """Changes that build on another state (the holder lacks the part) are NotApplicable, and
    the image keeps the state it had."""
    rng = np.random.default_rng(5)
    s = _store("adagrad")
    _round(s, 1, rng)
    other = Store(WORKERS)
    other.handle(0, Init("x", 0, "float32", (2,), True, "average", False, np.zeros(2, F)))
    image = Image(*checkpoint.snapshot(other))
    s.forget_changes()
    _round(s, 2, rng)
    with pytest.raises(NotApplicable):
        image.apply(*checkpoint.snapshot(s, changes_only=True))
    assert [it["key"] for it in image.whole()[0]["index"]] == ["x"]


def test_a_new_key_and_a_new_optimizer_travel_whole() -> None:
    """A part created since the last point, and every part after a new optimizer, are carried
    whole (the holder has nothing to apply rows to)."""
    s = _store("sgd")
    s.forget_changes()
    s.handle(0, Init("new", 0, "float32", (5,), True, "average", False, np.ones(5, F)))
    meta, _ = checkpoint.snapshot(s, changes_only=True)
    assert {it["key"]: it.get("changes") for it in meta["index"]} == {"emb": "rows", "w": "rows", "new": None}
    s.forget_changes()
    s.handle(0, SetOptimizer({"name": "adagrad", "params": {"learning_rate": 1.0}}, id=2))
    meta, _ = checkpoint.snapshot(s, changes_only=True)
    assert {it.get("changes") for it in meta["index"]} == {None}


def test_the_rows_changed_are_the_distinct_rows_of_the_rounds_sorted() -> None:
    from psnode.math.sparse import unique_rows

    def distinct(rows):
        return unique_rows(rows, runs=True)
    rng = np.random.default_rng(7)
    runs = [np.unique(rng.integers(0, 1000, int(rng.integers(0, 300)))) for _ in range(12)]
    runs.append(rng.integers(0, 1000, 200))   # (an unsorted one, with repeats)
    got = distinct(np.concatenate(runs))
    assert np.array_equal(got, np.unique(np.concatenate(runs)))
    assert len(distinct(np.empty(0, np.int64))) == 0 and distinct(np.array([5])).tolist() == [5]
