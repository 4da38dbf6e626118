"""kv.push / kv.pull / kv.pushpull with CUDA tensors straight through the KVStore API
(psnode.torch.values -> psnode.torch.devices), on the 'local' store: closed-form values.

Marked ``cuda``: skipped without a CUDA device (CI); tests/gpu/device_check.sh runs it.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

try:
    import torch
except ImportError:
    if os.environ.get("CI"):
        raise ImportError("CI must install torch for tests/gpu: pip install torch") from None
    pytest.skip("torch is not installed (pip install torch); CI fails here instead", allow_module_level=True)

import psnode

pytestmark = pytest.mark.cuda


def test_cuda_tensor_lists_through_the_kvstore() -> None:
    """Gradients 1 (float32) and 2 (bfloat16) on the GPU(s): SGD lr 0.5 from 1 gives -0.5 in
    every output (CUDA float32, CUDA bfloat16, CPU); a pushpull of 1 then gives -1; a
    row_sparse pull of row 2 into a CUDA tensor writes that row only."""
    devices = [f"cuda:{i}" for i in range(torch.cuda.device_count())] * 2
    kv = psnode.kv.create("local")
    kv.init("w", np.ones((64, 3), np.float32))
    kv.init("e", np.zeros((4, 3), np.float32), stype="row_sparse")
    kv.set_optimizer(psnode.optimizer.create("sgd", learning_rate=0.5))
    kv.push("w", [torch.full((64, 3), 1.0, device=devices[0]),
                  torch.full((64, 3), 2.0, device=devices[1], dtype=torch.bfloat16)])
    outs = [torch.zeros(64, 3, device=devices[0]), torch.zeros(64, 3, device=devices[1], dtype=torch.bfloat16),
            torch.zeros(64, 3)]
    for _ in range(2):                                  # the second pull reuses the host array
        kv.pull("w", out=outs)
        for t in outs:
            assert torch.equal(t, torch.full((64, 3), -0.5, device=t.device, dtype=t.dtype))
    g = torch.full((64, 3), 1.0, device=devices[0])
    kv.pushpull("w", g)
    assert torch.equal(g, torch.full((64, 3), -1.0, device=devices[0]))
    kv.push("e", torch.full((4, 3), 2.0, device=devices[0]))
    e = torch.full((4, 3), 7.0, device=devices[0])
    kv.pull("e", out=e, row_ids=[2])
    assert e[:, 0].tolist() == [7.0, 7.0, -1.0, 7.0]
