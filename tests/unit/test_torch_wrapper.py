"""psnode.torch with the in-process 'local' kvstore: pushes, updates and zero-copy views.

The reference is plain single-process PyTorch: the same model and data with
``torch.optim.SGD`` (psnode's sgd is the same math, so weights agree within float32 rounding).

CI installs torch: there a missing torch is an error; elsewhere these tests are skipped.
"""
from __future__ import annotations

import copy
import importlib
import os
import sys

import numpy as np
import pytest

try:
    import torch
except ImportError:
    if os.environ.get("CI"):
        raise ImportError("CI must install torch for tests/unit/test_torch_wrapper.py: pip install torch")
    pytest.skip("torch is not installed (pip install torch); CI fails here instead", allow_module_level=True)

import psnode
import psnode.torch as pt
from psnode.errors import ConfigError


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def data(seed: int = 1, n: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def loss_of(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(model(x), y)


class SpyKV:
    """A 'local' kvstore that records every push (key, copy of the value, priority)."""

    def __init__(self) -> None:
        self.kv = psnode.kv.create("local")
        self.pushes: list[tuple[str, np.ndarray, int]] = []
        self.pulls: list[tuple[list[str], int]] = []

    def push(self, key, value, priority=0):
        self.pushes.append((key, np.array(value, copy=True), priority))
        self.kv.push(key, value, priority)

    def pull(self, key, out=None, priority=0):
        self.pulls.append((list(key), priority))
        return self.kv.pull(key, out=out, priority=priority)

    def __getattr__(self, name):
        return getattr(self.kv, name)


@pytest.mark.parametrize("momentum,wd", [(0.0, 0.0), (0.9, 1e-3)])
def test_weights_after_steps_equal_torch_sgd(momentum: float, wd: float) -> None:
    model, ref = make_model(), make_model()
    trainer = pt.wrap(model, psnode.kv.create("local"),
                      psnode.optimizer.create("sgd", learning_rate=0.1, momentum=momentum, wd=wd))
    opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=momentum, weight_decay=wd)
    for step in range(6):
        x, y = data(seed=step)
        trainer.zero_grad()
        loss_of(model, x, y).backward()
        trainer.step()
        opt.zero_grad()
        loss_of(ref, x, y).backward()
        opt.step()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert torch.allclose(p, q, rtol=1e-5, atol=1e-6), name


def test_pushed_gradients_equal_reference_and_priorities_follow_layers() -> None:
    model, ref = make_model(), make_model()
    spy = SpyKV()
    trainer = pt.DistributedTrainer(model, spy, {"name": "sgd", "params": {"learning_rate": 0.1}})
    x, y = data()
    loss_of(model, x, y).backward()
    trainer.step()
    loss_of(ref, x, y).backward()
    names = [n for n, _ in ref.named_parameters()]
    assert [k for k, _, _ in spy.pushes] == names == trainer.keys
    assert [pr for _, _, pr in spy.pushes] == [-i for i in range(len(names))]
    # one pull of every key in layer order, below every push (a pull never overtakes a push)
    assert spy.pulls == [(names, -len(names))]
    for (key, grad, _), p in zip(spy.pushes, ref.parameters()):
        np.testing.assert_array_equal(grad, p.grad.numpy(), err_msg=key)


def test_parameters_are_shared_with_numpy_and_updated_in_place() -> None:
    model = make_model()
    ptrs = [p.data_ptr() for p in model.parameters()]
    trainer = pt.wrap(model, psnode.kv.create("local"), psnode.optimizer.create("sgd", learning_rate=0.5))
    for w, p in zip(trainer._weights, model.parameters()):
        assert np.shares_memory(w, p.data.numpy())
    before = copy.deepcopy(model.state_dict())
    loss_of(model, *data()).backward()
    trainer.step()
    assert [p.data_ptr() for p in model.parameters()] == ptrs
    assert all(not torch.equal(before[n], p) for n, p in model.named_parameters())


def test_parameter_without_grad_pushes_zeros_and_stays() -> None:
    class WithUnused(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = make_model()
            self.unused = torch.nn.Linear(2, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

    model = WithUnused()
    kept = model.unused.weight.detach().clone()
    trainer = pt.wrap(model, psnode.kv.create("local"), psnode.optimizer.create("sgd", learning_rate=0.1))
    loss_of(model, *data()).backward()
    trainer.step()
    assert model.unused.weight.grad is None
    assert torch.equal(model.unused.weight, kept)


def test_frozen_parameters_get_no_key_and_buffers_are_initialised() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    model[0].bias.requires_grad_(False)
    kv = psnode.kv.create("local")
    trainer = pt.wrap(model, kv, psnode.optimizer.create("sgd", learning_rate=0.1), prefix="m.")
    assert trainer.keys == ["m.0.weight", "m.1.weight", "m.1.bias"]
    assert "m.buffer:1.running_mean" in kv._keys and "m.buffer:1.num_batches_tracked" not in kv._keys
    model(torch.randn(5, 3)).sum().backward()
    trainer.step()


def test_bad_models_raise_config_error() -> None:
    kv = psnode.kv.create("local")
    with pytest.raises(ConfigError, match="nn.Module"):
        pt.wrap(object(), kv)
    with pytest.raises(ConfigError, match="bfloat16"):
        pt.wrap(torch.nn.Linear(2, 2).to(torch.bfloat16), kv)
    with pytest.raises(ConfigError, match="no parameters"):
        pt.wrap(torch.nn.ReLU(), kv)


def test_import_without_torch_says_pip_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)        # `import torch` now raises ImportError
    monkeypatch.delitem(sys.modules, "psnode.torch")
    monkeypatch.delattr(psnode, "torch", raising=False)
    with pytest.raises(ImportError, match="pip install torch"):
        importlib.import_module("psnode.torch")
