"""One worker of benchmarks/training/stream.py: a click model trained on a stream of open-ended ids.

    python benchmarks/training/stream_worker.py <config-json>     # under a psnode job (PSNODE_* env)

Each sample has ``head`` ids drawn Zipf(1.3) (the items that recur: each has a hidden +-1
effect, examples/recsys_torch.py's) and ``tail`` ids seen once in the whole stream (a counter
per rank: every tail id of the job is distinct); all are named by 64-bit ids (an odd multiple
of the item's index plus a constant: a bijection of the 64-bit integers, so distinct items never
share a row).  A click has probability ``sigmoid(0.75 * sum of the head ids' effects)``: the tail
is noise the model must not be hurt by.  The model: ``psnode.torch.EmbeddingBag(None, dim)``
with ``table={'max_rows': ...}`` (0: no cap), a linear head; AdaGrad on the servers; the next
batch's rows prefetched.

Held-out metrics by progressive validation: each batch is scored by the forward of the step
that then trains on it, so every score is of samples the model has not trained on.  Every
``window`` steps a rank records (step, wall time, AUC and mean log loss of the window's scores,
the AUC of the true click probabilities on the same samples).  Each rank reports one
BENCHRESULT line with those windows, its steps/s and its tail ids.
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

from benchmarks.cases import report
from benchmarks.training.stream import auc

ZIPF, EFFECT = 1.3, 0.75
MULT, ADD = np.uint64(0xD6E8FEB86659FD93), np.uint64(0x2545F4914F6CDD1D)
TAIL_BASE = 1 << 50      # head items are below (their Zipf index modulo it), tail items above


def effects(index: np.ndarray) -> np.ndarray:
    """Each head item's hidden effect, +1 or -1 (examples/recsys_torch.py's)."""
    h = (index.astype(np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
    return np.where((h >> np.uint64(61)) & np.uint64(1), 1.0, -1.0)


class Stream:
    """This rank's samples, drawn on the fly (seeded by rank)."""

    def __init__(self, cfg: dict, rank: int) -> None:
        self.rng = np.random.default_rng(5000 + rank)
        self.head, self.tail, self.batch = cfg["head"], cfg["tail"], cfg["batch"]
        self.next_tail = TAIL_BASE + (rank << 44)      # 2**44 tail ids per rank: distinct across ranks

    def draw(self) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """(ids [batch, head + tail] int64, clicks [batch] float32, true click probabilities)."""
        b = self.batch
        head = (self.rng.zipf(ZIPF, (b, self.head)) - 1) % TAIL_BASE
        tail = (self.next_tail + np.arange(b * self.tail, dtype=np.int64)).reshape(b, self.tail)
        self.next_tail += b * self.tail
        p = 1 / (1 + np.exp(-EFFECT * effects(head).sum(axis=1)))
        clicks = (self.rng.random(b) < p).astype(np.float32)
        index = np.concatenate([head, tail], axis=1).astype(np.uint64)
        ids = (index * MULT + ADD).view(np.int64)
        return torch.from_numpy(ids), torch.from_numpy(clicks), p


def main(cfg: dict) -> None:
    import psnode
    import psnode.torch as pt
    torch.set_num_threads(1)
    kv = psnode.kv.create("dist_sync")
    emb = pt.EmbeddingBag(None, cfg["dim"], mode="sum", kv=kv, key="stream", initializer=psnode.init.Normal(0.01),
                          seed=0, table={"max_rows": cfg["max_rows"]})
    torch.manual_seed(0)
    head = nn.Linear(cfg["dim"], 1)
    model = nn.ModuleDict({"emb": emb, "head": head})
    trainer = pt.DistributedTrainer(model, kv, psnode.optimizer.create("adagrad", learning_rate=cfg["lr"]))
    stream = Stream(cfg, kv.rank)
    windows: list[dict] = []
    scores: list[np.ndarray] = []
    labels: list[np.ndarray] = []
    truth: list[np.ndarray] = []
    nxt = stream.draw()
    kv.barrier()
    t0 = time.perf_counter()
    w0 = time.time()
    for step in range(1, cfg["steps"] + 1):
        ids, clicks, p = nxt
        trainer.zero_grad()
        logits = head(emb(ids)).squeeze(-1)
        loss = F.binary_cross_entropy_with_logits(logits, clicks)
        loss.backward()
        nxt = stream.draw()
        emb.prefetch(nxt[0])
        trainer.step()
        scores.append(logits.detach().numpy().copy())
        labels.append(clicks.numpy())
        truth.append(p)
        if step % cfg["window"] == 0:
            s, y, t = np.concatenate(scores), np.concatenate(labels), np.concatenate(truth)
            q = 1 / (1 + np.exp(-s.astype(np.float64)))
            logloss = float(-np.mean(y * np.log(np.clip(q, 1e-12, 1)) + (1 - y) * np.log(np.clip(1 - q, 1e-12, 1))))
            windows.append({"step": step, "time": time.time(), "auc": auc(s, y), "logloss": logloss,
                            "best_auc": auc(t, y)})
            scores, labels, truth = [], [], []
    rate = cfg["steps"] / (time.perf_counter() - t0)
    kv.barrier()
    report(system=cfg["system"], rank=kv.rank, steps_per_s=rate, windows=windows, timed_from=w0,
           tail_ids=stream.next_tail - TAIL_BASE - (kv.rank << 44), steps=cfg["steps"])
    kv.close()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(json.loads(sys.argv[1]))
