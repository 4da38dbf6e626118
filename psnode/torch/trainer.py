"""PyTorch glue: train a ``torch.nn.Module`` (CPU or CUDA) through a psnode KVStore.

Usage::

    import psnode, psnode.torch
    kv = psnode.kv.create('dist_sync')                       # or 'local' for one process
    model = model.to('cuda')                                 # or stay on the CPU
    trainer = psnode.torch.DistributedTrainer(
        model, kv, psnode.optimizer.create('sgd', learning_rate=0.1, momentum=0.9))
    for x, y in loader:
        trainer.zero_grad()
        loss_fn(model(x), y).backward()                      # CUDA: gradients leave as they come
        trainer.step()                                       # pull new weights (and push the rest)

Contract
--------
* **Keys.** One key per parameter that requires a gradient: ``prefix + name`` from
  ``model.named_parameters()`` (shared parameters appear once).  The constructor calls
  ``kv.init`` for every key in that order on every worker: rank 0's initial weights are stored
  and copied into every worker's parameters, so all workers start equal.  With
  ``broadcast_buffers=True`` (default) the module's floating-point buffers (e.g. BatchNorm
  running statistics) are copied from rank 0 the same way, once, under ``prefix + "buffer:" +
  name``; afterwards buffers stay local.  Integer buffers (``num_batches_tracked``) are not sent.
* **Optimizer.** ``optimizer`` (a :class:`psnode.optimizer.Optimizer` or its spec dict) is sent
  to the servers with ``kv.set_optimizer`` (None: keep what the kvstore has).  There is no
  local torch optimizer: with ``dist_sync`` + ``average`` a step applies the optimizer to the
  mean of all workers' gradients, once per round on the server; ``'local'`` equals plain
  single-process training with the same update rule (psnode's ``sgd`` is torch's SGD math).
* **Dtypes (multi_precision).** A key holds the parameter's dtype, except for float16 and
  bfloat16 parameters with ``multi_precision`` (the default; MXNet's option of that name):
  their keys are float32 *master weights* on the servers.  Gradients are cast to float32 on the
  parameter's device before they leave; pulled float32 weights are cast back on the device.
  Numpy has no bfloat16, so bfloat16 needs ``multi_precision`` (False raises ConfigError).
* **CPU parameters of a numpy dtype** (float16 without multi_precision, float32, float64) are
  zero-copy: pushes read ``p.grad`` through a numpy view, pulls write into ``p.data``'s memory.
  Other parameters go through one host buffer per parameter, allocated once (pinned for CUDA
  parameters), used for both the gradient going out and the weight coming back.
* **CUDA parameters.** Each CUDA device gets one side stream (high priority).  A gradient is
  copied to its pinned buffer on that stream after an event recorded on the stream that produced
  it; an event after the copy tells the pusher (one daemon thread per trainer) that the buffer is
  ready, and it pushes that key.  After the pull, the weights are copied back to the device on
  the side stream (after the compute stream's pending work) and ``step()`` waits for that copy:
  when it returns, the parameters are updated on the device.  Nothing is allocated per step.
  Several trainers (processes) may share one GPU.
* **Overlap** (``overlap=None``: on for CUDA models, off for CPU ones; True on CPU works too).
  A ``register_post_accumulate_grad_hook`` (torch >= 2.1) on every parameter stages its
  gradient as soon as backward has accumulated it and hands it to the pusher, so gradients of
  the last layers travel while backward still computes the first ones.  ``step()`` waits until
  the pusher has handed every staged gradient to the kvstore, then pushes what no hook pushed.
  Gradient accumulation over several backward passes: run all but the last inside
  ``with trainer.no_sync():``; a second backward reaching a parameter already pushed in this
  step makes ``step()`` raise ConfigError (its gradient went out incomplete).  The kvstore is
  called from the pusher thread during backward and from the caller's thread in ``step``, never
  from both at once.  Without overlap every push happens in ``step()``.
* **Gradient compression** (``compression=``, e.g. ``{'type': '2bit', 'threshold': 0.5}``):
  the constructor calls ``kv.set_gradient_compression(compression)`` (psnode.worker.kvstore), so every
  gradient push is compressed with this worker's residuals and the servers decode it; weights
  are pulled in float32.  Every key must be float32 (float16/bfloat16 parameters with
  ``multi_precision`` have float32 keys); another dtype raises ConfigError naming it.
* **Priorities.** The parameter of layer ``i`` (position in ``named_parameters()``) is pushed
  with priority ``-i``; the pull of all keys, in layer order, has priority ``-n`` (below every
  push of the step): the layers the next forward needs first are sent and answered first.  A
  parameter without ``.grad`` pushes zeros, so sync rounds still complete (DDP's
  ``find_unused_parameters``).  ``step`` does not clear gradients; call ``zero_grad()``.

* **Embedding tables** (pushed as row_sparse, first, priority 1): every
  :class:`psnode.torch.Embedding`/:class:`~psnode.torch.EmbeddingBag` of the model (a table on
  the servers; :mod:`psnode.torch.embedding`) pushes the gradient of the rows its forwards
  looked up, and a ``torch.nn.Embedding``/``EmbeddingBag`` with ``sparse=True`` (a table each
  worker holds: a row_sparse key initialised from rank 0's weight) pushes its sparse gradient
  and, before each of its forwards, pulls the rows of that forward's ids into its weight
  (:class:`~psnode.torch.embedding.HeldTable`); neither is pulled whole by ``step()``.  The
  servers' optimizer updates the rows present only (MXNet's lazy update).  Other sparse
  gradients raise ConfigError.

Several devices per worker (MXNet's device kvstore): :func:`host_value` and :func:`scatter` turn
lists of torch tensors (one per local GPU) into the one host array a push sends and back
(see their docstrings; :mod:`psnode.worker.kvstore` calls them for torch values).

This module is imported through :mod:`psnode.torch`, which raises ImportError saying
``pip install torch`` where torch is not installed.
"""
from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch as _torch

from psnode.errors import ConfigError
from psnode.math import optimizers as opt_mod
from psnode.math.compression import CompressionSpec
from psnode.torch.devices import host_value, scatter
from psnode.torch.embedding import HeldTable, ServerTable

__all__ = ["DistributedTrainer", "host_dtype", "host_value", "numpy_view", "scatter", "wrap"]

_HALF = (_torch.float16, _torch.bfloat16)


def numpy_view(tensor: Any, what: str = "tensor") -> np.ndarray:
    """The numpy array sharing ``tensor``'s CPU memory (no copy); ConfigError if impossible."""
    if tensor.device.type != "cpu":
        raise ConfigError(f"{what} is on {tensor.device}: a numpy view needs a CPU tensor "
                          "(psnode.torch stages device tensors through host buffers)")
    if tensor.layout != _torch.strided:
        raise ConfigError(f"{what} is a {tensor.layout} tensor; psnode.torch takes sparse gradients only "
                          "from nn.Embedding/nn.EmbeddingBag(..., sparse=True) modules (or use "
                          "psnode.torch.Embedding, a table on the servers)")
    if not tensor.is_contiguous():
        raise ConfigError(f"{what} is not contiguous; call .contiguous() on it first")
    try:
        arr = tensor.detach().numpy()
    except (TypeError, RuntimeError) as exc:
        raise ConfigError(f"{what} of dtype {tensor.dtype} has no numpy equivalent ({exc}); "
                          "use float32 or float64") from None
    return arr


def host_dtype(dtype: Any, multi_precision: bool = True, what: str = "tensor") -> np.dtype:
    """The numpy dtype a key holds for torch ``dtype`` (float32 for 16-bit floats with
    ``multi_precision``); ConfigError for dtypes numpy cannot hold."""
    if dtype in _HALF and multi_precision:
        return np.dtype(np.float32)
    if dtype == _torch.bfloat16:
        raise ConfigError(f"{what} is bfloat16, which numpy cannot hold: keep multi_precision=True "
                          "(float32 master weights on the servers)")
    try:
        return np.dtype(_torch.empty(0, dtype=dtype).numpy().dtype)
    except (TypeError, RuntimeError):
        raise ConfigError(f"{what} of dtype {dtype} has no numpy equivalent; use float32") from None


@dataclass
class _Device:
    """Per CUDA device: the side stream and the events ordering it with the compute stream."""
    stream: Any
    before: Any   # recorded on the compute stream before weights are written back
    done: Any     # recorded on the side stream after the last write-back (host waits on it)


@dataclass
class _GradSlot:
    """One parameter, its key and its staging (module docstring: CPU views or host buffers)."""
    index: int
    key: str
    param: Any
    dtype: np.dtype                       # the key's dtype
    host: np.ndarray | None = None        # staged buffer (None: zero-copy views of a CPU param)
    host_t: Any = None                    # the torch tensor owning ``host``
    dev: Any = None                       # float32 device buffer for casts on a CUDA device
    ready: Any = None                     # CUDA: event on the stream that produced the gradient
    copied: Any = None                    # CUDA: event after the device-to-host copy
    pushed: bool = False
    zeros: np.ndarray | None = field(default=None, repr=False)

    @property
    def cuda(self) -> bool:
        return bool(self.param.device.type == "cuda")


class _Pusher:
    """A daemon thread that pushes each handed slot once its staged gradient is ready."""

    def __init__(self, push: Callable[[_GradSlot], None]) -> None:
        self._push = push
        self._queue: queue.Queue[_GradSlot | None] = queue.Queue()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="psnode-torch-pusher", daemon=True)
        self._thread.start()

    def put(self, slot: _GradSlot) -> None:
        self._queue.put(slot)

    def drain(self) -> None:
        """Wait until every handed slot was pushed; raise the first error of the thread."""
        self._queue.join()
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            slot = self._queue.get()
            try:
                if slot is None:
                    return
                if self.error is None:
                    self._push(slot)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread by drain()
                self.error = exc
            finally:
                self._queue.task_done()


class DistributedTrainer:
    """Push a model's gradients and pull its weights through ``kv`` (module docstring)."""

    def __init__(self, model: Any, kv: Any, optimizer: Any = None, prefix: str = "",
                 broadcast_buffers: bool = True, overlap: bool | None = None,
                 multi_precision: bool = True, compression: dict[str, Any] | None = None) -> None:
        if not isinstance(model, _torch.nn.Module):
            raise ConfigError(f"DistributedTrainer needs a torch.nn.Module, not {type(model).__name__}")
        self.model = model
        self.kv = kv
        self.prefix = prefix
        self.slots: list[_GradSlot] = []
        # tables pushed as row_sparse (psnode.torch.embedding): on the servers, or held here
        self.tables: list[Any] = [m for m in model.modules() if isinstance(m, ServerTable)]
        for t in self.tables:
            if t.kv is not kv:
                raise ConfigError(f"{type(t).__name__} {t.key!r} lives on another KVStore than this trainer's")
        held = {id(m.weight): m for m in model.modules()
                if isinstance(m, (_torch.nn.Embedding, _torch.nn.EmbeddingBag)) and m.sparse}
        held_params: list[tuple[str, Any]] = []
        for name, p in model.named_parameters():
            if p.requires_grad:
                key = prefix + name
                if id(p) in held:
                    held_params.append((key, held[id(p)]))
                    continue
                what = f"parameter {key!r}"
                self.slots.append(_GradSlot(len(self.slots), key, p, host_dtype(p.dtype, multi_precision, what)))
        if not self.slots and not self.tables and not held_params:
            raise ConfigError("the model has no parameters that require a gradient")
        if compression is not None:
            spec = CompressionSpec.from_params(compression)
            odd = next((s for s in self.slots if spec.active and s.dtype != np.float32), None)
            if odd is not None:
                raise ConfigError(f"parameter {odd.key!r} has a {odd.dtype} key: gradient compression "
                                  f"({spec.type.value}) applies to float32 keys only")
            kv.set_gradient_compression(compression)
        self.keys = [s.key for s in self.slots]
        self.names = list(self.keys)
        self.params = [s.param for s in self.slots] + [m.weight for _, m in held_params]
        self._devices: dict[Any, _Device] = {}
        for s in self.slots:
            self._stage_buffers(s)
        # what pulls fill: the parameters' own memory (CPU zero-copy) or the staging buffers
        self._weights = [s.host if s.host is not None else numpy_view(s.param.data, f"parameter {s.key!r}")
                         for s in self.slots]
        if optimizer is not None:
            if isinstance(optimizer, dict):
                optimizer = opt_mod.from_spec(optimizer)
            kv.set_optimizer(optimizer)
        with _torch.no_grad():
            for s in self.slots:
                if s.host_t is not None:
                    s.host_t.copy_(s.param.data)           # rank 0's copy is what init stores
            if self.keys:
                kv.init(self.keys, self._weights)
            self._write_back()
            if held_params:   # (rank 0's tables stored: every worker's weight is overwritten)
                holders = [HeldTable(key, m, kv) for key, m in held_params]
                kv.init([h.key for h in holders], [h.view for h in holders], stype="row_sparse")
                self.tables.extend(holders)
            if broadcast_buffers:
                self._init_buffers()
        if overlap is None:
            overlap = bool(self._devices) and hasattr(_torch.Tensor, "register_post_accumulate_grad_hook")
        self.overlap = overlap
        self._sync = True
        self._error: ConfigError | None = None
        self._hooks: list[Any] = []
        self._pusher: _Pusher | None = None
        if overlap:
            if not hasattr(_torch.Tensor, "register_post_accumulate_grad_hook"):
                raise ConfigError(f"overlap=True needs torch >= 2.1 (this is {_torch.__version__})")
            self._pusher = _Pusher(self._push_staged)
            self._hooks = [s.param.register_post_accumulate_grad_hook(self._hook(s)) for s in self.slots]

    # ------------------------------------------------------------ staging
    def _stage_buffers(self, s: _GradSlot) -> None:
        """Allocate ``s``'s host (pinned for CUDA) and device buffers, once."""
        p = s.param
        if p.layout != _torch.strided:
            raise ConfigError(f"parameter {s.key!r} is a {p.layout} tensor; psnode.torch needs dense ones")
        if not s.cuda:
            if p.dtype not in _HALF or s.dtype != np.float32:  # the key holds the parameter's dtype
                numpy_view(p.data, f"parameter {s.key!r}")     # zero-copy: checks it can be viewed
                return
            s.host_t = _torch.empty(p.shape, dtype=_torch.float32)
        else:
            if p.device not in self._devices:
                self._devices[p.device] = _Device(_torch.cuda.Stream(p.device, priority=-1),
                                                  _torch.cuda.Event(), _torch.cuda.Event(blocking=True))
            host_torch = _torch.float32 if p.dtype in _HALF and s.dtype == np.float32 else p.dtype
            s.host_t = _torch.empty(p.shape, dtype=host_torch, pin_memory=True)
            if host_torch != p.dtype:
                s.dev = _torch.empty(p.shape, dtype=host_torch, device=p.device)
            s.ready, s.copied = _torch.cuda.Event(), _torch.cuda.Event(blocking=True)
        s.host = s.host_t.numpy()

    def _side(self, s: _GradSlot) -> Any:
        return _torch.cuda.stream(self._devices[s.param.device].stream) if s.cuda else contextlib.nullcontext()

    def _stage_grad(self, s: _GradSlot, grad: Any) -> None:
        """Start copying ``grad`` into ``s.host`` (CUDA: asynchronously, ``s.copied`` marks the end)."""
        if s.host_t is None:
            return                                            # CPU zero-copy: pushed from a view
        if grad.layout != _torch.strided:
            raise ConfigError(f"the gradient of {s.key!r} is {grad.layout}; psnode.torch needs dense ones")
        if s.cuda:
            s.ready.record(_torch.cuda.current_stream(s.param.device))
            self._devices[s.param.device].stream.wait_event(s.ready)
        with self._side(s):
            src = grad
            if s.dev is not None:
                s.dev.copy_(grad)                             # the cast runs on the device
                src = s.dev
            s.host_t.copy_(src, non_blocking=s.cuda)
            if s.cuda:
                s.copied.record()

    def _array(self, s: _GradSlot, staged: bool) -> np.ndarray:
        """What a push of ``s`` sends: the staged buffer (once copied), a view, or zeros."""
        if staged and s.host is not None:
            if s.copied is not None:
                s.copied.synchronize()
            return s.host
        grad = s.param.grad
        if grad is not None and s.host is None:
            return numpy_view(grad, f"gradient of {s.key!r}")
        if s.zeros is None:                                   # no gradient: push zeros
            s.zeros = np.zeros(s.param.shape, s.dtype)
        return s.zeros

    def _push_staged(self, s: _GradSlot) -> None:
        self.kv.push(s.key, self._array(s, True), priority=-s.index)

    def _hook(self, s: _GradSlot) -> Callable[[Any], None]:
        def hook(param: Any) -> None:
            if not self._sync:
                return
            if s.pushed:
                self._error = self._error or ConfigError(
                    f"parameter {s.key!r} got a second gradient before step(): its first one was "
                    "already pushed. Accumulate gradients inside `with trainer.no_sync():` (all "
                    "backward passes but the last), or create the trainer with overlap=False")
                return
            s.pushed = True
            with _torch.no_grad():
                self._stage_grad(s, param.grad)
            assert self._pusher is not None
            self._pusher.put(s)
        return hook

    def _write_back(self) -> None:
        """Copy the pulled weights from the host buffers into the parameters; wait for it."""
        for dev in self._devices.values():
            dev.before.record(_torch.cuda.current_stream(dev.stream.device))
            dev.stream.wait_event(dev.before)
        for s in self.slots:
            if s.host_t is None:
                continue
            with self._side(s):
                if s.dev is not None:
                    s.dev.copy_(s.host_t, non_blocking=True)
                    s.param.data.copy_(s.dev)
                else:
                    s.param.data.copy_(s.host_t, non_blocking=s.cuda)
        for dev in self._devices.values():
            dev.done.record(dev.stream)
            dev.done.synchronize()

    def _init_buffers(self) -> None:
        """Copy rank 0's floating-point buffers to every worker (views for CPU ones)."""
        bufs = [(self.prefix + "buffer:" + n, b) for n, b in self.model.named_buffers()
                if b.numel() and b.is_floating_point()]
        if not bufs:
            return
        views = [b.device.type == "cpu" and b.dtype not in _HALF and b.is_contiguous() for _, b in bufs]
        hosts = [numpy_view(b.data, f"buffer {k!r}") if view else b.detach().to("cpu", _torch.float32).numpy()
                 for (k, b), view in zip(bufs, views, strict=True)]
        self.kv.init([k for k, _ in bufs], hosts)
        for (_, b), host, view in zip(bufs, hosts, views, strict=True):
            if not view:
                b.data.copy_(_torch.from_numpy(host))

    # ------------------------------------------------------------ API
    def zero_grad(self) -> None:
        """Clear the gradients (``set_to_none=False`` semantics: zeros in place; the sparse
        gradients of embedding tables are dropped)."""
        for s in self.slots:
            p = s.param
            if p.grad is not None:
                p.grad.detach_()
                p.grad.zero_()
        for t in self.tables:
            t.zero_grad_rows()

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate gradients without pushing them (as DDP's)."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    def push(self) -> None:
        """Send every gradient no hook sent yet (embedding tables first, as row_sparse; then
        layer ``i`` with priority ``-i``); no waiting."""
        if self._pusher is not None:
            self._pusher.drain()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        with self.kv.batch():   # (one message per same-host server)
            for t in self.tables:
                self.kv.push(t.key, t.sparse_grad(), priority=1)
                t.pushed()
            todo = [s for s in self.slots if not s.pushed]
            with _torch.no_grad():
                staged = {s.index for s in todo if s.param.grad is not None and s.host is not None}
                for s in todo:
                    if s.index in staged:
                        self._stage_grad(s, s.param.grad)
                for s in todo:
                    self.kv.push(s.key, self._array(s, s.index in staged), priority=-s.index)
        for s in self.slots:
            s.pushed = False

    def pull(self) -> None:
        """Fetch every parameter (layer order) and write it into the model; blocks until done."""
        if self.keys:
            self.kv.pull(self.keys, out=self._weights, priority=-len(self.keys))
        with _torch.no_grad():
            self._write_back()

    def step(self) -> None:
        """One training step after ``loss.backward()``: push gradients, pull new weights."""
        self.push()
        self.pull()

    def close(self) -> None:
        """Remove the gradient hooks and stop the pusher thread (the kvstore stays open)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        for t in self.tables:
            if isinstance(t, HeldTable):
                t.close()
        if self._pusher is not None:
            self._pusher.close()
            self._pusher = None

    def __repr__(self) -> str:
        return f"<DistributedTrainer {len(self.keys)} keys via {self.kv!r} overlap={self.overlap}>"


def wrap(model: Any, kv: Any, optimizer: Any = None, **kw: Any) -> DistributedTrainer:
    """Shorthand for :class:`DistributedTrainer` ``(model, kv, optimizer, **kw)``."""
    return DistributedTrainer(model, kv, optimizer, **kw)
