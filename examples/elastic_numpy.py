"""Linear regression in an elastic job: workers may join, leave or be lost while it trains.

    python examples/elastic_numpy.py                                  # one process ('local')
    mxdist launch -n 2 --min-workers 1 --max-workers 4 examples/elastic_numpy.py
    mxdist scale JOB 4        # two more workers join at the next round they agree on
    mxdist scale JOB 1        # the highest ranks leave at their next push

The state pattern (Horovod's commit/restore, in a few lines): the weights live on the servers,
so the script's own state is its step counter; ``kv.num_pushes`` is where this worker's pushes
continue, for a restarted worker and a joiner alike.  Each epoch is sharded over the members
agreed for it (``ShardSampler.set_epoch``, a barrier), so every sample of an epoch is seen once
by that epoch's workers; a joiner arriving in the middle of an epoch trains on its own view of
the members until the next epoch (the others are not at a barrier then).  A worker asked to
leave ends with ``psnode.errors.Leave`` (exit code 0) at its next push; this one checks
``kv.leaving`` first and says goodbye.
"""
from __future__ import annotations

import os

import numpy as np

import psnode
from psnode.data import ShardSampler

STEPS_PER_EPOCH, EPOCHS, BATCH = 20, 5, 16


def main() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2000, 8)).astype(np.float32)
    true_w = np.arange(1, 9, dtype=np.float32)
    y = x @ true_w
    kv = psnode.kv.create("dist_sync" if "PSNODE_ROLE" in os.environ else "local")
    kv.set_optimizer(psnode.optimizer.create("sgd", learning_rate=0.05))
    kv.init("w", np.zeros(8, np.float32))
    step = kv.num_pushes("w")                     # the state: where this worker's pushes continue
    kv.on_membership_change(lambda g, m: print(f"worker {kv.rank}: generation {g}, members {m}", flush=True))
    sampler = ShardSampler(len(x), kv=kv, seed=1)
    w = kv.pull("w", out=np.zeros(8, np.float32))
    while step < STEPS_PER_EPOCH * EPOCHS:
        if step % STEPS_PER_EPOCH == 0:
            sampler.set_epoch(step // STEPS_PER_EPOCH)   # a barrier: re-shards over this epoch's members
        else:   # a joiner in the middle of an epoch (the others are not at a barrier): its own view
            sampler.epoch = step // STEPS_PER_EPOCH
        idx = sampler.indices()
        for i in range(step % STEPS_PER_EPOCH, STEPS_PER_EPOCH):
            if kv.leaving:
                print(f"worker {kv.rank}: leaving after step {step}", flush=True)
                kv.close()
                return
            batch = idx[(i * BATCH) % len(idx):][:BATCH]
            grad = 2 * x[batch].T @ (x[batch] @ w - y[batch]) / len(batch)
            kv.push("w", grad)
            kv.pull("w", out=w)
            step += 1
    if kv.rank == min(kv.members):
        print(f"loss {float(np.mean((x @ w - y) ** 2)):.4f} after {step} steps on {kv.num_workers} worker(s)")
    kv.close()


if __name__ == "__main__":
    main()
