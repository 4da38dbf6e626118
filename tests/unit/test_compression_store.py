"""Gradient compression around the wire, the server's store and the KVStore API (no processes).

* the push and pushpull ops carry the compression tag, validated on decode;
* :class:`psnode.server.store.Store` decodes compressed pushes (keys, buckets), refuses payloads
  of the wrong size, keys that are not dense float32, and a worker whose settings differ from
  another worker's, naming it and both settings;
* ``kv.set_gradient_compression`` on a ``'local'`` store: MXNet's rules, the same arithmetic as a
  one-worker job (values over rounds with the residual carried), clear errors.
"""
from __future__ import annotations

import numpy as np
import pytest

import psnode
from psnode.errors import ConfigError, ProtocolError
from psnode.math.compression import CompressionSpec
from psnode.protocol import (
    Command,
    Failed,
    Init,
    Message,
    Ok,
    Pull,
    Push,
    PushPull,
    SetOptimizer,
    decode,
    encode,
    resent,
)
from psnode.server.store import Store

F = np.float32
TWO = CompressionSpec.from_params({"type": "2bit", "threshold": 0.5})
FP16 = CompressionSpec.from_params({"type": "fp16"})


def _wire(ops: list) -> list:
    msg = Message(Command.DATA, "j", "", ops=ops)
    frames = [f if isinstance(f, bytes) else bytes(memoryview(f)) for f in encode(msg)]
    return decode(frames, "j", 1 << 30).ops


# ---------------------------------------------------------------- wire
def test_compressed_push_and_pushpull_round_trip_with_their_tag() -> None:
    payload = TWO.compress(np.ones(40, F), TWO.new_residual(40))
    half = FP16.compress(np.ones(7, F), None)
    ops = [Push("w", 1, 3, payload, comp=TWO.tag), PushPull(9, 0, 2, half, comp=FP16.tag),
           Push("p", 0, 1, np.ones(3, F))]
    got = _wire(ops)
    assert [(type(o).__name__, o.comp) for o in got] == [("Push", "2bit:0.5"), ("PushPull", "fp16"), ("Push", "")]
    assert np.array_equal(got[0].data, payload) and got[0].data.dtype == np.uint8
    assert np.array_equal(got[1].data, half) and got[1].data.dtype == np.float16
    assert resent(ops[0]).comp == "2bit:0.5"            # a resend is the same payload, same tag


@pytest.mark.parametrize("tag,data,reason", [
    ("3bit", np.zeros(4, np.uint8), "is '3bit'; accepted"),
    ("2bit:0.50", np.zeros(4, np.uint8), "the exact form is '2bit:0.5'"),
    ("none", np.zeros(4, F), "an uncompressed push has none"),
    (7, np.zeros(4, np.uint8), "bad compression tag"),
    ("2bit:0.5", np.zeros(4, F), "a 2bit:0.5 payload is 1-d uint8, not float32[4]"),
    ("fp16", np.zeros((2, 2), np.float16), "payload is 1-d float16"),
])
def test_bad_compression_fields_are_protocol_errors(tag, data, reason) -> None:
    op = Push("w", 0, 1, data)
    op.comp = tag
    with pytest.raises(ProtocolError, match=reason.replace("[", r"\[").replace("(", r"\(")):
        _wire([op])


# ---------------------------------------------------------------- server store
def _store(workers: int = 2, shape=(40,), dtype=F, sparse: bool = False) -> Store:
    store = Store(workers)
    for w in range(workers):
        value = np.zeros(shape, dtype) if w == 0 else None
        store.handle(w, Init("w", 0, np.dtype(dtype).name, shape, sparse=sparse, value=value))
    return store


def _failed(replies) -> Failed:
    fails = [r.answer for r in replies if isinstance(r.answer, Failed)]
    assert len(fails) == 1, replies
    return fails[0]


def test_store_decodes_compressed_pushes_of_a_round() -> None:
    store = _store()
    grads = [np.linspace(-1, 1, 40, dtype=F), np.full(40, 0.75, F)]
    res = [TWO.new_residual(40) for _ in grads]
    want = (TWO.roundtrip(grads[0], TWO.new_residual(40)) + TWO.roundtrip(grads[1], TWO.new_residual(40))) / F(2)
    for w in (0, 1):
        assert store.handle(w, Push("w", 0, 1, TWO.compress(grads[w], res[w]), comp=TWO.tag)) == []
    [reply] = store.handle(0, Pull("w", 0, 1))
    assert isinstance(reply.answer, Ok) and np.array_equal(reply.answer.arrays[0], want)


@pytest.mark.parametrize("optimizer", [None, {"name": "sgd", "learning_rate": 0.5, "momentum": 0.5}])
@pytest.mark.parametrize("average", [True, False])
@pytest.mark.parametrize("check_finite", [False, True])
def test_store_rounds_with_early_pushes_equal_decoding_first(optimizer, average: bool, check_finite: bool) -> None:
    """A worker two rounds ahead (its pushes wait, compressed, for their rounds): every round's
    value is that of decoding each push and summing float32 (exactly), with and without an
    optimizer, average or sum, and with the non-finite check (which decodes at once)."""
    store, ref = Store(2, check_finite=check_finite), Store(2, check_finite=check_finite)
    for s_ in (store, ref):
        if optimizer:
            s_.handle(0, SetOptimizer(optimizer))
        for w in (0, 1):
            value = np.zeros((3, 33), F) if w == 0 else None
            s_.handle(w, Init("w", 0, "float32", (3, 33), aggregation="average" if average else "sum", value=value))
    rng = np.random.default_rng(3)
    grads = {(w, q): rng.standard_normal((3, 33)).astype(F) for w in (0, 1) for q in (1, 2, 3)}
    res, res_ref = [TWO.new_residual(99) for _ in range(2)], [TWO.new_residual(99) for _ in range(2)]
    order = [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3)]    # worker 0 runs ahead
    for w, q in order:
        store.handle(w, Push("w", 0, q, TWO.compress(grads[w, q], res[w]), comp=TWO.tag))
        ref.handle(w, Push("w", 0, q, TWO.roundtrip(grads[w, q], res_ref[w])))
    [got] = store.handle(1, Pull("w", 0, 3))
    [want] = ref.handle(1, Pull("w", 0, 3))
    assert np.array_equal(got.answer.arrays[0], want.answer.arrays[0])
    assert store.rounds == ref.rounds == 3


def test_store_one_worker_rounds_take_the_decoded_push() -> None:
    """Residual 0.3, 0.6 -> 0.5 sent (0.1 left), 0.4: the rounds' values are 0, 0.5, 0."""
    store = _store(workers=1)
    res = TWO.new_residual(40)
    for q, sent in ((1, 0.0), (2, 0.5), (3, 0.0)):
        store.handle(0, Push("w", 0, q, TWO.compress(np.full(40, 0.3, F), res), comp=TWO.tag))
        [reply] = store.handle(0, Pull("w", 0, q))
        assert np.array_equal(reply.answer.arrays[0], np.full(40, sent, F))


def test_store_refuses_a_worker_whose_settings_differ_naming_both() -> None:
    store = _store()
    store.handle(0, Push("w", 0, 1, np.ones(40, F)))
    fail = _failed(store.handle(1, Push("w", 0, 1, TWO.compress(np.ones(40, F), TWO.new_residual(40)), comp=TWO.tag)))
    assert fail.kind == "ConfigError" and fail.na
    assert fail.message.startswith("worker 1 pushes with gradient compression {'type': '2bit', 'threshold': 0.5}, "
                                   "but worker 0 pushes with none (uncompressed float32)")
    # the refused push was not taken: worker 1 pushing as worker 0 does completes the round
    assert store.handle(1, Push("w", 0, 1, np.full(40, 3, F))) == []
    [reply] = store.handle(1, Pull("w", 0, 1))
    assert np.array_equal(reply.answer.arrays[0], np.full(40, 2, F))


def test_store_refuses_other_thresholds_too() -> None:
    store = _store()
    other = CompressionSpec.from_params({"type": "2bit", "threshold": 0.25})
    store.handle(0, Push("w", 0, 1, TWO.compress(np.ones(40, F), TWO.new_residual(40)), comp=TWO.tag))
    fail = _failed(store.handle(1, PushPull("w", 0, 1, other.compress(np.ones(40, F), other.new_residual(40)),
                                            comp=other.tag)))
    assert "worker 1 pushes with gradient compression {'type': '2bit', 'threshold': 0.25}, but worker 0 " \
           "pushes with {'type': '2bit', 'threshold': 0.5}" in fail.message and not fail.na


@pytest.mark.parametrize("store,payload,kind,reason", [
    (lambda: _store(), np.zeros(8, np.uint8), "ShapeMismatch", "its 2bit payload is uint8[12], the push sent [8]"),
    (lambda: _store(dtype=np.float64), np.zeros(12, np.uint8), "ConfigError", "holds float64"),
    (lambda: _store(shape=(10, 4), sparse=True), np.zeros(12, np.uint8), "ConfigError", "is row_sparse"),
])
def test_store_refuses_payloads_it_cannot_decode(store, payload, kind, reason) -> None:
    fail = _failed(store().handle(0, Push("w", 0, 1, payload, comp=TWO.tag)))
    assert fail.kind == kind and reason in fail.message, fail.message


def test_bucket_pushes_are_decoded_whole() -> None:
    store = Store(1)
    for i, n in enumerate((5, 21)):     # two members, the second at offset 5 (not a word boundary)
        store.handle(0, Init(f"k{i}", 0, "float32", (n,), value=np.zeros(n, F), bucket=0, offset=5 * i))
    grad = np.arange(26, dtype=F) / 16 - 0.7
    res = TWO.new_residual(26)
    want = TWO.roundtrip(grad, TWO.new_residual(26))
    store.handle(0, Push("\0bucket0", 0, 1, TWO.compress(grad, res), comp=TWO.tag))
    [reply] = store.handle(0, Pull("\0bucket0", 0, 1))
    assert np.array_equal(reply.answer.arrays[0], want)


# ---------------------------------------------------------------- the API on a 'local' store
def test_local_store_runs_a_one_worker_jobs_arithmetic() -> None:
    """Values over rounds equal the closed form: each round's value is what the server decodes
    from the push, with this worker's residual carried from round to round."""
    kv = psnode.kv.create("local")
    kv.init(["a", "b"], [np.zeros(10, F), np.zeros((3, 50), F)])     # keys initialised before: allowed
    kv.set_gradient_compression({"type": "2bit", "threshold": "0.25"})  # numeric strings, as MXNet takes
    assert kv.gradient_compression == {"type": "2bit", "threshold": 0.25}
    spec = CompressionSpec.from_params(kv.gradient_compression)
    res = {"a": spec.new_residual(10), "b": spec.new_residual(150)}
    rng = np.random.default_rng(5)
    for _ in range(5):
        grads = {"a": rng.standard_normal(10).astype(F) / 4, "b": rng.standard_normal((3, 50)).astype(F) / 4}
        kv.push(["a", "b"], [grads["a"], grads["b"]])
        for k in ("a", "b"):
            assert np.array_equal(kv.pull(k), spec.roundtrip(grads[k], res[k]))


def test_local_list_of_values_is_compressed_per_device_then_summed() -> None:
    """MXNet's 'local'/'device' rule: each array of the list (one per device) is compressed with
    its own residual, decoded, then the decoded arrays are summed."""
    kv = psnode.kv.create("local")
    kv.init("a", np.zeros(4, F))
    kv.set_gradient_compression({"type": "2bit", "threshold": 0.5})
    kv.push("a", [np.full(4, 0.3, F), np.full(4, 0.3, F)])   # each device: 0.3 < 0.5, nothing sent
    assert np.array_equal(kv.pull("a"), np.zeros(4, F))       # (the sum 0.6 would have sent 0.5)
    kv.push("a", [np.full(4, 0.3, F), np.full(4, 0.1, F)])   # device 0: 0.6 -> 0.5; device 1: 0.4 -> 0
    assert np.array_equal(kv.pull("a"), np.full(4, 0.5, F))
    kv.push("a", np.full(4, 0.0, F))                          # one array: device 0's residual 0.1
    assert np.array_equal(kv.pull("a"), np.zeros(4, F))
    kv.push("a", [np.full(4, 0.4, F), np.full(4, 0.1, F)])   # 0.1 + 0.4 = 0.5 -> 0.5; 0.4 + 0.1 -> 0.5
    assert np.array_equal(kv.pull("a"), np.full(4, 1.0, F))
    kv.set_updater(lambda key, recv, stored: np.add(stored, recv, out=stored))
    got = kv.pushpull("a", [np.full(4, 0.5, F)] * 3)           # residuals 0, 0, 0 (device 2 new)
    assert np.array_equal(got[0], np.full(4, 2.5, F)) and all(g is not None for g in got)


def test_set_gradient_compression_rules() -> None:
    kv = psnode.kv.create("local")
    for bad, reason in ((["2bit"], "expects a dict"), ({"threshold": 1}, "no 'type' field"),
                        ({"type": "3bit"}, "accepted: 'none', '1bit', '2bit', 'fp16'"),
                        ({"type": "2bit", "treshold": 1}, "unknown field 'treshold'"),
                        ({"type": "2bit", "threshold": 0}, "greater than 0")):
        with pytest.raises(ConfigError, match=reason):
            kv.set_gradient_compression(bad)
    kv.init(["d", "s", "f64"], [np.zeros(3, F), np.zeros((4, 2), F), np.zeros(2)], stype=None)
    kv.init("rs", np.zeros((4, 2), F), stype="row_sparse")
    kv.set_gradient_compression({"type": "1bit"})
    kv.set_gradient_compression({"type": "2bit"})      # again before a push: the last one counts
    assert kv.gradient_compression == {"type": "2bit", "threshold": 0.5}
    with pytest.raises(ConfigError, match="key 'rs' is row_sparse: gradient compression"):
        kv.push("rs", np.ones((4, 2), F))
    with pytest.raises(ConfigError, match="key 'f64' holds float64"):
        kv.push(["d", "f64"], [np.ones(3, F), np.ones(2)])   # nothing of the call is sent
    with pytest.raises(ConfigError, match="key 'rs' is row_sparse"):
        kv.pushpull("rs", np.ones((4, 2), F))
    kv.push("d", np.ones(3, F))
    assert np.array_equal(kv.pull("d"), np.full(3, 0.5, F))
    with pytest.raises(ConfigError, match="before the first push"):
        kv.set_gradient_compression({"type": "fp16"})


def test_none_turns_compression_off() -> None:
    kv = psnode.kv.create("local")
    kv.init("a", np.zeros(3, F))
    kv.set_gradient_compression({"type": "2bit"})
    kv.set_gradient_compression({"type": "none"})
    assert kv.gradient_compression == {"type": "none"}
    kv.push("a", np.full(3, 0.3, F))
    assert np.array_equal(kv.pull("a"), np.full(3, 0.3, F))
