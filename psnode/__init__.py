"""psnode: a parameter server for Python (MXNet-KVStore-style API over ZeroMQ).

Public names: ``psnode.kv`` (``create``), ``psnode.init`` (initializers), ``psnode.optimizer``,
``psnode.sparse`` (row_sparse values), ``psnode.data`` (data-parallel sharding), ``psnode.torch``
(PyTorch glue, needs torch), ``psnode.mxnet`` (psnode as an MXNet kvstore, needs mxnet),
``psnode.config`` (the ``PSNODE_*`` environment contract), ``psnode.errors``, ``psnode.files``
(atomic file writes) and the error types below. A launcher uses those and its door,
``psnode.launcher``; every other module is internal (an import-linter contract in pyproject.toml
keeps ``mxdist`` to that). Submodules load on first use, so ``import psnode`` stays cheap (the
``mxdist`` CLI imports it for every command).
"""
from __future__ import annotations

import importlib
from typing import Any

from psnode.errors import (
    ConfigError,
    KeyNotInitialized,
    PeerLost,
    ProtocolError,
    PSError,
    RemoteError,
    ShapeMismatch,
)
from psnode.worker import routes as _routes

__version__ = "0.1.0"

# public name -> the module it loads on first use
_SUBMODULES = {
    "kv": "psnode.kv", "init": "psnode.init", "optimizer": "psnode.optimizer", "sparse": "psnode.sparse",
    "data": "psnode.data", "torch": "psnode.torch", "mxnet": "psnode.mxnet", "config": "psnode.config",
    "initializer": "psnode.math.initializers",
}


def _torch_values() -> Any:
    """The torch route of the KVStore's values (loaded once torch is)."""
    from psnode.torch import values

    return values


_routes.install("torch", _torch_values)


def export(kv: Any, key: Any, path: str, since: str | None = None) -> int:
    """The trained rows of table ``key`` of ``kv`` (a table without a row count) as one .npz
    numpy loads without psnode (``ids``, ``values``; docs/dynamic-tables.md); ``since``: an
    earlier export's path, to write only the rows changed after it.  The number of rows."""
    return int(kv.export(key, path, since))


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(_SUBMODULES[name])
    raise AttributeError(f"module 'psnode' has no attribute {name!r}")


__all__ = [
    "ConfigError",
    "KeyNotInitialized",
    "PSError",
    "PeerLost",
    "ProtocolError",
    "RemoteError",
    "ShapeMismatch",
    "__version__",
    "data",
    "export",
    "init",
    "initializer",
    "kv",
    "optimizer",
    "sparse",
]
