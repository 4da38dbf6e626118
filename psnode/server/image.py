"""A server's state as a copy or a checkpoint holds it, brought forward by the changes of each
durable point (pure: no I/O).

A copy holder (psnode.server.replicas.Keeper) and a checkpoint chain (psnode.server.checkpoint)
start from a whole :func:`psnode.server.checkpoint.snapshot` and then take snapshots of changes
only (``changes_only``): per key part nothing, the rows its rounds changed (values and the
per-row optimizer state), or the part whole (new, dense, a new optimizer).  :class:`Image`
applies them in order; :meth:`Image.whole` gives the state back as one whole snapshot, which
is exactly the server's state at the last change applied (every key part of the latest index
is held: a part first carried as changes was carried whole before).

A part the server computed from a fill spec (``kv.init`` with ``ps_initializer``) comes whole as
that spec and the rows touched since it was made (``"origin"``: psnode.server.checkpoint); the
image holds those rows only (:class:`Spread`), and its changes add to them.

The cost of a durable point is therefore the rows touched since the last one, not the table's
size: with ``u`` rows of width ``d`` changed, ``u * (8 + 4 d (1 + o))`` bytes for float32 and
``o`` per-row optimizer arrays (Adagrad 1, Adam 2), plus the dense parts pushed and what
exactly-once needs (the index: pushes taken per worker, rounds in progress).  A whole copy (a
new holder's, a checkpoint base) of a spec-made part costs the same for the rows touched since
it was made; of any other part, its size.
"""
from __future__ import annotations

import re
from typing import Any

import numpy as np

from psnode.server.dyntable import HashIndex

Arrays = dict[str, np.ndarray]
PartKey = tuple[Any, int]

_PER_PART = re.compile(r"^(?:v|k|t|x|c|u|l)\d+$|^s\d+_")   # the arrays of a part's value and state


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
            if "dynamic" in item:
                parts[where] = _dynamic(self.parts.get(where), i, item, arrays)
                continue
            if "origin" in item:
                parts[where] = {"spread": Spread.of(i, item, arrays)}
                continue
            if item.get("changes") == "rows" and "spread" in self.parts[where]:
                spread = self.parts[where]["spread"]
                assert isinstance(spread, Spread)
                spread.apply(i, item, arrays)
                parts[where] = self.parts[where]
                continue
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
        index = []
        for i, item in enumerate(self.meta["index"]):
            part = self.parts[self._where(item)]
            index.append(item)
            if "dynamic" in item:
                rows = part["rows"]
                assert isinstance(rows, Rows)
                arrays.update(rows.whole(i))
                continue
            if "spread" in part:
                spread = part["spread"]
                assert isinstance(spread, Spread)
                index[-1] = {**item, **spread.fields()}
                arrays.update(spread.whole(i))
                continue
            arrays[f"v{i}"] = part["v"]
            for name in item["state"]:
                arrays[f"s{i}_{name}"] = part[f"s:{name}"]
        arrays.update(self.rest)
        return {**self.meta, "index": index}, arrays


class Rows(np.ndarray):
    """A dynamic part's rows as a copy holds them (psnode.server.checkpoint._dynamic_rows):
    hashed id -> position, the per-row arrays (value, per-row state), the rest as last sent.
    (An empty ndarray subclass, so an image's parts stay dicts of arrays.)"""

    index: HashIndex
    ids: np.ndarray
    held: np.ndarray
    per_row: dict[str, np.ndarray]
    other: dict[str, np.ndarray]
    free: list[int]
    used: int

    @classmethod
    def of(cls, ids: np.ndarray, per_row: dict[str, np.ndarray], other: dict[str, np.ndarray]) -> Rows:
        rows = np.zeros(0).view(cls)
        rows.index = HashIndex(2 * len(ids))
        rows.index.add(np.asarray(ids, np.int64), np.arange(len(ids), dtype=np.int64))
        rows.ids = np.array(ids, np.int64)
        rows.held = np.ones(len(ids), bool)
        rows.per_row = {n: _own(a) for n, a in per_row.items()}
        rows.other = {n: _own(a) for n, a in other.items()}
        rows.free, rows.used = [], len(ids)
        return rows

    @property
    def nbytes(self) -> int:  # type: ignore[override]
        return sum(a.nbytes for a in self.per_row.values()) + self.ids.nbytes

    def apply(self, gone: np.ndarray, ids: np.ndarray, per_row: dict[str, np.ndarray],
              other: dict[str, np.ndarray]) -> None:
        """Delete ``gone``, then write the rows of ``ids``."""
        at = self.index.get(gone)
        at = at[at >= 0]
        if len(at):
            self.index.remove(self.ids[at])
            self.held[at] = False
            self.free.extend(at.tolist())
        pos = self.index.get(ids)
        new = np.flatnonzero(pos < 0)
        if len(new):
            reuse = min(len(new), len(self.free))
            take = [self.free.pop() for _ in range(reuse)] + list(range(self.used, self.used + len(new) - reuse))
            self.used += len(new) - reuse
            if self.used > len(self.ids):
                cap = max(self.used, 2 * len(self.ids))
                self.ids = _grown(self.ids, cap)
                self.held = _grown(self.held, cap)
                self.per_row = {n: _grown(a, cap) for n, a in self.per_row.items()}
            pos[new] = take
            self.ids[pos[new]] = ids[new]
            self.held[pos[new]] = True
            self.index.add(ids[new], pos[new])
        for n, a in per_row.items():
            self.per_row[n][pos] = a
        self.other.update({n: _own(a) for n, a in other.items()})

    def whole(self, i: int) -> Arrays:
        """The rows as a whole snapshot's arrays of part ``i``."""
        live = np.flatnonzero(self.held[:self.used])
        out = {f"t{i}": self.ids[live]}
        out.update({n.replace("#", str(i)): a[live] for n, a in self.per_row.items()})
        out.update({n.replace("#", str(i)): a for n, a in self.other.items()})
        return out


class Spread(np.ndarray):
    """A spec-made part as a copy holds it (psnode.server.checkpoint, ``"origin"``): the spec,
    and the rows touched since the part was made, by row number (``at[row]``: 1 + its position,
    0: not held, the spec's value and a zero optimizer state), value and per-row state; the
    state arrays of other shapes as last sent.  (An empty ndarray subclass, as :class:`Rows`.)"""

    origin: dict[str, Any]
    at: np.ndarray
    ids: np.ndarray
    per_row: dict[str, np.ndarray]   # "v" and state names
    other: dict[str, np.ndarray]
    used: int

    @classmethod
    def of(cls, i: int, item: dict[str, Any], arrays: Arrays) -> Spread:
        """Part ``i`` of a whole snapshot, in its ``"origin"`` form."""
        spread = np.zeros(0).view(cls)
        spread.origin = item["origin"]
        rows = int(item["origin"]["shape"][0])
        spread.at = np.zeros(rows, np.int32 if rows < 2**31 - 1 else np.int64)   # (calloc: pages as touched)
        spread.ids = np.zeros(0, np.int64)
        spread.per_row, spread.other, spread.used = {}, {}, 0
        spread.apply(i, {**item, "changes": "rows"}, {**arrays, f"k{i}": arrays[f"t{i}"]})
        return spread

    @property
    def nbytes(self) -> int:  # type: ignore[override]
        return sum(a.nbytes for a in self.per_row.values()) + self.ids.nbytes + self.at.nbytes

    def apply(self, i: int, item: dict[str, Any], arrays: Arrays) -> None:
        """Write the rows of part ``i`` of a snapshot of changes (``k<i>``, ``v<i>``, per-row
        state) and its other state arrays."""
        per_row_names = set(item.get("state_rows", ()))
        for name in item["state"]:
            if name not in per_row_names and f"s{i}_{name}" in arrays:
                self.other[name] = _own(arrays[f"s{i}_{name}"])
        if f"k{i}" not in arrays:   # (no row changed)
            return
        ids = np.asarray(arrays[f"k{i}"], np.int64)
        given = {"v": arrays[f"v{i}"], **{n: arrays[f"s{i}_{n}"] for n in per_row_names}}
        pos = self.at[ids].astype(np.int64) - 1
        new = np.flatnonzero(pos < 0)
        if len(new):
            pos[new] = np.arange(self.used, self.used + len(new))
            self.used += len(new)
            if self.used > len(self.ids):
                cap = max(self.used, 2 * len(self.ids), 64)
                self.ids = _grown(self.ids, cap)
                self.per_row = {n: _grown(a, cap) for n, a in self.per_row.items()}
            self.ids[pos[new]] = ids[new]
            self.at[ids[new]] = pos[new] + 1
        for name, arr in given.items():
            held = self.per_row.get(name)
            if held is None:   # (a state made after the rows before it: zero there)
                held = self.per_row[name] = np.zeros((len(self.ids), *arr.shape[1:]), arr.dtype)
            held[pos] = arr

    def fields(self) -> dict[str, Any]:
        """The index fields of its whole form."""
        return {"origin": self.origin, "state_rows": sorted(n for n in self.per_row if n != "v")}

    def whole(self, i: int) -> Arrays:
        """Its arrays in a whole snapshot, as part ``i`` (the rows held, then their value and
        per-row state, then the other state arrays)."""
        n = self.used
        out = {f"t{i}": self.ids[:n]}
        out.update({(f"v{i}" if name == "v" else f"s{i}_{name}"): a[:n] for name, a in self.per_row.items()})
        out.update({f"s{i}_{name}": a for name, a in self.other.items()})
        return out


def _grown(arr: np.ndarray, cap: int) -> np.ndarray:
    out = np.zeros((cap, *arr.shape[1:]), arr.dtype)
    out[:len(arr)] = arr
    return out


def _dynamic(held: dict[str, np.ndarray] | None, i: int, item: dict[str, Any], arrays: Arrays) -> dict[str, np.ndarray]:
    """A dynamic part of an image brought forward by part ``i`` of a snapshot."""
    per_row_names = {f"v{i}"} | {f"s{i}_{n}" for n in item.get("state_rows", ())}
    mine = {n: a for n, a in arrays.items() if n in per_row_names or n in (f"c{i}",) or
            (n.startswith(f"s{i}_") and n[len(f"s{i}_"):] in item["state"])}
    def tmpl(n: str) -> str:   # (v<i> -> v#, s<i>_m -> s#_m)
        return n[0] + "#" + n[1 + len(str(i)):]
    per_row = {tmpl(n): a for n, a in mine.items() if n in per_row_names}
    other = {tmpl(n): a for n, a in mine.items() if n not in per_row_names}
    if item.get("changes") != "rows":
        per_row["l#"] = arrays[f"l{i}"]
        return {"rows": Rows.of(np.asarray(arrays[f"t{i}"], np.int64), per_row, other)}
    if held is None or "rows" not in held:
        raise NotApplicable(f"changes to a dynamic part this copy lacks: {item['key']!r}")
    rows = held["rows"]
    assert isinstance(rows, Rows)
    rows.apply(np.asarray(arrays[f"x{i}"], np.int64), np.asarray(arrays[f"k{i}"], np.int64), per_row, other)
    rows.apply(np.zeros(0, np.int64), np.asarray(arrays[f"u{i}"], np.int64), {"l#": arrays[f"l{i}"]}, {})
    return held


def nbytes(arrays: Arrays) -> int:
    """The bytes a snapshot's arrays hold (what a copy or a checkpoint of it moves)."""
    return sum(a.nbytes for a in arrays.values())


__all__ = ["Image", "NotApplicable", "Spread", "nbytes"]
