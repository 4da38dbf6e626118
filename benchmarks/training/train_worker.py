"""One rank of benchmarks/training/train.py: the same PyTorch model trained with psnode or with DDP + gloo.

    python benchmarks/training/train_worker.py psnode <config-json>    # under a psnode job (PSNODE_* env)
    python -m benchmarks.training.train_worker ddp <config-json>       # RANK, WORLD_SIZE, MASTER_ADDR/PORT set

The model (:class:`Net`): an MLP of ``depth`` residual blocks ``h + relu(Linear(LayerNorm(h)))``
(width x width) between an input and an output Linear: with benchmarks/training/train.py's defaults
(inp 512, width 1024, depth 15, 100 classes) 16.4 M float32 parameters in 64 tensors.
Synthetic data: each rank draws ``batches`` batches of (``batch`` x ``inp``) normal inputs and
class labels from its own seed once, and cycles through them (no data loading in the timing).
Both systems start from the same weights (seed 0) and run SGD with the same learning rate and
momentum: psnode on the servers (``psnode.torch.DistributedTrainer``, mean of the workers'
gradients), DDP locally after gloo's all-reduce (mean).

A step: zero the gradients, forward, loss, backward, then ``trainer.step()`` (push every
gradient, pull every weight) or ``optimizer.step()`` (DDP all-reduces during backward).  After
``warmup`` steps the next ``steps`` are timed on each rank: steps/s = steps / their wall time.
Reported (one BENCHRESULT line per rank): steps/s, the last loss, and a checksum of the final
weights (the driver checks that every rank ends with the same weights).
"""
from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.cases import leave_gloo, report


class Net(nn.Module):
    def __init__(self, inp: int, width: int, depth: int, classes: int) -> None:
        super().__init__()
        self.inp = nn.Linear(inp, width)
        self.blocks = nn.ModuleList(nn.ModuleDict({"fc": nn.Linear(width, width), "norm": nn.LayerNorm(width)})
                                    for _ in range(depth))
        self.out = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.inp(x))
        for b in self.blocks:
            h = h + F.relu(b["fc"](b["norm"](h)))
        return self.out(h)


def make(cfg: dict, rank: int) -> tuple[Net, list[tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(0)
    model = Net(cfg["inp"], cfg["width"], cfg["depth"], cfg["classes"])
    g = torch.Generator().manual_seed(1000 + rank)
    data = [(torch.randn(cfg["batch"], cfg["inp"], generator=g),
             torch.randint(0, cfg["classes"], (cfg["batch"],), generator=g)) for _ in range(cfg["batches"])]
    return model, data


def checksum(model: nn.Module) -> float:
    with torch.no_grad():
        return float(sum(p.double().sum() * (i + 1) for i, p in enumerate(model.parameters())))


def train(step_fn, model: nn.Module, data, cfg: dict) -> tuple[float, float]:
    """Run warm-up and timed steps; (steps/s of the timed steps, last loss)."""
    loss = torch.zeros(())
    t0 = time.perf_counter()
    for i in range(cfg["warmup"] + cfg["steps"]):
        if i == cfg["warmup"]:
            t0 = time.perf_counter()
        x, y = data[i % len(data)]
        loss = step_fn(model, x, y)
    return cfg["steps"] / (time.perf_counter() - t0), float(loss)


def run_psnode(cfg: dict) -> None:
    import psnode
    import psnode.torch
    kv = psnode.kv.create("dist_sync")
    model, data = make(cfg, kv.rank)
    trainer = psnode.torch.DistributedTrainer(
        model, kv, psnode.optimizer.create("sgd", learning_rate=cfg["lr"], momentum=cfg["momentum"]))

    def step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        trainer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        trainer.step()
        return loss.detach()
    kv.barrier()
    rate, loss = train(step, model, data, cfg)
    kv.barrier()
    report(system=cfg["system"], case="train", rank=kv.rank, steps_per_s=rate, loss=loss,
           checksum=checksum(model), params=sum(p.numel() for p in model.parameters()),
           tensors=len(list(model.parameters())))
    kv.close()


def run_ddp(cfg: dict) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model, data = make(cfg, rank)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=cfg["lr"], momentum=cfg["momentum"])

    def step(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(m(x), y)
        loss.backward()
        opt.step()
        return loss.detach()
    dist.barrier()
    rate, loss = train(step, ddp, data, cfg)
    dist.barrier()
    report(system=cfg["system"], case="train", rank=rank, steps_per_s=rate, loss=loss, checksum=checksum(model),
           params=sum(p.numel() for p in model.parameters()), tensors=len(list(model.parameters())))
    leave_gloo(dist)


if __name__ == "__main__":
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    mode, config = sys.argv[1], json.loads(sys.argv[2])
    {"psnode": run_psnode, "ddp": run_ddp}[mode](config)
