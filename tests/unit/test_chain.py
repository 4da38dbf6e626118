"""A server's checkpoint chain on disk (psnode.server.chain): a base and the changes of each
durable point restore exactly the state of the last point written; the files hold the rows
touched; a compaction written while rounds change the table (a fuzzy copy) is exact once
installed; and what a kill -9 leaves at any point of a write (a temporary file, a compaction
not installed, deltas a new base covers) restores the last whole chain."""
from __future__ import annotations

import os

import numpy as np
import pytest

from psnode.protocol import Init, Push, SetOptimizer
from psnode.server import chain as disk
from psnode.server import checkpoint
from psnode.server.store import Store

F = np.float32
DIM, WORKERS = 4, 2


def _store(rows: int) -> Store:
    s = Store(WORKERS)
    s.track_changes = True
    s.handle(0, Init("emb", 0, "float32", (rows, DIM), True, "sum", True, np.zeros((rows, DIM), F)))
    s.handle(0, Init("w", 0, "float32", (3,), True, "average", False, np.zeros(3, F)))
    s.handle(0, SetOptimizer({"name": "adagrad", "params": {"learning_rate": 1.0}}, id=1))
    return s


def _round(s: Store, q: int, rng: np.random.Generator, touch: int = 20) -> None:
    rows = s.entries[("emb", 0)].value.shape[0]
    for w in range(WORKERS):
        ids = rng.choice(rows, touch, replace=False).astype(np.int64)
        s.handle(w, Push("emb", 0, q, np.full((touch, DIM), w + q, F), rows=ids))
        s.handle(w, Push("w", 0, q, np.full(3, w + 1, F)))


def _point(chain: disk.Chain, s: Store) -> None:
    chain.point(s).result(30)
    s.forget_changes()
    s.mark_durable()


def _assert_restores(directory: str, s: Store, chain: str = "job") -> int:
    back = Store(WORKERS)
    _, got_chain, last = disk.load(directory, 0, back, same_job=True)
    assert got_chain == chain
    meta, arrays = checkpoint.snapshot(back)
    ref_meta, ref = checkpoint.snapshot(s)
    assert meta == ref_meta and sorted(arrays) == sorted(ref)
    for name, arr in ref.items():
        np.testing.assert_array_equal(arrays[name], arr, err_msg=name)
    return last


def test_base_and_deltas_restore_each_point_exactly_and_hold_the_rows_touched(tmp_path) -> None:
    rng = np.random.default_rng(1)
    s = _store(100_000)
    chain = disk.Chain(str(tmp_path), 0, "job")
    _point(chain, s)   # the base: the whole table
    base = os.path.getsize(checkpoint.path_for(str(tmp_path), 0))
    assert base > 100_000 * DIM * 4 * 2
    for q in range(1, 11):
        _round(s, q, rng)
        _point(chain, s)
        delta = os.path.getsize(disk.delta_path(str(tmp_path), 0, q))
        assert delta < base // 50
        assert _assert_restores(str(tmp_path), s) == q
    chain.close()


def test_a_compaction_written_while_rounds_go_on_is_exact_once_installed(tmp_path) -> None:
    """Deltas outgrow the base: a new base is written from the live arrays by another thread
    while rounds change them; it is installed at a later point, the deltas it covers go, and
    base + the deltas after it restore exactly."""
    rng = np.random.default_rng(2)
    rows = 2_000_000
    s = _store(rows)
    chain = disk.Chain(str(tmp_path), 0, "job")
    _point(chain, s)
    q = 0
    while chain._next is None:   # (each point touches a quarter of the table: four outgrow it)
        q += 1
        _round(s, q, rng, touch=rows // 8)
        _point(chain, s)
        assert q < 20
    started = q
    while os.path.exists(disk.delta_path(str(tmp_path), 0, 1)):   # until installed
        q += 1
        _round(s, q, rng, touch=1000)
        _point(chain, s)
        assert q < started + 200, "the compaction was never installed"
    assert sorted(disk._deltas(str(tmp_path), 0)) == list(range(started + 1, q + 1))
    assert _assert_restores(str(tmp_path), s) == q
    chain.close()
    assert not [n for n in os.listdir(tmp_path) if ".next-" in n]


def test_what_a_kill_leaves_mid_write_restores_the_last_whole_chain(tmp_path) -> None:
    """A temporary file (a write cut short), a compaction written but not installed, a delta
    of another chain, and a delta past a gap are all ignored: the restore is point 2."""
    rng = np.random.default_rng(3)
    s = _store(10_000)
    d = str(tmp_path)
    chain = disk.Chain(d, 0, "job")
    _point(chain, s)
    for q in (1, 2):
        _round(s, q, rng)
        _point(chain, s)
    chain.close()
    for name in (".server-0.npz.99.abc.tmp", ".server-0.3.delta.npz.99.abc.tmp"):
        with open(os.path.join(d, name), "wb") as fh:
            fh.write(b"PK\x03\x04 cut short")
    os.link(checkpoint.path_for(d, 0), disk.next_path(d, 0, 2))    # (a compaction never installed)
    _round(s, 3, rng)
    meta, arrays = checkpoint.snapshot(s, changes_only=True)
    disk._write(disk.delta_path(d, 0, 3), {**meta, "chain": "another-job", "n": 3}, arrays)
    disk._write(disk.delta_path(d, 0, 5), {**meta, "chain": "job", "n": 5}, arrays)
    back = Store(WORKERS)
    assert disk.load(d, 0, back, same_job=True)[1:] == ("job", 2)
    assert back.entries[("emb", 0)].round == 2


@pytest.mark.parametrize("whole", [True, False])
def test_a_resumed_job_starts_its_own_chain_and_drops_the_old_deltas(tmp_path, whole: bool) -> None:
    rng = np.random.default_rng(4)
    s = _store(1000)
    old = disk.Chain(str(tmp_path), 0, "first-job")
    _point(old, s)
    _round(s, 1, rng)
    _point(old, s)
    old.close()
    resumed = Store(WORKERS)
    disk.load(str(tmp_path), 0, resumed)           # (--resume: values and states)
    new = disk.Chain(str(tmp_path), 0, "second-job")
    new.point(resumed, whole=whole).result()
    new.close()
    assert disk._deltas(str(tmp_path), 0) == {}
    assert disk.load(str(tmp_path), 0, Store(WORKERS))[1:] == ("second-job", 0)
