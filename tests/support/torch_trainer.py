"""The closed-form psnode.torch job (tests/cluster/test_torch_trainer.py on the CPU, tests/gpu on
CUDA): a float32 and a bfloat16 parameter, rank r's gradient r + 1 everywhere, SGD with learning
rate 2^-10, so step k gives exactly 1 - 1.5k/1024."""
from __future__ import annotations

from pathlib import Path

import numpy as np

CLOSED_FORM = """
import numpy as np
import torch
import psnode
import psnode.torch

torch.set_num_threads(1)
kv = psnode.kv.create("dist_sync")
device = torch.device({device!r})


class Mixed(torch.nn.Module):
    def __init__(self, start):
        super().__init__()
        self.a = torch.nn.Parameter(torch.full((40, 3), start, device=device))
        self.b = torch.nn.Parameter(torch.full((50,), start, dtype=torch.bfloat16, device=device))


model = Mixed(1.0 + kv.rank)                       # rank 0's ones must win at init
trainer = psnode.torch.DistributedTrainer(model, kv, psnode.optimizer.create("sgd", learning_rate=2.0 ** -10),
                                          overlap={overlap})
c = float(kv.rank + 1)
saved, master = {{}}, np.empty(50, np.float32)
for k in range({steps}):
    trainer.zero_grad()
    ((model.a * c).sum() + (model.b.float() * c).sum()).backward()
    trainer.step()
    kv.pull("b", out=master)
    saved[f"a{{k + 1}}"] = model.a.detach().cpu().numpy().copy()
    saved[f"b{{k + 1}}"] = model.b.detach().float().cpu().numpy()
    saved[f"m{{k + 1}}"] = master.copy()
    assert model.a.device == device and model.b.dtype == torch.bfloat16
np.savez({out!r} + f"/r{{kv.rank}}.npz", **saved)
trainer.close()
kv.close()
"""
CLOSED_FORM_STEPS = 8


def closed_form_script(out: Path, device: str = "cpu", overlap: bool = True) -> str:
    """The closed-form worker script: its model on ``device``, saving every step under ``out``."""
    return CLOSED_FORM.format(device=device, overlap=overlap, steps=CLOSED_FORM_STEPS, out=str(out))


def check_closed_form(out: Path) -> None:
    """Both workers: a_k, the bfloat16 master m_k = 1 - 1.5k/1024 exactly; b_k = bf16(m_k)."""
    import torch  # (the callers need torch already; this module does not)

    for rank in range(2):
        with np.load(out / f"r{rank}.npz") as r:
            for k in range(1, CLOSED_FORM_STEPS + 1):
                exact = np.float32(1 - 1.5 * k / 1024)
                np.testing.assert_array_equal(r[f"a{k}"], np.full((40, 3), exact), err_msg=f"a{k}")
                np.testing.assert_array_equal(r[f"m{k}"], np.full(50, exact), err_msg=f"m{k}")
                rounded = torch.tensor(float(exact)).to(torch.bfloat16).float().item()
                np.testing.assert_array_equal(r[f"b{k}"], np.full(50, rounded, np.float32), err_msg=f"b{k}")
            assert r[f"b{CLOSED_FORM_STEPS}"][0] == 0.98828125          # 1 - 3 * 2^-8
