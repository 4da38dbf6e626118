"""Server checkpoints: each server's key parts and optimizer state, written atomically.

File ``<dir>/server-<rank>.npz`` holds, per key part, the value and the optimizer state arrays,
plus a JSON index (keys keep their int/str type).  It is written to a temporary file in the same
directory, flushed, fsynced and renamed over the previous one: a kill during the write leaves
the previous checkpoint loadable.

``save_states``/``load_states``: the file of ``kv.save_optimizer_states`` (every server's
optimizer state arrays, named by server, key, part and state name, plus the optimizer spec).
"""
from __future__ import annotations

import json
import os
import tempfile
from typing import TYPE_CHECKING, Any

import numpy as np

from psnode import optimizer as opt_mod
from psnode.errors import ConfigError

if TYPE_CHECKING:
    from psnode.aggregation import Store


def path_for(directory: str, rank: int) -> str:
    return os.path.join(directory, f"server-{rank}.npz")


def save_server(directory: str, rank: int, store: Store) -> str:
    """Write ``store``'s values and optimizer states; returns the file path."""
    os.makedirs(directory, exist_ok=True)
    store.fused.split_all()   # every key part's own state (psnode.fused)
    arrays: dict[str, np.ndarray] = {}
    index = []
    for i, ((key, part), entry) in enumerate(store.entries.items()):
        arrays[f"v{i}"] = entry.value
        names = []
        if entry.state is not None:
            for name, arr in opt_mod.state_to_arrays(entry.state).items():
                arrays[f"s{i}_{name}"] = arr
                names.append(name)
        item = {"key": key, "part": part, "sparse": entry.sparse, "sync": entry.sync,
                "average": entry.average, "round": entry.round, "state": names,
                "pushed": {str(w): q for w, q in entry.pushed.items()}}
        if entry.bucket is not None:
            item["bucket"] = [entry.bucket.bid, _offset(entry)]
        index.append(item)
    meta = {"index": index, "optimizer": store.optimizer.to_spec() if store.optimizer else None}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    fd, tmp = tempfile.mkstemp(prefix=f".server-{rank}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **arrays)  # type: ignore[arg-type]
            fh.flush()
            os.fsync(fh.fileno())
        final = path_for(directory, rank)
        os.replace(tmp, final)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return final


def load_server(directory: str, rank: int, store: Store, same_job: bool = False) -> int:
    """Restore ``store`` from the checkpoint; returns the number of key parts loaded.

    A new job (``--resume``) starts counting rounds and pushes at 0; a server restarted inside
    its job (``same_job``) keeps the checkpoint's counts, which :meth:`Store.rebase` then aligns
    with the workers'.
    """
    from psnode.aggregation import Entry

    path = path_for(directory, rank)
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(bytes(data["meta"]).decode())
            if meta.get("optimizer"):
                store.optimizer = opt_mod.from_spec(meta["optimizer"])
            for i, item in enumerate(meta["index"]):
                saved = data[f"v{i}"]
                bucket = item.get("bucket")
                if bucket:   # (values in shared memory on a server; small keys in their bucket)
                    value = store.fused.place(int(bucket[0]), int(bucket[1]), saved.shape, saved.dtype,
                                              item["sync"], item["average"])
                else:
                    value = store.alloc(saved.shape, saved.dtype)
                np.copyto(value, saved)
                entry = Entry(value=value, sparse=item["sparse"], sync=item["sync"], average=item["average"])
                if same_job:
                    entry.round = int(item.get("round", 0))
                    entry.pushed = {int(w): int(q) for w, q in item.get("pushed", {}).items()}
                if item["state"]:
                    entry.state = opt_mod.state_from_arrays(
                        {n: np.array(data[f"s{i}_{n}"]) for n in item["state"]})
                store.entries[(item["key"], int(item["part"]))] = entry
                if bucket:
                    store.fused.join(int(bucket[0]), (item["key"], int(item["part"])), entry, int(bucket[1]))
    except FileNotFoundError:
        raise ConfigError(f"no checkpoint for server {rank} at {path}") from None
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"checkpoint {path} is unreadable: {exc}") from None
    return len(meta["index"])


def _offset(entry: Any) -> int:
    """A bucket member's element offset in its bucket."""
    return next(m.offset for m in entry.bucket.members if m.entry is entry)


StateNames = list[tuple[Any, int, str]]   # (key, part, state name) per array


def save_states(fname: str, per_server: list[tuple[StateNames, list[np.ndarray]]],
                optimizer: dict[str, Any] | None) -> None:
    """Write the optimizer states of every server (index = server rank) to ``fname`` (.npz),
    through a temporary file and a rename."""
    arrays: dict[str, np.ndarray] = {}
    names: list[list[Any]] = []
    for s, (server_names, server_arrays) in enumerate(per_server):
        for (key, part, name), arr in zip(server_names, server_arrays, strict=False):
            arrays[f"a{len(names)}"] = np.array(arr)
            names.append([s, key, part, name])
    meta = {"names": names, "optimizer": optimizer}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    tmp = f"{fname}.tmp{os.getpid()}"
    with open(tmp, "wb") as fh:
        np.savez(fh, **arrays)  # type: ignore[arg-type]
    os.replace(tmp, fname)


def load_states(fname: str) -> dict[int, tuple[StateNames, list[np.ndarray]]]:
    """The states :func:`save_states` wrote, per server rank; ConfigError if unreadable."""
    try:
        with np.load(fname, allow_pickle=False) as data:
            meta = json.loads(bytes(data["meta"]).decode())
            per_server: dict[int, tuple[StateNames, list[np.ndarray]]] = {}
            for i, (s, key, part, name) in enumerate(meta["names"]):
                names, arrs = per_server.setdefault(int(s), ([], []))
                names.append((key, int(part), str(name)))
                arrs.append(np.array(data[f"a{i}"]))
    except (OSError, KeyError, ValueError, TypeError) as exc:
        raise ConfigError(f"cannot read optimizer states from {fname}: {exc}") from None
    return per_server
