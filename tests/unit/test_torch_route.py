"""Torch tensors straight through the KVStore API (psnode.worker.routes, psnode.torch.values) on the 'local' store.

Every expected value is closed-form: SGD with learning rate 0.5 on the stored value, the pushed
gradient the sum of the tensors given for the key.
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

try:
    import torch
except ImportError:  # pragma: no cover
    if os.environ.get("CI"):
        raise
    pytest.skip("torch is not installed (pip install torch); CI fails here instead", allow_module_level=True)

import psnode
from psnode.errors import KeyNotInitialized, ShapeMismatch
from psnode.worker import routes as torch_route


def _store() -> psnode.worker.kvstore.KVStore:
    kv = psnode.kv.create("local")
    kv.set_optimizer(psnode.optimizer.create("sgd", learning_rate=0.5))
    return kv


def test_push_list_of_keys_with_tensor_lists_and_pull_into_bf16() -> None:
    kv = _store()
    kv.init(["a", "b"], [np.ones(3, np.float32), np.zeros(3, np.float32)])
    kv.push(["a", "b"], [[torch.full((3,), 1.0), torch.full((3,), 3.0)], torch.full((3,), 2.0)])
    a = [torch.zeros(3), torch.zeros(3, dtype=torch.bfloat16)]
    b = torch.zeros(3)
    got = kv.pull(["a", "b"], out=[a, b])
    assert got == [a, b]
    for t in a:                                   # 1 - 0.5 * (1 + 3) = -1
        assert torch.equal(t, torch.full((3,), -1.0, dtype=t.dtype))
    assert torch.equal(b, torch.full((3,), -1.0))  # 0 - 0.5 * 2


def test_pull_reuses_one_host_array_per_key() -> None:
    kv = _store()
    kv.init("w", np.ones(4, np.float32))
    t = torch.zeros(4)
    kv.pull("w", out=t)
    host = kv._torch_bufs["w"]
    kv.push("w", torch.ones(4))
    kv.pull("w", out=t)
    assert kv._torch_bufs["w"] is host
    assert torch.equal(t, torch.full((4,), 0.5))


def test_pushpull_back_into_the_tensors() -> None:
    kv = _store()
    kv.init("w", np.full(2, 2.0, np.float32))
    g = [torch.full((2,), 1.0), torch.full((2,), 1.0)]
    assert kv.pushpull("w", g) is g               # 2 - 0.5 * 2 = 1 into both tensors
    for t in g:
        assert torch.equal(t, torch.ones(2))
    out = torch.zeros(2)
    kv.pushpull("w", torch.full((2,), 4.0), out=out)
    assert torch.equal(out, torch.full((2,), -1.0))


def test_row_sparse_pull_into_tensors_keeps_other_rows() -> None:
    kv = _store()
    kv.init("e", np.zeros((4, 2), np.float32), stype="row_sparse")
    kv.push("e", torch.full((4, 2), 2.0))                # every row: 0 - 0.5 * 2 = -1
    one = torch.full((4, 2), 7.0)
    kv.pull("e", out=one, row_ids=[3, 1])
    assert one[:, 0].tolist() == [7.0, -1.0, 7.0, -1.0]
    two = [torch.full((4, 2), 7.0), torch.full((4, 2), 8.0, dtype=torch.bfloat16)]
    kv.row_sparse_pull("e", out=two, row_ids=[np.array([0]), np.array([2])])
    assert two[0][:, 1].tolist() == [-1.0, 7.0, 7.0, 7.0]
    assert two[1][:, 1].tolist() == [8.0, 8.0, -1.0, 8.0]


def test_errors_name_the_key() -> None:
    kv = _store()
    kv.init("w", np.ones((2, 2), np.float32))
    with pytest.raises(ShapeMismatch, match="'w'"):
        kv.push("w", [torch.ones(2, 2), torch.ones(3)])
    with pytest.raises(ShapeMismatch, match="'w'"):
        kv.pull("w", out=torch.zeros(3))
    with pytest.raises(KeyNotInitialized, match="'nope'"):
        kv.push("nope", torch.ones(2))
    with pytest.raises(KeyNotInitialized, match="'nope'"):
        kv.pull("nope", out=torch.zeros(2))


def test_same_key_twice_in_one_push_sums_both() -> None:
    kv = psnode.kv.create("local", aggregator="sum")
    kv.init("w", np.zeros(2, np.float32))
    kv.push(["w", "w"], [[torch.ones(2), torch.ones(2)], [torch.full((2,), 3.0), torch.ones(2)]])
    # no optimizer: the stored value is the last push of the round (MXNet), 3 + 1 = 4
    assert torch.equal(kv.pull("w", out=torch.zeros(2)), torch.full((2,), 4.0))


def test_numpy_values_unchanged_and_no_torch_import() -> None:
    """Without torch loaded the routing never imports it and passes values through."""
    code = ("import sys, numpy as np, psnode\n"
            "from psnode.worker import routes as torch_route\n"
            "v = np.ones(2)\n"
            "assert torch_route.push_values('k', v, lambda k: None) is v\n"
            "assert torch_route.pull_outs('k', [v], lambda k: None, {}) == ([v], [])\n"
            "kv = psnode.kv.create('local'); kv.init('k', np.ones(2, np.float32)); kv.push('k', v.astype(np.float32))\n"
            "assert 'torch' not in sys.modules\n")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=60)
    v = [np.ones(2), np.zeros(2)]
    assert torch_route.push_values(["a", "b"], v, lambda k: None) is v
