"""Aggregation rules (psnode.math.aggregation): the rules themselves, on the wire, in a server's
rounds (single key parts, fused buckets, row_sparse, compressed pushes), in checkpoints, and as
``kv.create``'s ``aggregator``.  Exact values throughout."""
from __future__ import annotations

import numpy as np
import pytest

import psnode
from psnode.errors import ConfigError, ProtocolError
from psnode.math import aggregation
from psnode.math.aggregation import AVERAGE, CHUNK, MAX, SUM
from psnode.math.compression import CompressionSpec
from psnode.protocol import Command, Failed, Init, Message, Ok, Pull, Push, SetOptimizer, bucket_key, decode, encode
from psnode.server import checkpoint
from psnode.server.store import Store

F = np.float32


def _wire(op: Init) -> Init:
    message = Message(Command.DATA, "j", "", ops=[op])
    frames = [f if isinstance(f, bytes) else bytes(memoryview(f)) for f in encode(message)]
    (got,) = decode(frames, "j", 1 << 30).ops
    return got


def _store(workers: int, value: np.ndarray, rule: aggregation.Aggregation, key: str = "k",
           sparse: bool = False, **kw) -> Store:
    store = Store(workers)
    for w in range(workers):
        init = Init(key, 0, value.dtype.name, value.shape, aggregation=rule.name, sparse=sparse,
                    value=value.copy() if w == 0 else None, **kw)
        assert not [r for r in store.handle(w, init) if isinstance(r.answer, Failed)]
    return store


def _pull(store: Store, key: str, after: int) -> np.ndarray:
    [reply] = store.handle(0, Pull(key, 0, after, id=99))
    assert isinstance(reply.answer, Ok)
    return reply.answer.arrays[0]


# ---------------------------------------------------------------- the rules
def test_rules_by_name_and_a_clear_error_for_an_unknown_one() -> None:
    assert list(aggregation.RULES) == ["average", "sum", "max"]
    assert aggregation.parse("max", "here") is MAX
    with pytest.raises(ValueError, match=r"unknown aggregator 'median' \(kv.create\): use one of 'average', "
                                         r"'sum', 'max'"):
        aggregation.parse("median", "kv.create")
    assert [AVERAGE.scale(4), SUM.scale(4), MAX.scale(4), AVERAGE.scale(1)] == [0.25, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("rule", [SUM, AVERAGE, MAX])
@pytest.mark.parametrize("n", [7, 3 * CHUNK + 5])
def test_fold_scaled_equals_two_whole_array_passes(rule: aggregation.Aggregation, n: int) -> None:
    rng = np.random.default_rng(n)
    a, b = rng.standard_normal(n).astype(F), rng.standard_normal(n).astype(F)
    scale = rule.scale(3)
    want = rule.fold(a, b) * F(scale) if scale != 1.0 else rule.fold(a, b)
    out, to = np.empty(n, F), np.empty(n, F)
    rule.fold_scaled(a, b, out, scale)
    assert np.array_equal(out, want)
    rule.fold_scaled(a, b, out, scale, to=to)
    assert np.array_equal(to, want)


def test_fold_rows_takes_each_rows_maximum_over_the_pushes_holding_it() -> None:
    parts = [(np.array([3, 0]), np.array([[1, 9], [2, 2]], F)),
             (np.array([3, 3, 1]), np.array([[4, 4], [6, -6], [8, 8]], F))]
    rows, data = MAX.fold_rows(parts)
    assert rows.tolist() == [0, 1, 3] and data.tolist() == [[2, 2], [8, 8], [6, 9]]
    rows, data = SUM.fold_rows(parts)
    assert rows.tolist() == [0, 1, 3] and data.tolist() == [[2, 2], [8, 8], [11, 7]]


# ---------------------------------------------------------------- the wire
@pytest.mark.parametrize("name", list(aggregation.RULES))
def test_init_carries_its_rule_by_name(name: str) -> None:
    got = _wire(Init("w", 0, "float32", (2,), aggregation=name, value=np.zeros(2, F)))
    assert got.aggregation == name


@pytest.mark.parametrize("bad", [7, "", "x" * 33])
def test_a_rule_name_that_is_no_name_is_a_protocol_error(bad: object) -> None:
    op = Init("w", 0, "float32", (2,))
    op.aggregation = bad  # type: ignore[assignment]
    with pytest.raises(ProtocolError, match="init: agg must be an aggregation rule's name"):
        _wire(op)


def test_a_rule_the_server_does_not_know_is_refused_by_name() -> None:
    [reply] = Store(1).handle(0, Init("w", 0, "float32", (2,), aggregation="median", value=np.zeros(2, F), id=4))
    assert isinstance(reply.answer, Failed) and reply.answer.kind == "ConfigError"
    assert "unknown aggregator 'median' (init of key 'w')" in reply.answer.message


# ---------------------------------------------------------------- a server's rounds
def test_max_rounds_of_a_dense_key_part_take_the_elementwise_maximum() -> None:
    store = _store(3, np.zeros(4, F), MAX)
    pushes = [np.array([1, -5, 3, 0], F), np.array([2, -7, 1, -1], F), np.array([0, -6, 2, -2], F)]
    for w, p in enumerate(pushes):
        store.handle(w, Push("k", 0, 1, p))
    assert _pull(store, "k", 1).tolist() == [2, -5, 3, 0]
    for w, p in enumerate(pushes):   # round 2: the value becomes its aggregate (no optimizer)
        store.handle(w, Push("k", 0, 2, p - 10))
    assert _pull(store, "k", 2).tolist() == [-8, -15, -7, -10]


def test_max_with_backup_workers_is_of_the_pushes_the_round_took() -> None:
    store = _store(3, np.zeros(2, F), MAX, backup=1)
    store.handle(0, Push("k", 0, 1, np.array([1, 7], F)))
    store.handle(2, Push("k", 0, 1, np.array([5, 2], F)))          # 2 of 3: the round completes
    store.handle(1, Push("k", 0, 1, np.array([9, 9], F)))          # late: dropped
    assert _pull(store, "k", 1).tolist() == [5, 7]


def test_max_with_an_optimizer_feeds_it_the_maximum() -> None:
    store = Store(2)
    store.handle(0, SetOptimizer({"name": "sgd", "params": {"learning_rate": 0.5}}))
    for w in (0, 1):
        store.handle(w, Init("k", 0, "float32", (2,), aggregation="max", value=np.zeros(2, F) if w == 0 else None))
    store.handle(0, Push("k", 0, 1, np.array([4, -2], F)))
    store.handle(1, Push("k", 0, 1, np.array([2, -6], F)))
    assert _pull(store, "k", 1).tolist() == [-2, 1]


def test_max_of_fused_bucket_members() -> None:
    store = Store(2)
    for w in (0, 1):
        for i, n in enumerate((3, 5)):
            store.handle(w, Init(f"b{i}", 0, "float32", (n,), aggregation="max", bucket=0, offset=3 * i,
                                 value=np.zeros(n, F) if w == 0 else None))
    store.handle(0, Push(bucket_key(0), 0, 1, np.arange(8, dtype=F)))
    store.handle(1, Push(bucket_key(0), 0, 1, np.arange(8, dtype=F)[::-1].copy()))
    assert _pull(store, bucket_key(0), 1).tolist() == [7, 6, 5, 4, 4, 5, 6, 7]


def test_max_of_row_sparse_rounds_changes_the_rows_pushed() -> None:
    store = _store(2, np.full((5, 2), -1, F), MAX, sparse=True)
    store.handle(0, Push("k", 0, 1, np.array([[1, 1], [2, 2]], F), np.array([3, 0])))
    store.handle(1, Push("k", 0, 1, np.array([[4, 0], [-3, -3]], F), np.array([3, 1])))
    assert _pull(store, "k", 1).tolist() == [[2, 2], [-3, -3], [-1, -1], [4, 1], [-1, -1]]


def test_max_of_compressed_pushes_is_of_the_decoded_gradients() -> None:
    two = CompressionSpec.from_params({"type": "2bit", "threshold": 0.5})
    store = _store(2, np.zeros(8, F), MAX)
    grads = [np.array([1, -1, 0, 1, 0, 0, -1, 1], F), np.array([-1, 1, 1, 0, 0, -1, -1, 0], F)]
    for w, g in enumerate(grads):
        store.handle(w, Push("k", 0, 1, two.compress(g, two.new_residual(8)), comp=two.tag))
    assert _pull(store, "k", 1).tolist() == [0.5, 0.5, 0.5, 0.5, 0, 0, -0.5, 0.5]


def test_workers_with_different_rules_are_refused_by_name() -> None:
    store = Store(2)
    store.handle(0, Init("k", 0, "float32", (2,), aggregation="sum", value=np.zeros(2, F)))
    [reply] = store.handle(1, Init("k", 0, "float32", (2,), aggregation="average", id=3))
    assert isinstance(reply.answer, Failed) and reply.answer.kind == "ConfigError"
    assert "aggregator='sum'; this worker's has aggregator='average'" in reply.answer.message


# ---------------------------------------------------------------- checkpoints
def test_a_checkpoint_keeps_the_rule_and_restores_it() -> None:
    store = _store(2, np.zeros(3, F), MAX)
    store.handle(0, Push("k", 0, 1, np.array([1, 5, -1], F)))     # a round in progress
    meta, arrays = checkpoint.snapshot(store)
    assert meta["index"][0]["aggregation"] == "max"
    back = Store(2)
    checkpoint.restore(back, meta, {k: np.array(a) for k, a in arrays.items()}, same_job=True)
    assert back.entries[("k", 0)].aggregation is MAX
    back.handle(1, Push("k", 0, 1, np.array([3, 2, -4], F)))
    assert _pull(back, "k", 1).tolist() == [3, 5, -1]


@pytest.mark.parametrize("average,rule", [(True, AVERAGE), (False, SUM)])
def test_a_checkpoint_item_with_the_bool_average_restores(average: bool, rule: aggregation.Aggregation) -> None:
    meta, arrays = checkpoint.snapshot(_store(1, np.zeros(3, F), MAX))
    item = meta["index"][0]
    del item["aggregation"]
    item["average"] = average
    back = Store(1)
    checkpoint.restore(back, meta, arrays, same_job=True)
    assert back.entries[("k", 0)].aggregation is rule


def test_a_checkpoint_naming_an_unknown_rule_is_a_config_error() -> None:
    meta, arrays = checkpoint.snapshot(_store(1, np.zeros(3, F), MAX))
    meta["index"][0]["aggregation"] = "median"
    with pytest.raises(ConfigError, match="unknown aggregator 'median' \\(the checkpoint of key 'k'\\)"):
        checkpoint.restore(Store(1), meta, arrays, same_job=True)


def test_a_job_resumed_from_a_checkpoint_keeps_its_rule() -> None:
    meta, arrays = checkpoint.snapshot(_store(1, np.zeros(3, F), SUM))
    back = Store(1)
    checkpoint.restore(back, meta, arrays, same_job=False)
    [refused] = back.handle(0, Init("k", 0, "float32", (3,), aggregation="average", value=np.ones(3, F), id=5))
    assert isinstance(refused.answer, Failed) and "keeps the checkpoint's" in refused.answer.message
    [taken] = back.handle(0, Init("k", 0, "float32", (3,), aggregation="sum", value=np.ones(3, F), id=6))
    assert isinstance(taken.answer, Ok)


# ---------------------------------------------------------------- kv.create
def test_kv_create_takes_every_rule_and_names_the_choices_for_a_bad_one() -> None:
    kv = psnode.kv.create("local", aggregator="max")
    assert kv.aggregator == "max" and psnode.kv.AGGREGATORS == ("average", "sum", "max")
    kv.init("w", np.zeros(3, F))
    kv.push("w", np.array([1, -2, 3], F))
    assert kv.pull("w").tolist() == [1, -2, 3]
    with pytest.raises(ConfigError, match=r"unknown aggregator 'mean' \(kv.create\(aggregator=\.\.\.\)\): use one of"):
        psnode.kv.create("local", aggregator="mean")
