"""Collective mode on GPUs: the seed article's NCCL snippets (by parameter, hybrid), under mxdist.

    mxdist launch -n 1 -s 0 examples/ddp_nccl.py                 # 1 rank on GPU 0
    mxdist launch -n 4 -s 0 examples/ddp_nccl.py --mode param    # 4 ranks, GPUs 0-3 of one host
    python examples/ddp_nccl.py                                  # one process (world of 1)

The snippet runs as the seed wrote it: ``dist.init_process_group("nccl")``, ``DDP(model,
device_ids=[args.local_rank], output_device=args.local_rank, ...)`` with ``bucket_cap_mb``
("by parameter", ``--mode param``) or ``find_unused_parameters=True`` ("hybrid", the default),
``DistributedSampler`` and a ``DataLoader`` with ``pin_memory=True``.  Two lines the snippet
leaves to its surroundings come first: ``torch.cuda.set_device(args.local_rank)`` and moving
the model to that GPU.  ``args.local_rank`` is ``--local_rank`` (as ``torch.distributed.launch``
passed it) or ``$LOCAL_RANK``: each rank needs GPU ``cuda:LOCAL_RANK`` visible (torchrun's
convention) and its own GPU (NCCL refuses two ranks on one device).  Same data, model and loop as
``ddp_gloo.py``; rank 0 prints one line per epoch and ``accuracy=...``.
"""
from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from ddp_gloo import digits_dataset, parse_args, train, world_of_one
from mlp_torch import build_model
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    args = parse_args(__doc__.splitlines()[0], nccl=True)
    if not torch.cuda.is_available():
        sys.exit("ddp_nccl.py needs a CUDA GPU (NCCL); without one run examples/ddp_gloo.py")
    if args.local_rank >= torch.cuda.device_count():
        sys.exit(f"local rank {args.local_rank} has no GPU: this process sees "
                 f"{torch.cuda.device_count()} (cuda:0..{torch.cuda.device_count() - 1}); "
                 "start at most that many ranks per host, each with all of the host's GPUs visible")
    torch.set_num_threads(1)
    world_of_one()
    train_dataset, x_test, y_test, n_in = digits_dataset()
    torch.cuda.set_device(args.local_rank)
    model = build_model(n_in, args.hidden, 10, args.seed).cuda(args.local_rank)

    # --- the seed's snippet ("by parameter" / "hybrid") -----------------------------------
    dist.init_process_group("nccl")
    if args.mode == "param":
        model = DDP(model, device_ids=[args.local_rank], output_device=args.local_rank,
                    bucket_cap_mb=args.bucket_cap_mb)
    else:
        model = DDP(model, device_ids=[args.local_rank], output_device=args.local_rank,
                    find_unused_parameters=True)
    train_sampler = torch.utils.data.distributed.DistributedSampler(train_dataset)
    train_loader = torch.utils.data.DataLoader(train_dataset,
                                               batch_size=args.batch_size,
                                               sampler=train_sampler,
                                               num_workers=args.num_workers,
                                               pin_memory=True)
    # ---------------------------------------------------------------------------------------
    train(args, model, train_sampler, train_loader, x_test, y_test, "ddp_nccl")


if __name__ == "__main__":
    main()
