"""A server's state as a copy or a checkpoint holds it, brought forward by the changes of each
durable point (pure: no I/O).

A copy holder (psnode.server.replicas.Keeper) and a checkpoint chain (psnode.server.checkpoint)
start from a whole :func:`psnode.server.checkpoint.snapshot` and then take snapshots of changes
only (``changes_only``): per key part nothing, the rows its rounds changed (values and the
per-row optimizer state), or the part whole (new, dense, a new optimizer).  :class:`Image`
applies them in order; :meth:`Image.whole` gives the state back as one whole snapshot, which
is exactly the server's state at the last change applied (every key part of the latest index
is held: a part first carried as changes was carried whole before).

The cost of a durable point is therefore the rows touched since the last one, not the table's
size: with ``u`` rows of width ``d`` changed, ``u * (8 + 4 d (1 + o))`` bytes for float32 and
``o`` per-row optimizer arrays (Adagrad 1, Adam 2), plus the dense parts pushed and what
exactly-once needs (the index: pushes taken per worker, rounds in progress).
"""
from __future__ import annotations

import re
from typing import Any

import numpy as np

Arrays = dict[str, np.ndarray]
PartKey = tuple[Any, int]

_PER_PART = re.compile(r"^(?:v|k)\d+$|^s\d+_")   # the arrays of a part's value and state


def _own(arr: np.ndarray) -> np.ndarray:
    """``arr`` as an array of the image's own (C-contiguous, writable: changes are written in)."""
    return np.require(arr, requirements=["C", "W", "O"])


class NotApplicable(ValueError):
    """A snapshot of changes names a key part this image does not hold whole (it belongs after
    another image): the holder needs a whole copy."""


class Image:
    """A whole server state, kept up to date by snapshots of changes (module docstring)."""

    def __init__(self, meta: dict[str, Any], arrays: Arrays) -> None:
        self.meta: dict[str, Any] = {}
        self.parts: dict[PartKey, dict[str, np.ndarray]] = {}   # part -> {"v": value, "s:<name>": state}
        self.rest: Arrays = {}       # the latest snapshot's other arrays (rounds in progress)
        self.apply(meta, arrays)

    @staticmethod
    def _where(item: dict[str, Any]) -> PartKey:
        return (item["key"], int(item["part"]))

    def apply(self, meta: dict[str, Any], arrays: Arrays) -> None:
        """Bring the image to the state ``meta`` and ``arrays`` describe (a whole snapshot, or
        the changes since the state the image holds).  NotApplicable, the image unchanged,
        when they are changes to a key part it does not hold."""
        index = meta["index"]
        missing = [self._where(it) for it in index if it.get("changes") == "rows" and self._where(it) not in self.parts]
        if missing:
            raise NotApplicable(f"changes to key parts this copy lacks: {missing[:3]}")
        parts: dict[PartKey, dict[str, np.ndarray]] = {}
        for i, item in enumerate(index):
            where = self._where(item)
            if item.get("changes") != "rows":
                part = {"v": _own(arrays[f"v{i}"])}
                for name in item["state"]:
                    part[f"s:{name}"] = _own(arrays[f"s{i}_{name}"])
            else:
                part = self.parts[where]
                rows = arrays.get(f"k{i}")
                if rows is not None:
                    part["v"][rows] = arrays[f"v{i}"]
                per_row = set(item.get("state_rows", ()))
                for name in item["state"]:
                    if name in per_row:
                        part[f"s:{name}"][rows] = arrays[f"s{i}_{name}"]
                    elif f"s{i}_{name}" in arrays:
                        part[f"s:{name}"] = _own(arrays[f"s{i}_{name}"])
            parts[where] = part
        self.parts = parts
        self.rest = {n: _own(a) for n, a in arrays.items() if not _PER_PART.match(n)}
        self.meta = {**meta, "index": [{k: v for k, v in it.items() if k not in ("changes", "state_rows")}
                                       for it in index]}

    def whole(self) -> tuple[dict[str, Any], Arrays]:
        """The state as one whole snapshot (the arrays are the image's: read them before the
        next :meth:`apply`)."""
        arrays: Arrays = {}
        for i, item in enumerate(self.meta["index"]):
            part = self.parts[self._where(item)]
            arrays[f"v{i}"] = part["v"]
            for name in item["state"]:
                arrays[f"s{i}_{name}"] = part[f"s:{name}"]
        arrays.update(self.rest)
        return self.meta, arrays

    @property
    def nbytes(self) -> int:
        held = sum(a.nbytes for p in self.parts.values() for a in p.values())
        return held + sum(a.nbytes for a in self.rest.values())


def nbytes(arrays: Arrays) -> int:
    """The bytes a snapshot's arrays hold (what a copy or a checkpoint of it moves)."""
    return sum(a.nbytes for a in arrays.values())


__all__ = ["Image", "NotApplicable", "nbytes"]
