"""The digits MLP in PyTorch, trained through psnode.torch (optimizer on the servers).

    python examples/mlp_torch.py                          # one process ('local' kvstore)
    mxdist launch -n 2 -s 2 examples/mlp_torch.py         # 2 workers, 2 servers, dist_sync
    mxdist launch -n 2 -s 2 examples/mlp_torch.py --device cuda    # the same on GPUs

Same data, sharding, initial weights and update rule as ``mlp_numpy.py``: the model is a
``torch.nn.Sequential``, backward is torch's, and ``psnode.torch.DistributedTrainer`` pushes
the gradients and pulls the new weights (zero-copy views of CPU tensors; for CUDA, pinned
buffers filled while backward runs).  ``--device cuda`` puts worker ``LOCAL_RANK`` on GPU
``LOCAL_RANK % visible GPUs``: one GPU each when there are enough, else several workers share.
"""
from __future__ import annotations

import os
import sys

import common
import numpy as np
import torch
from mlp_numpy import init_params, save
from torch import nn

import psnode
import psnode.torch


def build_model(n_in: int, hidden: int, n_out: int, seed: int) -> nn.Module:
    """``fc1 -> relu -> fc2`` with the numpy example's initial weights."""
    model = nn.Sequential()
    model.add_module("fc1", nn.Linear(n_in, hidden))
    model.add_module("relu", nn.ReLU())
    model.add_module("fc2", nn.Linear(hidden, n_out))
    with torch.no_grad():
        for name, value in init_params(n_in, hidden, n_out, seed).items():
            model.get_parameter(name).copy_(torch.from_numpy(value))
    return model


def pick_device(spec: str) -> torch.device:
    """``cpu``, ``cuda:N``, or ``cuda``: this worker's GPU, ``LOCAL_RANK`` modulo the visible
    GPUs (torchrun's convention; workers share GPUs when there are fewer GPUs than workers)."""
    if spec.startswith("cuda") and not torch.cuda.is_available():
        sys.exit(f"--device {spec}: no CUDA device is visible here (torch.cuda.is_available() is False)")
    if spec == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return device
    return torch.device(spec)


def main() -> None:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu, cuda (LOCAL_RANK's GPU) or cuda:N")
    args = p.parse_args()
    torch.set_num_threads(1)          # small model: threads only add overhead
    device = pick_device(args.device)
    x_train, y_train, x_test, y_test = common.load_digits()
    x_test_t, y_test_t = torch.from_numpy(x_test).to(device), torch.from_numpy(y_test).to(device)
    kv = common.create_kv(args.kvstore, args.aggregator)
    progress = common.Progress(kv, args, "mlp_torch")
    print(f"worker {kv.rank}: device={device}", flush=True)

    model = build_model(x_train.shape[1], args.hidden, 10, args.seed).to(device)
    trainer = psnode.torch.DistributedTrainer(
        model, kv, psnode.optimizer.create("sgd", learning_rate=args.lr, momentum=args.momentum,
                                           wd=args.wd))
    loss_fn = nn.CrossEntropyLoss()

    acc = 0.0
    for epoch in range(args.epochs):
        idx = common.epoch_indices(len(x_train), kv, epoch, args.seed)
        xs, ys = torch.from_numpy(x_train[idx]).to(device), torch.from_numpy(y_train[idx]).to(device)
        losses = []
        model.train()
        for batch in common.batches(len(idx), args.batch_size):
            trainer.zero_grad()
            loss = loss_fn(model(xs[batch]), ys[batch])
            loss.backward()
            trainer.step()
            losses.append(loss.item())
            progress.step(args.batch_size)
        model.eval()
        with torch.no_grad():
            acc = float((model(x_test_t).argmax(dim=1) == y_test_t).float().mean())
        progress.epoch(epoch, float(np.mean(losses)) if losses else float("nan"), acc)
    progress.done(acc)
    save(args.save, kv, {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()})
    trainer.close()
    kv.close()


if __name__ == "__main__":
    main()
