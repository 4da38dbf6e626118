"""Tables without a row count (psnode.math.dynrows, psnode.server.dyntable, dynparts): the id
hash, the index, admission, eviction, and their copies and restores, checked exactly."""
from __future__ import annotations

import numpy as np
import pytest

from psnode.init import Normal, Uniform, Xavier
from psnode.math import dynrows
from psnode.protocol import Init, Pull, Push, SetOptimizer
from psnode.server import checkpoint
from psnode.server.dyntable import Params, Sketch, Table
from psnode.server.image import Image
from psnode.server.store import Store

F = np.float32
H = dynrows.HEIGHT


def test_the_hash_is_a_bijection_and_spreads_sequential_and_zipf_ids() -> None:
    rng = np.random.default_rng(0)
    ids = np.concatenate([rng.integers(-2**63, 2**63 - 1, 50_000), np.arange(-5, 5), [2**63 - 1, -2**63]])
    assert np.array_equal(dynrows.unmix(dynrows.mix(ids)), ids)
    assert len(np.unique(dynrows.mix(ids))) == len(np.unique(ids))
    for sample in (np.arange(90_000), rng.zipf(1.2, 90_000).astype(np.int64)):
        distinct = np.unique(sample)
        counts = np.bincount(dynrows.server_of(dynrows.mix(distinct), 3), minlength=3)
        assert counts.min() > 0.95 * len(distinct) / 3, counts
    h = dynrows.mix(ids)
    order, bounds = dynrows.split(h, 3)
    for s in range(3):
        assert (dynrows.server_of(h[order[bounds[s]:bounds[s + 1]]], 3) == s).all()


def test_a_rows_initial_values_depend_on_seed_key_and_id_only() -> None:
    h = dynrows.mix(np.arange(100))
    every = dynrows.row_values(Normal(1.0), 5, "emb", h, 8, F)
    assert np.array_equal(dynrows.row_values(Normal(1.0), 5, "emb", h[[42, 7]], 8, F), every[[42, 7]])
    assert not np.array_equal(dynrows.row_values(Normal(1.0), 6, "emb", h[:1], 8, F), every[:1])
    assert not np.array_equal(dynrows.row_values(Normal(1.0), 5, "other", h[:1], 8, F), every[:1])
    u = dynrows.row_values(Uniform(0.25), 0, "emb", h, 8, F)
    assert np.abs(u).max() <= 0.25 and abs(float(every.std()) - 1) < 0.1
    with pytest.raises(Exception, match="xavier"):
        dynrows.check_init(Xavier(), F)


def _table(**kw) -> Table:
    return Table(Params(width=2, **kw), Normal(1.0), 0, "emb")


def test_the_index_reuses_freed_slots_and_evicts_by_ttl_then_least_recently_used() -> None:
    t = _table(ttl=3, max_rows=4)
    h = np.array([10, 20, 30, 40, 50, 60], np.int64)
    slots = t.place(h, True)
    assert slots.tolist() == [0, 1, 2, 3, 4, 5] and t.lookup(np.array([30, 99])).tolist() == [2, -1]
    t.last[:6] = [1, 9, 5, 8, 2, 7]
    t.clock = 6                                   # ttl 3: last < 3 expires (10, 50)
    assert t.due()
    victims = t.victims(100, busy=np.zeros(0, np.int64))
    assert sorted(t.ids[victims].tolist()) == [10, 50]
    assert t.drop(victims).tolist() == [10, 50] and t.rows == 4 and not t.due()
    t.clock = 9                                   # now 30 (last 5) expires; then at most 4 rows
    t.place(np.array([70, 80], np.int64), True)   # (the freed slots first)
    assert sorted(t.lookup(np.array([70, 80])).tolist()) == [0, 4]
    t.last[t.lookup(np.array([70, 80]))] = [9, 9]
    victims = t.victims(100, busy=np.array([2]))  # 30 is busy (a round in progress): kept
    assert sorted(t.ids[victims].tolist()) == [40, 60]   # 6 rows, cap 4: the LRU of 20:9 40:8 60:7 70:9 80:9
    t.drop(victims)
    assert t.rows == 4 and t.evicted == 4 and t.gone_ids().tolist() == [10, 40, 50, 60]


def test_the_sketch_never_counts_below_the_truth_and_its_memory_is_fixed() -> None:
    sk = Sketch(depth=4, width=1 << 10)
    rng = np.random.default_rng(1)
    truth: dict[int, int] = {}
    for _ in range(200):
        batch = np.unique(rng.zipf(1.5, 50).astype(np.int64))
        sk.add(dynrows.mix(batch))
        for i in batch.tolist():
            truth[i] = truth.get(i, 0) + 1
    ids = np.array(sorted(truth), np.int64)
    est = sk.estimate(dynrows.mix(ids))
    assert (est >= np.minimum([truth[i] for i in ids.tolist()], 255)).all()
    assert sk.counts.nbytes == 4 << 10


def _store(**table) -> Store:
    s = Store(2)
    s.track_changes = True
    s.handle(0, SetOptimizer({"name": "adagrad", "params": {"learning_rate": 0.5}}, id=1))
    opts = {"width": 3, "min_count": 1, "ttl": 0, "max_rows": 0, "absent": "init", **table}
    fill = {"init": Normal(1.0).to_spec(), "seed": 4, "dynamic": opts}
    s.handle(0, Init("emb", 0, "float32", (H, 3), True, "average", True, fill=fill, bare=True))
    s.handle(1, Init("emb", 0, "float32", (H, 3), True, "average", True, bare=True))
    return s


def _pull(s: Store, ids: list[int], after: int) -> np.ndarray:
    rep = s.handle(0, Pull("emb", 0, after, dynrows.mix(np.array(ids, np.int64)), id=99))
    return np.array(rep[0].answer.arrays[0])


def test_store_rows_made_on_first_touch_trained_exactly_like_a_fixed_table() -> None:
    s = _store()
    ids = [5, -9, 2**40]
    got = _pull(s, ids, 0)
    assert np.array_equal(got, dynrows.row_values(Normal(1.0), 4, "emb", dynrows.mix(np.array(ids)), 3, F))
    from psnode.math import optimizers as opt
    ref = opt.create("adagrad", learning_rate=0.5)
    w = got.copy()
    st = ref.create_state(w)
    for q in (1, 2):
        s.handle(0, Push("emb", 0, q, np.full((2, 3), q, F), rows=dynrows.mix(np.array([5, 2**40]))))
        s.handle(1, Push("emb", 0, q, np.full((1, 3), 2 * q, F), rows=dynrows.mix(np.array([5]))))
        ref.update_rows(w, np.array([0, 2]), np.array([[1.5 * q] * 3, [0.5 * q] * 3], F), st)
    assert np.array_equal(_pull(s, ids, 2), w)


def test_a_push_reuses_its_pulls_slots_only_while_no_row_was_evicted_since() -> None:
    """A worker's push of the rows it pulled takes the pull's slots; once an eviction freed a
    slot (and another id took it), the push finds its rows again: sum aggregation, sgd(lr=1),
    zero initial values, so each row is minus the sum of its gradients."""
    s = Store(2)
    s.handle(0, SetOptimizer({"name": "sgd", "params": {"learning_rate": 1.0}}, id=1))
    fill = {"init": {"name": "zero", "params": {}}, "seed": 0,
            "dynamic": {"width": 2, "min_count": 1, "ttl": 0, "max_rows": 0, "absent": "init"}}
    s.handle(0, Init("emb", 0, "float32", (H, 2), True, "sum", True, fill=fill, bare=True))
    s.handle(1, Init("emb", 0, "float32", (H, 2), True, "sum", True, bare=True))
    table = s.entries[("emb", 0)].table
    mine = np.sort(dynrows.mix(np.array([1, 2, 3])))
    s.handle(0, Pull("emb", 0, 0, mine, id=10))
    assert table.recall(0, mine) is not None and table.recall(1, mine) is None
    s.handle(0, Pull("emb", 0, 0, mine, id=11))
    freed = table.lookup(mine[:1])
    table.drop(freed)                                          # evicted between the pull and the push
    other = dynrows.mix(np.array([77]))
    s.handle(1, Pull("emb", 0, 0, other, id=12))               # takes the freed slot
    assert table.lookup(other).tolist() == freed.tolist() and table.lookup(mine[:1]).tolist() == [-1]
    s.handle(0, Push("emb", 0, 1, np.full((3, 2), 2, F), rows=mine))
    s.handle(1, Push("emb", 0, 1, np.full((1, 2), 5, F), rows=other))
    got = s.handle(0, Pull("emb", 0, 1, np.concatenate([mine, other]), id=13))[0].answer.arrays[0]
    assert np.array_equal(np.array(got), np.array([[-2, -2]] * 3 + [[-5, -5]], F))


def test_a_pull_remembered_for_its_push_holds_its_own_ids_not_the_workers_buffer() -> None:
    """A pull's ids may be read in place from the worker's shared memory, reused once the pull
    is answered: a later push of other ids that lands in the same buffer must not take the
    first pull's slots (sum, sgd lr=1, zero initial values: each row is minus its gradients)."""
    s = Store(1)
    s.handle(0, SetOptimizer({"name": "sgd", "params": {"learning_rate": 1.0}}, id=1))
    fill = {"init": {"name": "zero", "params": {}}, "seed": 0,
            "dynamic": {"width": 2, "min_count": 1, "ttl": 0, "max_rows": 0, "absent": "init"}}
    s.handle(0, Init("emb", 0, "float32", (H, 2), True, "sum", True, fill=fill, bare=True))
    def ascending(ids: list[int]) -> np.ndarray:   # as a worker sends them: sorted as unsigned
        h = dynrows.mix(np.array(ids))
        return h[np.argsort(h.view(np.uint64))]
    first, second = ascending([1, 2]), ascending([3, 4])
    buffer = first.copy()
    s.handle(0, Pull("emb", 0, 0, buffer, id=10))               # rows of 1 and 2 made
    s.handle(0, Pull("emb", 0, 0, second, id=11))              # rows of 3 and 4 made
    buffer[:] = second                                         # the worker's buffer reused
    s.handle(0, Push("emb", 0, 1, np.full((2, 2), 3, F), rows=buffer))
    got = s.handle(0, Pull("emb", 0, 1, np.concatenate([first, second]), id=12))[0].answer.arrays[0]
    assert np.array_equal(np.array(got), np.array([[0, 0]] * 2 + [[-3, -3]] * 2, F))


def _mirror(s: Store, image: Image) -> None:
    meta, arrays = checkpoint.snapshot(s, changes_only=True)
    image.apply(meta, {n: np.array(a) for n, a in arrays.items()})
    s.begin_point()
    s.forget_changes()


def test_copies_follow_made_changed_and_evicted_rows_and_a_restore_rebuilds_the_index() -> None:
    s = _store(ttl=1)
    image = Image(*checkpoint.snapshot(s))
    s.forget_changes()
    rng = np.random.default_rng(2)
    for q in range(1, 13):
        for w in (0, 1):
            ids = rng.choice(40, 6, replace=False) + 1000 * (q % 3)
            s.handle(w, Push("emb", 0, q, np.full((6, 3), q + w, F), rows=dynrows.mix(ids)))
        if q == 12:   # a round in progress (worker 0's push 13 only) travels with its ids
            s.handle(0, Push("emb", 0, 13, np.ones((2, 3), F), rows=dynrows.mix(np.array([1, 2]))))
        s.evict_some()
        _mirror(s, image)
    table = s.entries[("emb", 0)].table
    assert table.evicted > 0 and table.made > table.trained_rows()
    restored = Store(2)
    checkpoint.restore(restored, *image.whole(), same_job=True)
    want, got = checkpoint.snapshot(s), checkpoint.snapshot(restored)
    assert want[0] == got[0]
    order_w, order_g = np.argsort(want[1]["t0"]), np.argsort(got[1]["t0"])
    for name in want[1]:
        a, b = want[1][name], got[1][name]
        if name in ("v0", "t0", "l0") or (name.startswith("s0_") and a.ndim == 2):
            a, b = a[order_w], b[order_g]
        np.testing.assert_array_equal(a, b, err_msg=name)
    restored.handle(1, Push("emb", 0, 13, np.ones((1, 3), F), rows=dynrows.mix(np.array([2]))))
    s.handle(1, Push("emb", 0, 13, np.ones((1, 3), F), rows=dynrows.mix(np.array([2]))))
    for st in (s, restored):
        assert st.entries[("emb", 0)].round == 13
    assert np.array_equal(_pull(s, [1, 2, 1000], 13), _pull(restored, [1, 2, 1000], 13))


def test_admission_drops_gradients_until_the_kth_occurrence() -> None:
    s = _store(min_count=3, absent="zeros")
    h = dynrows.mix(np.array([7]))
    assert np.array_equal(_pull(s, [7], 0), np.zeros((1, 3), F))          # not admitted: zeros
    for q in (1, 2):
        s.handle(0, Push("emb", 0, q, np.ones((1, 3), F), rows=h))
        s.handle(1, Push("emb", 0, q, np.zeros((0, 3), F), rows=np.zeros(0, np.int64)))
    table = s.entries[("emb", 0)].table
    assert table.dropped == 2 and table.admitted == 0
    assert np.array_equal(_pull(s, [7], 2), np.zeros((1, 3), F))
    s.handle(0, Push("emb", 0, 3, np.ones((1, 3), F), rows=h))            # the 3rd occurrence: trained
    s.handle(1, Push("emb", 0, 3, np.zeros((0, 3), F), rows=np.zeros(0, np.int64)))
    assert table.admitted == 1 and table.dropped == 2
    init = dynrows.row_values(Normal(1.0), 4, "emb", h, 3, F)
    from psnode.math import optimizers as opt
    ref = opt.create("adagrad", learning_rate=0.5)
    st = ref.create_state(init)
    ref.update_rows(init, np.array([0]), np.full((1, 3), 0.5, F), st)
    assert np.array_equal(_pull(s, [7], 3), init)


def test_status_carries_each_tables_rows_admissions_and_evictions() -> None:
    """A server's heartbeat carries (key, rows, admitted, evicted, dropped) per table (``mxdist
    status``'s ``tables`` column); malformed entries are left out."""
    from cli import ui
    from psnode.protocol.control import Counters
    from psnode.protocol.status import NodeRow
    s = _store(min_count=2, max_rows=1)
    for q, ids in ((1, [1, 2]), (2, [1, 2]), (3, [3])):
        s.handle(0, Push("emb", 0, q, np.ones((len(ids), 3), F), rows=dynrows.mix(np.array(ids))))
        s.handle(1, Push("emb", 0, q, np.zeros((0, 3), F), rows=np.zeros(0, np.int64)))
        s.evict_some()
    assert s.table_counts() == (("emb", 1, 2, 1, 3),)   # 1 and 2 admitted at q 2, one evicted (cap 1); 3 dropped
    body = Counters(tables=s.table_counts()).to_body()
    body["tables"].append(["bad", -1, 0, 0, 0])
    assert Counters.from_body(body).tables == (("emb", 1, 2, 1, 3),)
    row = NodeRow("server", 0, "h", "alive", tables=[["emb", 1, 2, 1, 3]])
    cols = dict(ui._big_state_columns([row]))
    assert cols["tables"](row) == "emb:1 +2 -1"


@pytest.mark.parametrize("batch", [50, 3])
def test_the_hash_index_agrees_with_a_dict_through_inserts_deletes_and_rehashes(batch: int) -> None:
    """Colliding keys (equal low bits: chains longer than a lookup's first window), deletes,
    re-inserts into tombstones and growth, inserted in batches and a few at a time: every
    lookup equals a Python dict's."""
    from psnode.server.dyntable import HashIndex
    rng = np.random.default_rng(5)
    idx, ref = HashIndex(16), {}
    for step in range(40 if batch > 10 else 200):
        new = np.unique(np.concatenate([rng.integers(-2**63, 2**63 - 1, batch),
                                        (rng.integers(0, 50, max(1, batch // 2)) << 20)]))
        new = np.array([k for k in new.tolist() if k not in ref], np.int64)
        idx.add(new, new // 7)
        ref.update({k: k // 7 for k in new.tolist()})
        if step % 3 == 2:
            gone = np.array(list(ref)[::4], np.int64)
            idx.remove(gone)
            for k in gone.tolist():
                del ref[k]
        probe = np.concatenate([np.array(list(ref), np.int64), rng.integers(-2**63, 2**63 - 1, 100)])
        assert idx.get(probe).tolist() == [ref.get(k, -1) for k in probe.tolist()]
        assert len(idx) == len(ref) and 2 * (idx.count + idx.dead) <= len(idx.keys)


def test_local_store_misuse_is_named_and_a_plain_template_starts_at_zero(tmp_path) -> None:
    import psnode
    from psnode.errors import ConfigError
    kv = psnode.kv.create("local")
    kv.init("emb", psnode.sparse.table(4))                       # no ps_initializer: rows start at zero
    assert np.array_equal(kv.row_sparse_pull("emb", row_ids=np.array([2**60])).data, np.zeros((1, 4), F))
    with pytest.raises(ConfigError, match="row_sparse_pull"):
        kv.pull("emb")
    with pytest.raises(ConfigError, match="xavier"):
        kv.init("e2", psnode.sparse.table(4), psnode.init.ps_initializer(Xavier()))
    kv.init("fixed", psnode.sparse.zeros((5, 4)))
    with pytest.raises(ConfigError, match="has a row count"):
        psnode.export(kv, "fixed", str(tmp_path / "x.npz"))
    assert psnode.export(kv, "emb", str(tmp_path / "e.npz")) == 1
    with np.load(tmp_path / "e.npz") as f:
        assert f["ids"].tolist() == [2**60] and f["values"].shape == (1, 4)


def test_a_capped_table_keeps_no_record_of_evicted_rows_without_copies_or_checkpoints() -> None:
    """Evicted ids are kept for the next durable point only when there is one (a store that
    tracks changes): without replicas or checkpoints a long stream under ``max_rows`` holds
    ``max_rows`` rows and nothing that grows with the ids it has seen."""
    for track in (False, True):
        s = _store(max_rows=4)
        s.track_changes = track
        for q in range(1, 41):
            ids = np.arange(8) + 8 * q                       # every id new: 8 rows made per round
            s.handle(0, Push("emb", 0, q, np.ones((8, 3), F), rows=dynrows.mix(ids)))
            s.handle(1, Push("emb", 0, q, np.zeros((0, 3), F), rows=np.zeros(0, np.int64)))
            s.evict_some()
        table = s.entries[("emb", 0)].table
        assert table.rows == 4 and table.evicted == 40 * 8 - 4
        assert len(table.gone_ids()) == (40 * 8 - 4 if track else 0)
        assert (len(table.touched_slots()) > 0) == track


def test_row_draws_follow_their_formula_across_any_cut_into_pieces() -> None:
    """Draw ``(r, j)`` of a row RNG is SplitMix64's finalizer of ``streams[r] + (j + 1) * golden``,
    whatever pieces the initializer asks for (a cut inside a row included)."""
    streams = (np.arange(7, dtype=np.uint64) + np.uint64(11)) * np.uint64(0x9E3779B97F4A7C15)
    for width in (1, 3, 5):
        want = [int(dynrows.mix(np.array([(int(streams[r]) + (j + 1) * 0x9E3779B97F4A7C15) % 2**64], np.uint64)
                                .view(np.int64)).view(np.uint64)[0])
                for r in range(7) for j in range(width)]
        rng = dynrows._RowRNG(streams, width)
        got: list[int] = []
        for n in (1, 2, width + 1, 7 * width):
            got += rng._bits(min(n, 7 * width - len(got))).tolist()
            if len(got) == 7 * width:
                break
        assert got == want


def test_the_least_recently_touched_are_the_smallest_ticks_by_count_or_by_partial_sort() -> None:
    from psnode.server.dyntable import oldest
    rng = np.random.default_rng(0)
    for span in (1, 5, 300, 10**9):                       # 10**9: wider than 4x the rows, a partial sort
        for _ in range(200):
            last = rng.integers(1000, 1000 + span, int(rng.integers(1, 60))).astype(np.int64)
            k = int(rng.integers(1, len(last) + 1))
            got = oldest(last, k)
            assert len(set(got.tolist())) == k
            assert np.array_equal(np.sort(last[got]), np.sort(last)[:k])
    assert oldest(np.array([5, 3, 3, 4, 3]), 2).tolist() == [1, 2]   # ties in position order
