"""A click-through model on open-ended 64-bit ids: a table without a row count on the servers.

The data of recsys_torch.py (8 items per sample drawn Zipf(1.3), a hidden +-1 effect per item,
clicks with probability ``sigmoid(0.75 * sum of effects)``), but every item is a 64-bit id (a
hash of its index: no table size, nothing hashed into ``[0, N)``, no two items sharing a row).
The model: ``psnode.torch.EmbeddingBag(None, 16)`` -- rows made on first use from ``(seed,
key, id)`` and spread over the servers by a hash of the id --, an item trained only from its
``--min-count``-th occurrence, at most ``--max-rows`` rows per server (least recently used
evicted), then a small MLP; AdaGrad on the servers.  Rank 0 prints the loss and the held-out
AUC every ``--eval-every`` steps, then ``best_auc=``, ``auc=``, and ``exported=`` (the rows
``psnode.export`` wrote: ids and vectors in one .npz, loaded back with plain numpy).

    mxdist launch -n 2 -s 2 examples/recsys_dynamic.py
    python examples/recsys_dynamic.py                            # one process ('local' store)
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import create_kv

import psnode

try:
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError:
    sys.exit("recsys_dynamic.py needs PyTorch: pip install torch (a CPU build is enough)")

from recsys_torch import EFFECT, IDS, TEST, ZIPF, auc, effects

import psnode.torch as pt


def draw(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` samples: (64-bit item ids [n, 8], clicks [n] as 0/1 floats, true click probabilities)."""
    index = rng.zipf(ZIPF, (n, IDS)) - 1                     # an open-ended item space
    p = 1 / (1 + np.exp(-EFFECT * effects(index).sum(axis=1)))
    clicks = (rng.random(n) < p).astype(np.float32)
    ids = (index.astype(np.uint64) * np.uint64(0xD6E8FEB86659FD93) + np.uint64(0x2545F4914F6CDD1D)).view(np.int64)
    return ids, clicks, p


class CTR(nn.Module):
    def __init__(self, dim: int, kv, seed: int, table: dict) -> None:
        super().__init__()
        self.emb = pt.EmbeddingBag(None, dim, mode="sum", kv=kv, key="items", initializer=psnode.init.Normal(0.01),
                                   seed=seed, table=table)
        torch.manual_seed(seed)
        self.mlp = nn.Sequential(nn.Linear(dim, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.emb(ids)).squeeze(-1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dim", type=int, default=16, help="embedding size")
    p.add_argument("--steps", type=int, default=600, help="training steps per worker")
    p.add_argument("--batch-size", type=int, default=256, help="samples per step per worker")
    p.add_argument("--lr", type=float, default=0.1, help="AdaGrad learning rate (on the servers)")
    p.add_argument("--min-count", type=int, default=2, help="occurrences before an item trains")
    p.add_argument("--max-rows", type=int, default=0, help="rows per server (0: no cap)")
    p.add_argument("--eval-every", type=int, default=200, help="steps between evaluations")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kvstore", default="dist_sync", choices=psnode.kv.TYPES)
    args = p.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

    kv = create_kv(args.kvstore)
    model = CTR(args.dim, kv, args.seed, {"min_count": args.min_count, "max_rows": args.max_rows})
    trainer = pt.DistributedTrainer(model, kv, psnode.optimizer.create("adagrad", learning_rate=args.lr))
    rng = np.random.default_rng(args.seed + 1 + 1000 * kv.rank)
    test_ids, test_clicks, test_p = draw(np.random.default_rng(args.seed + 999_999), TEST)
    say = print if kv.rank == 0 else (lambda *a, **k: None)
    say(f"recsys_dynamic: kvstore={kv.type} workers={kv.num_workers} servers={kv.num_servers} dim={args.dim} "
        f"min_count={args.min_count} max_rows={args.max_rows} steps={args.steps} "
        f"batch_size={args.batch_size}x{kv.num_workers}", flush=True)

    def evaluate() -> float:
        with torch.no_grad():
            return auc(model(torch.from_numpy(test_ids)).numpy(), test_clicks)

    losses: list[float] = []
    start, score = time.monotonic(), 0.5
    for step in range(1, args.steps + 1):
        ids, clicks, _ = draw(rng, args.batch_size)
        trainer.zero_grad()
        loss = F.binary_cross_entropy_with_logits(model(torch.from_numpy(ids)), torch.from_numpy(clicks))
        loss.backward()
        trainer.step()
        losses.append(loss.item())
        if step % args.eval_every == 0 or step == args.steps:
            score = evaluate()
            say(f"step {step}/{args.steps} loss={np.mean(losses):.4f} test_auc={score:.4f} "
                f"time={time.monotonic() - start:.1f}s", flush=True)
            losses = []
    kv.barrier()
    if kv.rank == 0:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "items.npz")
            psnode.export(kv, "items", path)
            with np.load(path) as f:                           # plain numpy: ids and vectors
                say(f"exported={len(f['ids'])} rows of {f['values'].shape[1]}")
    say(f"best_auc={auc(test_p, test_clicks):.4f}")
    say(f"auc={score:.4f}", flush=True)
    kv.barrier()
    kv.close()


if __name__ == "__main__":
    main()
