"""The key parts of tables without a row count, as the store serves them (pure: no I/O).

The store (psnode.server.store) hands a dynamic part's pushes and pulls here first: their
hashed ids (psnode.math.dynrows) become slots of the part's value (rows made on first touch,
admission counted: psnode.server.dyntable), then the part's rounds (psnode.server.rounds) take
them like any row_sparse part's.  The value and the per-row optimizer state grow with the
table (:func:`fit`); eviction runs in steps of at most ``budget`` rows (:func:`evict_some`),
called by the server's loop between messages.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from psnode.math import optimizers as opt_mod
from psnode.math.aggregation import Aggregation
from psnode.math.initializers import Initializer
from psnode.server.dyntable import Params, Table, grow
from psnode.server.keypart import Entry, note_change, received
from psnode.server.rounds import Alloc

EVICT_STEP = 1 << 16   # rows one eviction step drops at most


def make_entry(key: Any, params: Params, init: Initializer, seed: int, dtype: np.dtype, sync: bool,
               aggregation: Aggregation, staleness: int, optimizer: opt_mod.Optimizer | None, alloc: Alloc) -> Entry:
    """A new, empty dynamic part."""
    entry = Entry(value=alloc((0, params.width), dtype), sparse=True, sync=sync, aggregation=aggregation,
                  staleness=staleness)
    entry.table = Table(params, init, seed, key)
    entry.fixed = False
    if optimizer is not None and dtype.kind == "f":
        entry.state = optimizer.create_state(entry.value)
    return entry


def fit(entry: Entry, alloc: Alloc) -> None:
    """The value and per-row optimizer state of ``entry`` grown to its table's capacity."""
    table: Table = entry.table
    cap = table.capacity
    if len(entry.value) >= cap:
        return
    value = alloc((cap, entry.value.shape[1]), entry.value.dtype)
    value[:len(entry.value)] = entry.value
    value[len(entry.value):] = 0
    entry.value = value
    entry.value_sends = []
    if entry.state is not None:
        entry.state.arrays = {n: grow(a, cap) for n, a in entry.state.arrays.items()}


def _made(entry: Entry, alloc: Alloc, hashed: np.ndarray, trained: bool, track: bool) -> np.ndarray:
    """Rows for ``hashed`` (distinct, none held) with their initial values; their slots."""
    table: Table = entry.table
    slots = table.place(hashed, trained)
    if track:
        table.touched.append(slots)
    fit(entry, alloc)
    entry.value[slots] = table.initial(hashed, entry.value.dtype, trained)
    if entry.state is not None:
        for a in entry.state.arrays.values():
            a[slots] = 0
    if track and trained:
        note_change(entry, slots)
    return slots


def due(entry: Entry) -> bool:
    """Is an eviction step of ``entry`` due?  (A sync part's clock is its completed rounds.)"""
    table: Table = entry.table
    if entry.sync:
        table.clock = entry.round
    return table.due()


def _distinct(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """``(distinct ids, inverse)``; the inverse None when ``rows`` are distinct already: strictly
    increasing as unsigned, as a worker's pull sends them (one pass tells)."""
    rows = np.asarray(rows, np.int64)
    u = rows.view(np.uint64)
    if len(rows) < 2 or (u[1:] > u[:-1]).all():
        return rows, None
    return np.unique(rows, return_inverse=True)


def push_rows(entry: Entry, worker: int, seq: int, rows: np.ndarray, data: np.ndarray, alloc: Alloc,
              track: bool) -> tuple[np.ndarray, np.ndarray]:
    """A push's (hashed ids, rows) as (slots, rows) of the part: rows made, occurrences
    counted, the rows of ids not admitted dropped.  A duplicate push changes nothing."""
    table: Table = entry.table
    if received(entry, worker, seq) or not len(rows):
        return np.zeros(0, np.int64), data[:0]
    if entry.sync:
        when = seq   # (the round it belongs to)
    else:
        table.clock += 1
        when = table.clock
    uniq, inverse = _distinct(rows)
    slots = table.recall(worker, uniq)
    if slots is None:
        slots = table.lookup(uniq)
    if table.sketch is None:
        new = slots < 0
        if new.any():
            slots[new] = _made(entry, alloc, uniq[new], True, track)
    else:
        waiting = slots < 0
        waiting[~waiting] = ~table.trained[slots[~waiting]]
        if waiting.any():
            counts = table.sketch.add(uniq[waiting])
            admit = np.flatnonzero(waiting)[counts >= table.params.min_count]
            if len(admit):
                table.admitted += len(admit)
                held = admit[slots[admit] >= 0]
                if len(held):   # provisional rows become trained, from their initial values
                    s = slots[held]
                    table.trained[s] = True
                    table.made += len(s)
                    entry.value[s] = table.initial(uniq[held], entry.value.dtype)
                    if track:
                        note_change(entry, s)
                fresh = admit[slots[admit] < 0]
                if len(fresh):
                    slots[fresh] = _made(entry, alloc, uniq[fresh], True, track)
    per_row = slots if inverse is None else slots[inverse]
    keep = per_row >= 0
    keep[keep] = table.trained[per_row[keep]]
    table.touch(per_row[keep], when, track)
    table.changed(per_row[keep])
    if keep.all():
        return per_row, data
    table.dropped += int((~keep).sum())
    return per_row[keep], data[keep]


def pull_rows(entry: Entry, rows: np.ndarray, alloc: Alloc, track: bool, after: int = 0,
              worker: int | None = None) -> np.ndarray:
    """A pull's hashed ids as slots of the part (rows made for those without one: trained,
    or provisional until admitted; the slots remembered for the push of the same rows by
    ``worker``, when given); a sync pull touches them at the round it waits for (``after``),
    an async one at the part's clock."""
    table: Table = entry.table
    uniq, inverse = _distinct(rows)
    slots = table.lookup(uniq)
    new = slots < 0
    if new.any():
        slots[new] = _made(entry, alloc, uniq[new], table.sketch is None, track)
    if worker is not None:
        table.remember(worker, uniq, slots)
    per_row = slots if inverse is None else slots[inverse]
    when = after if entry.sync else table.clock
    table.touch(per_row, when, track)
    return per_row


def export(entry: Entry) -> list[np.ndarray]:
    """The trained rows of ``entry`` for an export (psnode.worker.kvstore.KVStore.export):
    hashed ids, values, the version of each row's last change, and the table's version."""
    table: Table = entry.table
    slots = table.live_slots()
    return [table.ids[slots], entry.value[slots], table.stamp[slots], np.array([table.version], np.int64)]


def busy(entry: Entry) -> np.ndarray:
    """The slots a round in progress or a parked pull of ``entry`` refers to."""
    parts = [r for r, _ in entry.sparse_parts]
    parts += [r for queue in entry.early.values() for _, _, r in queue if r is not None]
    parts += [r for _, _, _, r, _ in entry.pulls if r is not None]
    return np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.int64)


def evict_some(entries: dict[Any, Entry], budget: int = EVICT_STEP, track: bool = True) -> int:
    """One eviction step over the dynamic parts (psnode.server.dyntable); rows evicted (their
    ids recorded for the next durable point: ``track``)."""
    done = 0
    for entry in entries.values():
        table = entry.table
        if table is None or not due(entry):
            continue
        victims = table.victims(budget - done, busy(entry))
        if len(victims):
            table.drop(victims, track)
            done += len(victims)
        if done >= budget:
            break
    return done


def counters(entries: dict[Any, Entry]) -> dict[str, dict[str, int]]:
    """Per dynamic key: rows held, made, admitted, evicted, gradient rows dropped."""
    out: dict[str, dict[str, int]] = {}
    for (key, _part), entry in entries.items():
        t = entry.table
        if t is None:
            continue
        c = out.setdefault(str(key), {"rows": 0, "made": 0, "admitted": 0, "evicted": 0, "dropped": 0})
        c["rows"] += t.trained_rows()
        c["made"] += t.made
        c["admitted"] += t.admitted
        c["evicted"] += t.evicted
        c["dropped"] += t.dropped
    return out


__all__ = ["EVICT_STEP", "busy", "counters", "due", "evict_some", "export", "fit", "make_entry", "pull_rows",
           "push_rows"]
