"""The arrays a KVStore call was given, checked against their keys (pure: no I/O).

:func:`gradients` reads the arrays of a push (one or more keys, in any of MXNet's forms);
:func:`plain` recognises the common call (a list of initialised keys, one plain numpy array of
the key's shape and dtype each) in one pass; :func:`prepare` makes one gradient of the arrays
given for a key (several are summed, row_sparse ones concatenated); :func:`targets` the
outputs of a pull and the C-contiguous array its answers are copied into.  A wrong shape or
dtype raises :class:`~psnode.errors.ShapeMismatch` naming the key
(:meth:`psnode.worker.keys.KeyInfo.check`; :class:`~psnode.errors.DTypeMismatch` when only the
dtype differs).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from psnode.errors import KeyNotInitialized, ShapeMismatch
from psnode.math.sparse import RowSparseArray
from psnode.worker import forms
from psnode.worker.keys import Item, KeyInfo


def info(infos: dict[Any, KeyInfo], key: Any) -> KeyInfo:
    """The key's info; :class:`~psnode.errors.KeyNotInitialized` naming it when it has none."""
    got = infos.get(key)
    if got is None:
        raise KeyNotInitialized(f"key {key!r} is not initialised: call kv.init({key!r}, value) first")
    return got


def gradients(infos: dict[Any, KeyInfo], key: Any, value: Any) -> list[Item]:
    """The gradients of a push, ``[(key, info, gradient)]``: a plain numpy array of its key's
    shape and dtype as it is (one key, or a list of them: :func:`plain`); any other form as
    :func:`psnode.worker.forms.groups` reads it, each key's arrays made one (:func:`prepare`)."""
    if type(value) is np.ndarray and not isinstance(key, (list, tuple)):
        got = infos.get(key)
        if got is not None and value.shape == got.shape and value.dtype == got.dtype:
            return [(key, got, value)]
    items = plain(infos, key, value, False)
    if items is not None:
        return items
    out: list[Item] = []
    for k, values in forms.groups(key, value, "push")[0]:
        kinfo = info(infos, k)
        out.append((k, kinfo, prepare(k, kinfo, values)))
    return out


def plain(infos: dict[Any, KeyInfo], key: Any, arrays: Any, writing: bool) -> list[Item] | None:
    """``[(key, info, array)]`` when ``key`` is a list of initialised keys and ``arrays`` a
    list of plain numpy arrays of their shapes and dtypes (writable, C-contiguous when
    ``writing``: pull outputs); None otherwise (the general forms apply)."""
    if type(key) is not list or type(arrays) is not list or len(key) != len(arrays):
        return None
    items: list[Item] = []
    for k, a in zip(key, arrays, strict=True):
        info = infos.get(k)
        if info is None or type(a) is not np.ndarray or a.shape != info.shape or a.dtype != info.dtype:
            return None
        if writing:
            if not (a.flags.c_contiguous and a.flags.writeable):
                return None
            items.append((k, info, (a, None)))
        else:
            items.append((k, info, a))
    return items


def prepare(key: Any, info: KeyInfo, values: list[Any]) -> np.ndarray | RowSparseArray:
    """One gradient from the arrays given for ``key`` (several are summed)."""
    if len(values) > 1:
        if all(isinstance(v, RowSparseArray) for v in values):
            value: Any = RowSparseArray(np.concatenate([v.data for v in values]),
                                        np.concatenate([v.indices for v in values]), values[0].shape)
        else:
            parts = [v.todense() if isinstance(v, RowSparseArray) else np.asarray(v) for v in values]
            for p in parts:
                info.check(key, p.shape, p.dtype)
            value = np.sum(parts, axis=0, dtype=info.dtype)
    else:
        value = values[0]
    if isinstance(value, RowSparseArray):
        info.check(key, value.shape, value.dtype)
        if not info.sparse:
            return value.todense()
        return value
    value = np.asarray(value)
    info.check(key, value.shape, value.dtype)
    return value


def targets(k: Any, info: KeyInfo, targets: list[Any]) -> tuple[list[Any], np.ndarray]:
    """The outputs for key ``k`` (allocated when None) and the C-contiguous array the
    servers' answers are copied into."""
    done = []
    for o in targets:
        if o is None:
            o = np.empty(info.shape, info.dtype)
        if not isinstance(o, np.ndarray):
            raise ShapeMismatch(f"key {k!r}: out must be a numpy array, not {type(o).__name__}")
        info.check(k, o.shape, o.dtype, out=True)
        done.append(o)
    first = done[0]
    dest = first if first.flags.c_contiguous and first.flags.writeable else np.empty_like(first, order="C")
    return done, dest


__all__ = ["gradients", "info", "plain", "prepare", "targets"]
