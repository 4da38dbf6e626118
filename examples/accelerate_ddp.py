"""Hugging Face Accelerate, unmodified, under mxdist (as under torchrun).

    mxdist launch -n 2 -s 0 examples/accelerate_ddp.py
    mxdist launch -H hosts.txt -n 4 -s 0 examples/accelerate_ddp.py      # hosts.txt: node1 slots=2, node2 slots=2

``Accelerator(cpu=True)`` reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and
``MASTER_PORT`` from the environment mxdist gives every worker and wraps the model in DDP over
gloo.  A tiny linear regression on random data (seed 0), a few steps, one torch thread; each
rank prints ``RESULT {json}``: its process index, local index, the number of processes and the
final weights (equal on every rank), then ends as Accelerate's documentation says
(``accelerator.wait_for_everyone()``, ``accelerator.end_training()``: the process group is
destroyed before the interpreter exits).  ``--bare-exit`` just returns instead.  Under torchrun,
with torch 2.13 on Python 3.11, either ending can abort one rank at interpreter exit after its
result ("terminate called without an active exception", SIGABRT; the bare one in about half the
runs): a gloo thread takes the GIL during finalization.  Every Python mxdist starts carries
psnode's exit guard (psnode/exitguard/sitecustomize.py), which ends the process group before
finalization, so both endings exit 0 under mxdist.
"""
from __future__ import annotations

import argparse
import json

import torch
from accelerate import Accelerator
from torch import nn


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--bare-exit", action="store_true",
                   help="return without wait_for_everyone() and end_training()")
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    step = 0
    while step < args.steps:
        for xb, yb in loader:
            loss = nn.functional.mse_loss(model(xb), yb)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if step == args.steps:
                break
    params = accelerator.unwrap_model(model).parameters()
    weights = [float(v) for v in torch.cat([t.detach().flatten() for t in params])]
    print("RESULT " + json.dumps({"rank": accelerator.process_index, "world": accelerator.num_processes,
                                  "local_rank": accelerator.local_process_index,
                                  "distributed": str(accelerator.distributed_type), "weights": weights}), flush=True)
    if not args.bare_exit:
        accelerator.wait_for_everyone()
        accelerator.end_training()


if __name__ == "__main__":
    main()
