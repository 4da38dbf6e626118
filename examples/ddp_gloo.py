"""Collective mode: plain PyTorch DDP over gloo (no parameter server), started by mxdist.

    mxdist launch -n 2 -s 0 examples/ddp_gloo.py          # 2 workers, no servers
    python examples/ddp_gloo.py                           # one process (world of 1)

This is the seed article's "by instance" snippet - ``dist.init_process_group("gloo")``,
``DDP(model, ...)``, ``DistributedSampler``, ``args.local_rank`` - used as is: the launcher
gives every worker RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, which is all
``init_process_group``'s default ``env://`` rendezvous needs.  Gradients are averaged by DDP's
all-reduce and every worker runs the same local torch optimizer.  ``--device auto`` (default)
uses GPU ``args.local_rank`` when CUDA is available, else the CPU; two CPU-only adjustments to
the snippet: ``device_ids``/``output_device`` are passed only with CUDA (DDP rejects them for
CPU modules) and ``pin_memory`` only with CUDA.  ``examples/ddp_nccl.py`` is the seed's NCCL
snippet.  Rank 0 prints one line per epoch and ``accuracy=...``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import common
import torch
import torch.distributed as dist
from mlp_torch import build_model
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args(description: str = __doc__.splitlines()[0], nccl: bool = False) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--local_rank", "--local-rank", type=int,
                   default=int(os.environ.get("LOCAL_RANK", "0")),
                   help="set by older launchers; default: $LOCAL_RANK")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", "--batch_size", dest="batch_size", type=int, default=32,
                   help="samples per step on each worker")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-workers", "--num_workers", dest="num_workers", type=int, default=0,
                   help="DataLoader worker processes")
    if nccl:
        p.add_argument("--mode", choices=("param", "hybrid"), default="hybrid",
                       help="which of the seed's two NCCL snippets: by parameter or hybrid")
        p.add_argument("--bucket-cap-mb", "--bucket_cap_mb", dest="bucket_cap_mb", type=int, default=25,
                       help="DDP's gradient bucket size (the 'by parameter' snippet)")
    else:
        p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                       help="auto: GPU local_rank when CUDA is available, else the CPU")
    return p.parse_args()


def world_of_one() -> None:
    """Plain ``python script.py``: set the variables a launcher would set, for a world of 1."""
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
        print("note: no RANK/WORLD_SIZE (not started by a launcher): running a world of 1",
              flush=True)


def digits_dataset() -> tuple[Any, torch.Tensor, torch.Tensor, int]:
    x_train, y_train, x_test, y_test = common.load_digits()
    train_dataset = torch.utils.data.TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train))
    return train_dataset, torch.from_numpy(x_test), torch.from_numpy(y_test), x_train.shape[1]


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    world_of_one()
    cuda = torch.cuda.is_available() if args.device == "auto" else args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device is visible here (torch.cuda.is_available() is False)")
    train_dataset, x_test, y_test, n_in = digits_dataset()

    # --- the seed's snippet ---------------------------------------------------------------
    dist.init_process_group("gloo")
    model = build_model(n_in, args.hidden, 10, args.seed)
    if cuda:
        model = model.cuda(args.local_rank)
    ddp_model = DDP(model, find_unused_parameters=True,
                    device_ids=[args.local_rank] if cuda else None,
                    output_device=args.local_rank if cuda else None)
    train_sampler = torch.utils.data.distributed.DistributedSampler(train_dataset, seed=args.seed,
                                                                    drop_last=True)
    train_loader = torch.utils.data.DataLoader(train_dataset,
                                               batch_size=args.batch_size,
                                               sampler=train_sampler,
                                               num_workers=args.num_workers,
                                               pin_memory=cuda,
                                               drop_last=True)
    # ---------------------------------------------------------------------------------------
    train(args, ddp_model, train_sampler, train_loader, x_test, y_test, "ddp_gloo")


def train(args: argparse.Namespace, ddp_model: Any, train_sampler: Any, train_loader: Any,
          x_test: torch.Tensor, y_test: torch.Tensor, name: str) -> None:
    """The training loop of both DDP examples, then a clean exit from the process group."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model = ddp_model.module
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=args.lr, momentum=args.momentum)
    loss_fn = nn.CrossEntropyLoss()
    device = next(model.parameters()).device
    x_test_t, y_test_t = x_test.to(device), y_test.to(device)
    if rank == 0:
        print(f"{name}: backend={dist.get_backend()} world_size={world} "
              f"local_rank={args.local_rank} device={device} epochs={args.epochs} "
              f"batch_size={args.batch_size}x{world} lr={args.lr}", flush=True)
    start, samples, acc = time.monotonic(), 0, 0.0
    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        ddp_model.train()
        total, steps = 0.0, 0
        for x, y in train_loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            optimizer.zero_grad()
            loss = loss_fn(ddp_model(x), y)
            loss.backward()
            optimizer.step()
            total, steps = total + loss.item(), steps + 1
            samples += len(x) * world
        ddp_model.eval()
        with torch.no_grad():
            acc = float((model(x_test_t).argmax(dim=1) == y_test_t).float().mean())
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs} loss={total / max(steps, 1):.4f} "
                  f"test_acc={acc:.4f} samples={samples} time={time.monotonic() - start:.1f}s",
                  flush=True)
    if rank == 0:
        print(f"samples={samples}")
        print(f"accuracy={acc:.4f}", flush=True)
    # Leave together, then end the process without tearing gloo down: with torch 2.13 a rank
    # whose group is torn down (del DDP, destroy_process_group, or the interpreter's own exit)
    # while the other still uses it can abort ("terminate called without an active exception",
    # about 1 run in 10 on a loaded machine, under torchrun too).  Past the barrier every rank is
    # done; the process's exit frees the rest.
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
