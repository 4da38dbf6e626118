"""The digits MLP with dist_async: each worker's gradients are applied on arrival.

    python examples/async_numpy.py                        # one process ('local' kvstore)
    mxdist launch -n 2 -s 2 examples/async_numpy.py       # 2 workers, 2 servers, dist_async

No worker waits for the others: a pull returns the weights as they are after this worker's
own push was applied (other workers' pushes included whenever they arrived first), so the
workers' weights differ slightly while training and the run is not bit-reproducible.  Each
push is one optimizer step on the servers, so W workers take W times as many steps per epoch
as a sync run: the default learning rate is lower.  At the end every worker waits at a barrier
(all pushes applied) and pulls the final weights; rank 0 reports their test accuracy.
"""
from __future__ import annotations

import common
import numpy as np
from mlp_numpy import PARAM_NAMES, accuracy, init_params, loss_and_grads, save

import psnode


def main() -> None:
    args = common.parser(__doc__.splitlines()[0], lr=0.05, kvstore="dist_async").parse_args()
    x_train, y_train, x_test, y_test = common.load_digits()
    kv = common.create_kv(args.kvstore, args.aggregator)
    progress = common.Progress(kv, args, "async_numpy")

    params = init_params(x_train.shape[1], args.hidden, 10, args.seed)
    kv.set_optimizer(psnode.optimizer.create("sgd", learning_rate=args.lr,
                                             momentum=args.momentum, wd=args.wd))
    kv.init(list(PARAM_NAMES), [params[k] for k in PARAM_NAMES])
    names, outs = list(PARAM_NAMES), [params[k] for k in PARAM_NAMES]

    for epoch in range(args.epochs):
        idx = common.epoch_indices(len(x_train), kv, epoch, args.seed)
        xs, ys = x_train[idx], y_train[idx]
        losses = []
        for batch in common.batches(len(idx), args.batch_size):
            loss, grads = loss_and_grads(params, xs[batch], ys[batch])
            losses.append(loss)
            for i, k in enumerate(names):
                kv.push(k, grads[k], priority=-i)
            kv.pull(names, out=outs, priority=-len(names))   # no round to wait for
            progress.step(args.batch_size)
        # rank 0's current (possibly slightly stale) view; no barrier: workers run free
        progress.epoch(epoch, float(np.mean(losses)) if losses else float("nan"),
                       accuracy(params, x_test, y_test))
    kv.barrier()                            # every worker's pushes are applied
    kv.pull(names, out=outs)
    progress.done(accuracy(params, x_test, y_test))
    save(args.save, kv, params)
    kv.close()


if __name__ == "__main__":
    main()
