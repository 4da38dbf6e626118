"""Shared helpers of the examples: the digits dataset, options, kvstore choice, sharding, logging.

The dataset is scikit-learn's handwritten digits (1797 8x8 images, 10 classes, shipped inside
the scikit-learn package: no download).  The split is fixed (seed 0: 1437 train, 360 test) and
features are standardized with the training set's mean and standard deviation, so every
process of a job - and a single-process run - sees exactly the same arrays.

Equivalence of a distributed run and a single-process run
---------------------------------------------------------
Each epoch, :func:`epoch_indices` takes one permutation of the training set that depends only
on ``(seed, epoch)`` (:func:`psnode.data.shard_indices`) and gives worker ``r`` of ``W`` the
positions ``r, r + W, ...`` (``drop_last``: equal shards).  Batch ``i`` of every worker
(``batch_size`` rows, incomplete batches dropped) therefore covers positions
``[i*W*b, (i+1)*W*b)`` of the permutation together, and with ``dist_sync`` + ``average`` the
server applies the optimizer to the mean gradient over exactly those ``W*b`` samples.  A
single-process run (``'local'`` kvstore: same server code in-process) with ``--batch-size W*b``
takes the very same batches, so both runs compute the same updates up to float32 rounding
(the order of the sum).  With ``mxdist launch --distribution param`` every worker reads the
full dataset instead, each in its own order (only the parameters are spread over the
servers); ``data`` and ``hybrid`` shard the dataset as above.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import numpy as np

import psnode

TEST_FRACTION = 0.2
SPLIT_SEED = 0


def load_digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(x_train, y_train, x_test, y_test)``: float32 features (standardized), int64 labels."""
    try:
        from sklearn.datasets import load_digits as sk_load_digits
    except ImportError:
        sys.exit("the examples need scikit-learn for their dataset: pip install scikit-learn")
    digits = sk_load_digits()
    x = digits.data.astype(np.float64)
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(SPLIT_SEED).permutation(len(x))
    n_test = int(round(len(x) * TEST_FRACTION))
    test, train = order[:n_test], order[n_test:]
    mean = x[train].mean(axis=0)
    std = x[train].std(axis=0)
    std[std == 0] = 1.0
    x = ((x - mean) / std).astype(np.float32)
    return x[train], y[train], x[test], y[test]


def parser(description: str, epochs: int = 10, batch_size: int = 32, lr: float = 0.1,
           kvstore: str = "dist_sync") -> argparse.ArgumentParser:
    """The options every example shares."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--epochs", type=int, default=epochs, help="passes over the training set")
    p.add_argument("--batch-size", type=int, default=batch_size,
                   help="samples per step on each worker (global batch = workers x this)")
    p.add_argument("--lr", type=float, default=lr, help="learning rate (server-side SGD)")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    p.add_argument("--wd", type=float, default=0.0, help="weight decay")
    p.add_argument("--hidden", type=int, default=64, help="hidden units of the MLP")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the shuffles")
    p.add_argument("--kvstore", default=kvstore, choices=psnode.kv.TYPES,
                   help="KVStore type; without a launcher dist_* falls back to 'local'")
    p.add_argument("--aggregator", default="average", choices=psnode.kv.AGGREGATORS)
    p.add_argument("--save", default=None, metavar="FILE.npz",
                   help="rank 0 writes the final weights here")
    return p


def create_kv(kind: str, aggregator: str = "average") -> Any:
    """``psnode.kv.create(kind)``; a dist_* type outside a launched job becomes 'local'."""
    if kind != "local" and not os.environ.get("PSNODE_ROLE"):
        print(f"note: not started by a launcher (no PSNODE_ROLE): using a 'local' kvstore "
              f"instead of {kind!r} (single process; use `mxdist launch` to distribute)",
              flush=True)
        kind = "local"
    return psnode.kv.create(kind, aggregator=aggregator)


def epoch_indices(n: int, kv: Any, epoch: int, seed: int) -> np.ndarray:
    """This worker's training rows for ``epoch`` (see the module docstring)."""
    if kv.distribution == "param":
        # param mode: every worker reads the full dataset, each in its own order
        return psnode.data.shard_indices(n, 1, 0, epoch=epoch, seed=seed + 1000 * kv.rank)
    return psnode.data.shard_indices(n, kv.num_workers, kv.rank, epoch=epoch, seed=seed,
                                     shuffle=True, drop_last=True)


def batches(n: int, batch_size: int) -> list[slice]:
    """Full batches of ``range(n)`` (the incomplete tail is dropped)."""
    return [slice(lo, lo + batch_size) for lo in range(0, n - batch_size + 1, batch_size)]


class Progress:
    """Per-epoch lines and the final ``accuracy=`` line, printed by rank 0 only."""

    def __init__(self, kv: Any, args: argparse.Namespace, name: str) -> None:
        self.kv = kv
        self.args = args
        self.samples = 0
        self.start = time.monotonic()
        self.say(f"{name}: kvstore={kv.type} workers={kv.num_workers} servers={kv.num_servers} "
                 f"distribution={kv.distribution} epochs={args.epochs} "
                 f"batch_size={args.batch_size}x{kv.num_workers} lr={args.lr}")

    def say(self, text: str) -> None:
        if self.kv.rank == 0:
            print(text, flush=True)

    def step(self, batch_size: int) -> None:
        """Count one step: every worker trained on ``batch_size`` samples (sync)."""
        self.samples += batch_size * self.kv.num_workers

    def epoch(self, epoch: int, loss: float, accuracy: float) -> None:
        self.say(f"epoch {epoch + 1}/{self.args.epochs} loss={loss:.4f} test_acc={accuracy:.4f} "
                 f"samples={self.samples} time={time.monotonic() - self.start:.1f}s")

    def done(self, accuracy: float) -> None:
        self.say(f"samples={self.samples}")
        self.say(f"accuracy={accuracy:.4f}")
