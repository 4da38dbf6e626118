"""PyTorch Lightning's DDP, unmodified, under mxdist (as under torchrun).

    mxdist launch -n 2 -s 0 examples/lightning_ddp.py                          # one host, 2 processes
    mxdist launch -H hosts.txt -n 4 -s 0 examples/lightning_ddp.py --num-nodes 2   # 2 hosts x 2 slots

``Trainer(strategy='ddp', accelerator='cpu', devices=D, num_nodes=N)`` with ``D x N`` equal to
the workers (``-n``).  mxdist gives every worker torchrun's environment (``TORCHELASTIC_RUN_ID``,
``GROUP_RANK``, ``LOCAL_WORLD_SIZE``...), so Lightning picks its ``TorchElasticEnvironment`` and
starts no processes of its own.  A tiny linear regression on random data (seed 0), a few steps,
one torch thread; each rank prints ``RESULT {json}``: its global, local and node rank, the world
size and the final weights (equal on every rank: DDP averages the gradients).  ``--devices``
defaults to ``$LOCAL_WORLD_SIZE``.
"""
from __future__ import annotations

import argparse
import json
import os

import lightning as L
import torch
from torch import nn


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(8, 1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    p.add_argument("--num-nodes", type=int, default=1)
    p.add_argument("--steps", type=int, default=4)
    args = p.parse_args()
    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
    model = Regression()
    trainer = L.Trainer(strategy="ddp", accelerator="cpu", devices=args.devices, num_nodes=args.num_nodes,
                        max_steps=args.steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=os.environ.get("TMPDIR", "/tmp"))
    trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=8))
    weights = [float(v) for v in torch.cat([t.detach().flatten() for t in model.parameters()])]
    print("RESULT " + json.dumps({"rank": trainer.global_rank, "world": trainer.world_size,
                                  "local_rank": trainer.local_rank, "node_rank": trainer.node_rank,
                                  "env": type(trainer.strategy.cluster_environment).__name__,
                                  "weights": weights}), flush=True)


if __name__ == "__main__":
    main()
