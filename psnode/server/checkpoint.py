"""Server checkpoints: a server's whole state, written atomically.

File ``<dir>/server-<rank>.npz`` holds a :func:`snapshot` of the store: per key part the value,
the optimizer state, the round, the pushes taken per worker and everything of the round in
progress (contributors and their partial sum, row_sparse parts, pushes waiting for a later
round, async pushes applied past a gap), plus a JSON index (keys keep their int/str type).  A
server restarted inside its job restores exactly that state (:func:`restore`), so every push the
checkpoint holds is applied once and every other one is still in its worker's journal (the
exactly-once invariant: psnode.server.store states the server's half, psnode.worker.journal the
worker's).  It is written to a temporary file in the same
directory, flushed, fsynced and renamed over the previous one: a kill during the write leaves
the previous checkpoint loadable; only then are its pushes reported durable
(:meth:`psnode.server.store.Store.mark_durable`).
"""
from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from psnode.errors import ConfigError
from psnode.files import atomic_file
from psnode.math import optimizers as opt_mod
from psnode.server.buckets import Bucket
from psnode.server.compressed import Packed, spec_of_tag
from psnode.server.keypart import Entry

if TYPE_CHECKING:
    from psnode.server.store import Store

Arrays = dict[str, np.ndarray]


def path_for(directory: str, rank: int) -> str:
    return os.path.join(directory, f"server-{rank}.npz")


def snapshot(store: Store) -> tuple[dict[str, Any], Arrays]:
    """The store's state as a JSON-able index and named arrays (buckets are split first: every
    key part then holds its own state, psnode.server.buckets).  The arrays may be the store's own
    buffers: write them out before the store changes."""
    store.fused.split_all()
    arrays: Arrays = {}
    index = []
    for i, ((key, part), entry) in enumerate(store.entries.items()):
        arrays[f"v{i}"] = entry.value
        names = []
        if entry.state is not None:
            for name, arr in opt_mod.state_to_arrays(entry.state).items():
                arrays[f"s{i}_{name}"] = arr
                names.append(name)
        item: dict[str, Any] = {
            "key": key, "part": part, "sparse": entry.sparse, "sync": entry.sync, "average": entry.average,
            "round": entry.round, "state": names, "pushed": {str(w): q for w, q in entry.pushed.items()}}
        if entry.bucket is not None:
            item["bucket"] = [cast(Bucket, entry.bucket).bid, _offset(entry)]
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


def _round_in_progress(i: int, entry: Entry, arrays: Arrays) -> dict[str, Any]:
    """The index fields (and arrays) of what ``entry`` holds beyond its completed rounds."""
    out: dict[str, Any] = {}
    if entry.contributors:
        out["contributors"] = sorted(entry.contributors)
        out["nonfinite"] = sorted(entry.nonfinite)
        acc = entry.first if entry.first is not None else entry.spare
        if entry.sparse_parts:
            for j, (ids, part) in enumerate(entry.sparse_parts):
                arrays[f"r{i}_{j}"], arrays[f"d{i}_{j}"] = ids, part
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
                arrays[name + "r"] = rows
            early.append([w, seq, name, rows is not None, tag])
    if early:
        out["early"] = early
    if entry.ahead:
        out["ahead"] = {str(w): sorted(qs) for w, qs in entry.ahead.items() if qs}
    if entry.skipped:
        out["skipped"] = entry.skipped
    return out


def restore(store: Store, meta: dict[str, Any], arrays: Any, same_job: bool = False) -> int:
    """Load a :func:`snapshot` into ``store``; returns the number of key parts.  A new job
    (``--resume``) takes the values and optimizer states only, counting rounds and pushes from
    0; a server restarted inside its job (``same_job``) takes everything."""
    if meta.get("optimizer"):
        store.optimizer = opt_mod.from_spec(meta["optimizer"])
    for i, item in enumerate(meta["index"]):
        saved = arrays[f"v{i}"]
        bucket = item.get("bucket")
        if bucket:   # (values in shared memory on a server; small keys in their bucket)
            value = store.fused.place(int(bucket[0]), int(bucket[1]), saved.shape, saved.dtype,
                                      item["sync"], item["average"])
        else:
            value = store.alloc(saved.shape, saved.dtype)
        np.copyto(value, saved)
        entry = Entry(value=value, sparse=item["sparse"], sync=item["sync"], average=item["average"],
                      staleness=int(item.get("staleness", -1)), backup=int(item.get("backup", 0)))
        if same_job:
            entry.round = int(item.get("round", 0))
            entry.pushed = {int(w): int(q) for w, q in item.get("pushed", {}).items()}
            entry.start = {int(w): int(q) for w, q in item.get("start", {}).items()}
            _restore_round(i, item, entry, arrays)
        if item["state"]:
            entry.state = opt_mod.state_from_arrays({n: np.array(arrays[f"s{i}_{n}"]) for n in item["state"]})
        store.entries[(item["key"], int(item["part"]))] = entry
        if bucket:
            store.fused.join(int(bucket[0]), (item["key"], int(item["part"])), entry, int(bucket[1]))
    if same_job:
        store.rules.admitted = {int(w): int(g) for w, g in meta.get("admitted", {}).items()}
    store.mark_durable()
    return len(meta["index"])


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


def save_server(directory: str, rank: int, store: Store) -> str:
    """Write ``store``'s :func:`snapshot`; once it is on disk, its pushes are durable.
    Returns the file path."""
    meta, arrays = snapshot(store)
    final = write_server(directory, rank, meta, arrays)
    store.mark_durable()
    return final


def write_server(directory: str, rank: int, meta: dict[str, Any], arrays: Arrays) -> str:
    """Write a :func:`snapshot` as server ``rank``'s checkpoint (the caller marks the store
    durable once every copy it needs is made).  Returns the file path."""
    os.makedirs(directory, exist_ok=True)
    final = path_for(directory, rank)
    named = {**arrays, "meta": np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)}
    with atomic_file(final, sync=True) as fh:
        np.savez(fh, **named)  # type: ignore[arg-type]
    return final


def load_server(directory: str, rank: int, store: Store, same_job: bool = False) -> int:
    """Restore ``store`` from the checkpoint (:func:`restore`); returns the number of key parts."""
    path = path_for(directory, rank)
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(bytes(data["meta"]).decode())
            return restore(store, meta, data, same_job)
    except FileNotFoundError:
        raise ConfigError(f"no checkpoint for server {rank} at {path}") from None
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"checkpoint {path} is unreadable: {exc}") from None


def _offset(entry: Any) -> int:
    """A bucket member's element offset in its bucket."""
    return next(m.offset for m in entry.bucket.members if m.entry is entry)
