"""Torch tensors through the KVStore API: the torch route (:mod:`psnode.worker.routes`) that hands
them to :mod:`psnode.torch.devices`.

``kv.push(key, t)`` / ``kv.push(key, [g0, g1, ...])`` with torch tensors (one per local device)
and ``kv.pull(key, out=[w0, w1, ...])`` into torch tensors work like their numpy forms (MXNet's
device kvstore).  The KVStore calls the functions here first (through the route ``psnode`` installs:
this module is loaded once ``torch`` is); they replace torch values by host arrays and say which
tensors get the pulled values afterwards:

* :func:`push_values` -- every torch tensor, or non-empty list of them, given for a key becomes
  ``torch_devices.host_value(v, dtype=<the key's dtype>, key=k)``; anything else is left as is.
* :func:`pull_outs` -- every torch tensor, or list of them, given as ``out`` for a key becomes
  one host array of the key's shape and dtype (reused across calls, in ``bufs``); the returned
  :class:`Scatter` list is applied by :func:`finish` after the pull (``torch_devices.scatter``).
  With ``row_ids`` (a row_sparse pull writes only the fetched rows) each tensor gets its own
  host array, a copy of the tensor, so the rows not fetched keep their values.

Torch is never imported here (it is loaded already when this module is): every function returns
its input unchanged when no value is a tensor.  Keys not
initialised, or of another shape, are left for the KVStore's own checks (its usual errors).
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

Info = Callable[[Any], Any]   # key -> its KeyInfo (shape, dtype), or None when not initialised


@dataclass
class Scatter:
    """After the pull: write ``host`` (the key's value) into every tensor of ``tensors``."""

    key: Any
    host: np.ndarray
    tensors: list[Any]


def _tensor_type() -> Any:
    torch = sys.modules.get("torch")
    return None if torch is None else torch.Tensor


def _group(v: Any, tensor: Any) -> bool:
    """``v`` is a torch tensor or a non-empty list/tuple of them."""
    if type(v) is np.ndarray:          # the common case, before torch's slower isinstance
        return False
    if isinstance(v, tensor):
        return True
    return isinstance(v, (list, tuple)) and bool(v) and all(isinstance(x, tensor) for x in v)


def _any(key: Any, value: Any, tensor: Any) -> bool:
    """Is any key's value (MXNet's forms) a torch tensor or a list of them?"""
    if isinstance(key, (list, tuple)) and isinstance(value, (list, tuple)):
        return any(_group(v, tensor) for v in value if type(v) is not np.ndarray)
    return _group(value, tensor)


def _per_key(key: Any, value: Any) -> list[tuple[Any, Any]] | None:
    """``[(key, its value)]`` in MXNet's forms (:mod:`psnode.worker.forms`); None when malformed (left
    for the KVStore to report)."""
    if isinstance(key, (list, tuple)):
        values = list(value) if isinstance(value, (list, tuple)) else [value] * len(key)
        return list(zip(key, values, strict=True)) if len(values) == len(key) else None
    return [(key, value)]


def push_values(key: Any, value: Any, info: Info) -> Any:
    """``value`` with each key's torch tensor(s) replaced by the host array to push."""
    tensor = _tensor_type()
    if tensor is None or not _any(key, value, tensor):
        return value
    pairs = _per_key(key, value)
    if pairs is None:
        return value
    from psnode.torch.devices import host_value

    dup = len({k for k, _ in pairs}) != len(pairs)   # host_value reuses one buffer per key
    done = []
    for k, v in pairs:
        if _group(v, tensor):
            meta = info(k)
            v = host_value(v, dtype=None if meta is None else meta.dtype, key=k)
            if dup:
                v = v.copy()
        done.append(v)
    return done if isinstance(key, (list, tuple)) else done[0]


def pull_outs(key: Any, out: Any, info: Info, bufs: dict[Any, np.ndarray],
              rows: bool = False) -> tuple[Any, list[Scatter]]:
    """``out`` with each key's torch tensor(s) replaced by host arrays, and what to scatter.

    Without ``rows`` one host array per key, kept in ``bufs`` (reused by the next pull of the
    key).  With ``rows`` (a row_sparse pull) one fresh host copy per tensor.
    """
    tensor = _tensor_type()
    if tensor is None or out is None or not _any(key, out, tensor):
        return out, []
    pairs = _per_key(key, out)
    if pairs is None:
        return out, []
    scatters: list[Scatter] = []
    done = []
    for k, o in pairs:
        meta = info(k)
        if not _group(o, tensor) or meta is None:
            done.append(o)
            continue
        ts = [o] if isinstance(o, tensor) else list(o)
        if rows:
            hosts = [_copy_of(t, meta.dtype) for t in ts]
            scatters.extend(Scatter(k, h, [t]) for h, t in zip(hosts, ts, strict=True))
            done.append(hosts if isinstance(o, (list, tuple)) else hosts[0])
            continue
        host = bufs.get(k)
        if host is None or host.shape != meta.shape or host.dtype != meta.dtype:
            host = bufs[k] = _host_array(meta.shape, meta.dtype, any(t.is_cuda for t in ts))
        if any(s.host is host for s in scatters):      # the same key twice in one pull
            host = np.empty_like(host)
        scatters.append(Scatter(k, host, ts))
        done.append(host)
    return (done if isinstance(key, (list, tuple)) else done[0]), scatters


def finish(scatters: list[Scatter]) -> None:
    """Write each pulled host array into its tensors (the tensors hold it on return)."""
    if not scatters:
        return
    from psnode.torch.devices import scatter

    for s in scatters:
        scatter(s.host, s.tensors, key=s.key)


def _host_array(shape: tuple[int, ...], dtype: np.dtype, pinned: bool) -> np.ndarray:
    """A host array for pulls: page-locked (a faster host-to-device copy) for CUDA tensors."""
    torch = sys.modules["torch"]
    if pinned and torch.cuda.is_available():
        tdtype = torch.from_numpy(np.empty(0, dtype)).dtype
        return np.asarray(torch.empty(shape, dtype=tdtype, pin_memory=True).numpy())
    return np.empty(shape, dtype)


def _copy_of(t: Any, dtype: np.dtype) -> np.ndarray:
    """A host copy of tensor ``t`` in ``dtype`` (bfloat16 goes through float32)."""
    torch = sys.modules["torch"]
    src = t.detach()
    if src.dtype == torch.bfloat16:
        src = src.float()
    return np.array(src.cpu().numpy(), dtype=dtype, copy=True)


__all__ = ["Scatter", "finish", "pull_outs", "push_values"]
