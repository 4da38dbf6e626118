"""Pure core modules: env contract, wire format, placement, aggregation rounds."""
from __future__ import annotations

import json

import numpy as np
import pytest

from psnode.config import Distribution, NodeConfig, Role
from psnode.errors import KINDS, ConfigError, ProtocolError
from psnode.math import optimizers as optimizer
from psnode.protocol import VERSION, Command, Failed, Init, Message, Ok, Pull, Push, SetOptimizer, decode, encode
from psnode.server.store import Store
from psnode.worker.placement import Placer, split_ranges


# ------------------------------------------------------------------ config
def test_env_round_trip() -> None:
    cfg = NodeConfig(role=Role.SERVER, scheduler_host="10.0.0.1", scheduler_port=9000,
                     num_workers=4, num_servers=2, job_id="job-1", host="10.0.0.2", rank=1,
                     distribution=Distribution.DATA, resume=True, heartbeat_interval=0.5)
    env = cfg.to_env()
    assert env["PSNODE_SCHEDULER"] == "10.0.0.1:9000" and env["PSNODE_ROLE"] == "server"
    assert NodeConfig.from_env(env) == cfg


@pytest.mark.parametrize("var,value,words", [
    ("PSNODE_ROLE", "boss", ["PSNODE_ROLE", "'boss'", "scheduler, server, worker"]),
    ("PSNODE_NUM_WORKERS", "two", ["PSNODE_NUM_WORKERS", "'two'"]),
    ("PSNODE_NUM_WORKERS", "0", ["PSNODE_NUM_WORKERS", ">= 1"]),
    ("PSNODE_SCHEDULER", "nohost", ["PSNODE_SCHEDULER", "host:port"]),
    ("PSNODE_SCHEDULER", "a:99999", ["99999"]),
    ("PSNODE_HOST", "0.0.0.0", ["wildcard"]),
    ("PSNODE_HOST", "h;touch /tmp/x", ["not a valid host"]),
    ("PSNODE_JOB_ID", "a b", ["PSNODE_JOB_ID"]),
    ("PSNODE_HEARTBEAT_INTERVAL", "nan", ["PSNODE_HEARTBEAT_INTERVAL"]),
    ("PSNODE_CPU_POLICY", "fast", ["PSNODE_CPU_POLICY='fast'", "batch, normal"]),
])
def test_env_errors_name_variable_and_value(var: str, value: str, words: list[str]) -> None:
    env = {"PSNODE_ROLE": "worker", "PSNODE_SCHEDULER": "127.0.0.1:9000", "PSNODE_NUM_WORKERS": "2",
           "PSNODE_NUM_SERVERS": "1", "PSNODE_JOB_ID": "j"}
    env[var] = value
    with pytest.raises(ConfigError) as err:
        NodeConfig.from_env(env)
    for w in words:
        assert w in str(err.value)


# ------------------------------------------------------------------ protocol
def _frames(msg: Message) -> list[bytes]:
    return [bytes(memoryview(f)) if not isinstance(f, bytes) else f for f in encode(msg)]


def test_wire_round_trip_arrays_and_zero_d() -> None:
    arrays = [np.arange(12, dtype=np.float32).reshape(3, 4), np.array(7, np.int64),
              np.zeros((0, 5), np.float64), np.arange(10, dtype=np.int32)[::2],
              np.arange(40000, dtype=np.float32), np.ones(3, np.uint8)]
    msg = Message(Command.DATA, "j", "worker:0", {"ops": [{"id": 1}]}, arrays)
    frames = _frames(msg)
    assert len(frames) == 4          # the big array alone, the five small ones packed
    got = decode(frames, "j", 2**20)
    assert got.cmd is Command.DATA and got.body == {"ops": [{"id": 1}]}
    for a, b in zip(arrays, got.arrays):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


def _header(**kw) -> bytes:
    h = {"c": "data", "j": "j", "s": "x", "b": {}, "a": []}
    h.update(kw)
    return json.dumps(h).encode()


@pytest.mark.parametrize("frames,reason", [
    ([b"PSN9", _header()], "version"),
    ([VERSION], "frame"),
    ([VERSION, b"\xff\xfe garbage"], "JSON"),
    ([VERSION, b"[1, 2]"], "object"),
    ([VERSION, _header(c="rm -rf")], "unknown command"),
    ([VERSION, _header(j="other-job")], "other-job"),
    ([VERSION, _header(a=[["float32", [4], 0, 0]]), b"\x00" * 8], "does not fit"),
    ([VERSION, _header(a=[["float32", [2], 0, 4]]), b"\x00" * 8], "does not fit"),
    ([VERSION, _header(a=[["object", [1], 0, 0]]), b"\x00" * 8], "not allowed"),
    ([VERSION, _header(a=[["float32", [-1], 0, 0]]), b""], "shape"),
    ([VERSION, _header(a=[["float32", [2**20, 2**20], 0, 0]]), b""], "exceeds"),
    ([VERSION, _header(a=[["float32", [1], 0, 0]])], "does not exist"),
    ([VERSION, _header(a=[["float32", [1]]]), b"\x00" * 4], "description"),
    ([VERSION, _header(a=[]), b"\x00" * 4], "referenced"),
])
def test_bad_frames_are_rejected_with_a_reason(frames: list[bytes], reason: str) -> None:
    with pytest.raises(ProtocolError, match=reason):
        decode(frames, "j", 2**30)


# ------------------------------------------------------------------ sharding
def test_split_ranges_cover_and_balance() -> None:
    for n in (0, 1, 7, 100, 101):
        for k in (1, 2, 3, 7):
            r = split_ranges(n, k)
            assert r[0][0] == 0 and r[-1][1] == n and all(a[1] == b[0] for a, b in zip(r, r[1:]))
            sizes = [hi - lo for lo, hi in r]
            assert max(sizes) - min(sizes) <= 1


def test_placement_balances_bytes_and_splits_big_keys() -> None:
    p = Placer(3, bound=1000)
    big = p.place("big", (5000,), 4)
    assert [(x.server, x.lo, x.hi) for x in big.parts] == [(0, 0, 1667), (1, 1667, 3334), (2, 3334, 5000)]
    small = Placer(3, bound=1000)
    sizes = [900, 10, 10, 500, 400, 5]
    servers = [small.place(f"k{i}", (n,), 4).parts[0].server for i, n in enumerate(sizes)]
    assert servers == [0, 1, 2, 1, 2, 2]        # each to the least loaded server (ties: lowest)
    assert small.load == [3600, 2040, 1660]
    assert small.place("k0", (900,), 4) is small.placed["k0"]  # stable
    rows = p.place("emb", (10, 200), 4, by_rows=True)
    assert rows.by_rows and [(x.lo, x.hi) for x in rows.parts] == [(0, 4), (4, 7), (7, 10)]
    assert not Placer(3, bound=None).place("big", (10**7,), 4).split


def test_slice_bytes_deals_parts_of_a_big_key_round_robin() -> None:
    p = Placer(3, bound=1000, slice_bytes=4000)   # parts of at most 1000 float32
    big = p.place("big", (5000,), 4)              # 6 parts (the least multiple of 3 with <= 1000 each)
    assert [(x.server, x.index, x.lo, x.hi) for x in big.parts] == [
        (0, 0, 0, 834), (1, 1, 834, 1668), (2, 2, 1668, 2501), (0, 3, 2501, 3334), (1, 4, 3334, 4167),
        (2, 5, 4167, 5000)]
    assert p.load == [1667 * 4, 1667 * 4, 1666 * 4]
    assert len(p.place("fits", (2400,), 4).parts) == 3          # 800 each: one part per server
    assert len(p.place("emb", (4000, 2), 4, by_rows=True).parts) == 3   # rows: one part per server
    assert not p.place("small", (1000,), 4).split


# ------------------------------------------------------------------ aggregation
def _push(store: Store, w: int, key, seq: int, value, rows=None):
    rows = None if rows is None else np.asarray(rows, np.int64)
    return store.handle(w, Push(key, 0, seq, np.asarray(value), rows, id=seq * 10 + w, na=False))


def _pull(store: Store, w: int, key, after: int, rows=None):
    rows = None if rows is None else np.asarray(rows, np.int64)
    return store.handle(w, Pull(key, 0, after, rows, id=1000 + w))


def _init(store: Store, key, value, sparse=False, sync=True, agg="average"):
    v = np.asarray(value)
    return store.handle(0, Init(key, 0, v.dtype.name, v.shape, sync, agg, sparse, v))


def test_sync_round_parks_pulls_and_early_pushes() -> None:
    s = Store(2)
    _init(s, "k", np.zeros(2, np.float32))
    _push(s, 0, "k", 1, np.full(2, 1, np.float32))
    assert _pull(s, 0, "k", 1) == []                       # parked: round 1 incomplete
    _push(s, 0, "k", 2, np.full(2, 100, np.float32))       # early: round 2
    out = _push(s, 1, "k", 1, np.full(2, 3, np.float32))   # completes round 1
    pulls = [r for r in out if r.answer.arrays]
    assert len(pulls) == 1 and pulls[0].worker == 0 and np.array_equal(pulls[0].answer.arrays[0], [2, 2])
    dup = _push(s, 1, "k", 1, np.full(2, 1000, np.float32))  # duplicate: acked, not applied
    assert [r.answer for r in dup] == [Ok(11, seq=1)]    # seq: its pushes received without a gap
    out = _push(s, 1, "k", 2, np.full(2, 200, np.float32))
    assert s.entries[("k", 0)].round == 2 and np.array_equal(s.entries[("k", 0)].value, [150, 150])


def test_leaving_worker_completes_the_round_over_the_rest() -> None:
    s = Store(3, )
    _init(s, 1, np.zeros(1, np.float32), agg="sum")
    _push(s, 0, 1, 1, np.ones(1, np.float32))
    _push(s, 2, 1, 1, np.full(1, 5, np.float32))
    s.set_active({0, 2})
    assert s.entries[(1, 0)].round == 1 and s.entries[(1, 0)].value[0] == 6


def test_row_sparse_rounds_combine_rows_exactly() -> None:
    s = Store(2)
    _init(s, "e", np.zeros((5, 2), np.float32), sparse=True)
    _push(s, 0, "e", 1, np.array([[1, 1], [2, 2]], np.float32), rows=[3, 0])
    _push(s, 1, "e", 1, np.array([[4, 4], [6, 6], [8, 8]], np.float32), rows=[3, 3, 1])
    value = s.entries[("e", 0)].value
    assert np.array_equal(value, np.array([[1, 1], [4, 4], [0, 0], [(1 + 10) / 2] * 2, [0, 0]], np.float32))
    (reply,) = _pull(s, 1, "e", 1, rows=[1, 3])
    assert np.array_equal(reply.answer.arrays[0], [[4, 4], [5.5, 5.5]])
    _push(s, 0, "e", 2, np.zeros((0, 2), np.float32), rows=[])  # touched no rows: no stall
    _push(s, 1, "e", 2, np.ones((1, 2), np.float32), rows=[4])
    assert s.entries[("e", 0)].round == 2 and np.array_equal(value[4], [0.5, 0.5])


def test_row_sparse_sgd_equals_dense_sgd_on_densified_gradients() -> None:
    rng = np.random.default_rng(0)
    table = rng.standard_normal((50, 4)).astype(np.float32)
    grads = [(rng.choice(50, 7, replace=False), rng.standard_normal((7, 4)).astype(np.float32)) for _ in range(2)]
    sparse, dense = Store(2), Store(2)
    for st in (sparse, dense):
        st.handle(0, SetOptimizer(optimizer.create("sgd", learning_rate=0.5).to_spec()))
    _init(sparse, "t", table.copy(), sparse=True)
    _init(dense, "t", table.copy())
    for w, (rows, g) in enumerate(grads):
        _push(sparse, w, "t", 1, g, rows=rows)
        full = np.zeros_like(table)
        full[rows] = g
        _push(dense, w, "t", 1, full)
    assert np.array_equal(sparse.entries[("t", 0)].value, dense.entries[("t", 0)].value)


def test_bad_operations_are_answered_not_raised() -> None:
    """Operations that decode well but do not fit the store (structural faults are the
    decoder's: tests/unit/test_protocol_ops.py) are answered Failed, never raised."""
    s = Store(1)
    _init(s, "k", np.zeros(3, np.float32))
    f32 = np.zeros(3, np.float32)
    for op in [object(), Push("k", 0, 1, np.zeros(5, np.float32), id=2),
               Push("k", 0, 1, np.zeros(3, np.float64), id=3), Pull("missing", 0, 0, id=4),
               Push("k", 0, 1, f32.reshape(3, 1), id=5), SetOptimizer({"name": "pickle"}, id=6),
               Pull("k", 0, 0, np.array([7]), id=7), Push("k", 3, 1, f32, id=8),
               Push("k", 0, 1, f32, np.array([0, 1, 2]), id=9),
               Init("k", 0, "float32", (4,), id=10), Init("new", 0, "float32", (3,), value=f32[:2], id=11)]:
        (reply,) = s.handle(0, op)
        assert isinstance(reply.answer, Failed) and reply.answer.id == getattr(op, "id", 0), reply
        assert reply.answer.message and reply.answer.kind in KINDS, reply
    assert s.entries[("k", 0)].round == 0


def test_integer_keys_live_beside_an_optimizer() -> None:
    import psnode

    kv = psnode.kv.create("local")
    kv.set_optimizer(psnode.optimizer.create("sgd", learning_rate=0.5))
    kv.init("steps", np.zeros((), np.int64))
    kv.init("w", np.ones(2, np.float32))
    kv.push(["steps", "w"], [np.array(7, np.int64), np.ones(2, np.float32)])
    assert kv.pull("steps") == 7                       # not an optimizer's business
    assert np.array_equal(kv.pull("w"), [0.5, 0.5])


def test_values_referenced_by_unsent_replies_are_never_overwritten() -> None:
    s = Store(1)
    _init(s, "k", np.zeros(100_000, np.float32))
    _push(s, 0, "k", 1, np.ones(100_000, np.float32))
    (reply,) = _pull(s, 0, "k", 1)                     # not sent yet
    _push(s, 0, "k", 2, np.full(100_000, 2, np.float32))
    assert (reply.answer.arrays[0] == 1).all()         # still round 1's value
    assert (s.entries[("k", 0)].value == 2).all()
