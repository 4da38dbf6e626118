"""psnode: a parameter server for Python (MXNet-KVStore-style API over ZeroMQ)."""
from __future__ import annotations

from psnode.errors import (
    ConfigError,
    KeyNotInitialized,
    PeerLost,
    ProtocolError,
    PSError,
    RemoteError,
    ShapeMismatch,
)

from psnode import data, initializer, kv, optimizer, sparse
from psnode import init

__version__ = "0.1.0"

__all__ = [
    "data",
    "init",
    "initializer",
    "kv",
    "optimizer",
    "sparse",
    "ConfigError",
    "KeyNotInitialized",
    "PeerLost",
    "ProtocolError",
    "PSError",
    "RemoteError",
    "ShapeMismatch",
    "__version__",
]
