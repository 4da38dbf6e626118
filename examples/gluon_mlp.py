"""The digits MLP of examples/mlp_numpy.py in MXNet Gluon, trained through psnode (``kvstore='psnode'``).

    pip install -e '.[mxnet,examples]'                       # MXNet 1.9.1 (its own venv: numpy < 1.24)
    python examples/gluon_mlp.py                             # one process (psnode's 'local' store)
    mxdist launch -n 2 -s 2 examples/gluon_mlp.py            # 2 workers, 2 servers: psnode dist_sync
    mxdist launch --engine mxnet -n 2 -s 2 examples/gluon_mlp.py   # MXNet's own dist_sync (ps-lite)
    python examples/gluon_mlp.py --kvstore none              # MXNet alone, no kvstore

The data, the model (64 -> hidden ReLU -> 10, Xavier uniform weights, zero biases), the
optimizer (SGD with momentum) and the sharding are those of mlp_numpy.py (examples/common.py):
each worker trains on its shard, and ``trainer.step(W * batch_size)`` makes a step of W workers
the update one process makes over the W*b samples (psnode.mxnet sums the workers' gradients,
as MXNet's dist_sync does).  Started with MXNet's ``DMLC_*`` variables (``mxdist launch --engine
mxnet``, or MXNet's own launcher) the default store is MXNet's ``dist_sync``; else psnode's.
``--update-on-kvstore`` runs the SGD on psnode's servers
(MXNet's optimizer sent as a psnode optimizer spec); ``--no-update-on-kvstore`` pushpulls the
gradients and runs MXNet's SGD on every worker.  Rank 0 prints one line per epoch and
``accuracy=...``; ``--save FILE`` writes the final weights (``{rank}`` in FILE: every worker).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

try:
    import mxnet as mx
    from mxnet import autograd, gluon
except ImportError:
    sys.exit("this example needs MXNet 1.9: pip install -e '.[mxnet,examples]' (in a venv of its own: "
             "MXNet needs numpy < 1.24)")

import common

import psnode.mxnet  # noqa: F401 - registers 'psnode' and 'psnode_async' with MXNet's kvstore registry

KVSTORES = ("psnode", "psnode_async", "local", "device", "dist_sync", "dist_async", "none")


def default_kvstore() -> str:
    """MXNet's dist_sync in a job of MXNet's own processes (``DMLC_ROLE`` set), else psnode."""
    return "dist_sync" if os.environ.get("DMLC_ROLE") else "psnode"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=10, help="passes over the training set")
    p.add_argument("--batch-size", type=int, default=32, help="samples per step on each worker")
    p.add_argument("--lr", type=float, default=0.1, help="learning rate")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    p.add_argument("--wd", type=float, default=0.0, help="weight decay")
    p.add_argument("--hidden", type=int, default=64, help="hidden units of the MLP")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the shuffles")
    p.add_argument("--kvstore", default=default_kvstore(), choices=KVSTORES,
                   help="psnode's stores, MXNet's own, or none (default: dist_sync under mxdist launch "
                        "--engine mxnet, else psnode)")
    p.add_argument("--update-on-kvstore", action=argparse.BooleanOptionalAction, default=None,
                   help="run the optimizer on the kvstore's servers (default: MXNet's choice)")
    p.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: whole epochs)")
    p.add_argument("--save", default=None, metavar="FILE.npz", help="rank 0 writes the final weights here")
    return p


def build(hidden: int, seed: int) -> gluon.nn.HybridSequential:
    """The MLP, its weights drawn from ``seed`` (rank 0's reach every worker through the kvstore)."""
    mx.random.seed(seed)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(hidden, activation="relu", in_units=64), gluon.nn.Dense(10, in_units=hidden))
    net.initialize(mx.init.Xavier(rnd_type="uniform", factor_type="avg", magnitude=3))
    return net


class Job:
    """Rank, workers and sharding of this process (a kvstore's, or one process without one)."""

    def __init__(self, kv) -> None:
        store = getattr(kv, "store", None)      # psnode's own store behind psnode.mxnet's
        self.rank = kv.rank if kv is not None else 0
        self.num_workers = kv.num_workers if kv is not None else 1
        self.num_servers = store.num_servers if store is not None else int(os.environ.get("DMLC_NUM_SERVER", 0))
        self.distribution = store.distribution if store is not None else "data"
        self.type = kv.type if kv is not None else "none"


def accuracy(net, x: np.ndarray, y: np.ndarray) -> float:
    return float((net(mx.nd.array(x)).argmax(axis=1).asnumpy().astype(np.int64) == y).mean())


def main() -> None:
    args = parser().parse_args()
    x_train, y_train, x_test, y_test = common.load_digits()
    kv = None if args.kvstore == "none" else mx.kv.create(args.kvstore)
    job = Job(kv)
    progress = common.Progress(job, args, "gluon_mlp")
    net = build(args.hidden, args.seed)
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": args.lr, "momentum": args.momentum, "wd": args.wd},
                            kvstore=kv, update_on_kvstore=args.update_on_kvstore)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    acc, steps, start = 0.0, 0, time.monotonic()
    for epoch in range(args.epochs):
        idx = common.epoch_indices(len(x_train), job, epoch, args.seed)
        xs, ys = x_train[idx], y_train[idx]
        losses = []
        for batch in common.batches(len(idx), args.batch_size):
            x, y = mx.nd.array(xs[batch]), mx.nd.array(ys[batch])
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            trainer.step(args.batch_size * job.num_workers)   # the mean over every worker's samples
            losses.append(float(loss.mean().asscalar()))
            progress.step(args.batch_size)
            steps += 1
            if steps == args.steps:
                break
        acc = accuracy(net, x_test, y_test)
        progress.epoch(epoch, float(np.mean(losses)) if losses else float("nan"), acc)
        if steps == args.steps:
            break
    progress.say(f"steps={steps} steps_per_s={steps / (time.monotonic() - start):.1f} "
                 f"update_on_kvstore={trainer._update_on_kvstore}")
    progress.done(acc)
    if args.save and ("{rank}" in args.save or job.rank == 0):
        params = {name: p.data().asnumpy() for name, p in net.collect_params().items()}
        np.savez(args.save.format(rank=job.rank), **params)
    if kv is not None and hasattr(kv, "close"):
        kv.close()


if __name__ == "__main__":
    main()
