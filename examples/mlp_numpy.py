"""A numpy MLP on scikit-learn's handwritten digits, trained through a psnode KVStore.

    python examples/mlp_numpy.py                          # one process ('local' kvstore)
    mxdist launch -n 2 -s 2 examples/mlp_numpy.py         # 2 workers, 2 servers, dist_sync
    mxdist launch -n 2 -s 2 examples/mlp_numpy.py --compression 2bit   # 2-bit gradient pushes

Every worker trains on its shard of the data (``examples/common.py``), pushes its gradients
(one key per parameter, averaged over the workers on the servers, which run SGD with
momentum) and pulls the new weights.  Rank 0 prints one line per epoch and ``accuracy=...``.
With W workers and ``--batch-size b`` the run computes the same updates as a single process
with ``--batch-size W*b`` (see common.py), so the test accuracies agree.  ``--compression``
turns on MXNet's gradient compression (``kv.set_gradient_compression``): pushes travel as 2 bits
(or 1 bit, or float16) per element with each worker's residual carried, pulls stay float32.
"""
from __future__ import annotations

import common
import numpy as np

import psnode

PARAM_NAMES = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")


def init_params(n_in: int, hidden: int, n_out: int, seed: int) -> dict[str, np.ndarray]:
    """Xavier weights (MXNet layout: ``(out, in)``), zero biases; float32, seeded."""
    rng = np.random.default_rng(seed)
    xavier = psnode.init.Xavier(rnd_type="uniform", factor_type="avg", magnitude=3)
    params = {
        "fc1.weight": np.empty((hidden, n_in), np.float32),
        "fc1.bias": np.zeros(hidden, np.float32),
        "fc2.weight": np.empty((n_out, hidden), np.float32),
        "fc2.bias": np.zeros(n_out, np.float32),
    }
    xavier(params["fc1.weight"], rng)
    xavier(params["fc2.weight"], rng)
    return params


def forward(params: dict[str, np.ndarray], x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(hidden activations, logits)``."""
    h = np.maximum(x @ params["fc1.weight"].T + params["fc1.bias"], 0)
    return h, h @ params["fc2.weight"].T + params["fc2.bias"]


def loss_and_grads(params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray
                   ) -> tuple[float, dict[str, np.ndarray]]:
    """Mean softmax cross-entropy over the batch and its gradients (float32)."""
    h, logits = forward(params, x)
    logits = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(logits)
    prob = exp / exp.sum(axis=1, keepdims=True)
    n = len(x)
    loss = float(-np.log(prob[np.arange(n), y] + 1e-12).mean())
    d = prob
    d[np.arange(n), y] -= 1
    d /= n
    dh = d @ params["fc2.weight"]
    dh[h <= 0] = 0
    grads = {"fc1.weight": dh.T @ x, "fc1.bias": dh.sum(axis=0),
             "fc2.weight": d.T @ h, "fc2.bias": d.sum(axis=0)}
    return loss, {k: v.astype(np.float32, copy=False) for k, v in grads.items()}


def accuracy(params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> float:
    return float((forward(params, x)[1].argmax(axis=1) == y).mean())


def save(path: str | None, kv, params: dict[str, np.ndarray]) -> None:
    """``--save FILE``: rank 0 writes FILE; a ``{rank}`` in FILE makes every worker write."""
    if path and ("{rank}" in path or kv.rank == 0):
        np.savez(path.format(rank=kv.rank), **params)


def parser():
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--compression", default="none", choices=("none", "2bit", "1bit", "fp16"),
                   help="gradient compression of the pushes (kv.set_gradient_compression)")
    p.add_argument("--compression-threshold", type=float, default=0.5,
                   help="threshold of 2bit and 1bit compression (MXNet's default: 0.5)")
    return p


def compression(args) -> dict:
    """``kv.set_gradient_compression``'s argument for the command line's choice."""
    if args.compression in ("2bit", "1bit"):
        return {"type": args.compression, "threshold": args.compression_threshold}
    return {"type": args.compression}


def main() -> None:
    args = parser().parse_args()
    x_train, y_train, x_test, y_test = common.load_digits()
    kv = common.create_kv(args.kvstore, args.aggregator)
    kv.set_gradient_compression(compression(args))   # before the first push (MXNet's rule)
    progress = common.Progress(kv, args, "mlp_numpy")
    if args.compression != "none":
        progress.say(f"gradient compression: {kv.gradient_compression} (pulls stay float32)")

    params = init_params(x_train.shape[1], args.hidden, 10, args.seed)
    kv.set_optimizer(psnode.optimizer.create("sgd", learning_rate=args.lr,
                                             momentum=args.momentum, wd=args.wd))
    kv.init(list(PARAM_NAMES), [params[k] for k in PARAM_NAMES])  # rank 0's weights everywhere

    acc = 0.0
    for epoch in range(args.epochs):
        idx = common.epoch_indices(len(x_train), kv, epoch, args.seed)
        xs, ys = x_train[idx], y_train[idx]
        losses = []
        for batch in common.batches(len(idx), args.batch_size):
            loss, grads = loss_and_grads(params, xs[batch], ys[batch])
            losses.append(loss)
            for i, k in enumerate(PARAM_NAMES):       # first layer first
                kv.push(k, grads[k], priority=-i)
            # pull after (below) every push; in layer order
            kv.pull(list(PARAM_NAMES), out=[params[k] for k in PARAM_NAMES],
                    priority=-len(PARAM_NAMES))
            progress.step(args.batch_size)
        acc = accuracy(params, x_test, y_test)
        progress.epoch(epoch, float(np.mean(losses)) if losses else float("nan"), acc)
    progress.done(acc)
    save(args.save, kv, params)
    kv.close()


if __name__ == "__main__":
    main()
