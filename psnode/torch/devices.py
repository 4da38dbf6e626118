"""Several devices per worker (MXNet's device kvstore): torch tensors to and from host arrays.

``kv.push(key, [g0, g1, ...])`` with one torch tensor per local GPU sends their sum, computed on
a GPU; ``kv.pull(key, out=[w0, w1, ...])`` writes the pulled value into every tensor.  The
KVStore does this through the two functions here, for values that are torch tensors:

* ``host_value(values, dtype, key) -> np.ndarray`` before a push (the array to send);
* ``scatter(value, outs, key)`` after a pull (the host array into the tensors).

Their docstrings are the contract.  Buffers (device sums, pinned host copies) are allocated on
first use per ``(key, shape, dtype, device)`` and reused: no allocation per step.  Imported
only with torch installed: :mod:`psnode.torch.values` (the KVStore's torch route) imports it lazily, when a value is a
tensor; :mod:`psnode.torch` re-exports both functions.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch as _torch

from psnode.errors import ConfigError, ShapeMismatch

__all__ = ["host_value", "scatter"]


def _host_dtype(dtype: Any, what: str) -> np.dtype:
    """numpy's dtype for torch ``dtype``; float32 for bfloat16 (numpy has none)."""
    if dtype == _torch.bfloat16:
        return np.dtype(np.float32)
    try:
        return np.dtype(_torch.empty(0, dtype=dtype).numpy().dtype)
    except (TypeError, RuntimeError):
        raise ConfigError(f"{what}: dtype {dtype} has no numpy equivalent; use float32") from None


def _numpy(tensor: Any) -> np.ndarray:
    return np.asarray(tensor.detach().numpy())


_BUFFERS: dict[tuple[Any, ...], Any] = {}


def _buffer(tag: tuple[Any, ...], shape: Any, dtype: Any, device: Any, pin: bool = False) -> Any:
    """A tensor allocated on first use and reused by every later call with the same arguments."""
    k = (*tag, tuple(shape), dtype, str(device))
    t = _BUFFERS.get(k)
    if t is None:
        t = _BUFFERS[k] = _torch.empty(tuple(shape), dtype=dtype, device=device, pin_memory=pin)
    return t


def _tensors(values: Any, what: str) -> list[Any]:
    ts = [values] if isinstance(values, _torch.Tensor) else list(values)
    if not ts:
        raise ShapeMismatch(f"{what}: empty list of tensors")
    for t in ts:
        if not isinstance(t, _torch.Tensor):
            raise ConfigError(f"{what}: a list mixing torch tensors and {type(t).__name__}")
        if t.layout != _torch.strided:
            raise ConfigError(f"{what}: {t.layout} tensors are not supported; use dense ones")
        if t.shape != ts[0].shape:
            raise ShapeMismatch(f"{what}: tensors of shapes {list(ts[0].shape)} and {list(t.shape)}")
    return ts


def host_value(values: Any, dtype: Any = None, key: Any = None) -> np.ndarray:
    """The host array a push of torch ``values`` (one tensor, or one per local device) sends.

    Contract (the KVStore calls this for torch values before its own checks):

    * The tensors are summed in list order on the device of the first CUDA tensor (the others
      are copied there first), in ``dtype`` (the key's numpy dtype; None: the tensors' own, and
      float32 for bfloat16), cast on the device, then copied once to a pinned host buffer.  CPU
      tensors only: summed on the CPU; a single contiguous CPU tensor of ``dtype`` is returned as
      a zero-copy numpy view.
    * The result may be a buffer reused by the next call with the same ``key``, shape and dtype:
      the caller must read it before then (``kv.push`` copies its value before returning).
    * Different shapes raise ShapeMismatch; a non-tensor in the list or a sparse tensor,
      ConfigError.  Data is ready when this returns (the device-to-host copy is waited for).
    """
    what = f"key {key!r}"
    ts = _tensors(values, what)
    target = np.dtype(dtype) if dtype is not None else _host_dtype(ts[0].dtype, what)
    tdtype = _torch.from_numpy(np.empty(0, target)).dtype
    shape = ts[0].shape
    first = next((t for t in ts if t.is_cuda), ts[0])
    with _torch.no_grad():
        if len(ts) == 1 and first.dtype == tdtype and first.is_contiguous():
            src = first
        else:
            src = _buffer(("sum", key), shape, tdtype, first.device)
            src.copy_(first)
            for i, t in enumerate(ts):
                if t is first:
                    continue
                if t.device != first.device:
                    peer = _buffer(("peer", key, i), shape, t.dtype, first.device)
                    peer.copy_(t)
                    t = peer
                src.add_(t)
        if not src.is_cuda:
            return _numpy(src)
        host = _buffer(("host", key), shape, tdtype, "cpu", pin=True)
        host.copy_(src)                                       # blocking: the data is there after
        return np.asarray(host.numpy())


def scatter(value: Any, outs: Any, key: Any = None) -> None:
    """Write the pulled host array ``value`` into every torch tensor of ``outs`` (broadcast).

    Contract: ``value`` goes to the first CUDA tensor of ``outs`` (one host-to-device copy;
    when dtypes differ, into a reused device buffer of ``value``'s dtype and cast there), and
    from that device to every other tensor, cast to each tensor's dtype (float32 master weights
    into bfloat16 parameters).  CPU-only ``outs`` are copied on the CPU.  Every tensor holds the
    value when this returns (the copies are waited for).  A shape differing from ``value``'s
    raises ShapeMismatch.
    """
    what = f"key {key!r}"
    ts = _tensors(outs, what)
    arr = np.ascontiguousarray(value)
    if tuple(arr.shape) != tuple(ts[0].shape):
        raise ShapeMismatch(f"{what}: value of shape {list(arr.shape)} for tensors of shape {list(ts[0].shape)}")
    src = _torch.from_numpy(arr)
    first = next((t for t in ts if t.is_cuda), None)
    with _torch.no_grad():
        if first is None:
            for t in ts:
                t.copy_(src)
            return
        base = first
        if first.dtype != src.dtype:
            base = _buffer(("bcast", key), arr.shape, src.dtype, first.device)
        base.copy_(src)
        for t in ts:
            if t is not base:
                t.copy_(base)
        for device in {t.device for t in ts if t.is_cuda}:
            _torch.cuda.current_stream(device).synchronize()
