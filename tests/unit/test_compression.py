"""psnode.math.compression: MXNet's gradient compression rules, checked three ways.

* against a straightforward reference: MXNet's kernels (``gradient_compression-inl.h``)
  transcribed element by element into Python over float32 scalars, bit for bit (payload bytes
  and residual bits), over several rounds, for sizes that end mid-byte, mid-word and mid-chunk,
  with threshold hits, NaN, infinities, -0.0 and subnormals;
* against closed forms computed by hand, over several rounds with the residual carried;
* the spec's validation, its JSON wire form, the split-key contract and the wire sizes.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from psnode.errors import ConfigError, ProtocolError, ShapeMismatch
from psnode.math.compression import CHUNK, DEFAULT_THRESHOLD, CompressionSpec, CompressionType, Residual
from psnode.protocol import parse_tag

# infinities and NaN in the gradients are part of the contract: no warnings about them
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                                        "ignore:invalid value encountered:RuntimeWarning")

F32 = np.float32
TWO = CompressionSpec.from_params({"type": "2bit", "threshold": 0.5})
ONE = CompressionSpec.from_params({"type": "1bit", "threshold": 0.5})
FP16 = CompressionSpec.from_params({"type": "fp16"})
NONE = CompressionSpec.from_params({"type": "none"})


# ------------------------------------------------------------------ the reference (MXNet's kernels)

def ref_quantize_2bit(grad: np.ndarray, residual: np.ndarray, threshold: float) -> np.ndarray:
    """quantize_2bit::Map for every output byte, as MXNet writes it."""
    n = grad.size
    pos_t, neg_t = F32(threshold), F32(-1) * F32(threshold)
    posbits, negbits = (0xC0, 0x30, 0x0C, 0x03), (0x80, 0x20, 0x08, 0x02)
    out = bytearray(4 * math.ceil(n / 16))
    for byte_id in range(len(out)):
        start = byte_id << 2
        end = min(start + 4, n)
        for i in range(start, end):
            residual[i] = residual[i] + grad[i]
            if residual[i] >= pos_t:
                out[byte_id] |= posbits[i & 3]
                residual[i] = residual[i] - pos_t
            elif residual[i] <= neg_t:
                out[byte_id] |= negbits[i & 3]
                residual[i] = residual[i] - neg_t
    return np.frombuffer(bytes(out), np.uint8)


def ref_dequantize_2bit(packed: np.ndarray, n: int, threshold: float) -> np.ndarray:
    posbits, negbits = (0xC0, 0x30, 0x0C, 0x03), (0x80, 0x20, 0x08, 0x02)
    out = np.empty(n, F32)
    for i in range(n):
        byte = int(packed[(i >> 4) * 4 + ((i & 15) >> 2)])
        col = i & 3
        masked = byte & posbits[col]
        out[i] = F32(threshold) if masked == posbits[col] else (
            F32(-1) * F32(threshold) if masked == negbits[col] else F32(0))
    return out


def ref_quantize_1bit(grad: np.ndarray, residual: np.ndarray, threshold: float) -> np.ndarray:
    """quantize_1bit::Map for every output byte, as MXNet writes it."""
    n = grad.size
    t = F32(threshold)
    bits = (0x80, 0x40, 0x20, 0x10, 0x08, 0x04, 0x02, 0x01)
    out = bytearray(4 * math.ceil(n / 32))
    for byte_id in range(len(out)):
        start = byte_id << 3
        end = min(start + 8, n)
        for i in range(start, end):
            residual[i] = residual[i] + grad[i]
            if residual[i] > t:
                out[byte_id] |= bits[i & 7]
                residual[i] = residual[i] - F32(1)
            else:
                residual[i] = residual[i] + F32(1)
    return np.frombuffer(bytes(out), np.uint8)


def ref_dequantize_1bit(packed: np.ndarray, n: int) -> np.ndarray:
    bits = (0x80, 0x40, 0x20, 0x10, 0x08, 0x04, 0x02, 0x01)
    out = np.empty(n, F32)
    for i in range(n):
        byte = int(packed[(i >> 5) * 4 + ((i & 31) >> 3)])
        out[i] = F32(1) if byte & bits[i & 7] == bits[i & 7] else F32(-1)
    return out


def nasty(rng: np.random.Generator, n: int, t: float) -> np.ndarray:
    """Gradients with threshold hits, near misses, NaN, infinities, -0.0 and subnormals."""
    pool = np.array([t, -t, np.nextafter(F32(t), F32(0)), np.nextafter(F32(-t), F32(0)), 0.0, -0.0,
                     np.nan, np.inf, -np.inf, 1e-45, -1e-45, 3e38, 2 * t, t / 2], F32)
    g = (rng.standard_normal(n) * t).astype(F32)
    mask = rng.random(n) < 0.3
    g[mask] = rng.choice(pool, int(mask.sum()))
    return g


def bits_of(a: np.ndarray) -> np.ndarray:
    """The float32 bits, every NaN as one pattern: which NaN an operation on two NaNs returns
    (its sign and payload) is left open by IEEE 754 and differs between numpy's SIMD loops and
    CPUs; every other value is compared bit for bit."""
    bits = np.ascontiguousarray(a, F32).view(np.uint32).copy()
    bits[np.isnan(np.asarray(a, F32).reshape(bits.shape))] = 0x7FC00000
    return bits


SIZES = [0, 1, 3, 4, 5, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 257, 1000]


# ------------------------------------------------------------------ bit-exact against the reference

@pytest.mark.parametrize("threshold", [0.5, 0.1, 2.0])
def test_2bit_matches_mxnet_reference_bit_for_bit_over_rounds(threshold: float) -> None:
    rng = np.random.default_rng(17)
    spec = CompressionSpec.from_params({"type": "2bit", "threshold": threshold})
    for n in SIZES:
        mine, ref = spec.new_residual(n), np.zeros(n, F32)
        assert mine is not None
        for _ in range(4):
            g = nasty(rng, n, threshold)
            g_before = g.copy()
            packed = spec.compress(g, mine)
            expect = ref_quantize_2bit(g, ref, threshold)
            assert packed.dtype == np.uint8 and packed.tobytes() == expect.tobytes(), n
            assert np.array_equal(bits_of(mine.data), bits_of(ref)), n
            assert np.array_equal(bits_of(g), bits_of(g_before))           # the gradient is not touched
            assert np.array_equal(bits_of(spec.decompress(packed, n)),
                                  bits_of(ref_dequantize_2bit(expect, n, threshold)))


@pytest.mark.parametrize("threshold", [0.5, 0.0, -0.25])
def test_1bit_matches_mxnet_reference_bit_for_bit_over_rounds(threshold: float) -> None:
    rng = np.random.default_rng(18)
    spec = CompressionSpec.from_params({"type": "1bit", "threshold": threshold})
    for n in SIZES:
        mine, ref = spec.new_residual(n), np.zeros(n, F32)
        assert mine is not None
        for _ in range(4):
            g = nasty(rng, n, abs(threshold) or 0.5)
            packed = spec.compress(g, mine)
            expect = ref_quantize_1bit(g, ref, threshold)
            assert packed.tobytes() == expect.tobytes(), n
            assert np.array_equal(bits_of(mine.data), bits_of(ref)), n
            assert np.array_equal(spec.decompress(packed, n), ref_dequantize_1bit(expect, n))


def test_decoding_any_bytes_matches_the_reference() -> None:
    """Every bit pattern decodes as MXNet's dequantize does (``01`` is 0 in 2bit)."""
    rng = np.random.default_rng(3)
    for n in (1, 7, 16, 33, 250):
        for spec in (TWO, ONE):
            packed = rng.integers(0, 256, spec.packed_size(n), dtype=np.uint8)
            ref = (ref_dequantize_2bit(packed, n, spec.threshold) if spec is TWO
                   else ref_dequantize_1bit(packed, n))
            assert np.array_equal(spec.decompress(packed, n), ref)
            acc = np.arange(n, dtype=F32)
            spec.accumulate(acc, packed)
            assert np.array_equal(acc, np.arange(n, dtype=F32) + ref)


def test_many_chunks_match_a_whole_array_reference() -> None:
    """Sizes over several internal chunks, against an unchunked numpy transcription."""
    rng = np.random.default_rng(5)
    n = 2 * CHUNK + 37
    t = F32(0.5)
    res2, res1 = np.zeros(n, F32), np.zeros(n, F32)
    mine2, mine1 = TWO.new_residual(n), ONE.new_residual(n)
    assert mine2 is not None and mine1 is not None
    for _ in range(3):
        g = nasty(rng, n, 0.5)
        res2 += g
        pos, neg = res2 >= t, res2 <= -t
        res2[pos] -= t
        res2[neg] -= -t
        codes = np.where(pos, 3, np.where(neg, 2, 0)).astype(np.uint8)
        codes = np.concatenate([codes, np.zeros(-n % 16, np.uint8)]).reshape(-1, 4)
        expect2 = (codes[:, 0] << 6) | (codes[:, 1] << 4) | (codes[:, 2] << 2) | codes[:, 3]
        assert TWO.compress(g, mine2).tobytes() == expect2.astype(np.uint8).tobytes()
        assert np.array_equal(bits_of(mine2.data), bits_of(res2))
        res1 += g
        up = res1 > t
        res1[up] -= F32(1)
        res1[~up] += F32(1)
        expect1 = np.packbits(np.concatenate([up, np.zeros(-n % 32, bool)]))
        assert ONE.compress(g, mine1).tobytes() == expect1.tobytes()
        assert np.array_equal(bits_of(mine1.data), bits_of(res1))


# ------------------------------------------------------------------ hand-computed closed forms

def test_2bit_closed_form_three_rounds_residual_carried() -> None:
    g = np.array([0.25, -0.25, 0.75, -1.25, 0.5, -0.5, 0.0, 2.0], F32)
    res = TWO.new_residual(g.size)
    assert res is not None
    rounds = [  # (values sent, residual after)
        ([0, 0, .5, -.5, .5, -.5, 0, .5], [.25, -.25, .25, -.75, 0, 0, 0, 1.5]),
        ([.5, -.5, .5, -.5, .5, -.5, 0, .5], [0, 0, .5, -1.5, 0, 0, 0, 3.0]),
        ([0, 0, .5, -.5, .5, -.5, 0, .5], [.25, -.25, .75, -2.25, 0, 0, 0, 4.5]),
    ]
    total = np.zeros(g.size, F32)
    for i, (sent, after) in enumerate(rounds):
        packed = TWO.compress(g, res)
        if i == 0:   # codes 00 00 11 10 | 11 10 00 11, then the word's padding
            assert packed.tolist() == [0x0E, 0xE3, 0, 0]
        got = TWO.decompress(packed, g.size)
        assert got.tolist() == sent and res.data.tolist() == after
        total += got
    assert np.array_equal(total + res.data, 3 * g)   # error feedback: nothing is lost


def test_1bit_closed_form_three_rounds_residual_carried() -> None:
    g = np.array([0.75, 0.25, -0.5, 0.0, 2.0], F32)
    res = ONE.new_residual(g.size)
    assert res is not None
    rounds = [
        ([1, -1, -1, -1, 1], [-.25, 1.25, .5, 1, 1]),
        ([-1, 1, -1, 1, 1], [1.5, .5, 1, 0, 2]),      # 0.5 is not > 0.5: -1
        ([1, 1, -1, -1, 1], [1.25, -.25, 1.5, 1, 3]),
    ]
    for i, (sent, after) in enumerate(rounds):
        packed = ONE.compress(g, res)
        if i == 0:
            assert packed.tolist() == [0x88, 0, 0, 0]
        assert ONE.decompress(packed, g.size).tolist() == sent
        assert res.data.tolist() == after


def test_fp16_closed_form() -> None:
    g = np.array([1.0, 1 / 3, 65504, 65520, -70000, 2.0**-24, 2.0**-26, -0.0], F32)
    packed = FP16.compress(g, None)
    assert packed.dtype == np.float16
    expect = [1.0, 0.333251953125, 65504.0, math.inf, -math.inf, 2.0**-24, 0.0, -0.0]
    got = FP16.decompress(packed, g.size)
    assert got.dtype == F32 and got.tolist() == expect
    assert math.copysign(1, got[-1]) == -1
    acc = np.full(g.size, 1.0, F32)      # the server's float32 sum
    FP16.accumulate(acc, packed)
    assert acc.tolist() == [float(F32(1) + F32(v)) for v in expect]   # 1 + 2**-24 is 1 in float32


def test_two_workers_average_closed_form() -> None:
    """What a server holds after W=2 pushes per round, averaged: mean of the decoded pushes."""
    n = 3
    g = [np.array([0.25, 0.5, -1.0], F32), np.array([0.5, -0.25, 1.0], F32)]
    res = [TWO.new_residual(n) for _ in g]
    # worker 0, [.25 .5 -1]: sends [0 .5 -.5], keeps [.25 0 -.5]; sends [.5 .5 -.5], keeps [0 0 -1];
    #                        sends [0 .5 -.5]
    # worker 1, [.5 -.25 1]: sends [.5 0 .5], keeps [0 -.25 .5]; sends [.5 -.5 .5], keeps [0 0 1];
    #                        sends [.5 0 .5]
    expect = [[0.25, 0.25, 0.0], [0.5, 0.0, 0.0], [0.25, 0.25, 0.0]]
    for want in expect:
        acc = np.zeros(n, F32)
        for w in range(2):
            TWO.accumulate(acc, TWO.compress(g[w], res[w]))
        assert (acc / 2).tolist() == want


# ------------------------------------------------------------------ split keys, shapes, sizes

@pytest.mark.parametrize("spec", [TWO, ONE, FP16, NONE])
def test_split_key_parts_decode_as_the_whole(spec: CompressionSpec) -> None:
    """Parts compressed with their residual slices decode to what the whole array does."""
    rng = np.random.default_rng(9)
    n = 1000
    bounds = [(0, 333), (333, 667), (667, 1000)]   # unaligned, like sharding.split_ranges
    whole, parted = spec.new_residual(n), spec.new_residual(n)
    for _ in range(3):
        g = nasty(rng, n, 0.5)
        expect = spec.roundtrip(g, whole)
        got = np.empty(n, F32)
        sizes = []
        for lo, hi in bounds:
            part = parted.part(lo, hi) if parted is not None else None
            packed = spec.compress(g[lo:hi], part)
            assert packed.size == spec.packed_size(hi - lo)
            spec.decompress(packed, hi - lo, out=got[lo:hi])
            sizes.append(packed.nbytes)
        assert np.array_equal(bits_of(got), bits_of(expect))
        if whole is not None and parted is not None:
            assert np.array_equal(bits_of(parted.data), bits_of(whole.data))
        assert sum(sizes) == spec.push_nbytes([hi - lo for lo, hi in bounds])


def test_any_shape_is_read_in_c_order() -> None:
    g = np.arange(24, dtype=F32).reshape(2, 3, 4) / 8 - 1
    t = np.ascontiguousarray(g.transpose(2, 0, 1))   # the same values, another order
    r1, r2 = TWO.new_residual(24), TWO.new_residual(24)
    out = TWO.roundtrip(g.transpose(2, 0, 1), r1)     # non-contiguous input
    assert out.shape == (4, 2, 3)
    assert np.array_equal(out, TWO.roundtrip(t, r2))


def test_wire_sizes() -> None:
    n = 4 * 2**20   # 16 MiB of float32
    assert NONE.nbytes(n) == 16 * 2**20
    assert FP16.nbytes(n) == 8 * 2**20          # 1/2
    assert TWO.nbytes(n) == 2**20               # 1/16
    assert ONE.nbytes(n) == 2**19               # 1/32
    assert TWO.ratio(n) == 16 and FP16.ratio(n) == 2 and ONE.ratio(n) == 32
    assert [TWO.nbytes(k) for k in (0, 1, 16, 17, 32, 33)] == [0, 4, 4, 8, 8, 12]
    assert [ONE.nbytes(k) for k in (1, 32, 33)] == [4, 4, 8]
    assert TWO.push_nbytes([2**21, 2**21]) == 2**20  # a 16 MiB key split over 2 servers
    assert TWO.push_nbytes([17, 17]) == 16              # each part padded on its own
    for spec in (TWO, ONE, FP16, NONE):
        for k in (0, 1, 5, 100, CHUNK + 1):
            g = np.ones(k, F32)
            assert spec.compress(g, spec.new_residual(k)).nbytes == spec.nbytes(k)


def test_accumulate_equals_decompress_plus_add() -> None:
    rng = np.random.default_rng(11)
    for spec in (TWO, ONE, FP16, NONE):
        for n in (0, 1, 31, CHUNK, CHUNK + 77):
            g = (rng.standard_normal(n)).astype(F32)
            packed = spec.compress(g, spec.new_residual(n))
            base = rng.standard_normal(n).astype(F32)
            acc = base.copy()
            spec.accumulate(acc, packed)
            assert np.array_equal(acc, base + spec.decompress(packed, n))


# ------------------------------------------------------------------ the spec: validation and wire form

def test_spec_defaults_and_forms() -> None:
    assert CompressionSpec.from_params({"type": "2bit"}).threshold == DEFAULT_THRESHOLD == 0.5
    assert CompressionSpec.from_params({"type": "1bit"}).threshold == 0.5
    assert CompressionSpec.from_params({"type": "2bit", "threshold": "0.25"}).threshold == 0.25  # MXNet passes str
    assert CompressionSpec.from_params({"type": "2bit", "threshold": 1}).threshold == 1.0
    assert CompressionSpec.from_params({"type": "1bit", "threshold": 0}).threshold == 0.0
    assert CompressionSpec.from_params({"type": "1bit", "threshold": -1}).threshold == -1.0
    assert CompressionSpec().type is CompressionType.NONE and not CompressionSpec().active
    assert TWO.active and FP16.active and not NONE.active
    assert TWO.wire_dtype == np.uint8 and FP16.wire_dtype == np.float16 and NONE.wire_dtype == F32
    assert FP16.new_residual(5) is None and NONE.new_residual(5) is None
    r = TWO.new_residual(5)
    assert isinstance(r, Residual) and r.data.dtype == F32 and not r.data.any()
    # the threshold is a C float, as in MXNet: 0.1 is float32(0.1)
    assert CompressionSpec.from_params({"type": "2bit", "threshold": 0.1}).threshold == float(F32(0.1))


def test_tag_form_round_trips() -> None:
    assert [s.tag for s in (TWO, ONE, FP16, NONE)] == ["2bit:0.5", "1bit:0.5", "fp16", "none"]
    for params in ({"type": "2bit", "threshold": 0.1}, {"type": "1bit", "threshold": -3}, {"type": "fp16"}):
        spec = CompressionSpec.from_params(params)
        assert CompressionSpec.from_tag(parse_tag(spec.tag)) == spec
    assert CompressionSpec.from_params({"type": "2bit", "threshold": 0.1}).tag == "2bit:0.10000000149011612"
    for bad in (None, 3, "", "2bit", "2bit:", "2bit:0.50", "2bit:-1", "fp16:0.5", "3bit:1", "2bit:0.1"):
        with pytest.raises(ProtocolError, match="compression"):
            parse_tag(bad)


@pytest.mark.parametrize(("params", "message"), [
    ([("type", "2bit")], r"expects a dict like \{'type': '2bit', 'threshold': 0.5\}; got list"),
    ("2bit", "expects a dict"),
    ({}, r"no 'type' field \(accepted: 'none', '1bit', '2bit', 'fp16'\)"),
    ({"threshold": 0.5}, "no 'type' field"),
    ({"type": "3bit"}, r"'type' is '3bit'; accepted: 'none', '1bit', '2bit', 'fp16'"),
    ({"type": "2BIT"}, "'type' is '2BIT'; accepted"),
    ({"type": 2}, "'type' is 2; accepted"),
    ({"type": "2bit", "treshold": 0.5}, r"unknown field 'treshold' for type '2bit'; accepted fields: 'type', "
                                         r"'threshold'"),
    ({"type": "fp16", "threshold": 0.5}, r"unknown field 'threshold' for type 'fp16'; accepted fields: 'type'"),
    ({"type": "2bit", "threshold": 0}, "'threshold' must be greater than 0 for 2bit; got 0"),
    ({"type": "2bit", "threshold": -0.5}, "greater than 0 for 2bit"),
    ({"type": "2bit", "threshold": 1e-50}, "greater than 0 for 2bit"),   # 0 as a C float
    ({"type": "2bit", "threshold": "abc"}, "'threshold' must be a number; got 'abc'"),
    ({"type": "2bit", "threshold": True}, "'threshold' must be a number; got True"),
    ({"type": "2bit", "threshold": None}, "must be a number"),
    ({"type": "1bit", "threshold": float("nan")}, "must be finite"),
    ({"type": "2bit", "threshold": 1e39}, "must be finite in float32"),
])
def test_bad_params_name_the_field_and_the_accepted_values(params: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        CompressionSpec.from_params(params)


def test_bad_inputs_are_clear_errors() -> None:
    with pytest.raises(ShapeMismatch, match="float32 gradients; got float64"):
        TWO.compress(np.ones(4), TWO.new_residual(4))
    with pytest.raises(ShapeMismatch, match=r"needs a float32\[4\] residual; got none"):
        TWO.compress(np.ones(4, F32), None)
    with pytest.raises(ShapeMismatch, match=r"needs a float32\[4\] residual; got float32\[5\]"):
        TWO.compress(np.ones(4, F32), TWO.new_residual(5))
    with pytest.raises(ProtocolError, match=r"2bit payload for 17 elements must be uint8\[8\]; got uint8\[4\]"):
        TWO.decompress(np.zeros(4, np.uint8), 17)
    with pytest.raises(ProtocolError, match=r"fp16 payload for 3 elements must be float16\[3\]; got float32"):
        FP16.accumulate(np.zeros(3, F32), np.zeros(3, F32))
    with pytest.raises(ShapeMismatch, match="decompress into"):
        TWO.decompress(np.zeros(4, np.uint8), 3, out=np.zeros(3, np.float64))
    with pytest.raises(ConfigError, match="key 'emb' is row_sparse: gradient compression"):
        TWO.check_key("emb", F32, sparse=True)
    with pytest.raises(ConfigError, match=r"key 3 holds float64: gradient compression \(fp16\) applies to float32"):
        FP16.check_key(3, np.float64, sparse=False)
    NONE.check_key("emb", np.float64, sparse=True)   # compression off: anything goes
    TWO.check_key("w", F32, sparse=False)
