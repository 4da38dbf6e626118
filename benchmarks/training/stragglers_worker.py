"""One worker of benchmarks/training/stragglers.py: examples/mlp_numpy.py's digits MLP, trained with
plain SGD on the servers, a fixed data shard per worker, and a sleep per step that stands for
its compute time (straggling as the scenario says).

    python benchmarks/training/stragglers_worker.py '{"mode": "dist_ssp", "staleness": 3, ...}'   # under a job

Per step a worker sleeps ``step_s`` (times ``slow`` on a straggling step: transient, each step
each worker with probability ``p``, seeded per rank; persistent, every step of rank
``slow_rank``), computes its batch's gradients on the weights it holds, pushes them and pulls
the weights.  After each pull it evaluates the training loss of those weights on the whole
training set and records (seconds since the common start, loss).  At the end (a barrier, then a
pull: every push is in) rank 0 reports the test accuracy.  One ``BENCHRESULT {json}`` line per
worker (benchmarks.cases.MARK).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

#: The repository: a folder above this file, or (the harness runs a copy of it) the one on sys.path.
ROOT = next(p for p in [*Path(__file__).resolve().parents, *map(Path, sys.path)]
            if (p / "examples" / "mlp_numpy.py").exists())
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT))

import common as ex_common  # noqa: E402  (examples/common.py)
import mlp_numpy as mlp  # noqa: E402

import psnode  # noqa: E402
from benchmarks.cases import MARK  # noqa: E402


def main() -> None:
    cfg = json.loads(sys.argv[1])
    mode, staleness = cfg["mode"], cfg.get("staleness")
    backup = cfg.get("backup") or None   # (dist_sync only: backup workers)
    kv = psnode.kv.create(mode, aggregator=cfg.get("aggregator", "sum"), staleness=staleness, backup_workers=backup)
    W, r = kv.num_workers, kv.rank
    x_train, y_train, x_test, y_test = ex_common.load_digits()
    shard = np.arange(len(x_train))[r::W]                 # a fixed shard per worker
    params = mlp.init_params(x_train.shape[1], cfg["hidden"], 10, cfg["seed"])
    kv.set_optimizer(psnode.optimizer.create("sgd", learning_rate=cfg["lr"]))
    names = list(mlp.PARAM_NAMES)
    kv.init(names, [params[k] for k in names])
    batch_rng = np.random.default_rng(cfg["seed"] + 17 * r + 1)
    slow_rng = np.random.default_rng(cfg["straggle_seed"] + 101 * r)
    kv.barrier()
    t0 = time.time()
    curve, slow_steps = [], 0
    for _ in range(cfg["steps"]):
        if cfg["kind"] == "transient":
            slow = slow_rng.random() < cfg["p"]
        else:
            slow = cfg["kind"] == "persistent" and r == cfg["slow_rank"]
        slow_steps += slow
        time.sleep(cfg["step_s"] * (cfg["slow"] if slow else 1.0))
        idx = batch_rng.choice(shard, cfg["batch"], replace=False)
        _, grads = mlp.loss_and_grads(params, x_train[idx], y_train[idx])
        for i, k in enumerate(names):
            kv.push(k, grads[k], priority=-i)
        kv.pull(names, out=[params[k] for k in names])
        loss, _ = mlp.loss_and_grads(params, x_train, y_train)
        curve.append((round(time.time() - t0, 4), round(loss, 5)))
    kv.barrier()
    kv.pull(names, out=[params[k] for k in names])
    final_loss, _ = mlp.loss_and_grads(params, x_train, y_train)
    acc = mlp.accuracy(params, x_test, y_test)
    print(MARK + json.dumps({"rank": r, "curve": curve, "slow_steps": slow_steps, "final_loss": final_loss,
                             "accuracy": acc, "seconds": time.time() - t0}), flush=True)
    kv.close()


if __name__ == "__main__":
    main()
