"""Unit tests of psnode.math.initializers: exact constants, distribution bounds and statistics
(tolerances of 6 standard errors), Xavier scales, validation errors, spec round trips."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from psnode.errors import ConfigError
from psnode.math import initializers as I

N = 1_000_000
SIGMAS = 6.0  # tolerance in standard errors: a false failure has probability ~1e-9


def check_mean_var(x: np.ndarray, var: float, fourth_moment: float) -> None:
    """Sample mean ~ 0 and sample variance ~ ``var`` within 6 standard errors."""
    x = x.astype(np.float64).ravel()
    n = x.size
    assert abs(x.mean()) <= SIGMAS * math.sqrt(var / n)
    se_var = math.sqrt((fourth_moment - var * var) / n)
    assert abs(np.mean(x * x) - var) <= SIGMAS * se_var + 1e-12


# -- constants -----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int64])
def test_zero_one_constant_exact(dtype):
    a = np.full((3, 4), 7, dtype)
    assert I.Zero()(a) is a and not a.any() and a.dtype == dtype
    I.One()(a)
    assert (a == 1).all()
    I.Constant(3)(a)
    assert (a == 3).all()
    I.create("constant", value=-2.5)(a)
    assert (a == dtype(-2.5)).all()


def test_aliases_and_case():
    assert I.create("zeros") == I.Zero() and I.create("ONES") == I.One()
    assert I.create("Xavier", magnitude=2) == I.Xavier(magnitude=2)
    assert set(I.registered()) == {"zero", "one", "constant", "uniform", "normal", "xavier"}


# -- random ----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_uniform_bounds_and_statistics(dtype):
    s = 0.5
    a = I.Uniform(s)(np.empty(N, dtype), np.random.default_rng(0))
    assert a.dtype == dtype
    bound = dtype(s)
    assert a.min() >= -bound and a.max() <= bound
    # P(no sample within 1e-3*s of an end) = (1 - 5e-4)^N ~ exp(-500)
    assert a.max() > s * (1 - 1e-3) and a.min() < -s * (1 - 1e-3)
    check_mean_var(a, s * s / 3, s ** 4 / 5)


def test_uniform_default_scale_and_noncontiguous_target():
    assert I.Uniform().scale == 0.07
    base = np.zeros((200, 400), np.float32)
    view = base[:, ::2]
    I.Uniform(0.25)(view, np.random.default_rng(5))
    assert np.abs(view).max() <= np.float32(0.25) and np.abs(view).max() > 0.2
    assert not base[:, 1::2].any()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_normal_statistics(dtype):
    sigma = 2.0
    a = I.Normal(sigma)(np.empty((1000, 1000), dtype), np.random.default_rng(1))
    assert a.dtype == dtype
    check_mean_var(a, sigma ** 2, 3 * sigma ** 4)
    assert I.Normal().sigma == 0.01


def test_same_seed_same_values_different_seed_different():
    a = I.Normal(1.0)(np.empty(100, np.float32), np.random.default_rng(42))
    b = I.Normal(1.0)(np.empty(100, np.float32), np.random.default_rng(42))
    c = I.Normal(1.0)(np.empty(100, np.float32), np.random.default_rng(43))
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert np.array_equal(I.Uniform(1.0)(np.empty(9), 7), I.Uniform(1.0)(np.empty(9), 7))


def test_random_needs_float_array():
    with pytest.raises(ConfigError, match="floating"):
        I.Uniform()(np.zeros(3, np.int32))
    with pytest.raises(ConfigError, match="numpy array"):
        I.Zero()([1, 2])


# -- xavier ----------------------------------------------------------------------------------
SHAPES = {(300, 200): (200, 300), (64, 32, 3, 3): (32 * 9, 64 * 9)}  # shape -> (fan_in, fan_out)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("factor_type", ["avg", "in", "out"])
def test_xavier_uniform_scale(shape, factor_type):
    fan_in, fan_out = SHAPES[shape]
    factor = {"avg": (fan_in + fan_out) / 2, "in": fan_in, "out": fan_out}[factor_type]
    scale = math.sqrt(3 / factor)
    init = I.Xavier("uniform", factor_type, 3)
    assert init.scale_for(shape) == pytest.approx(scale, rel=1e-12)
    a = init(np.empty(shape, np.float32), np.random.default_rng(2))
    assert np.abs(a).max() <= np.float32(scale)
    assert np.abs(a).max() > 0.99 * scale  # P(fail) = 0.99^18432 ~ 1e-80
    check_mean_var(a, scale ** 2 / 3, scale ** 4 / 5)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("factor_type", ["avg", "in", "out"])
def test_xavier_gaussian_std(shape, factor_type):
    fan_in, fan_out = SHAPES[shape]
    factor = {"avg": (fan_in + fan_out) / 2, "in": fan_in, "out": fan_out}[factor_type]
    sigma = math.sqrt(2.0 / factor)
    a = I.Xavier(rnd_type="gaussian", factor_type=factor_type, magnitude=2.0)(
        np.empty(shape, np.float32), np.random.default_rng(3))
    check_mean_var(a, sigma ** 2, 3 * sigma ** 4)


def test_xavier_defaults_and_dims():
    x = I.Xavier()
    assert (x.rnd_type, x.factor_type, x.magnitude) == ("uniform", "avg", 3.0)
    with pytest.raises(ConfigError, match=r"at least 2 dims.*\(5,\)"):
        x(np.zeros(5, np.float32))
    with pytest.raises(ConfigError, match=r"\(\)"):
        x(np.zeros((), np.float32))
    empty = np.zeros((0, 3), np.float32)
    assert x(empty) is empty


# -- validation and specs ------------------------------------------------------------------
@pytest.mark.parametrize("call,words", [
    (lambda: I.create("glorot"), ["glorot", "xavier", "zero"]),
    (lambda: I.create(None), ["None"]),
    (lambda: I.create("uniform", sigma=1.0), ["uniform", "sigma", "scale"]),
    (lambda: I.create("zero", value=1), ["zero", "value", "none"]),
    (lambda: I.create("constant"), ["constant", "value"]),
    (lambda: I.Uniform(-1.0), ["uniform", "scale", "-1.0", "> 0"]),
    (lambda: I.Uniform("0.1"), ["scale", "'0.1'"]),
    (lambda: I.Normal(float("nan")), ["normal", "sigma", "nan"]),
    (lambda: I.Normal(0), ["sigma", "0"]),
    (lambda: I.Constant(float("inf")), ["constant", "value", "inf"]),
    (lambda: I.Constant(True), ["value", "True"]),
    (lambda: I.Xavier(rnd_type="normal"), ["xavier", "rnd_type", "'normal'", "'gaussian'"]),
    (lambda: I.Xavier(factor_type="fan_in"), ["factor_type", "'fan_in'", "'avg'", "'in'"]),
    (lambda: I.Xavier(magnitude=0), ["magnitude", "0"]),
    (lambda: I.from_spec({"name": "zero"}), ["'name'", "'params'"]),
    (lambda: I.from_spec("zero"), ["str"]),
    (lambda: I.from_spec({"name": "zero", "params": None}), ["params", "NoneType"]),
    (lambda: I.from_spec({"name": "xavier", "params": {"magnitude": "3"}}), ["magnitude"]),
])
def test_validation_errors_name_the_problem(call, words):
    with pytest.raises(ConfigError) as info:
        call()
    msg = str(info.value)
    for word in words:
        assert word in msg, (word, msg)


@pytest.mark.parametrize("init", [
    I.Zero(), I.One(), I.Constant(3), I.Constant(-0.25), I.Uniform(), I.Uniform(0.5),
    I.Normal(), I.Normal(1.5), I.Xavier(), I.Xavier("gaussian", "in", 2.0),
])
def test_spec_round_trip_through_json(init):
    spec = init.to_spec()
    back = I.from_spec(json.loads(json.dumps(spec)))
    assert back == init and type(back) is type(init) and back.to_spec() == spec
    assert set(spec) == {"name", "params"}
    a = back(np.empty((4, 6), np.float32), np.random.default_rng(9))
    b = init(np.empty((4, 6), np.float32), np.random.default_rng(9))
    assert np.array_equal(a, b)


# -- computed where the values live (ps_initializer) ------------------------------------------
def _splitmix64(stream: int, i: int) -> int:
    """Draw ``i`` of a stream, in plain Python integers (the reference for CounterRNG)."""
    m = (1 << 64) - 1
    z = (stream + (i + 1) * 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def test_counter_rng_draws_are_splitmix64_of_the_counter():
    stream = I.stream_of(7, "emb")
    rng = I.CounterRNG(stream, 10**12)
    bits = rng._bits(5).copy()
    assert [int(b) for b in bits] == [_splitmix64(stream, 10**12 + j) for j in range(5)]
    assert rng.start == 10**12 + 5
    # float32 uniforms: the top 24 bits; float64: the top 53
    u32 = I.CounterRNG(stream, 3).random(4, np.float32)
    assert [float(u) for u in u32] == [(_splitmix64(stream, 3 + j) >> 40) / 2**24 for j in range(4)]
    u64 = I.CounterRNG(stream, 3).random(4)
    assert [float(u) for u in u64] == [(_splitmix64(stream, 3 + j) >> 11) / 2**53 for j in range(4)]


def test_stream_of_keys_and_seeds():
    assert I.stream_of(0, 3) == I.stream_of(0, 3)
    assert len({I.stream_of(0, 3), I.stream_of(0, "3"), I.stream_of(1, 3), I.stream_of(0, 4)}) == 4
    assert 0 <= I.stream_of(2**63 - 1, "k" * 256) < 2**64


@pytest.mark.parametrize("init", [I.Normal(0.5), I.Uniform(0.2), I.Xavier("gaussian"), I.Constant(2)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_any_piece_of_a_key_is_computed_alone(init, dtype):
    """Element i of the key depends on (seed, key, i) only: pieces computed from any offset (also
    odd ones, and chunks of the generator's size) equal the whole; rows equal the table's rows."""
    ps = I.ps_initializer(init, seed=5)
    shape = (1000, 70)                        # 70_000 elements: more than one generator chunk
    whole = ps.values("t", shape, dtype)
    assert whole.dtype == dtype and whole.shape == shape
    flat = whole.reshape(-1)
    spec = ps.part(shape)
    for lo, hi in [(0, 1), (1, 70_000), (65_535, 65_537), (33_333, 66_667), (69_999, 70_000)]:
        piece = spec.fill("t", np.empty(hi - lo, dtype), lo)
        assert np.array_equal(piece, flat[lo:hi]), (lo, hi)
    part = ps.part(shape, start=70 * 400)   # rows 400.. as a server holding them computes them
    assert np.array_equal(part.fill("t", np.empty(70 * 3, dtype)), flat[70 * 400:70 * 403])
    assert np.array_equal(ps.values("t", shape, dtype, rows=[999, 0, 400]), whole[[999, 0, 400]])
    other = I.ps_initializer(init, seed=6).values("t", shape, dtype)
    assert np.array_equal(other, whole) == isinstance(init, I.Constant)     # another seed: other values


def test_counter_normals_and_uniforms_have_the_right_statistics():
    x = I.ps_initializer(I.Normal(1.0)).values("n", (N,))
    check_mean_var(x, 1.0, 3.0)
    assert np.isfinite(x).all() and np.abs(x).max() < 6.0   # (|x| <= sqrt(2 ln 2**24) = 5.77)
    u = I.ps_initializer(I.Uniform(0.5)).values("u", (N,), np.float64)
    assert u.min() >= -0.5 and u.max() < 0.5
    check_mean_var(u, 0.25 / 3, 0.5 ** 4 / 5)
    xav = I.ps_initializer(I.Xavier()).values("x", (400, 300))
    bound = I.Xavier().scale_for((400, 300))     # the whole key's fans, not a piece's
    assert np.abs(xav).max() <= np.float32(bound) and np.abs(xav).max() > 0.99 * bound


def test_fill_spec_round_trips_and_is_checked():
    spec = I.ps_initializer(I.Xavier(magnitude=2), seed=9).part((10, 4), start=8)
    back = I.FillSpec.from_json(json.loads(json.dumps(spec.to_json())))
    assert back == spec
    good = spec.to_json()
    for bad, words in [
        ({**good, "pickle": 1}, ["init, seed, shape and start"]),
        ({**good, "seed": -1}, ["seed"]), ({**good, "seed": 2**63}, ["seed"]), ({**good, "seed": 1.0}, ["seed"]),
        ({**good, "shape": [10, -4]}, ["shape"]), ({**good, "shape": "10"}, ["shape"]),
        ({**good, "start": 41}, ["start", "outside"]),
        ({**good, "init": {"name": "orthogonal", "params": {}}}, ["unknown initializer"]),
    ]:
        with pytest.raises(ConfigError) as info:
            I.FillSpec.from_json(bad)
        assert all(w in str(info.value) for w in words), (bad, str(info.value))
    with pytest.raises(ConfigError, match="float32 or float64"):
        I.ps_initializer(I.Normal()).part((3,)).check(np.int32)
    I.ps_initializer(I.Constant(4)).part((3,)).check(np.int32)       # constants fill any dtype
    with pytest.raises(ConfigError, match="at least 2 dims"):
        I.ps_initializer(I.Xavier()).part((3,)).check(np.float32)
    with pytest.raises(ConfigError, match="seed"):
        I.ps_initializer(I.Normal(), seed=-2)
    with pytest.raises(ConfigError, match="psnode.init initializer"):
        I.ps_initializer("normal")  # type: ignore[arg-type]
