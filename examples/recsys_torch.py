"""A click-through model whose embedding table lives on the servers (psnode.torch.EmbeddingBag).

Generated data: every sample is 8 item ids drawn Zipf(1.3) from a table of ``--rows`` items
(a few items are very popular, most are rare, as in recommendation logs); each item has a
hidden effect of +1 or -1 (a hash of its id), and the sample is clicked with probability
``sigmoid(0.75 * sum of its items' effects)``.  The model: an EmbeddingBag of ``--dim``
(sum of the 8 items' vectors), then a small MLP to one logit, binary cross-entropy, AdaGrad on
the servers.  The table is created on the servers (``ps_initializer``: no worker holds it) and
each step pulls only the rows of its batch; the next batch's rows are prefetched while the
step's gradients travel.

Each worker draws its own batches (seed and rank); rank 0 prints the mean training loss and the
AUC on 20,000 held-out samples every ``--eval-every`` steps, then ``auc=`` and the AUC the true
click probabilities reach on the same samples (``best_auc=``, no model can beat it on average).

    mxdist launch -n 2 -s 2 examples/recsys_torch.py             # 2 workers, the table split over 2 servers
    python examples/recsys_torch.py                              # one process ('local' store)
"""
from __future__ import annotations

import argparse
import os
import sys
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
    sys.exit("recsys_torch.py needs PyTorch: pip install torch (a CPU build is enough)")

import psnode.torch as pt

IDS, ZIPF, EFFECT, TEST = 8, 1.3, 0.75, 20_000


def effects(ids: np.ndarray) -> np.ndarray:
    """Each item's hidden effect, +1 or -1: a hash of its id (the same in every process)."""
    h = (ids.astype(np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
    return np.where((h >> np.uint64(61)) & np.uint64(1), 1.0, -1.0)


def draw(rng: np.random.Generator, n: int, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` samples: (ids [n, 8], clicks [n] as 0/1 floats, the true click probabilities)."""
    ids = (rng.zipf(ZIPF, (n, IDS)) - 1) % rows
    p = 1 / (1 + np.exp(-EFFECT * effects(ids).sum(axis=1)))
    clicks = (rng.random(n) < p).astype(np.float32)
    return ids.astype(np.int64), clicks, p


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve: the chance a random click scores above a random non-click
    (ties count half)."""
    order = np.argsort(scores, kind="stable")
    s = scores[order]
    ranks = np.empty(len(s))
    lo = 0
    while lo < len(s):                       # average ranks over ties
        hi = lo
        while hi + 1 < len(s) and s[hi + 1] == s[lo]:
            hi += 1
        ranks[order[lo:hi + 1]] = (lo + hi) / 2 + 1
        lo = hi + 1
    pos = labels > 0.5
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


class CTR(nn.Module):
    def __init__(self, rows: int, dim: int, kv, seed: int) -> None:
        super().__init__()
        self.emb = pt.EmbeddingBag(rows, dim, mode="sum", kv=kv, key="items",
                                   initializer=psnode.init.Normal(0.01), seed=seed)
        torch.manual_seed(seed)
        self.mlp = nn.Sequential(nn.Linear(dim, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.emb(ids)).squeeze(-1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000, help="items in the table")
    p.add_argument("--dim", type=int, default=16, help="embedding size")
    p.add_argument("--steps", type=int, default=600, help="training steps per worker")
    p.add_argument("--batch-size", type=int, default=256, help="samples per step per worker")
    p.add_argument("--lr", type=float, default=0.1, help="AdaGrad learning rate (on the servers)")
    p.add_argument("--eval-every", type=int, default=200, help="steps between evaluations")
    p.add_argument("--no-prefetch", action="store_true", help="pull each batch's rows in its forward")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kvstore", default="dist_sync", choices=psnode.kv.TYPES)
    args = p.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))

    kv = create_kv(args.kvstore)
    model = CTR(args.rows, args.dim, kv, args.seed)
    trainer = pt.DistributedTrainer(model, kv, psnode.optimizer.create("adagrad", learning_rate=args.lr))
    rng = np.random.default_rng(args.seed + 1 + 1000 * kv.rank)
    test_ids, test_clicks, test_p = draw(np.random.default_rng(args.seed + 999_999), TEST, args.rows)
    test_ids_t = torch.from_numpy(test_ids)
    say = print if kv.rank == 0 else (lambda *a, **k: None)
    say(f"recsys_torch: kvstore={kv.type} workers={kv.num_workers} servers={kv.num_servers} rows={args.rows} "
        f"dim={args.dim} steps={args.steps} batch_size={args.batch_size}x{kv.num_workers}", flush=True)

    def evaluate() -> float:
        with torch.no_grad():
            return auc(model(test_ids_t).numpy(), test_clicks)

    ids, clicks, _ = draw(rng, args.batch_size, args.rows)
    losses: list[float] = []
    start = time.monotonic()
    score = 0.5
    for step in range(1, args.steps + 1):
        x, y = torch.from_numpy(ids), torch.from_numpy(clicks)
        trainer.zero_grad()
        loss = F.binary_cross_entropy_with_logits(model(x), y)
        loss.backward()
        ids, clicks, _ = draw(rng, args.batch_size, args.rows)     # the next batch: known now
        if not args.no_prefetch:
            model.emb.prefetch(torch.from_numpy(ids))             # its rows come with this step
        trainer.step()
        losses.append(loss.item())
        if step % args.eval_every == 0 or step == args.steps:
            score = evaluate()
            say(f"step {step}/{args.steps} loss={np.mean(losses):.4f} test_auc={score:.4f} "
                f"time={time.monotonic() - start:.1f}s", flush=True)
            losses = []
    kv.barrier()
    say(f"best_auc={auc(test_p, test_clicks):.4f}")
    say(f"auc={score:.4f}", flush=True)
    kv.close()


if __name__ == "__main__":
    main()
