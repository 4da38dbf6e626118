"""One rank of benchmarks/training/embedding.py: the embedding workload trained with psnode or DDP + gloo.

    python benchmarks/training/embedding_worker.py psnode <config-json>    # under a psnode job (PSNODE_* env)
    python -m benchmarks.training.embedding_worker ddp <config-json>       # RANK, WORLD_SIZE, MASTER_ADDR/PORT set

The embedding workload: an ``EmbeddingBag(rows, 16,
mode='sum')`` and a linear head to one logit, binary cross-entropy; each step a batch of 256
samples of 8 ids drawn Zipf(1.3) mod ``rows``, labelled 1 when most of its ids are even; AdaGrad
with learning rate 0.1 and epsilon 1e-10 (torch's default; psnode's, MXNet's formula, adds it
under the square root); one torch thread per rank.

* psnode: ``psnode.torch.EmbeddingBag`` (the table on the servers, computed there: N(0, 1)),
  ``DistributedTrainer`` with the servers' ``adagrad`` (the mean of the workers' gradients), the
  next batch's rows prefetched after backward (``--no-prefetch``: not).
* DDP: ``nn.EmbeddingBag(..., sparse=True)`` holding psnode's initial table (computed on rank 0,
  which DDP broadcasts), ``torch.optim.Adagrad``; every rank holds the table and its AdaGrad
  state.  Both systems start from the same weights and take the same batches.

Each rank draws its ``warmup + steps + 1`` batches from its own seed before training (no data
generation in the timing).  After ``warmup`` steps the next ``steps`` are timed: steps/s =
steps / their wall time.  Reported (one BENCHRESULT line per rank): steps/s, this process's CPU
milliseconds per timed step, the mean loss of the first and of the last ``loss_window`` steps,
the peak resident memory of this process (VmHWM) and the seconds from start to the first step
(table creation included).
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.cases import leave_gloo, report

IDS, DIM, BATCH, ZIPF = 8, 16, 256, 1.3


def peak_mib() -> float:
    """This process's peak resident memory (VmHWM), MiB."""
    with open("/proc/self/status") as fh:
        kib = next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))
    return kib / 1024


def batches(cfg: dict, rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    rng = np.random.default_rng(1000 + rank)
    out = []
    for _ in range(cfg["warmup"] + cfg["steps"] + 1):
        ids = ((rng.zipf(ZIPF, (BATCH, IDS)) - 1) % cfg["rows"]).astype(np.int64)
        label = ((ids % 2 == 0).sum(axis=1) > IDS // 2).astype(np.float32)
        if cfg.get("dynamic"):   # the same items named by 64-bit ids (a table without a row count)
            ids = (ids.astype(np.uint64) * np.uint64(0xD6E8FEB86659FD93) + np.uint64(1)).view(np.int64)
        out.append((torch.from_numpy(ids), torch.from_numpy(label)))
    return out


class Net(nn.Module):
    def __init__(self, emb: nn.Module) -> None:
        super().__init__()
        self.emb = emb
        torch.manual_seed(0)
        self.head = nn.Linear(DIM, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids)).squeeze(-1)


class Phases:
    """Where a step's time goes on this rank: per phase (``mark(name)`` ends it), the wall and
    this thread's CPU milliseconds, kept for the timed steps only; their medians per phase."""

    def __init__(self) -> None:
        self.on = False
        self.seen: dict[str, list[tuple[float, float]]] = {}
        self._t = self._c = 0.0

    def begin(self) -> None:
        self._t, self._c = time.perf_counter(), time.thread_time()

    def mark(self, name: str) -> None:
        t, c = time.perf_counter(), time.thread_time()
        if self.on:
            self.seen.setdefault(name, []).append(((t - self._t) * 1e3, (c - self._c) * 1e3))
        self._t, self._c = t, c

    def medians(self) -> dict[str, dict[str, float]]:
        return {name: {"wall_ms": float(np.median([w for w, _ in v])), "cpu_ms": float(np.median([c for _, c in v]))}
                for name, v in self.seen.items()}


PHASES = Phases()


def train(step_fn, data, cfg: dict) -> tuple:
    """Warm-up and timed steps: (steps/s of the timed steps, this process's CPU ms per timed
    step, every step's loss, the wall-clock times the timed steps began and ended)."""
    losses = []
    t0, c0, w0 = time.perf_counter(), time.process_time(), time.time()
    for i in range(cfg["warmup"] + cfg["steps"]):
        if i == cfg["warmup"]:
            t0, c0, w0 = time.perf_counter(), time.process_time(), time.time()
            PHASES.on = True
        PHASES.begin()
        losses.append(step_fn(i, *data[i], data[i + 1][0]))
    cpu = (time.process_time() - c0) * 1e3 / cfg["steps"]
    return cfg["steps"] / (time.perf_counter() - t0), cpu, losses, (w0, time.time())


def touched(cfg: dict, world: int = 2) -> float:
    """Rows of the table a timed step touches (the ids of every rank's batch, each once), mean
    over the timed steps."""
    ranks = [batches(cfg, r) for r in range(world)]
    w = cfg["warmup"]
    return float(np.mean([len(np.unique(np.concatenate([b[i][0].numpy().ravel() for b in ranks])))
                          for i in range(w, w + cfg["steps"])]))


def result(cfg: dict, rank: int, timed: tuple, ready: float) -> None:
    rate, cpu, losses, (w0, w1) = timed
    k = cfg["loss_window"]
    report(system=cfg["system"], case=f"rows={cfg['rows']}", rows=cfg["rows"], rank=rank, steps_per_s=rate,
           rows_touched=touched(cfg), cpu_ms_per_step=cpu, loss_first=float(np.mean(losses[:k])),
           loss_last=float(np.mean(losses[-k:])),
           peak_mib=peak_mib(), ready_s=ready, phases=PHASES.medians(), steps=cfg["steps"], warmup=cfg["warmup"],
           timed_from=w0, timed_to=w1)


def run_psnode(cfg: dict) -> None:
    start = time.perf_counter()
    import psnode
    import psnode.torch as pt
    kv = psnode.kv.create("dist_sync")
    emb = pt.EmbeddingBag(None if cfg.get("dynamic") else cfg["rows"], DIM, mode="sum", kv=kv, key="emb")
    model = Net(emb)
    # eps as torch's Adagrad default (MXNet's formula adds it under the square root: 1e-7 there
    # damps the small gradients of this model's rows)
    trainer = pt.DistributedTrainer(model, kv, psnode.optimizer.create("adagrad", learning_rate=cfg["lr"],
                                                                       eps=1e-10))
    data = batches(cfg, kv.rank)
    prefetch = cfg.get("prefetch", True)

    def step(i: int, x: torch.Tensor, y: torch.Tensor, nxt: torch.Tensor) -> float:
        trainer.zero_grad()
        PHASES.mark("zero_grad")
        loss = F.binary_cross_entropy_with_logits(model(x), y)
        PHASES.mark("forward")        # (the batch's rows: prefetched, or pulled here)
        loss.backward()
        PHASES.mark("backward")
        if prefetch:
            emb.prefetch(nxt)
        PHASES.mark("prefetch")       # (asks the servers for the next batch's rows)
        trainer.step()
        PHASES.mark("step")           # (pushes the gradients; the servers' AdaGrad)
        out = loss.item()
        PHASES.mark("loss")
        return out
    kv.barrier()
    ready = time.perf_counter() - start
    timed = train(step, data, cfg)
    kv.barrier()
    result(cfg, kv.rank, timed, ready)
    kv.close()


def run_ddp(cfg: dict) -> None:
    start = time.perf_counter()
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    # rank 0's table is psnode's initial table (DDP broadcasts it); the others' is overwritten
    import psnode
    shape = (cfg["rows"], DIM)
    table = psnode.init.ps_initializer(psnode.init.Normal(1.0)).values("emb", shape) if rank == 0 \
        else np.empty(shape, np.float32)
    model = Net(nn.EmbeddingBag(cfg["rows"], DIM, mode="sum", sparse=True, _weight=torch.from_numpy(table)))
    ddp = DDP(model)
    opt = torch.optim.Adagrad(ddp.parameters(), lr=cfg["lr"])
    data = batches(cfg, rank)

    def step(i: int, x: torch.Tensor, y: torch.Tensor, nxt: torch.Tensor, ddp: nn.Module = ddp) -> float:
        opt.zero_grad()
        PHASES.mark("zero_grad")
        loss = F.binary_cross_entropy_with_logits(ddp(x), y)
        PHASES.mark("forward")
        loss.backward()
        PHASES.mark("backward")       # (DDP's all-reduce of the gradients)
        opt.step()
        PHASES.mark("step")           # (AdaGrad on this rank's copy of the table)
        out = loss.item()
        PHASES.mark("loss")
        return out
    dist.barrier()
    ready = time.perf_counter() - start
    timed = train(step, data, cfg)
    dist.barrier()
    result(cfg, rank, timed, ready)
    leave_gloo(dist)


if __name__ == "__main__":
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    mode, config = sys.argv[1], json.loads(sys.argv[2])
    {"psnode": run_psnode, "ddp": run_ddp}[mode](config)
