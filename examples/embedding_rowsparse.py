"""Matrix factorisation with row_sparse embeddings: the seed's second aggregator.

A synthetic ratings matrix of rank 4 (5,000 users x 2,000 items, 300,000 observed ratings,
noise 0.05) is learned as two embedding tables, ``user`` and ``item``, stored on the servers as
``row_sparse`` keys.  Each step a worker takes a minibatch of its shard of the ratings, pulls
only the embedding rows that minibatch touches (``row_sparse_pull``), computes the squared-error
gradient for those rows, and pushes them back as a ``row_sparse_array``: traffic and server work
scale with the touched rows, not with the tables.  Server-side SGD updates lazily (only the rows
present).  Gradients are summed per row and the store uses the ``sum`` aggregator, so W workers
with batch b make the updates of one process with batch W*b.  Rank 0 prints the held-out RMSE per epoch and a final ``rmse=`` line.

    mxdist launch -n 2 -s 2 examples/embedding_rowsparse.py
    python examples/embedding_rowsparse.py        # one process ('local' store)
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
from psnode.sparse import row_sparse_array

USERS, ITEMS, RANK, OBSERVED, NOISE = 5_000, 2_000, 4, 300_000, 0.05


def ratings(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(users, items, ratings) of the synthetic low-rank matrix; identical in every process."""
    rng = np.random.default_rng(seed)
    u = rng.standard_normal((USERS, RANK)) / np.sqrt(RANK)
    v = rng.standard_normal((ITEMS, RANK))
    users = rng.integers(0, USERS, OBSERVED)
    items = rng.integers(0, ITEMS, OBSERVED)
    r = (u[users] * v[items]).sum(axis=1) + NOISE * rng.standard_normal(OBSERVED)
    return users, items, r.astype(np.float32)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=1000, help="ratings per step per worker")
    p.add_argument("--dim", type=int, default=8, help="embedding size")
    p.add_argument("--wd", type=float, default=0.01, help="weight decay (lazy: touched rows only)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--aggregator", default="sum", choices=psnode.kv.AGGREGATORS)
    p.add_argument("--kvstore", default="dist_sync", choices=psnode.kv.TYPES)
    args = p.parse_args()

    kv = create_kv(args.kvstore, args.aggregator)
    kv.set_optimizer(psnode.optimizer.create("sgd", learning_rate=args.lr, wd=args.wd))
    rng = np.random.default_rng(1)
    user = (0.3 * rng.standard_normal((USERS, args.dim))).astype(np.float32)
    item = (0.3 * rng.standard_normal((ITEMS, args.dim))).astype(np.float32)
    kv.init("user", user, stype="row_sparse")      # rank 0's tables win
    kv.init("item", item, stype="row_sparse")

    users, items, r = ratings()
    n_test = OBSERVED // 10
    test = slice(0, n_test)
    train = np.arange(n_test, OBSERVED)
    start = time.monotonic()
    for epoch in range(args.epochs):
        mine = train[psnode.data.shard_indices(len(train), kv.num_workers, kv.rank, epoch=epoch,
                                               seed=0, drop_last=True)]
        for lo in range(0, len(mine) - args.batch_size + 1, args.batch_size):
            batch = mine[lo:lo + args.batch_size]
            bu, bi, br = users[batch], items[batch], r[batch]
            uid, u_inv = np.unique(bu, return_inverse=True)
            iid, i_inv = np.unique(bi, return_inverse=True)
            pu = kv.row_sparse_pull("user", row_ids=uid).data      # only the touched rows
            qi = kv.row_sparse_pull("item", row_ids=iid).data
            err = (pu[u_inv] * qi[i_inv]).sum(axis=1) - br          # d(0.5 err^2)/d(pred)
            gu = np.zeros_like(pu)
            gi = np.zeros_like(qi)
            np.add.at(gu, u_inv, err[:, None] * qi[i_inv])            # summed per row
            np.add.at(gi, i_inv, err[:, None] * pu[u_inv])
            kv.push("user", row_sparse_array((gu, uid), shape=(USERS, args.dim)))
            kv.push("item", row_sparse_array((gi, iid), shape=(ITEMS, args.dim)))
        if kv.rank == 0:
            tu, tu_inv = np.unique(users[test], return_inverse=True)
            ti, ti_inv = np.unique(items[test], return_inverse=True)
            pu = kv.row_sparse_pull("user", row_ids=tu).data
            qi = kv.row_sparse_pull("item", row_ids=ti).data
            pred = (pu[tu_inv] * qi[ti_inv]).sum(axis=1)
            rmse = float(np.sqrt(np.mean((pred - r[test]) ** 2)))
            print(f"epoch {epoch + 1}/{args.epochs} test_rmse={rmse:.4f} "
                  f"time={time.monotonic() - start:.1f}s", flush=True)
    kv.barrier()
    if kv.rank == 0:
        print(f"rmse={rmse:.4f} (rating std {float(r.std()):.3f})", flush=True)
    kv.close()


if __name__ == "__main__":
    main()
