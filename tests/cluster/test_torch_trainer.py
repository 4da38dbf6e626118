"""psnode.torch in a real 2-worker, 2-server dist_sync job, against single-process PyTorch.

Each worker seeds its model differently (rank 0's weights must win at init), trains 4 steps on
its own half of each batch, and saves its weights.  The test checks: both workers hold the
very same weights after init and at the end (bit for bit), and those equal a single-process
torch.optim.SGD run on the full batches (the mean of the two workers' mean gradients is the
mean gradient of the full batch) within float32 rounding.  PSNODE_BIG_ARRAY_BOUND=16 splits
the larger weights over both servers (param distribution) on the way.  Both push paths run:
at step time, and from the gradient hooks while backward runs (``overlap=True``).

The closed-form test mixes a float32 and a bfloat16 parameter (float32 master weights on the
servers): rank r's gradient is r + 1 everywhere, so every round averages to 1.5 and SGD with
learning rate 2^-10 gives exactly 1 - 1.5k/1024 after k steps.  tests/gpu runs the same script
with the model on CUDA (``closed_form_script(device="cuda")``).

CI installs torch: there a missing torch is an error; elsewhere the test is skipped.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tests.support.cluster import run_job
from tests.support.torch_trainer import check_closed_form, closed_form_script

try:
    import torch
except ImportError:
    if os.environ.get("CI"):
        raise ImportError("CI must install torch for tests/cluster/test_torch_trainer.py: pip install torch")
    pytest.skip("torch is not installed (pip install torch); CI fails here instead", allow_module_level=True)

STEPS, BATCH, LR, MOMENTUM = 4, 8, 0.2, 0.9

SCRIPT = """
import sys
import numpy as np
import torch
import psnode
import psnode.torch

torch.set_num_threads(1)
kv = psnode.kv.create("dist_sync")
sys.path.insert(0, {here!r})
from test_torch_trainer import batches, make_model

model = make_model(seed=100 + kv.rank)            # rank 1 starts from other weights
trainer = psnode.torch.DistributedTrainer(
    model, kv, psnode.optimizer.create("sgd", learning_rate={lr}, momentum={momentum}), overlap={overlap})
saved = {{"init." + n: p.detach().numpy().copy() for n, p in model.named_parameters()}}
x, y = batches()
for s in range(x.shape[0]):
    trainer.zero_grad()
    torch.nn.functional.cross_entropy(model(x[s, kv.rank]), y[s, kv.rank]).backward()
    trainer.step()
saved.update({{"final." + n: p.detach().numpy() for n, p in model.named_parameters()}})
np.savez({out!r} + f"/r{{kv.rank}}.npz", **saved)
kv.close()
"""


def make_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))


def batches() -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs ``[step, rank, sample, feature]`` and labels ``[step, rank, sample]``."""
    g = torch.Generator().manual_seed(7)
    return torch.randn(STEPS, 2, BATCH, 5, generator=g), torch.randint(0, 3, (STEPS, 2, BATCH), generator=g)


@pytest.mark.parametrize("overlap", [False, True])
def test_two_workers_equal_single_process_sgd(tmp_path: Path, overlap: bool) -> None:
    script = SCRIPT.format(here=str(Path(__file__).parent), lr=LR, momentum=MOMENTUM, out=str(tmp_path),
                           overlap=overlap)
    job = run_job(script, 2, 2, timeout=60, tmp=tmp_path, env={"PSNODE_BIG_ARRAY_BOUND": "16"})
    assert all(p.code == 0 for p in job.procs), job.describe()

    ref = make_model(seed=100)
    opt = torch.optim.SGD(ref.parameters(), lr=LR, momentum=MOMENTUM)
    start = {n: p.detach().numpy().copy() for n, p in ref.named_parameters()}
    x, y = batches()
    for s in range(STEPS):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ref(x[s].reshape(-1, 5)), y[s].reshape(-1)).backward()
        opt.step()

    with np.load(tmp_path / "r0.npz") as r0, np.load(tmp_path / "r1.npz") as r1:
        for name, p in ref.named_parameters():
            np.testing.assert_array_equal(r0["init." + name], start[name], err_msg=name)
            np.testing.assert_array_equal(r1["init." + name], start[name], err_msg=name)
            np.testing.assert_array_equal(r0["final." + name], r1["final." + name], err_msg=name)
            np.testing.assert_allclose(r0["final." + name], p.detach().numpy(), rtol=1e-5, atol=1e-6,
                                       err_msg=name)


@pytest.mark.parametrize("overlap", [False, True])
def test_float32_and_bfloat16_pushes_closed_form(tmp_path: Path, overlap: bool) -> None:
    job = run_job(closed_form_script(tmp_path, "cpu", overlap), 2, 2, timeout=60, tmp=tmp_path,
                  env={"PSNODE_BIG_ARRAY_BOUND": "64"})
    assert all(p.code == 0 for p in job.procs), job.describe()
    check_closed_form(tmp_path)
