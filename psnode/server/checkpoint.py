"""Server checkpoints: a server's state as one snapshot, and its restore.

A :func:`snapshot` of the store holds per key part the value, the optimizer state, the round,
the pushes taken per worker and everything of the round in progress (contributors and their
partial sum, row_sparse parts, pushes waiting for a later round, async pushes applied past a
gap), plus a JSON index (keys keep their int/str type); with ``changes_only``, only what changed
since the last durable point (psnode.server.image).  A server restarted inside its job restores
exactly such a state (:func:`restore`), so every push it holds is applied once and every other
one is still in its worker's journal (the exactly-once invariant: psnode.server.store states the
server's half, psnode.worker.journal the worker's).  Snapshots go to disk as a chain of files,
written off the server's loop (psnode.server.chain), and to the holders of its replicas
(psnode.server.replicas); only once they are there are its pushes reported durable
(:meth:`psnode.server.store.Store.mark_durable`).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from psnode.errors import ConfigError
from psnode.math import aggregation as agg_mod
from psnode.math import optimizers as opt_mod
from psnode.math.initializers import FillSpec
from psnode.math.initializers import from_spec as init_from_spec
from psnode.server import dynparts
from psnode.server.buckets import FusedBucket
from psnode.server.compressed import Packed, spec_of_tag
from psnode.server.dyntable import Params, Table
from psnode.server.keypart import Entry, changed_rows, made_from, note_touch

if TYPE_CHECKING:
    from psnode.server.store import Store

Arrays = dict[str, np.ndarray]


def path_for(directory: str, rank: int) -> str:
    return os.path.join(directory, f"server-{rank}.npz")


def aggregation_of(item: dict[str, Any]) -> agg_mod.Aggregation:
    """A snapshot item's aggregation rule: ``"aggregation"``, its name (psnode.math.aggregation),
    or a boolean ``"average"`` (true: average, false: sum), the form checkpoints of stores with
    two rules hold.  An unknown name raises ConfigError naming it."""
    if "aggregation" in item:
        try:
            return agg_mod.parse(item["aggregation"], f"the checkpoint of key {item.get('key')!r}")
        except ValueError as exc:
            raise ConfigError(f"{exc}; restore it with the psnode that wrote it") from None
    return agg_mod.AVERAGE if item.get("average", True) else agg_mod.SUM


def snapshot(store: Store, changes_only: bool = False) -> tuple[dict[str, Any], Arrays]:
    """The store's state as a JSON-able index and named arrays (buckets are split first: every
    key part then holds its own state, psnode.server.buckets).  The arrays may be the store's own
    buffers: write them out before the store changes.

    ``changes_only`` (the store tracks changes: psnode.server.keypart.note_change): a key part
    unchanged since the last durable point carries no value, one whose row_sparse rounds changed
    some rows carries only those (``"changes": "rows"``, ids in ``k<i>``, and the rows of each
    optimizer state array shaped like the value); everything else (the index, rounds in
    progress, pushes taken) is carried whole.  psnode.server.image applies such a snapshot to
    the whole one before it."""
    bucketed = {id(e) for e in store.entries.values() if e.bucket is not None}   # (rounds not tracked)
    store.fused.split_all()
    arrays: Arrays = {}
    index = []
    for i, ((key, part), entry) in enumerate(store.entries.items()):
        item: dict[str, Any] = {
            "key": key, "part": part, "sparse": entry.sparse, "sync": entry.sync,
            "aggregation": entry.aggregation.name,
            "round": entry.round, "state": [], "pushed": {str(w): q for w, q in entry.pushed.items()}}
        if entry.table is not None:   # (a table without a row count: rows by id)
            _dynamic_rows(i, entry, arrays, item, changes_only and not entry.changed)
        elif changes_only and not entry.changed and id(entry) not in bucketed:
            item["changes"] = "rows"
            _changed_rows(i, entry, arrays, item)
        elif _spread(entry):
            _origin_rows(i, entry, arrays, item)
        else:
            arrays[f"v{i}"] = entry.value
            if entry.state is not None:
                for name, arr in opt_mod.state_to_arrays(entry.state).items():
                    arrays[f"s{i}_{name}"] = arr
                    item["state"].append(name)
        if entry.bucket is not None:
            item["bucket"] = [cast(FusedBucket, entry.bucket).bid, _offset(entry)]
        if entry.staleness >= 0:   # (a dist_ssp part: psnode.server.staleness)
            item["staleness"] = entry.staleness
        if entry.backup:   # (backup workers: psnode.server.rounds)
            item["backup"] = entry.backup
        if entry.start:   # (an elastic job's joiners: their start rounds here)
            item["start"] = {str(w): s for w, s in entry.start.items()}
        item.update(_round_in_progress(i, entry, arrays))
        index.append(item)
    meta = {"index": index, "optimizer": store.optimizer.to_spec() if store.optimizer else None}
    if store.rules.admitted:
        meta["admitted"] = {str(w): g for w, g in store.rules.admitted.items()}
    return meta, arrays


def _changed_rows(i: int, entry: Entry, arrays: Arrays, item: dict[str, Any]) -> None:
    """The rows of ``entry`` changed since the last durable point (copies), and its optimizer
    state's: per-row arrays sliced, the others (the step count) whole."""
    rows = changed_rows(entry)
    if len(rows):
        arrays[f"k{i}"] = rows
        arrays[f"v{i}"] = np.take(entry.value, rows, axis=0)   # (a third of ``value[rows]``'s time)
    if entry.state is not None:
        for name, arr in opt_mod.state_to_arrays(entry.state).items():
            if arr.shape == entry.value.shape:
                if len(rows):
                    arrays[f"s{i}_{name}"] = np.take(arr, rows, axis=0)
                    item.setdefault("state_rows", []).append(name)
            else:
                arrays[f"s{i}_{name}"] = arr
            item["state"].append(name)


SPREAD_FRACTION = 8   # a spec-made part goes whole as its spec and rows while under 1/8 of its rows are touched


def _spread(entry: Entry) -> bool:
    """Is ``entry`` carried whole as its fill spec and the rows touched since?  While fewer than
    1/SPREAD_FRACTION of its rows are: those rows are copied on the caller's loop, so the copy
    stays a fraction of the part (past it, the part goes whole, its arrays read in place)."""
    return (entry.ever is not None and entry.bucket is None
            and SPREAD_FRACTION * int(np.count_nonzero(entry.ever)) < len(entry.ever))


def _origin_rows(i: int, entry: Entry, arrays: Arrays, item: dict[str, Any]) -> None:
    """A spec-made part whole (psnode.server.keypart, ``origin``): the spec, shape and dtype
    (``"origin"``), the rows touched since it was made (``t<i>``), their values and per-row
    optimizer state (copies); every other row is the spec's value with a zero state."""
    assert entry.ever is not None and entry.origin is not None
    rows = np.flatnonzero(entry.ever)
    item["origin"] = {"spec": entry.origin.to_json(), "shape": list(entry.value.shape),
                      "dtype": entry.value.dtype.str}
    arrays[f"t{i}"] = rows
    arrays[f"v{i}"] = entry.value[rows]
    if entry.state is not None:
        item["state_rows"] = []
        for name, arr in opt_mod.state_to_arrays(entry.state).items():
            if arr.shape == entry.value.shape:
                arrays[f"s{i}_{name}"] = arr[rows]
                item["state_rows"].append(name)
            else:
                arrays[f"s{i}_{name}"] = arr
            item["state"].append(name)


def _dynamic_rows(i: int, entry: Entry, arrays: Arrays, item: dict[str, Any], changes: bool) -> None:
    """A dynamic part's rows (psnode.server.dyntable) by hashed id: its trained rows
    (``t<i>``: ids, ``v<i>``, per-row state), or with ``changes`` those changed since the last
    durable point (``k<i>``) and the ids evicted since (``x<i>``); its sketch whole (``c<i>``)."""
    table: Table = entry.table
    item["dynamic"] = table.meta()
    if changes:
        item["changes"] = "rows"
        slots = changed_rows(entry)
        slots = slots[table.trained[slots]]
        arrays[f"k{i}"] = table.ids[slots]
        arrays[f"x{i}"] = table.gone_ids()
        touched = table.touched_slots()   # (a superset of the changed rows)
        arrays[f"u{i}"], arrays[f"l{i}"] = table.ids[touched], table.last[touched]
    else:
        slots = table.live_slots()
        arrays[f"t{i}"], arrays[f"l{i}"] = table.ids[slots], table.last[slots]
    arrays[f"v{i}"] = entry.value[slots]
    if entry.state is not None:
        for name, arr in opt_mod.state_to_arrays(entry.state).items():
            if arr.ndim == 2:
                arrays[f"s{i}_{name}"] = arr[slots]
                item.setdefault("state_rows", []).append(name)
            else:
                arrays[f"s{i}_{name}"] = arr
            item["state"].append(name)
    if table.sketch is not None:
        arrays[f"c{i}"] = table.sketch.counts


def _ids(entry: Entry, rows: np.ndarray) -> np.ndarray:
    """Rows of a round in progress as a snapshot holds them: slots of a dynamic part by id."""
    return rows if entry.table is None else entry.table.ids[rows]


def _round_in_progress(i: int, entry: Entry, arrays: Arrays) -> dict[str, Any]:
    """The index fields (and arrays) of what ``entry`` holds beyond its completed rounds."""
    out: dict[str, Any] = {}
    if entry.contributors:
        out["contributors"] = sorted(entry.contributors)
        out["nonfinite"] = sorted(entry.nonfinite)
        acc = entry.first if entry.first is not None else entry.spare
        if entry.sparse_parts:
            for j, (ids, part) in enumerate(entry.sparse_parts):
                arrays[f"r{i}_{j}"], arrays[f"d{i}_{j}"] = _ids(entry, ids), part
            out["sparse_parts"] = len(entry.sparse_parts)
        elif acc is not None:
            arrays[f"a{i}"] = acc
    early = []
    for w, queue in entry.early.items():
        for j, (seq, data, rows) in enumerate(queue):
            name = f"e{i}_{w}_{j}"
            tag = ""
            if isinstance(data, Packed):
                tag, data = data.spec.tag, data.payload
            arrays[name] = data
            if rows is not None:
                arrays[name + "r"] = _ids(entry, rows)
            early.append([w, seq, name, rows is not None, tag])
    if early:
        out["early"] = early
    if entry.ahead:
        out["ahead"] = {str(w): sorted(qs) for w, qs in entry.ahead.items() if qs}
    if entry.skipped:
        out["skipped"] = entry.skipped
    return out


CHUNK_BYTES = 32 << 20   # a restore copies this much between two calls of its pump


def copy_in_chunks(dst: np.ndarray, src: np.ndarray, pump: Callable[[], None]) -> None:
    """``dst[...] = src``, CHUNK_BYTES at a time (by rows), calling ``pump`` between chunks: a
    big state moves without holding the caller's loop (its heartbeats go on)."""
    if dst.ndim == 0 or dst.nbytes <= CHUNK_BYTES:
        np.copyto(dst, src)
        return
    step = max(1, CHUNK_BYTES // max(1, dst[0].nbytes))
    for lo in range(0, len(dst), step):
        np.copyto(dst[lo:lo + step], src[lo:lo + step])
        pump()


def fill_in_chunks(value: np.ndarray, spec: FillSpec, key: Any, pump: Callable[[], None]) -> None:
    """``value`` = what ``spec`` computes for ``key``, CHUNK_BYTES at a time, calling ``pump``
    between chunks (as :func:`copy_in_chunks`)."""
    flat = value.reshape(-1)
    step = max(1, CHUNK_BYTES // max(1, value.itemsize))
    for lo in range(0, flat.size, step):
        spec.fill(key, flat[lo:lo + step], lo)
        pump()


def restore(store: Store, meta: dict[str, Any], arrays: Any, same_job: bool = False,
            pump: Callable[[], None] = lambda: None) -> int:
    """Load a :func:`snapshot` into ``store``; returns the number of key parts.  A new job
    (``--resume``) takes the values and optimizer states only, counting rounds and pushes from
    0; a server restarted inside its job (``same_job``) takes everything.  ``pump`` is called
    at least every CHUNK_BYTES copied (the server's heartbeats)."""
    if meta.get("optimizer"):
        store.optimizer = opt_mod.from_spec(meta["optimizer"])
    for i, item in enumerate(meta["index"]):
        if "dynamic" in item:
            store.entries[(item["key"], int(item["part"]))] = _restore_dynamic(store, i, item, arrays, same_job)
            continue
        saved = arrays[f"v{i}"]
        bucket = item.get("bucket")
        origin = item.get("origin")
        if origin is not None:
            spec = FillSpec.from_json(origin["spec"])
            value = store.alloc(tuple(origin["shape"]), np.dtype(origin["dtype"]))
            rows = np.asarray(arrays[f"t{i}"], np.int64)
            fill_in_chunks(value, spec, item["key"], pump)
            value[rows] = saved
        elif bucket:   # (values in shared memory on a server; small keys in their bucket)
            value = store.fused.place(int(bucket[0]), int(bucket[1]), saved.shape, saved.dtype,
                                      item["sync"], aggregation_of(item))
        else:
            value = store.alloc(saved.shape, saved.dtype)
        if origin is None:
            copy_in_chunks(value, saved, pump)
        entry = Entry(value=value, sparse=item["sparse"], sync=item["sync"], aggregation=aggregation_of(item),
                      staleness=int(item.get("staleness", -1)), backup=int(item.get("backup", 0)))
        if origin is not None:
            made_from(entry, spec)
            note_touch(entry, rows)
        if same_job:
            entry.round = int(item.get("round", 0))
            entry.pushed = {int(w): int(q) for w, q in item.get("pushed", {}).items()}
            entry.start = {int(w): int(q) for w, q in item.get("start", {}).items()}
            _restore_round(i, item, entry, arrays)
        if item["state"]:
            named = {}
            per_row = set(item.get("state_rows", ())) if origin is not None else set()
            for n in item["state"]:
                if n in per_row:   # (the rows held; every other row's state is zero)
                    named[n] = opt_mod.lazy_zeros(value.shape, arrays[f"s{i}_{n}"].dtype)
                    named[n][rows] = arrays[f"s{i}_{n}"]
                    continue
                named[n] = np.empty_like(arrays[f"s{i}_{n}"])
                copy_in_chunks(named[n], arrays[f"s{i}_{n}"], pump)
            entry.state = opt_mod.state_from_arrays(named)
        store.entries[(item["key"], int(item["part"]))] = entry
        if bucket:
            store.fused.join(int(bucket[0]), (item["key"], int(item["part"])), entry, int(bucket[1]))
    if same_job:
        store.rules.admitted = {int(w): int(g) for w, g in meta.get("admitted", {}).items()}
    store.mark_durable()
    store.forget_changes()   # (the source holds it as it is)
    return len(meta["index"])


def _restore_dynamic(store: Store, i: int, item: dict[str, Any], arrays: Any, same_job: bool) -> Entry:
    """A dynamic part from its snapshot (:func:`_dynamic_rows`, whole): the index rebuilt
    from the ids, each row in a slot of its own."""
    dyn = item["dynamic"]
    values = np.asarray(arrays[f"v{i}"])
    entry = dynparts.make_entry(item["key"], Params.from_json(dyn["params"]), init_from_spec(dyn["init"]),
                                int(dyn["seed"]), values.dtype, item["sync"], aggregation_of(item),
                                int(item.get("staleness", -1)), None, store.alloc)
    table: Table = entry.table
    slots = table.place(np.asarray(arrays[f"t{i}"], np.int64), True)
    dynparts.fit(entry, store.alloc)
    entry.value[slots] = values
    table.last[slots] = np.asarray(arrays[f"l{i}"])
    table.stamp[slots] = int(dyn.get("version", 0))   # (rows restored: changed as of the restore)
    for name in ("clock", "version", "made", "admitted", "evicted", "dropped"):
        setattr(table, name, int(dyn[name]))
    table.scanned = -1
    if f"c{i}" in arrays and table.sketch is not None:
        table.sketch.counts[...] = arrays[f"c{i}"]
    if item["state"]:
        named = {}
        for n in item["state"]:
            saved = np.asarray(arrays[f"s{i}_{n}"])
            if saved.ndim == 2:   # (per row, like the value; the step count is 0-d)
                named[n] = np.zeros((table.capacity, *saved.shape[1:]), saved.dtype)
                named[n][slots] = saved
            else:
                named[n] = np.array(saved)
        entry.state = opt_mod.state_from_arrays(named)
    if same_job:
        entry.round = int(item.get("round", 0))
        entry.pushed = {int(w): int(q) for w, q in item.get("pushed", {}).items()}
        entry.start = {int(w): int(q) for w, q in item.get("start", {}).items()}
        _restore_round(i, item, entry, arrays)
        entry.sparse_parts = [(_slots(store, entry, r), d) for r, d in entry.sparse_parts]
        for w, queue in entry.early.items():
            entry.early[w] = [(q, d, None if r is None else _slots(store, entry, r)) for q, d, r in queue]
    return entry


def _slots(store: Store, entry: Entry, ids: np.ndarray) -> np.ndarray:
    """The slots of a restored round's ids (rows made where they were evicted before)."""
    return dynparts.pull_rows(entry, ids, store.alloc, False)


def _restore_round(i: int, item: dict[str, Any], entry: Entry, arrays: Any) -> None:
    entry.contributors = {int(w) for w in item.get("contributors", [])}
    entry.nonfinite = {int(w) for w in item.get("nonfinite", [])}
    entry.skipped = int(item.get("skipped", 0))
    if entry.contributors:
        n = int(item.get("sparse_parts", 0))
        entry.sparse_parts = [(np.array(arrays[f"r{i}_{j}"]), np.array(arrays[f"d{i}_{j}"])) for j in range(n)]
        if f"a{i}" in arrays:   # the partial sum goes on as the round's first push
            entry.first = np.array(arrays[f"a{i}"])
    for w, seq, name, has_rows, tag in item.get("early", []):
        data: Any = np.array(arrays[name])
        if tag:
            data = Packed(spec_of_tag(tag), data, entry.value.shape)
        rows = np.array(arrays[name + "r"]) if has_rows else None
        entry.early.setdefault(int(w), []).append((int(seq), data, rows))
    entry.ahead = {int(w): {int(q) for q in qs} for w, qs in item.get("ahead", {}).items()}


def _offset(entry: Any) -> int:
    """A bucket member's element offset in its bucket."""
    return next(m.offset for m in entry.bucket.members if m.entry is entry)
