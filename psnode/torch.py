"""PyTorch glue: train a ``torch.nn.Module`` through a psnode KVStore (optimizer on the servers).

Usage::

    import psnode, psnode.torch
    kv = psnode.kv.create('dist_sync')                       # or 'local' for one process
    trainer = psnode.torch.DistributedTrainer(
        model, kv, psnode.optimizer.create('sgd', learning_rate=0.1, momentum=0.9))
    for x, y in loader:
        trainer.zero_grad()
        loss_fn(model(x), y).backward()
        trainer.step()                                       # push grads, pull new weights

Contract
--------
* Only CPU tensors: every parameter's storage is shared with numpy (``p.data.numpy()``) without
  copies; pushes read the gradients through ``p.grad.numpy()`` views and pulls write the new
  weights straight into the parameters' memory.  Parameters must be contiguous and of a dtype
  numpy knows (float16/32/64); bfloat16 and CUDA tensors raise :class:`ConfigError`.
* One key per parameter that requires a gradient: ``prefix + name`` from
  ``model.named_parameters()`` (shared parameters appear once).  The constructor calls
  ``kv.init`` for every key in that order on every worker, so rank 0's initial weights are
  stored and copied in place into every worker's parameters: all workers start equal.
  With ``broadcast_buffers=True`` (default) the module's floating-point buffers (e.g.
  BatchNorm running statistics) are copied from rank 0 the same way, once, under the key
  ``prefix + "buffer:" + name``; afterwards buffers stay local to each worker.  Integer
  buffers (``num_batches_tracked``) are not sent: they count steps, equal on every worker.
* ``optimizer``: a :class:`psnode.optimizer.Optimizer` or its spec dict is sent to the servers
  with ``kv.set_optimizer`` (None: keep what the kvstore already has).  There is no local torch
  optimizer: with ``dist_sync`` + ``average`` a step applies the optimizer to the mean of all
  workers' gradients, exactly once per round on the server; ``dist_async`` applies each
  worker's gradient on arrival.  With ``'local'`` (one process) this equals plain single-process
  training with the same update rule (psnode's ``sgd`` is ``torch.optim.SGD``'s math, with
  momentum and weight decay).
* ``step()``: pushes every gradient (a parameter without ``.grad`` pushes zeros, so sync rounds
  still complete, like DDP's ``find_unused_parameters``), then pulls every parameter and
  returns when the new weights are in the model.  Priority follows layer order: the parameter
  of layer ``i`` (position in ``named_parameters()``) is pushed with priority ``-i``, and the
  pulls are issued in layer order at priority ``-n`` (below every push of the step, so a pull
  never overtakes a push it waits for), so the first layers - the ones the next forward pass
  needs first - are sent and answered first.
* ``step`` does not clear gradients; call ``zero_grad()`` (or the model's) as with torch.

This module is imported only on request (``import psnode.torch``); without torch installed the
import raises ImportError saying ``pip install torch``.
"""
from __future__ import annotations

from typing import Any

try:
    import torch as _torch
except ImportError as _exc:  # pragma: no cover - exercised only without torch
    raise ImportError("psnode.torch needs PyTorch, which is not installed: pip install torch "
                      "(a CPU build is enough)") from _exc

import numpy as np

from psnode import optimizer as opt_mod
from psnode.errors import ConfigError

__all__ = ["DistributedTrainer", "numpy_view", "wrap"]


def numpy_view(tensor: Any, what: str = "tensor") -> np.ndarray:
    """The numpy array sharing ``tensor``'s memory (no copy); ConfigError if impossible."""
    if tensor.device.type != "cpu":
        raise ConfigError(f"{what} is on {tensor.device}; psnode.torch works with CPU tensors "
                          "only: move the model with model.cpu()")
    if tensor.layout != _torch.strided:
        raise ConfigError(f"{what} is a {tensor.layout} tensor; psnode.torch needs dense "
                          "gradients (e.g. nn.Embedding(..., sparse=False))")
    if not tensor.is_contiguous():
        raise ConfigError(f"{what} is not contiguous; call .contiguous() on it first")
    try:
        arr = tensor.detach().numpy()
    except (TypeError, RuntimeError) as exc:
        raise ConfigError(f"{what} of dtype {tensor.dtype} has no numpy equivalent ({exc}); "
                          "use float32 or float64") from None
    return arr


class DistributedTrainer:
    """Push a model's gradients and pull its weights through ``kv`` (module docstring)."""

    def __init__(self, model: Any, kv: Any, optimizer: Any = None, prefix: str = "",
                 broadcast_buffers: bool = True) -> None:
        if not isinstance(model, _torch.nn.Module):
            raise ConfigError(f"DistributedTrainer needs a torch.nn.Module, not {type(model).__name__}")
        self.model = model
        self.kv = kv
        self.prefix = prefix
        if optimizer is not None:
            if isinstance(optimizer, dict):
                optimizer = opt_mod.from_spec(optimizer)
            kv.set_optimizer(optimizer)
        self.names: list[str] = []
        self.params: list[Any] = []
        for name, p in model.named_parameters():
            if p.requires_grad:
                self.names.append(prefix + name)
                self.params.append(p)
        if not self.params:
            raise ConfigError("the model has no parameters that require a gradient")
        self.keys = list(self.names)
        self._weights = [numpy_view(p.data, f"parameter {n!r}") for n, p in zip(self.names, self.params, strict=False)]
        self._zeros: dict[int, np.ndarray] = {}
        kv.init(self.keys, self._weights)
        if broadcast_buffers:
            bufs = [(prefix + "buffer:" + n, b) for n, b in model.named_buffers()
                    if b.numel() and b.is_floating_point()]
            if bufs:
                kv.init([k for k, _ in bufs], [numpy_view(b.data, f"buffer {k!r}") for k, b in bufs])

    def zero_grad(self) -> None:
        """Clear the gradients (``set_to_none=False`` semantics: zeros in place)."""
        for p in self.params:
            if p.grad is not None:
                p.grad.detach_()
                p.grad.zero_()

    def _grad(self, i: int) -> np.ndarray:
        p = self.params[i]
        if p.grad is None:
            zeros = self._zeros.get(i)
            if zeros is None:
                zeros = self._zeros[i] = np.zeros_like(self._weights[i])
            return zeros
        return numpy_view(p.grad, f"gradient of {self.names[i]!r}")

    def push(self) -> None:
        """Send every gradient (layer ``i`` with priority ``-i``); returns without waiting."""
        for i in range(len(self.params)):
            self.kv.push(self.keys[i], self._grad(i), priority=-i)

    def pull(self) -> None:
        """Fetch every parameter into the model's memory, in layer order (blocks)."""
        self.kv.pull(self.keys, out=self._weights, priority=-len(self.keys))

    def step(self) -> None:
        """One training step after ``loss.backward()``: push gradients, pull new weights."""
        with _torch.no_grad():
            self.push()
            self.pull()

    def __repr__(self) -> str:
        return f"<DistributedTrainer {len(self.keys)} keys via {self.kv!r}>"


def wrap(model: Any, kv: Any, optimizer: Any = None, **kw: Any) -> DistributedTrainer:
    """Shorthand for :class:`DistributedTrainer` ``(model, kv, optimizer, **kw)``."""
    return DistributedTrainer(model, kv, optimizer, **kw)
