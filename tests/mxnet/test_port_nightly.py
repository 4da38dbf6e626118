"""The local tests of MXNet 1.9's ``tests/nightly/test_kvstore.py``, ported to psnode's numpy API.

MXNet's script runs test_kvstore and test_group_kvstore on 'local_update_cpu',
'local_allreduce_cpu' and 'local_allreduce_device' for both storage types, and
test_compress_kvstore on 'local_allreduce_device', with nworker=4 device arrays per push and
MXNet's 'test' optimizer (``weight += rescale_grad * grad``).  MXNet's ``set_optimizer`` on a
local store is ``_set_updater(get_updater(optimizer))``; psnode's stores take their own
optimizers, so the port sets that updater.  The random data is drawn per (repeat, key, device)
from seeded generators instead of held at once (MXNet's list holds 1.3 GB at these shapes), and
the 2bit reference (compute_expected_2bit_quantization) is MXNet's element loop vectorised.
"""
from __future__ import annotations

import numpy as np
import pytest

import psnode
from tests.support.mxnet_port import F, asnumpy, check_diff_to_scalar, tostype

keys = [3, 5, 7]
shapes = [(4, 4), (100, 100), (2000, 2000)]   # the last exceeds MXNET_KVSTORE_BIGARRAY_BOUND
stypes = ["default", "row_sparse"]
gc_init_test_key = 9
lr = 0.1
nworker = 4
nrepeat = 10
LOCAL = ["local_update_cpu", "local_allreduce_cpu", "local_allreduce_device"]


def data(i: int, j: int, g: int) -> np.ndarray:
    """MXNet's ``data[i][j][g] = np.random.random(s) * 2 - 1`` (float64)."""
    return np.random.default_rng((i, j, g)).random(shapes[j]) * 2 - 1


def test_optimizer(rescale_grad: float):
    """MXNet's 'test' optimizer as a local store runs it (an updater)."""
    def update(key: object, grad: np.ndarray, weight: np.ndarray) -> None:
        weight += grad * F(rescale_grad)
    return update


test_optimizer.__test__ = False  # type: ignore[attr-defined]   # (a helper, not a test)


@pytest.mark.parametrize("stype", stypes)
@pytest.mark.parametrize("kv_type", LOCAL)
def test_kvstore(kv_type: str, stype: str) -> None:
    """individual key interface"""
    kv = psnode.kv.create(kv_type)
    kv.set_updater(test_optimizer(rescale_grad=lr))
    for k, s in zip(keys, shapes, strict=True):
        kv.init(k, np.zeros(s, F))
    res = [np.zeros(s) for s in shapes]
    for i in range(nrepeat):
        d = [[data(i, j, g) for g in range(nworker)] for j in range(len(keys))]
        for j in range(len(keys)):
            kv.push(keys[j], [tostype(d[j][g].astype(F), stype) for g in range(nworker)])
        res = [a + sum(d[j]) * lr for j, a in enumerate(res)]
        for j in range(len(keys)):
            out = [np.zeros(shapes[j], F) for _ in range(nworker)]
            kv.pull(keys[j], out=out)
            err = sum(np.sum(np.abs(o - res[j])) for o in out) / np.sum(np.abs(res[j]))
            assert err < 1e-6, (err, shapes[j])


def compute_expected_2bit_quantization(arr: np.ndarray, curr_residual: np.ndarray, threshold: float):
    """(decompressed values, new residual) of MXNet's 2bit rule, element by element."""
    a = arr + curr_residual
    decompr = np.where(a >= threshold, threshold, np.where(a <= -threshold, -threshold, 0.0))
    return decompr, a - decompr


def test_compress_kvstore(kv_type: str = "local_allreduce_device", compression: str = "2bit",
                          threshold: float = 0.5) -> None:
    rate = 2
    kv = psnode.kv.create(kv_type)
    kv.set_gradient_compression({"type": compression, "threshold": threshold})
    kv.set_updater(test_optimizer(rescale_grad=rate))
    for k, s in zip(keys, shapes, strict=True):
        kv.init(k, np.zeros(s, F))
    kv.init(gc_init_test_key, np.ones(shapes[0], F))   # to check it is not compressed at init
    random_keys = [13, 15, 17]      # fresh keys for the random tests: residuals from the start
    for k, s in zip(random_keys, shapes, strict=True):
        kv.init(k, np.zeros(s, F))

    # pull_init_test: compression is not applied to init of a key
    out = [np.zeros(shapes[0], F) for _ in range(nworker)]
    kv.pull(gc_init_test_key, out=out)
    for o in out:
        np.testing.assert_array_equal(o, np.ones_like(o))

    # pull_before_push
    for _ in range(nrepeat):
        for j in range(len(keys)):
            out = [np.ones(shapes[j], F) for _ in range(nworker)]
            kv.pull(keys[j], out=out)
            for o in out:
                np.testing.assert_array_equal(o, np.zeros_like(o))

    # push_zeros
    for _ in range(nrepeat):
        for j in range(len(keys)):
            kv.push(keys[j], [np.zeros(shapes[j], F) for _ in range(nworker)])
            out = [np.ones(shapes[j], F) for _ in range(nworker)]
            kv.pull(keys[j], out=out)
            for o in out:
                np.testing.assert_array_equal(o, np.zeros_like(o))

    # verify_residual
    curval = 0.0
    for j in range(len(keys)):
        kv.push(keys[j], [np.ones(shapes[j], F) * 0.4 for _ in range(nworker)])
        out = [np.zeros(shapes[j], F) for _ in range(nworker)]
        kv.pull(keys[j], out=out)
        for o in out:
            check_diff_to_scalar(o, 0)
        kv.push(keys[j], [np.ones(shapes[j], F) * (threshold - 0.3) for _ in range(nworker)])
        out = [np.zeros(shapes[j], F) for _ in range(nworker)]
        kv.pull(keys[j], out=out)
        curval = threshold * rate * nworker
        for o in out:
            check_diff_to_scalar(o, curval)
        kv.push(keys[j], [np.ones(shapes[j], F) * 0.2 for _ in range(nworker)])
        out = [np.zeros(shapes[j], F) for _ in range(nworker)]
        kv.pull(keys[j], out=out)
        for o in out:
            check_diff_to_scalar(o, curval)
        kv.push(keys[j], [np.ones(shapes[j], F) * (threshold - 0.3) for _ in range(nworker)])
        out = [np.zeros(shapes[j], F) for _ in range(nworker)]
        kv.pull(keys[j], out=out)
        curval += threshold * rate * nworker
        for o in out:
            check_diff_to_scalar(o, curval)
        # residual would be 0 now

    # check_neg
    neg = -1 * threshold
    for _ in range(nrepeat):
        curval = curval + rate * nworker * neg
        for j in range(len(keys)):
            kv.push(keys[j], [np.ones(shapes[j], F) * neg for _ in range(nworker)])
            out = [np.ones(shapes[j], F) for _ in range(nworker)]
            kv.pull(keys[j], out=out)
            for o in out:
                check_diff_to_scalar(o, curval)
        # residual would be 0 again

    # check_compr_random
    rng = np.random.default_rng(11)
    for k, s in zip(random_keys, shapes, strict=True):
        curr_residual = [np.zeros(s) for _ in range(nworker)]
        orig_val = [np.zeros(s, F) for _ in range(nworker)]
        kv.pull(k, out=orig_val)
        grads = [rng.uniform(-0.6, 0.6, size=s).astype(F) for _ in range(nworker)]
        grads_cpy = [g.copy() for g in grads]
        kv.push(k, grads)
        val = [np.zeros(s, F) for _ in range(nworker)]
        kv.pull(k, out=val)
        diffs = [val[g] - orig_val[g] for g in range(nworker)]
        sum_dequantized_vals = np.zeros(s)
        for g in range(nworker):
            decompr, curr_residual[g] = compute_expected_2bit_quantization(grads_cpy[g], curr_residual[g],
                                                                           threshold)
            sum_dequantized_vals += decompr * rate
        for g in range(nworker):
            np.testing.assert_allclose(asnumpy(diffs[g]), sum_dequantized_vals, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("stype", stypes)
@pytest.mark.parametrize("kv_type", LOCAL)
def test_group_kvstore(kv_type: str, stype: str) -> None:
    """group keys interface"""
    kv = psnode.kv.create(kv_type)
    kv.set_updater(test_optimizer(rescale_grad=lr))
    kv.init(keys, [np.zeros(s, F) for s in shapes])
    res = [np.zeros(s) for s in shapes]
    out = [[np.zeros(s, F) for _ in range(nworker)] for s in shapes]
    for i in range(nrepeat):
        d = [[data(i, j, g) for g in range(nworker)] for j in range(len(keys))]
        kv.push(keys, [[tostype(d[j][g].astype(F), stype) for g in range(nworker)] for j in range(len(keys))])
        kv.pull(keys, out=out)
        res = [a + sum(d[j]) * lr for j, a in enumerate(res)]
        for a, b in zip(res, out, strict=True):
            err = sum(np.sum(np.abs(o - a)) for o in b) / np.sum(np.abs(a))
            assert err < 1e-6, (err, a.shape)
