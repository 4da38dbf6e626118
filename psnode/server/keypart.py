"""A key part's state on its server, and the rules of its push numbers (pure data, no I/O).

A key is cut into parts, one per server that holds a slice of it (psnode.worker.placement);
a server keeps one :class:`Entry` per key part it holds: the value, the round being summed,
the pushes taken per worker, parked pulls, the optimizer state and the durable watermarks.
Push ``q`` of a worker is taken once (:func:`received`); ``pushed`` counts a worker's pushes
applied without a gap, ``early`` (sync) and ``ahead`` (async) hold those past one.  ``start``
holds the start round of each worker that joined the running job and agreed it with this part
(a JOIN; the workers of the first generation start at round 1).

**Changes since the last durable point** (kept only while a server copies or checkpoints its
state: psnode.server.checkpoint.snapshot with ``changes_only``): ``changed`` says the whole
value (and optimizer state) may differ from the last copy -- a new part, a dense round, a new
optimizer --; otherwise ``changed_rows`` holds the row ids of row_sparse rounds applied since,
so a copy carries only those rows, whatever the table's size.

**Rows touched since creation** (kept always, for a part the server computed from a fill spec:
``kv.init`` with ``ps_initializer``): ``origin`` is that spec and ``ever`` marks the rows any
round changed since.  Every other row still holds the spec's value and a zero optimizer state
(psnode.math.optimizers.create_state), so a whole copy or a checkpoint base of the part is the
spec plus those rows (psnode.server.checkpoint).  A dense round, a Python updater or optimizer
states loaded from a file make the part whole-only again (``origin`` None).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from psnode.math.aggregation import Aggregation
from psnode.math.sparse import unique_rows
from psnode.server.replies import Reply

Key = tuple[Any, int]  # (user key, part index)


class Group(Protocol):
    """The bucket a key part's value lives in (psnode.server.buckets), as its rounds see it."""

    def answer(self, member: Callable[[int], bool]) -> list[Reply]:
        """The bucket pulls a completed round of a member lets through (``member(w)``: does
        worker ``w`` take part)."""
        ...


@dataclass
class Entry:
    """One key part this server holds (see the module docstring)."""

    value: np.ndarray
    sparse: bool
    sync: bool
    aggregation: Aggregation   # how a round's pushes fold (psnode.math.aggregation)
    round: int = 0
    first: np.ndarray | None = None   # the round's first dense push, by reference
    spare: np.ndarray | None = None   # buffer the next aggregate is summed into
    spare_sends: list[Any] = field(default_factory=list)
    contributors: set[int] = field(default_factory=set)
    sparse_parts: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    # pushes for later rounds: (seq, data: an array or a psnode.server.compressed.Packed, rows)
    early: dict[int, list[tuple[int, Any, np.ndarray | None]]] = field(default_factory=dict)
    pushed: dict[int, int] = field(default_factory=dict)
    ahead: dict[int, set[int]] = field(default_factory=dict)  # async: applied beyond a gap
    # parked pulls: (worker, request id, after, row ids, landing area)
    pulls: list[tuple[int, int, int, np.ndarray | None, np.ndarray | None]] = field(default_factory=list)
    state: Any = None
    value_sends: list[Any] = field(default_factory=list)  # sends reading ``value`` (psnode.server.replies)
    nonfinite: set[int] = field(default_factory=set)   # workers whose push this round was bad
    skipped: int = 0
    bucket: Group | None = None   # the bucket it belongs to (its value is a view of the bucket's)
    fixed: bool = False    # value stays where it is (written in place, never swapped)
    scaled: bool = False   # spare already holds the round's mean (folded and scaled at once)
    row_sum: np.ndarray | None = None   # flat scratch a sync row_sparse round is summed into
    durable: dict[int, int] = field(default_factory=dict)   # worker -> pushes its last checkpoint holds
    start: dict[int, int] = field(default_factory=dict)   # joiner -> its start round here (psnode.server.rounds)
    staleness: int = -1   # async: pulls wait for the bound (dist_ssp: psnode.server.staleness); -1: none
    changed: bool = True  # value and state may differ wholly from the last copy (module docstring)
    changed_rows: list[np.ndarray] = field(default_factory=list)   # else: the rows changed since
    # a durable point in the background reads these optimizer state arrays until ``done``: the
    # rounds write a copy instead (the value is held the same way: a Pin in ``value_sends``)
    state_pin: Any = None
    fresh: bool = True    # created after the last durable point began that has completed
    backup: int = 0       # sync: a round completes without this many of its workers (psnode.server.rounds)
    alone_at: float = 0.0   # when the round began to wait for one worker alone (psnode.server.awaited); 0: not
    alone_for: int = -1     # that worker
    table: Any = None   # a table without a row count: its index (psnode.server.dyntable.Table)
    origin: Any = None   # the fill spec it was computed from (psnode.math.initializers.FillSpec; module docstring)
    ever: np.ndarray | None = None   # with ``origin``: the rows changed since creation (a mask)


class Pin:
    """Marks arrays a durable point in the background still reads (psnode.server.points): until
    ``done``, the rounds never write them in place (psnode.server.rounds: copy on write)."""

    done = False


class RowPin(Pin):
    """A Pin on a row_sparse part's value and per-row state arrays (``arrays``, by name: ``v``
    and the state's) that a whole copy reads while the rounds go on: the rounds write rows in
    place, but :meth:`save` first what each row held when the copy began, once per row; the
    copy, fuzzy as read, is made exact by those rows (:meth:`taken`: psnode.server.points).  So
    a whole copy costs the rounds the rows they touch meanwhile, not a copy of the part."""

    def __init__(self, arrays: dict[str, np.ndarray], part: int = -1) -> None:
        self.arrays = arrays
        self.part = part   # (the part's number in the snapshot the copy holds)
        self.seen = np.zeros(len(arrays["v"]), dtype=bool)   # (pages made as rows are saved)
        self._rows: list[np.ndarray] = []
        self._saved: dict[str, list[np.ndarray]] = {n: [] for n in arrays}

    def save(self, rows: np.ndarray) -> None:
        """``rows`` are about to be written: keep what those not saved yet hold."""
        if self.done or not len(rows):
            return
        rows = np.asarray(rows, np.int64)
        new = rows[~self.seen[rows]]
        if not len(new):
            return
        new = np.unique(new)   # (an async push may name a row twice)
        self.seen[new] = True
        self._rows.append(new)
        for name, arr in self.arrays.items():
            self._saved[name].append(np.take(arr, new, axis=0))

    def taken(self) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The rows saved (sorted) and, per array, what they held when the copy began."""
        if not self._rows:
            return np.empty(0, np.int64), {}
        rows = np.concatenate(self._rows)
        order = np.argsort(rows, kind="stable")
        return rows[order], {n: np.concatenate(a)[order] for n, a in self._saved.items()}


def note_change(entry: Entry, rows: np.ndarray | None) -> None:
    """Record that ``rows`` of ``entry`` (None: all of it) changed since the last copy."""
    if rows is None:
        entry.changed = True
        entry.changed_rows.clear()
    elif not entry.changed and len(rows):
        entry.changed_rows.append(np.array(rows, dtype=np.int64))   # (a copy: pushes' ids are views of frames)


def made_from(entry: Entry, spec: Any) -> None:
    """``entry``'s value was just computed from the fill spec ``spec`` (module docstring)."""
    if entry.value.ndim >= 1 and entry.table is None and entry.bucket is None:
        entry.origin = spec
        entry.ever = np.zeros(entry.value.shape[0], dtype=bool)


def note_touch(entry: Entry, rows: np.ndarray | None) -> None:
    """Record that ``rows`` of ``entry`` (None: any of it) differ from its fill spec from now on."""
    if entry.ever is None:
        return
    if rows is None:
        entry.origin = entry.ever = None
    elif len(rows):
        entry.ever[rows] = True


def forget_changes(entry: Entry) -> None:
    """``entry`` as it is is held by every copy (a durable point)."""
    entry.changed = False
    entry.changed_rows.clear()


def changed_rows(entry: Entry) -> np.ndarray:
    """The distinct rows of ``entry`` changed since the last copy, sorted (``changed`` False)."""
    if not entry.changed_rows:
        return np.empty(0, np.int64)
    entry.changed_rows[:] = [unique_rows(np.concatenate(entry.changed_rows), runs=True)]   # (rounds' rows: sorted runs)
    return entry.changed_rows[0]


def fmt(key: Any, part: int) -> str:
    """A key part as messages name it: ``key 'w'``, ``key 'w' part 1``."""
    return f"key {key!r}" + (f" part {part}" if part else "")


def received(entry: Entry, worker: int, seq: int) -> bool:
    """Push ``seq`` of ``worker`` was taken (applied, being summed or waiting)."""
    return (seq <= entry.pushed.get(worker, 0) or seq in entry.ahead.get(worker, ())
            or any(s == seq for s, *_ in entry.early.get(worker, [])))


def first_gap(entry: Entry, worker: int) -> int:
    """The first push sequence number of ``worker`` this key part has not received."""
    have = {s for s, *_ in entry.early.get(worker, [])} | entry.ahead.get(worker, set())
    seq = entry.pushed.get(worker, 0) + 1
    while seq in have:
        seq += 1
    return seq


def contiguous(entry: Entry, worker: int) -> int:
    """How many pushes of ``worker`` this key part holds, counted without a gap (1..n all
    received: applied, in the round being summed, or waiting for a later round)."""
    if not entry.early and not entry.ahead:
        return entry.pushed.get(worker, 0)
    return first_gap(entry, worker) - 1


def mark_async(entry: Entry, worker: int, seq: int) -> None:
    """Record async push ``seq`` of ``worker`` as applied; ``pushed`` stays contiguous."""
    done = entry.pushed.get(worker, 0)
    if seq != done + 1:
        entry.ahead.setdefault(worker, set()).add(seq)
        return
    done = seq
    ahead = entry.ahead.get(worker)
    while ahead and done + 1 in ahead:
        ahead.discard(done + 1)
        done += 1
    entry.pushed[worker] = done


__all__ = ["Entry", "Group", "Key", "Pin", "changed_rows", "contiguous", "first_gap", "fmt", "forget_changes",
           "made_from", "mark_async", "note_change", "note_touch", "received"]
