"""Elastic training: workers join and leave a running job; the weights stay exact.

    mxdist launch -d -n 2 --max-workers 4 examples/elastic_numpy.py    # then, while it runs:
    mxdist scale 4          # workers 2 and 3 join at the next rounds
    mxdist scale 2          # workers 3 and 2 leave at a round boundary (exit code 0)
    python examples/elastic_numpy.py                                   # one process ('local')

By default it runs about a minute (1200 steps of at least ``--step-time`` 0.05 s, the time a
real step's compute would take), long enough to scale it by hand; ``--step-time 0`` runs the
steps as fast as they go.

Least squares on synthetic data (``y = X @ w_true``).  Each step every member pushes the
gradient of one batch of its shard; the servers average the pushes of the round's contributors
and run SGD; every worker pulls the new weights.  A step is a round of the key ``w``: a worker
that joins starts at ``kv.num_pushes('w')`` (the rounds done before its first), exactly as a
restarted one resumes.

The script's own counters are its elastic state, in the pattern of Horovod's
``hvd.elastic.State``: :meth:`State.commit` once a step's pull is in, :meth:`State.restore` from
the servers when the worker starts.  A membership change re-shards the data at the next step
(``kv.on_membership_change``): each member takes the ``psnode.data.ShardSampler`` shard of its
position among the members as it sees them.  (``ShardSampler(n, kv=kv)`` shards over members
agreed in a barrier at ``set_epoch`` instead; a joiner may start mid-epoch, before a barrier the
others hold at an epoch's start, so this script does without one: two workers may see a change
one step apart, which only changes the samples drawn, never the exactness of the rounds.)  A
worker asked to leave ends on its own terms (``kv.leaving``).
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import common
import numpy as np

import psnode
from psnode.data import ShardSampler


@dataclass
class State:
    """The script's counters: ``step`` (the next round to push) and the last committed one."""

    step: int = 0
    committed: int = 0

    def commit(self) -> None:
        self.committed = self.step

    def restore(self, kv: psnode.kv.KVStore) -> None:
        """Where this worker starts: the rounds of ``w`` done before its first push."""
        self.step = self.committed = kv.num_pushes("w")


def make_data(n: int, dim: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    w_true = rng.standard_normal(dim).astype(np.float32)
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x, x @ w_true, w_true


def shard(kv: psnode.kv.KVStore, n: int, epoch: int, seed: int) -> ShardSampler:
    """This worker's shard for ``epoch``: by its position among the members now."""
    members = kv.members if kv.members else [kv.rank]
    sampler = ShardSampler(n, num_replicas=len(members), rank=members.index(kv.rank), seed=seed)
    sampler.set_epoch(epoch)
    return sampler


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kvstore", default="dist_sync", choices=psnode.kv.TYPES,
                   help="KVStore type; without a launcher dist_* falls back to 'local'")
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--step-time", type=float, default=0.05,
                   help="seconds each step takes at least (a stand-in for a real step's compute)")
    p.add_argument("--steps-per-epoch", type=int, default=50)
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    kv = common.create_kv(args.kvstore)
    x, y, w_true = make_data(args.samples, args.dim, args.seed)
    kv.set_optimizer(psnode.optimizer.create("sgd", learning_rate=args.lr))
    kv.init("w", np.zeros(args.dim, np.float32))      # a joiner gets the current weights
    changed: list[int] = []
    kv.on_membership_change(lambda generation, members: changed.append(generation))

    state = State()
    state.restore(kv)
    w = np.empty(args.dim, np.float32)
    kv.pull("w", out=w)
    sampler = None
    print(f"worker {kv.rank}: starts at step {state.step} of {args.steps}, members {kv.members}", flush=True)
    while state.step < args.steps:
        if kv.leaving:
            print(f"worker {kv.rank}: leaves at step {state.step}", flush=True)
            break
        epoch, batch = divmod(state.step, args.steps_per_epoch)
        if sampler is None or changed or batch == 0:
            changed.clear()
            sampler = shard(kv, len(x), epoch, args.seed)
        time.sleep(args.step_time)
        idx = sampler.indices()
        take = idx[np.arange(batch * args.batch_size, (batch + 1) * args.batch_size) % len(idx)]
        grad = x[take].T @ (x[take] @ w - y[take]) / len(take)
        try:
            kv.push("w", grad.astype(np.float32))
        except psnode.errors.Leave:   # asked to leave after the check above: the push left
            print(f"worker {kv.rank}: leaves at step {state.step}", flush=True)
            raise
        kv.pull("w", out=w)
        state.step += 1
        state.commit()
        if kv.rank == min(kv.members or [kv.rank]) and state.step % args.steps_per_epoch == 0:
            loss = float(np.mean((x @ w - y) ** 2))
            print(f"epoch {epoch}: loss={loss:.6f} workers={kv.num_workers} generation={kv.generation}",
                  flush=True)
    print(f"worker {kv.rank}: done at step {state.committed}, |w - w_true|={np.linalg.norm(w - w_true):.6f}",
          flush=True)
    kv.close()


if __name__ == "__main__":
    main()
