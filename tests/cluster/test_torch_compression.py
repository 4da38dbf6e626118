"""``psnode.torch.DistributedTrainer(compression=...)`` in a real 2-worker, 2-server job.

A float32 parameter (split over both servers) and a bfloat16 one (a float32 master key) get
gradient ``c * (rank + 1)`` everywhere; 2bit compression with threshold 0.75 sends +-0.75 or 0
per element as each worker's residual crosses the threshold, so the weights follow a closed
form: SGD with learning rate 2^-10 on the mean of what the servers decode, each worker's
residual carried from step to step (computed here with psnode.math.compression's rules).  Both push
paths run (at step time, and from the gradient hooks: ``overlap=True``).  A float64 parameter
with compression is a ConfigError naming it.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import psnode
from psnode.errors import ConfigError
from psnode.math.compression import CompressionSpec
from tests.support.cluster import run_job

try:
    import torch

    import psnode.torch
except ImportError as exc:
    if os.environ.get("CI"):
        raise ImportError("CI must install torch for tests/cluster/test_torch_compression.py: "
                          "pip install torch") from exc
    pytest.skip("torch is not installed (pip install torch); CI fails here instead", allow_module_level=True)

STEPS, LR, C = 6, 2.0 ** -10, 0.5
PARAMS = {"type": "2bit", "threshold": 0.75}

SCRIPT = """
import numpy as np, torch, psnode, psnode.torch
torch.set_num_threads(1)
kv = psnode.kv.create("dist_sync")


class Mixed(torch.nn.Module):
    def __init__(self, start):
        super().__init__()
        self.a = torch.nn.Parameter(torch.full((40, 3), start))
        self.b = torch.nn.Parameter(torch.full((50,), start, dtype=torch.bfloat16))


model = Mixed(1.0 + kv.rank)
trainer = psnode.torch.DistributedTrainer(model, kv, psnode.optimizer.create("sgd", learning_rate={lr}),
                                          overlap={overlap}, compression={params!r})
c = {c} * (kv.rank + 1)
saved, master = {{}}, np.empty(50, np.float32)
for k in range({steps}):
    trainer.zero_grad()
    ((model.a * c).sum() + (model.b.float() * c).sum()).backward()
    trainer.step()
    kv.pull("b", out=master)
    saved[f"a{{k + 1}}"] = model.a.detach().numpy().copy()
    saved[f"m{{k + 1}}"] = master.copy()
np.savez({out!r} + f"/r{{kv.rank}}.npz", **saved)
trainer.close()
kv.close()
"""


def closed_form() -> list[np.float32]:
    """The weight after each step (every element alike)."""
    spec = CompressionSpec.from_params(PARAMS)
    res = [spec.new_residual(1) for _ in range(2)]
    w, out = np.float32(1.0), []
    for _ in range(STEPS):
        sent = [spec.roundtrip(np.full(1, C * (r + 1), np.float32), res[r])[0] for r in range(2)]
        w = np.float32(w - np.float32(LR) * ((sent[0] + sent[1]) / np.float32(2)))
        out.append(w)
    return out


@pytest.mark.parametrize("overlap", [False, True])
def test_trainer_with_2bit_compression_closed_form(tmp_path: Path, overlap: bool) -> None:
    script = SCRIPT.format(lr=LR, overlap=overlap, params=PARAMS, c=C, steps=STEPS, out=str(tmp_path))
    job = run_job(script, 2, 2, timeout=60, tmp=tmp_path, env={"PSNODE_BIG_ARRAY_BOUND": "64"})
    assert all(p.code == 0 for p in job.procs), job.describe()
    want = closed_form()
    assert len(set(want)) == STEPS and want[-1] != np.float32(1 - LR * 0.75 * STEPS)   # residuals matter
    for rank in range(2):
        with np.load(tmp_path / f"r{rank}.npz") as r:
            for k in range(1, STEPS + 1):
                np.testing.assert_array_equal(r[f"a{k}"], np.full((40, 3), want[k - 1]), err_msg=f"a{k}")
                np.testing.assert_array_equal(r[f"m{k}"], np.full(50, want[k - 1]), err_msg=f"m{k}")


def test_trainer_compression_needs_float32_keys() -> None:
    model = torch.nn.Linear(3, 2).double()
    with pytest.raises(ConfigError, match="parameter 'weight' has a float64 key: gradient compression"):
        psnode.torch.DistributedTrainer(model, psnode.kv.create("local"), compression={"type": "fp16"})
    with pytest.raises(ConfigError, match="accepted: 'none', '1bit', '2bit', 'fp16'"):
        psnode.torch.DistributedTrainer(torch.nn.Linear(3, 2), psnode.kv.create("local"), compression={"type": "x"})
