"""psnode.torch with the in-process 'local' kvstore: pushes, updates and zero-copy views.

The reference is plain single-process PyTorch: the same model and data with
``torch.optim.SGD`` (psnode's sgd is the same math, so weights agree within float32 rounding).
Every CPU path of the trainer is here: step-time pushes (zero-copy), the hook-driven pipeline
(``overlap=True``: pushes from the pusher thread while backward runs), bfloat16/float16
parameters with float32 master weights, gradient accumulation with ``no_sync``, and the
several-devices helpers ``host_value``/``scatter`` on CPU tensors.  The CUDA paths: tests/gpu.

CI installs torch: there a missing torch is an error; elsewhere these tests are skipped.
"""
from __future__ import annotations

import copy
import importlib
import os
import sys
import threading

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
        pt.wrap(torch.nn.Linear(2, 2).to(torch.bfloat16), kv, multi_precision=False)
    with pytest.raises(ConfigError, match="no parameters"):
        pt.wrap(torch.nn.ReLU(), kv)


def test_import_without_torch_says_pip_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)        # `import torch` now raises ImportError
    monkeypatch.delitem(sys.modules, "psnode.torch")
    monkeypatch.delattr(psnode, "torch", raising=False)
    with pytest.raises(ImportError, match="pip install torch"):
        importlib.import_module("psnode.torch")


# ---------------------------------------------------------------- the hook-driven pipeline


class RecordingKV(SpyKV):
    """SpyKV that also records the pushing thread and signals each pushed key."""

    def __init__(self) -> None:
        super().__init__()
        self.pushed: dict[str, threading.Event] = {}
        self.threads: list[str] = []

    def push(self, key, value, priority=0):
        self.threads.append(threading.current_thread().name)
        super().push(key, value, priority)
        self.pushed.setdefault(key, threading.Event()).set()

    def event(self, key: str) -> threading.Event:
        return self.pushed.setdefault(key, threading.Event())


def train(trainer: pt.DistributedTrainer, model: torch.nn.Module, steps: int = 5) -> None:
    for step in range(steps):
        x, y = data(seed=step)
        trainer.zero_grad()
        loss_of(model, x, y).backward()
        trainer.step()


def test_overlap_on_cpu_gives_the_step_time_results_bit_for_bit() -> None:
    results = []
    for overlap in (False, True):
        model = make_model()
        trainer = pt.wrap(model, psnode.kv.create("local"),
                          psnode.optimizer.create("sgd", learning_rate=0.1, momentum=0.9), overlap=overlap)
        assert trainer.overlap is overlap
        train(trainer, model)
        trainer.close()
        results.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


def test_hooks_push_the_last_layers_while_backward_still_runs() -> None:
    model = make_model()
    kv = RecordingKV()
    trainer = pt.wrap(model, kv, psnode.optimizer.create("sgd", learning_rate=0.1), overlap=True)
    seen: list[bool] = []
    # the first layer's weight gets its gradient last: by then the last layer's must have left
    model[0].weight.register_post_accumulate_grad_hook(
        lambda p: seen.append(kv.event("2.weight").wait(timeout=10)))
    loss_of(model, *data()).backward()
    assert seen == [True]
    trainer.step()
    assert sorted(k for k, _, _ in kv.pushes) == sorted(trainer.keys)          # each key once
    assert {k: pr for k, _, pr in kv.pushes} == {k: -i for i, k in enumerate(trainer.keys)}
    assert set(kv.threads) == {"psnode-torch-pusher"}
    assert kv.pulls == [(trainer.keys, -len(trainer.keys))]
    ref = make_model()
    loss_of(ref, *data()).backward()
    grads = {k: g for k, g, _ in kv.pushes}
    for name, p in ref.named_parameters():
        np.testing.assert_array_equal(grads[name], p.grad.numpy(), err_msg=name)
    trainer.close()


def test_unused_parameter_pushes_zeros_at_step_with_overlap() -> None:
    model = torch.nn.ModuleDict({"used": torch.nn.Linear(6, 3), "unused": torch.nn.Linear(2, 2)})
    kv = RecordingKV()
    trainer = pt.wrap(model, kv, psnode.optimizer.create("sgd", learning_rate=0.1), overlap=True)
    model["used"](data()[0]).sum().backward()
    trainer.step()
    pushed = {k: (g, t) for (k, g, _), t in zip(kv.pushes, kv.threads, strict=True)}
    assert set(pushed) == set(trainer.keys)
    np.testing.assert_array_equal(pushed["unused.weight"][0], np.zeros((2, 2), np.float32))
    assert pushed["unused.weight"][1] == threading.current_thread().name     # pushed by step()
    assert pushed["used.weight"][1] == "psnode-torch-pusher"
    trainer.close()


def test_no_sync_accumulation_equals_step_time_accumulation() -> None:
    results = []
    for overlap in (False, True):
        model = make_model()
        kv = RecordingKV()
        trainer = pt.wrap(model, kv, psnode.optimizer.create("sgd", learning_rate=0.1), overlap=overlap)
        for step in range(3):
            trainer.zero_grad()
            with trainer.no_sync():
                loss_of(model, *data(seed=10 * step)).backward()
                loss_of(model, *data(seed=10 * step + 1)).backward()
            assert len(kv.pushes) == 4 * step                 # nothing pushed inside no_sync
            loss_of(model, *data(seed=10 * step + 2)).backward()
            trainer.step()
        assert len(kv.pushes) == 12
        trainer.close()
        results.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)


def test_second_backward_without_no_sync_raises_at_step() -> None:
    model = make_model()
    trainer = pt.wrap(model, psnode.kv.create("local"), psnode.optimizer.create("sgd", learning_rate=0.1),
                      overlap=True)
    loss_of(model, *data()).backward()
    loss_of(model, *data(seed=2)).backward()
    with pytest.raises(ConfigError, match="no_sync"):
        trainer.step()
    trainer.close()


def test_a_push_error_in_the_pusher_thread_is_raised_by_step() -> None:
    class Failing(SpyKV):
        def push(self, key, value, priority=0):
            if key == "2.bias":
                raise psnode.PSError("server said no")
            super().push(key, value, priority)

    model = make_model()
    trainer = pt.wrap(model, Failing(), psnode.optimizer.create("sgd", learning_rate=0.1), overlap=True)
    loss_of(model, *data()).backward()
    with pytest.raises(psnode.PSError, match="server said no"):
        trainer.step()
    trainer.close()


def test_close_removes_the_hooks() -> None:
    model = make_model()
    kv = RecordingKV()
    trainer = pt.wrap(model, kv, psnode.optimizer.create("sgd", learning_rate=0.1), overlap=True)
    trainer.close()
    loss_of(model, *data()).backward()
    assert kv.pushes == []


# ---------------------------------------------------------------- 16-bit parameters

LR = 2.0 ** -10


class Scaled(torch.nn.Module):
    """loss = sum(c * w): the gradient of ``w`` is exactly ``c`` every step."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(4, 3, dtype=dtype))

    def forward(self, c: float) -> torch.Tensor:
        return (self.w * c).sum()


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_parameters_keep_float32_master_weights(dtype: torch.dtype, overlap: bool) -> None:
    """SGD with lr 2^-10 and gradient 1.5: master_k = 1 - 1.5k/1024 exactly (float32); the
    parameter is its rounding.  Plain bfloat16 SGD stays at 1.0 (each step is below bf16's
    spacing), master weights reach 0.98828125 = 1 - 3 * 2^-8 after 8 steps."""
    model = Scaled(dtype)
    kv = psnode.kv.create("local")
    trainer = pt.wrap(model, kv, psnode.optimizer.create("sgd", learning_rate=LR), overlap=overlap)
    master = np.empty((4, 3), np.float32)
    for k in range(1, 9):
        trainer.zero_grad()
        model(1.5).backward()
        trainer.step()
        kv.pull("w", out=master)
        expected = np.float32(1 - 1.5 * k / 1024)
        np.testing.assert_array_equal(master, np.full((4, 3), expected))
        assert model.w.dtype == dtype
        assert torch.equal(model.w.detach(), torch.full((4, 3), float(expected)).to(dtype))
    if dtype == torch.bfloat16:
        assert torch.equal(model.w.detach(), torch.full((4, 3), 0.98828125, dtype=dtype))
        plain = Scaled(dtype)
        opt = torch.optim.SGD(plain.parameters(), lr=LR)
        for _ in range(8):
            opt.zero_grad()
            plain(1.5).backward()
            opt.step()
        assert torch.equal(plain.w.detach(), torch.ones(4, 3, dtype=dtype))
    trainer.close()


def test_float16_without_multi_precision_stays_zero_copy() -> None:
    model = Scaled(torch.float16)
    kv = psnode.kv.create("local")
    trainer = pt.wrap(model, kv, psnode.optimizer.create("sgd", learning_rate=0.5), multi_precision=False)
    assert np.shares_memory(trainer._weights[0], model.w.data.numpy())
    model(1.0).backward()
    trainer.step()
    assert torch.equal(model.w.detach(), torch.full((4, 3), 0.5, dtype=torch.float16))
    assert kv.pull("w").dtype == np.float16


def test_bfloat16_buffers_are_broadcast_through_float32() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)).to(torch.bfloat16)
    with torch.no_grad():
        model[1].running_mean.fill_(0.25)
    kv = psnode.kv.create("local")
    pt.wrap(model, kv, psnode.optimizer.create("sgd", learning_rate=0.1))
    np.testing.assert_array_equal(kv.pull("buffer:1.running_mean"), np.full(4, 0.25, np.float32))
    assert model[1].running_mean.dtype == torch.bfloat16


# ---------------------------------------------------------------- several devices: CPU tensors


def test_host_value_sums_cpu_tensors_exactly() -> None:
    parts = [torch.full((3, 2), float(r + 1)) for r in range(3)]
    np.testing.assert_array_equal(pt.host_value(parts, np.float32, key="a"), np.full((3, 2), 6, np.float32))
    bf = [torch.full((5,), 0.5 * (r + 1), dtype=torch.bfloat16) for r in range(2)]
    out = pt.host_value(bf, key="b")
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, np.full(5, 1.5, np.float32))
    single = torch.arange(4, dtype=torch.float32)
    assert np.shares_memory(pt.host_value(single, np.float32), single.numpy())        # zero-copy
    with pytest.raises(psnode.errors.ShapeMismatch, match="shapes"):
        pt.host_value([torch.zeros(2), torch.zeros(3)])
    with pytest.raises(ConfigError, match="mixing"):
        pt.host_value([torch.zeros(2), np.zeros(2)])


def test_scatter_broadcasts_with_casts() -> None:
    outs = [torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.bfloat16), torch.zeros(2, 3, dtype=torch.float64)]
    value = np.full((2, 3), 0.75, np.float32)
    pt.scatter(value, outs, key="w")
    for t in outs:
        assert torch.equal(t, torch.full((2, 3), 0.75, dtype=t.dtype))
    with pytest.raises(psnode.errors.ShapeMismatch):
        pt.scatter(np.zeros(3, np.float32), [torch.zeros(2)])


def test_device_list_push_and_pull_through_a_kvstore() -> None:
    """What kv.push(key, [g0, g1]) / kv.pull(key, out=[w0, w1]) do with torch values: host_value
    before the push, scatter after the pull.  'sum' of two device gradients 1 and 2 = 3; SGD lr
    0.5 from 1.0 gives -0.5 on every device, in each device's dtype."""
    kv = psnode.kv.create("local")
    kv.init("w", np.ones((2, 2), np.float32))
    kv.set_optimizer(psnode.optimizer.create("sgd", learning_rate=0.5))
    kv.push("w", pt.host_value([torch.full((2, 2), 1.0), torch.full((2, 2), 2.0, dtype=torch.bfloat16)],
                               np.float32, key="w"))
    outs = [torch.zeros(2, 2), torch.zeros(2, 2, dtype=torch.bfloat16)]
    pt.scatter(kv.pull("w"), outs, key="w")
    for t in outs:
        assert torch.equal(t, torch.full((2, 2), -0.5, dtype=t.dtype))


def test_kvstore_takes_torch_tensor_lists_directly() -> None:
    """The same through the KVStore API itself: kvstore.py routes torch values to
    host_value/scatter (psnode.torch.values)."""
    kv = psnode.kv.create("local")
    kv.init("w", np.ones((2, 2), np.float32))
    kv.set_optimizer(psnode.optimizer.create("sgd", learning_rate=0.5))
    outs = [torch.zeros(2, 2), torch.zeros(2, 2)]
    kv.push("w", [torch.full((2, 2), 1.0), torch.full((2, 2), 2.0)])
    kv.pull("w", out=outs)
    for t in outs:
        assert torch.equal(t, torch.full((2, 2), -0.5))
