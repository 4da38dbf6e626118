"""Unit tests of psnode.math.optimizers: update rules against float64 references, lazy row
updates, spec round trips, validation errors and checkpoint arrays."""
from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest

from psnode.errors import ConfigError, ShapeMismatch
from psnode.math import optimizers as O


def ro(a: np.ndarray) -> np.ndarray:
    """A read-only copy, like a gradient received in a zmq frame."""
    a = np.array(a)
    a.setflags(write=False)
    return a


# -- float64 references, written straight from the formulas ----------------------------
def ref_sgd(w, grads, lr, momentum=0.0, wd=0.0, rescale=1.0, clip=None):
    w = np.array(w, np.float64)
    mom = np.zeros_like(w)
    for g in grads:
        g = rescale * np.asarray(g, np.float64)
        if clip is not None:
            g = np.clip(g, -clip, clip)
        if momentum:
            mom = momentum * mom - lr * (g + wd * w)
            w = w + mom
        else:
            w = w - lr * (g + wd * w)
    return w, mom


def ref_adam(w, grads, lr, beta1=0.9, beta2=0.999, eps=1e-8, wd=0.0, rescale=1.0, clip=None):
    w = np.array(w, np.float64)
    mean, var = np.zeros_like(w), np.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        lr_t = lr * math.sqrt(1 - beta2 ** t) / (1 - beta1 ** t)
        g = rescale * np.asarray(g, np.float64) + wd * w
        if clip is not None:
            g = np.clip(g, -clip, clip)
        mean = beta1 * mean + (1 - beta1) * g
        var = beta2 * var + (1 - beta2) * g * g
        w = w - lr_t * mean / (np.sqrt(var) + eps)
    return w, mean, var


def ref_adagrad(w, grads, lr, eps=1e-7, wd=0.0, rescale=1.0, clip=None):
    w = np.array(w, np.float64)
    hist = np.zeros_like(w)
    for g in grads:
        g = rescale * np.asarray(g, np.float64)
        if clip is not None:
            g = np.clip(g, -clip, clip)
        hist = hist + g * g
        w = w - lr * (g / np.sqrt(hist + eps) + wd * w)
    return w, hist


def run(opt, w0, grads):
    w = np.array(w0, np.float32)
    st = opt.create_state(w)
    for g in grads:
        opt.update(w, ro(np.asarray(g, np.float32)), st)
    return w, st


RNG = np.random.default_rng(1234)
W0 = RNG.standard_normal((5, 7)).astype(np.float32)
GRADS = [RNG.standard_normal((5, 7)).astype(np.float32) for _ in range(4)]


# -- closed-form values ------------------------------------------------------------------
def test_sgd_closed_form_exact():
    opt = O.create("sgd", learning_rate=0.5)
    w = np.ones(4, np.float32)
    st = opt.create_state(w)
    opt.update(w, ro(np.full(4, 0.5, np.float32)), st)
    assert np.array_equal(w, np.full(4, 0.75, np.float32))  # 1 - 0.5*0.5
    opt.update(w, ro(np.full(4, 0.5, np.float32)), st)
    assert np.array_equal(w, np.full(4, 0.5, np.float32))
    assert st.t == 2 and st.arrays == {}


def test_sgd_momentum_closed_form_exact():
    opt = O.create("SGD", lr=0.5, momentum=0.5)
    w = np.ones(3, np.float32)
    st = opt.create_state(w)
    g = ro(np.ones(3, np.float32))
    opt.update(w, g, st)  # mom = -0.5, w = 0.5
    assert np.array_equal(st["mom"], np.full(3, -0.5, np.float32))
    assert np.array_equal(w, np.full(3, 0.5, np.float32))
    opt.update(w, g, st)  # mom = -0.25 - 0.5 = -0.75, w = -0.25
    assert np.array_equal(st["mom"], np.full(3, -0.75, np.float32))
    assert np.array_equal(w, np.full(3, -0.25, np.float32))


def test_sgd_wd_rescale_clip_closed_form():
    # g = clip(0.5 * 8, 2) = 2; w = (1 - 0.25*0.5)*2 - 0.25*2 = 1.75 - 0.5 = 1.25
    opt = O.create("sgd", learning_rate=0.25, wd=0.5, rescale_grad=0.5, clip_gradient=2.0)
    w = np.full(2, 2.0, np.float32)
    opt.update(w, ro(np.array([8.0, -8.0], np.float32)), opt.create_state(w))
    assert w.tolist() == [1.25, 1.75 + 0.5]


def test_adagrad_closed_form():
    # g = 2, history = 4, w = 1 - 0.5 * 2/sqrt(4 + eps) ~= 0.5
    opt = O.create("adagrad", learning_rate=0.5, eps=1e-7)
    w = np.ones(2, np.float32)
    st = opt.create_state(w)
    opt.update(w, ro(np.full(2, 2.0, np.float32)), st)
    assert st["history"].tolist() == [4.0, 4.0]
    np.testing.assert_allclose(w, 0.5, rtol=1e-6)


def test_adam_first_step_is_lr_times_sign():
    # t=1: mean = 0.1g, var = 0.001g^2, lr_t = lr*sqrt(0.001)/0.1 -> step = lr*g/|g| (eps~0)
    opt = O.create("adam", learning_rate=0.125)
    w = np.zeros(3, np.float32)
    st = opt.create_state(w)
    opt.update(w, ro(np.array([3.0, -0.5, 100.0], np.float32)), st)
    np.testing.assert_allclose(w, [-0.125, 0.125, -0.125], rtol=1e-5)
    assert st.t == 1


# -- several steps against float64 references --------------------------------------------
@pytest.mark.parametrize("kw", [
    {},
    {"momentum": 0.9},
    {"momentum": 0.9, "wd": 0.01},
    {"wd": 0.05, "rescale_grad": 0.25},
    {"momentum": 0.5, "rescale_grad": 2.0, "clip_gradient": 0.5},
])
def test_sgd_matches_reference(kw):
    opt = O.create("sgd", learning_rate=0.1, **kw)
    w, st = run(opt, W0, GRADS)
    ref_w, ref_mom = ref_sgd(W0, GRADS, 0.1, kw.get("momentum", 0.0), kw.get("wd", 0.0),
                             kw.get("rescale_grad", 1.0), kw.get("clip_gradient"))
    assert w.dtype == np.float32
    np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-6)
    if kw.get("momentum"):
        np.testing.assert_allclose(st["mom"], ref_mom, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kw", [
    {},
    {"wd": 0.1},
    {"rescale_grad": 0.5, "clip_gradient": 0.3},
    {"beta1": 0.5, "beta2": 0.75, "epsilon": 1e-3},
])
def test_adam_matches_reference_with_bias_correction(kw):
    opt = O.create("adam", learning_rate=0.01, **kw)
    grads = GRADS[:3]
    w, st = run(opt, W0, grads)
    ref_w, ref_mean, ref_var = ref_adam(
        W0, grads, 0.01, kw.get("beta1", 0.9), kw.get("beta2", 0.999), kw.get("epsilon", 1e-8),
        kw.get("wd", 0.0), kw.get("rescale_grad", 1.0), kw.get("clip_gradient"))
    assert st.t == 3
    np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(st["mean"], ref_mean, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(st["var"], ref_var, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("kw", [{}, {"wd": 0.1}, {"rescale_grad": 3.0, "clip_gradient": 1.0}])
def test_adagrad_matches_reference(kw):
    opt = O.create("adagrad", learning_rate=0.1, **kw)
    w, st = run(opt, W0, GRADS)
    ref_w, ref_hist = ref_adagrad(W0, GRADS, 0.1, 1e-7, kw.get("wd", 0.0),
                                  kw.get("rescale_grad", 1.0), kw.get("clip_gradient"))
    np.testing.assert_allclose(w, ref_w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(st["history"], ref_hist, rtol=1e-5, atol=1e-6)


def test_negative_clip_means_no_clipping():
    a, b = O.create("sgd", clip_gradient=-1.0), O.create("sgd")
    assert a == b and a.clip_gradient is None
    wa, _ = run(a, W0, GRADS)
    wb, _ = run(b, W0, GRADS)
    assert np.array_equal(wa, wb)


def test_chunking_does_not_change_results(monkeypatch):
    big_w = RNG.standard_normal(1000).astype(np.float32)
    big_g = [RNG.standard_normal(1000).astype(np.float32) for _ in range(2)]
    for name in O.registered():
        opt = O.create(name, wd=0.01, momentum=0.9) if name == "sgd" else O.create(name, wd=0.01)
        whole, st_whole = run(opt, big_w, big_g)
        monkeypatch.setattr(O, "CHUNK", 96)
        chunked, st_chunked = run(opt, big_w, big_g)
        monkeypatch.undo()
        assert np.array_equal(whole, chunked), name
        for k in st_whole.arrays:
            assert np.array_equal(st_whole[k], st_chunked[k])


def test_float64_weight_stays_float64_and_noncontiguous_weight():
    opt = O.create("sgd", learning_rate=0.5)
    w64 = np.ones(3)
    opt.update(w64, ro(np.ones(3)), opt.create_state(w64))
    assert w64.dtype == np.float64 and w64.tolist() == [0.5] * 3
    base = np.ones((4, 4), np.float32)
    w = base.T  # not C-contiguous
    opt.update(w, ro(np.ones((4, 4), np.float32)), opt.create_state(w))
    assert np.array_equal(base, np.full((4, 4), 0.5, np.float32))


def test_grad_is_never_written():
    g = np.array(GRADS[0])
    g_copy = g.copy()
    for name in O.registered():
        opt = O.create(name, clip_gradient=0.1, rescale_grad=3.0, wd=0.1)
        w = W0.copy()
        opt.update(w, g, opt.create_state(w))
        assert np.array_equal(g, g_copy)


def test_shape_errors():
    opt = O.create("adam")
    w = np.zeros((2, 3), np.float32)
    with pytest.raises(ShapeMismatch, match=r"\(3, 2\)"):
        opt.update(w, np.zeros((3, 2), np.float32), opt.create_state(w))
    with pytest.raises(ShapeMismatch, match="mean"):
        opt.update(w, np.zeros((2, 3), np.float32), O.OptState())
    with pytest.raises(ShapeMismatch, match="floating"):
        opt.create_state(np.zeros(3, np.int32))


# -- lazy row updates ----------------------------------------------------------------------
ROWS = np.array([0, 2, 3], np.int64)


def dense_from_rows(shape, rows, grad_rows):
    g = np.zeros(shape, np.float32)
    g[rows] = grad_rows
    return g


@pytest.mark.parametrize("name,kw", [
    ("sgd", {}), ("sgd", {"rescale_grad": 0.5, "clip_gradient": 0.7}),
    ("sgd", {"momentum": 0.9, "wd": 0.1}), ("adam", {"wd": 0.1}), ("adagrad", {"wd": 0.1}),
])
def test_update_rows_equals_dense_on_rows_and_leaves_rest(name, kw):
    opt = O.create(name, learning_rate=0.1, **kw)
    w_lazy, w_dense = W0.copy(), W0.copy()
    st_lazy, st_dense = opt.create_state(w_lazy), opt.create_state(w_dense)
    other = np.setdiff1d(np.arange(W0.shape[0]), ROWS)
    for g in GRADS[:3]:
        grad_rows = ro(g[ROWS])
        opt.update_rows(w_lazy, ROWS, grad_rows, st_lazy)
        # dense reference restricted to the rows: the same kernel on the gathered rows
        opt.update(w_dense, ro(dense_from_rows(W0.shape, ROWS, g[ROWS])), st_dense)
    assert st_lazy.t == 3
    assert np.array_equal(w_lazy[other], W0[other])
    for k in st_lazy.arrays:
        assert not st_lazy[k][other].any()
    if name == "sgd" and not kw.get("momentum") and not kw.get("wd"):
        assert np.array_equal(w_lazy, w_dense)  # exact, everywhere
    else:
        np.testing.assert_allclose(w_lazy[ROWS], w_dense[ROWS], rtol=1e-6, atol=1e-7)


def test_update_rows_wd_differs_from_dense_off_rows():
    opt = O.create("sgd", learning_rate=0.5, wd=0.5)
    w_lazy, w_dense = np.ones((3, 2), np.float32), np.ones((3, 2), np.float32)
    rows, grad_rows = np.array([1]), np.ones((1, 2), np.float32)
    opt.update_rows(w_lazy, rows, grad_rows, opt.create_state(w_lazy))
    opt.update(w_dense, dense_from_rows((3, 2), rows, grad_rows), opt.create_state(w_dense))
    assert np.array_equal(w_lazy[1], w_dense[1])          # 0.75*1 - 0.5 = 0.25
    assert w_lazy[[0, 2]].tolist() == [[1.0, 1.0]] * 2    # lazy: untouched
    assert w_dense[[0, 2]].tolist() == [[0.75, 0.75]] * 2  # dense: decayed


def test_update_rows_empty_and_errors():
    opt = O.create("adam")
    w = W0.copy()
    st = opt.create_state(w)
    opt.update_rows(w, np.array([], np.int64), np.zeros((0, 7), np.float32), st)
    assert np.array_equal(w, W0) and st.t == 1
    for rows in ([2, 1], [1, 1], [0, 5], [-1, 0]):
        with pytest.raises(ShapeMismatch, match="sorted, unique"):
            opt.update_rows(w, np.array(rows), np.zeros((2, 7), np.float32), st)
    with pytest.raises(ShapeMismatch, match="grad_rows shape"):
        opt.update_rows(w, np.array([0, 1]), np.zeros((2, 6), np.float32), st)


# -- specs -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name,kw", [
    ("sgd", {}), ("sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4}),
    ("adam", {"lr": 0.002, "beta2": 0.99, "clip_gradient": 5.0, "rescale_grad": 1 / 32}),
    ("adagrad", {"eps": 1e-6, "wd": 0}),
])
def test_spec_round_trip_through_json(name, kw):
    opt = O.create(name, **kw)
    spec = opt.to_spec()
    text = json.dumps(spec)
    back = O.from_spec(json.loads(text))
    assert back == opt and back.to_spec() == spec and type(back) is type(opt)
    assert spec["name"] == name and set(spec) == {"name", "params"}
    assert all(v is None or type(v) is float for v in spec["params"].values())


def test_defaults_and_alias():
    assert O.create("sgd").learning_rate == 0.01
    assert O.create("Adam").learning_rate == 0.001 and O.create("adam").epsilon == 1e-8
    assert O.create("ADAGRAD").eps == 1e-7
    assert O.create("sgd", lr=0.3).lr == 0.3 == O.create("sgd", learning_rate=0.3).learning_rate
    assert O.create("sgd", lr=0.3) != O.create("sgd", lr=0.2)
    assert O.create("sgd") != O.create("adagrad")
    assert {"sgd", "adam", "adagrad"} <= set(O.registered())


@pytest.mark.parametrize("call,words", [
    (lambda: O.create("rmsprop_x"), ["rmsprop_x", "sgd", "adam"]),
    (lambda: O.create(3), ["3", "accepted"]),
    (lambda: O.create("sgd", beta1=0.9), ["sgd", "beta1", "momentum"]),
    (lambda: O.create("sgd", momentum="0.9"), ["sgd", "momentum", "'0.9'", "[0, 1)"]),
    (lambda: O.create("sgd", momentum=True), ["momentum", "True"]),
    (lambda: O.create("adam", learning_rate=float("nan")), ["adam", "learning_rate", "nan"]),
    (lambda: O.create("adam", learning_rate=float("inf")), ["learning_rate", "inf"]),
    (lambda: O.create("sgd", learning_rate=-0.1), ["sgd", "learning_rate", "-0.1", "> 0"]),
    (lambda: O.create("sgd", learning_rate=0), ["learning_rate", "0"]),
    (lambda: O.create("sgd", lr=0.1, learning_rate=0.1), ["learning_rate", "twice"]),
    (lambda: O.create("sgd", momentum=1.0), ["momentum", "1.0"]),
    (lambda: O.create("adam", beta2=-0.5), ["adam", "beta2", "-0.5"]),
    (lambda: O.create("adam", wd=-1), ["wd", "-1"]),
    (lambda: O.create("adagrad", eps=0.0), ["adagrad", "eps", "0.0"]),
    (lambda: O.create("sgd", clip_gradient="big"), ["clip_gradient", "'big'", "None"]),
    (lambda: O.create("sgd", rescale_grad=None), ["rescale_grad", "None"]),
    (lambda: O.from_spec({"name": "sgd"}), ["'name'", "'params'"]),
    (lambda: O.from_spec({"name": "sgd", "params": {}, "x": 1}), ["exactly", "'x'"]),
    (lambda: O.from_spec(["sgd"]), ["list"]),
    (lambda: O.from_spec({"name": "sgd", "params": [1]}), ["params", "list"]),
    (lambda: O.from_spec({"name": "nope", "params": {}}), ["nope"]),
    (lambda: O.from_spec({"name": "sgd", "params": {"momentum": None}}), ["momentum", "None"]),
])
def test_validation_errors_name_the_problem(call, words):
    with pytest.raises(ConfigError) as info:
        call()
    msg = str(info.value)
    for word in words:
        assert word in msg, (word, msg)


# -- checkpoints ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["sgd", "adam", "adagrad"])
def test_state_arrays_round_trip_bit_for_bit_via_savez(name):
    opt = O.create(name, momentum=0.9) if name == "sgd" else O.create(name)
    w, st = run(opt, W0, GRADS)
    arrays = O.state_to_arrays(st)
    assert arrays["t"].dtype == np.int64 and arrays["t"].shape == ()
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    buf.seek(0)
    with np.load(buf) as npz:
        back = O.state_from_arrays(dict(npz))
    assert back.t == st.t == len(GRADS)
    assert set(back.arrays) == set(st.arrays)
    for k in st.arrays:
        assert back[k].dtype == st[k].dtype
        assert back[k].tobytes() == st[k].tobytes()
    # the restored state continues exactly like the original
    g = ro(GRADS[0])
    w2 = w.copy()
    opt.update(w, g, st)
    opt.update(w2, g, back)
    assert np.array_equal(w, w2)


def test_state_from_arrays_errors_and_readonly_input():
    with pytest.raises(ConfigError, match="'t'"):
        O.state_from_arrays({"mom": np.zeros(2)})
    with pytest.raises(ConfigError, match="'t'"):
        O.state_from_arrays({"t": np.array(1.5)})
    frozen = np.zeros(2, np.float32)
    frozen.setflags(write=False)
    st = O.state_from_arrays({"t": np.array(4), "mom": frozen})
    assert st.t == 4 and st["mom"].flags.writeable


def _rss_anon_kib() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("RssAnon:"))


def test_big_states_take_memory_only_for_the_rows_written():
    """A 64 MiB state written on 40 rows spread over it occupies a few pages (4 KiB each), not
    the whole array (numpy's np.zeros would map it in 2 MiB pages); values as np.zeros."""
    weight = np.broadcast_to(np.float32(1), (1_000_000, 16))     # (the weight's memory is not the point)
    before = _rss_anon_kib()
    state = O.create("adam").create_state(np.ones((1, 16), np.float32))   # small: np.zeros
    big = O.lazy_zeros(weight.shape, np.float32)
    assert big.shape == (1_000_000, 16) and big.dtype == np.float32 and big.flags.writeable
    assert big.flags.c_contiguous and not big[::997].any()
    big[np.arange(0, 1_000_000, 25_000)] = 2.0
    grown = _rss_anon_kib() - before
    assert grown < 8 * 1024, f"{grown} KiB for 40 rows of a 64 MiB array"
    assert state.arrays["mean"].shape == (1, 16)
    rule = O.create("adagrad", learning_rate=0.5)
    w = np.ones((1_000_000, 16), np.float32)
    lazy, dense = rule.create_state(w), O.OptState({"history": np.zeros_like(w)})
    assert lazy.arrays["history"].base is not None          # (the lazy mapping)
    rows, g = np.array([3, 500_000]), np.full((2, 16), 0.5, np.float32)
    w2 = w.copy()
    rule.update_rows(w, rows, g, lazy)
    rule.update_rows(w2, rows, g, dense)
    assert np.array_equal(w, w2) and np.array_equal(lazy.arrays["history"], dense.arrays["history"])
