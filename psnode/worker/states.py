"""The file of ``kv.save_optimizer_states`` / ``kv.load_optimizer_states`` (an .npz, no pickle).

Arrays ``a0, a1, ...``: every server's optimizer state arrays; ``meta``: JSON (UTF-8 bytes as
uint8) ``{"names": [[server, key, part, state name], ...], "optimizer": spec or null}``, row
``i`` naming array ``a<i>`` (keys keep their int/str type).  :func:`save_states` writes it
through a temporary file in the same directory and a rename, so a reader sees the previous file
or the new one, never a part; :func:`load_states` reads it back per server rank, raising
:class:`~psnode.errors.ConfigError` when the file is missing or unreadable.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np

from psnode.errors import ConfigError
from psnode.files import atomic_file

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
    with atomic_file(fname, mode=0o666) as fh:      # the user's file: the umask decides who reads it
        np.savez(fh, **arrays)  # type: ignore[arg-type]


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


__all__ = ["StateNames", "load_states", "save_states"]
