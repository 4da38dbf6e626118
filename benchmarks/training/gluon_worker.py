"""One worker of benchmarks/training/gluon.py: examples/gluon_mlp.py's model and data, timed steps.

    python benchmarks/training/gluon_worker.py SYSTEM CONFIG_JSON OUT_DIR

SYSTEM ``mxnet``: MXNet's own ``dist_sync`` store (its scheduler and servers started with the
DMLC_* variables); ``psnode``: ``mx.kv.create('psnode')`` under ``mxdist launch``.  The step is
the example's (forward, backward, ``trainer.step(W * b)``); after ``warmup`` steps ``steps``
more are timed to ``mx.nd.waitall()``.  Each rank writes ``OUT_DIR/<system>-<rank>.json``:
steps/s, the accuracy on the test set and a checksum of its weights (ranks must agree).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]

import common  # noqa: E402  (examples/common.py)
import gluon_mlp  # noqa: E402  (examples/gluon_mlp.py: the model, and psnode.mxnet registered)
import mxnet as mx  # noqa: E402
import numpy as np  # noqa: E402
from mxnet import autograd, gluon  # noqa: E402


def main() -> None:
    system, cfg, out_dir = sys.argv[1], json.loads(sys.argv[2]), Path(sys.argv[3])
    kv = mx.kv.create("psnode" if system == "psnode" else "dist_sync")
    job = gluon_mlp.Job(kv)
    x_train, y_train, x_test, y_test = common.load_digits()
    net = gluon_mlp.build(cfg["hidden"], 0)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": cfg["lr"], "momentum": 0.9},
                            kvstore=kv, update_on_kvstore=cfg["update_on_kvstore"])
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    b = cfg["batch"]
    steps, epoch, start = 0, 0, 0.0
    total = cfg["warmup"] + cfg["steps"]
    while steps < total:
        idx = common.epoch_indices(len(x_train), job, epoch, 0)
        for batch in common.batches(len(idx), b):
            if steps == cfg["warmup"]:
                mx.nd.waitall()
                start = time.perf_counter()
            x, y = mx.nd.array(x_train[idx][batch]), mx.nd.array(y_train[idx][batch])
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            trainer.step(b * job.num_workers)
            steps += 1
            if steps == total:
                break
        epoch += 1
    mx.nd.waitall()
    elapsed = time.perf_counter() - start
    weights = [p.data().asnumpy() for p in net.collect_params().values()]
    record = {"system": system, "rank": job.rank, "steps_per_s": cfg["steps"] / elapsed,
              "accuracy": gluon_mlp.accuracy(net, x_test, y_test),
              "checksum": float(sum(np.abs(w).sum(dtype=np.float64) for w in weights))}
    (out_dir / f"{system}-{job.rank}.json").write_text(json.dumps(record))
    if system == "psnode":
        kv.close()


if __name__ == "__main__":
    main()
