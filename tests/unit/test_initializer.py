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
