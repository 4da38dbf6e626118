"""psnode.torch with CUDA models: the trainer's device paths, exact values, no per-step allocation.

Every test is marked ``cuda`` (skipped without a CUDA device, see conftest.py).  References:
the same model on the CPU through the zero-copy path, torch.optim.SGD on the GPU, and closed
forms (tests/cluster/test_torch_trainer.py's mixed float32/bfloat16 job, run with the model on
CUDA: two workers sharing GPU 0, two servers).
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

try:
    import torch
except ImportError:
    if os.environ.get("CI"):
        raise ImportError("CI must install torch for tests/gpu: pip install torch") from None
    pytest.skip("torch is not installed (pip install torch); CI fails here instead", allow_module_level=True)

import psnode
import psnode.torch as pt
from tests.support.cluster import run_job
from tests.support.torch_trainer import check_closed_form, closed_form_script

pytestmark = pytest.mark.cuda


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))


def data(seed: int, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(16, 6, generator=g).to(device), torch.randint(0, 3, (16,), generator=g).to(device)


def sgd() -> psnode.math.optimizers.Optimizer:
    return psnode.optimizer.create("sgd", learning_rate=0.1, momentum=0.9, wd=1e-4)


def train(model: torch.nn.Module, trainer: pt.DistributedTrainer, device: str, steps: int = 6) -> None:
    for step in range(steps):
        trainer.zero_grad()
        torch.nn.functional.cross_entropy(model(data(step, device)[0]), data(step, device)[1]).backward()
        trainer.step()


@pytest.mark.parametrize("overlap", [False, True])
def test_cuda_model_trains_like_the_cpu_model(overlap: bool) -> None:
    cpu, gpu = make_model(), make_model().cuda()
    train(cpu, pt.wrap(cpu, psnode.kv.create("local"), sgd()), "cpu")
    trainer = pt.wrap(gpu, psnode.kv.create("local"), sgd(), overlap=overlap)
    assert trainer.overlap is overlap
    train(gpu, trainer, "cuda")
    trainer.close()
    for (name, a), b in zip(cpu.named_parameters(), gpu.parameters(), strict=True):
        assert b.is_cuda
        torch.testing.assert_close(b.detach().cpu(), a.detach(), rtol=1e-4, atol=1e-5, msg=name)


def test_cuda_overlap_is_on_by_default_and_pushes_during_backward() -> None:
    model = make_model().cuda()
    kv = psnode.kv.create("local")
    pushed: dict[str, threading.Event] = {k: threading.Event() for k in ("0.weight", "2.weight")}
    threads: list[str] = []
    real_push = kv.push

    def push(key, value, priority=0):
        threads.append(threading.current_thread().name)
        real_push(key, value, priority)
        if key in pushed:
            pushed[key].set()

    kv.push = push  # type: ignore[method-assign]
    trainer = pt.wrap(model, kv, sgd())
    assert trainer.overlap
    seen: list[bool] = []
    model[0].weight.register_post_accumulate_grad_hook(lambda p: seen.append(pushed["2.weight"].wait(10)))
    x, y = data(0, "cuda")
    torch.nn.functional.cross_entropy(model(x), y).backward()
    assert seen == [True]                     # the last layer left before the first got its gradient
    trainer.step()
    assert set(threads) == {"psnode-torch-pusher"} and len(threads) == 4
    trainer.close()


def test_step_allocates_no_device_memory() -> None:
    model = make_model().cuda()
    trainer = pt.wrap(model, psnode.kv.create("local"), sgd())
    train(model, trainer, "cuda", steps=2)                 # warm up
    x, y = data(5, "cuda")
    torch.nn.functional.cross_entropy(model(x), y).backward()
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    trainer.step()
    trainer.step()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before
    trainer.close()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_cuda_parameters_keep_float32_master_weights(dtype: torch.dtype) -> None:
    w = torch.nn.Parameter(torch.ones(64, 3, dtype=dtype, device="cuda"))
    model = torch.nn.ParameterDict({"w": w})
    kv = psnode.kv.create("local")
    trainer = pt.wrap(model, kv, psnode.optimizer.create("sgd", learning_rate=2.0 ** -10))
    master = np.empty((64, 3), np.float32)
    for k in range(1, 9):
        trainer.zero_grad()
        (w.float() * 1.5).sum().backward()
        trainer.step()
        kv.pull("w", out=master)
        exact = np.float32(1 - 1.5 * k / 1024)
        np.testing.assert_array_equal(master, np.full((64, 3), exact))
        assert torch.equal(w.detach(), torch.full((64, 3), float(exact), device="cuda").to(dtype))
    trainer.close()


@pytest.mark.parametrize("overlap", [False, True])
def test_two_workers_sharing_the_gpu_closed_form(tmp_path: Path, overlap: bool) -> None:
    job = run_job(closed_form_script(tmp_path, "cuda", overlap), 2, 2, timeout=120, tmp=tmp_path,
                  env={"PSNODE_BIG_ARRAY_BOUND": "64"})
    assert all(p.code == 0 for p in job.procs), job.describe()
    check_closed_form(tmp_path)


def test_host_value_and_scatter_with_one_tensor_per_gpu() -> None:
    """Rank-style values r + 1 on every visible GPU (twice on GPU 0 when there is one), one of
    them bfloat16: the sum is n(n+1)/2 exactly; scatter writes 0.75 into every device and dtype."""
    devices = [f"cuda:{i}" for i in range(torch.cuda.device_count())] or ["cuda:0"]
    if len(devices) == 1:
        devices = devices * 2
    grads = [torch.full((300, 7), float(r + 1), device=d, dtype=torch.bfloat16 if r == 1 else torch.float32)
             for r, d in enumerate(devices)]
    n = len(grads)
    for _ in range(2):                                          # the second call reuses the buffers
        host = pt.host_value(grads, np.float32, key="g")
        np.testing.assert_array_equal(host, np.full((300, 7), n * (n + 1) / 2, np.float32))
    outs = [torch.zeros(300, 7, device=d, dtype=g.dtype) for d, g in zip(devices, grads, strict=True)]
    pt.scatter(np.full((300, 7), 0.75, np.float32), outs, key="g")
    for t in outs:
        assert torch.equal(t, torch.full((300, 7), 0.75, device=t.device, dtype=t.dtype))
