"""MXNet's KVStore calling conventions, normalised (pure: no I/O).

Every KVStore method takes one key or a list of keys, and per key one array or a list of
arrays, as MXNet's ``kvstore.py`` documents:

==========================  ==========================================================
``init(k, v)``               ``v`` an array, or a one-element list holding it
                             (``kv.init('200', [value])``, as MXNet's nightly test does)
``init([k, ...], [v, ...])`` one value per key (each may be a one-element list)
``push(k, v)``               ``v`` an array, or a list of arrays: summed (several devices)
``push([k, ...], [v, ...])`` per key an array or a list of arrays (a list of lists)
``pull(k, out)``             ``out`` an array or a list of arrays: each one gets the value
``pushpull(k, v, out)``      as push, then as pull into ``out`` (None: into every ``v``)
``row_sparse_pull(k, out, row_ids)``  ``row_ids`` one array of any shape (flattened; integer
                             or integral float values, repeats and any order allowed) for
                             every out, or a list with one array per out
==========================  ==========================================================

A list of keys with a single array (not a list) applies that array to every key.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from psnode.errors import ConfigError, ShapeMismatch

Group = tuple[Any, list[Any]]   # (key, the arrays given for it)


def _is_list(x: Any) -> bool:
    return isinstance(x, (list, tuple))


def groups(key: Any, value: Any, what: str) -> tuple[list[Group], bool]:
    """``[(key, [array, ...]), ...]`` and whether ``key`` was a list."""
    if _is_list(key):
        keys = list(key)
        values = list(value) if _is_list(value) else [value] * len(keys)
        if len(values) != len(keys):
            raise ConfigError(f"{what}: {len(keys)} keys but {len(values)} values")
        return [(k, list(v) if _is_list(v) else [v]) for k, v in zip(keys, values, strict=True)], True
    if _is_list(value):
        if not value:
            raise ShapeMismatch(f"{what}: key {key!r} got an empty list of values")
        return [(key, list(value))], False
    return [(key, [value])], False


def init_pairs(key: Any, value: Any) -> list[tuple[Any, Any]]:
    """``[(key, value), ...]`` for init: exactly one value per key."""
    out = []
    for k, values in groups(key, value, "init")[0]:
        if len(values) != 1:
            raise ConfigError(f"init of key {k!r} got {len(values)} values; a key is initialised "
                              "with one value (as in MXNet: kv.init(key, value) or kv.init(key, [value]))")
        out.append((k, values[0]))
    return out


def out_groups(key: Any, out: Any, what: str) -> tuple[list[Group], bool]:
    """Like :func:`groups` for outputs; ``out=None`` gives ``[None]`` per key (allocate)."""
    if out is None:
        keys = list(key) if _is_list(key) else [key]
        return [(k, [None]) for k in keys], _is_list(key)
    return groups(key, out, what)


def row_ids(ids: Any, key: Any) -> np.ndarray:
    """One row-id array (any shape) as int64, flattened; floats must hold whole numbers."""
    arr = np.asarray(ids)
    if arr.dtype == object:
        raise ConfigError(f"row_ids for key {key!r} must be numbers")
    arr = arr.reshape(-1)
    if not len(arr):
        return np.zeros(0, np.int64)
    if arr.dtype.kind == "f":
        if not np.isfinite(arr).all() or (arr != np.floor(arr)).any():
            raise ConfigError(f"row_ids for key {key!r} must be whole numbers")
        return arr.astype(np.int64)
    if arr.dtype.kind not in "iub":
        raise ConfigError(f"row_ids for key {key!r} must be integers, not {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def _is_id_list(ids: Sequence[Any]) -> bool:
    """A plain list of numbers is one id array, not one array per output."""
    return all(isinstance(i, (int, float, np.integer, np.floating)) and not isinstance(i, bool)
               for i in ids)


def row_id_lists(outs: list[Group], ids: Any, many: bool) -> list[list[np.ndarray]]:
    """Per key group, one int64 id array per output (one array given for several outputs is
    shared by all of them)."""
    if ids is None:
        raise ConfigError(f"row_sparse_pull of key {outs[0][0]!r} needs row_ids")
    if many:
        per_key = list(ids) if _is_list(ids) and not _is_id_list(ids) else [ids] * len(outs)
        if len(per_key) != len(outs):
            raise ConfigError(f"row_sparse_pull: {len(outs)} keys but {len(per_key)} row_ids")
    else:
        per_key = [ids]
    result = []
    for (key, targets), given in zip(outs, per_key, strict=True):
        if _is_list(given) and given and not _is_id_list(given):
            if len(given) != len(targets):
                raise ConfigError(f"row_sparse_pull of key {key!r}: {len(targets)} outputs but "
                                  f"{len(given)} row_ids")
            result.append([row_ids(g, key) for g in given])
        else:
            one = row_ids(given, key)
            result.append([one] * len(targets))
    return result


__all__ = ["Group", "groups", "init_pairs", "out_groups", "row_id_lists", "row_ids"]
