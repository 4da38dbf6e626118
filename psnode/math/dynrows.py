"""Rows of tables without a row count: the id hash and the rows' initial values (pure, numpy).

A dynamic table (``kv.init(key, psnode.sparse.zeros((None, width)), ps_initializer(...))``)
takes any int64 id as a row.  Its rows are addressed by the **table hash** of the id,
:func:`mix` (SplitMix64's finalizer, a bijection of the 64-bit integers: distinct ids never
share a row, and :func:`unmix` gives the id back).  The hash spreads ids evenly whatever
their distribution (sequential ids, a Zipf head): server ``s`` of ``S`` holds the ids whose
hash, read as unsigned, lies in ``[s * 2**64 / S, (s + 1) * 2**64 / S)`` (:func:`cuts`).

A row's initial values are a function of ``(seed, key, id)`` alone (:func:`row_values`), so
a row made again (after eviction, on another server, after a restart) starts from the same
values.  Only initializers that do not depend on the table's height are accepted: Zero,
One, Constant, Uniform and Normal (:func:`check_init`).
"""
from __future__ import annotations

import functools
from typing import Any

import numpy as np

from psnode.errors import ConfigError
from psnode.math.initializers import Constant, CounterRNG, Initializer, Normal, One, Uniform, Zero, stream_of

#: the height a dynamic table's shape reports (the whole int64 id space; never materialised)
HEIGHT = (1 << 63) - 1

_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_I1, _I2 = pow(_M1, -1, 1 << 64), pow(_M2, -1, 1 << 64)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _xorshift(z: np.ndarray, s: int) -> None:
    z ^= z >> np.uint64(s)


def _unxorshift(z: np.ndarray, s: int) -> None:
    """Inverse of ``z ^= z >> s`` in place."""
    y = z.copy()
    k = s
    while k < 64:
        z ^= y >> np.uint64(k)
        k += s


def mix(ids: Any) -> np.ndarray:
    """The table hash of int64 ``ids`` (int64, a bijection)."""
    z = np.array(ids, dtype=np.int64).view(np.uint64)
    with np.errstate(over="ignore"):
        _xorshift(z, 30)
        z *= np.uint64(_M1)
        _xorshift(z, 27)
        z *= np.uint64(_M2)
        _xorshift(z, 31)
    return z.view(np.int64)


def unmix(hashed: Any) -> np.ndarray:
    """The ids of table hashes (the inverse of :func:`mix`)."""
    z = np.array(hashed, dtype=np.int64).view(np.uint64)
    with np.errstate(over="ignore"):
        _unxorshift(z, 31)
        z *= np.uint64(_I2)
        _unxorshift(z, 27)
        z *= np.uint64(_I1)
        _unxorshift(z, 30)
    return z.view(np.int64)


def server_of(hashed: np.ndarray, num_servers: int) -> np.ndarray:
    """The server holding each hashed id: ``floor(h * S / 2**64)`` for the unsigned ``h``
    (its high 32 bits, so the product fits)."""
    high = hashed.view(np.uint64) >> np.uint64(32)
    return ((high * np.uint64(num_servers)) >> np.uint64(32)).astype(np.int64)


@functools.lru_cache(maxsize=64)
def cuts(num_servers: int) -> np.ndarray:
    """The first unsigned hash of servers 1..S-1 (sorted as unsigned; read-only)."""
    return _frozen(np.array([-(-(s << 32) // num_servers) << 32 for s in range(1, num_servers)], np.uint64))


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def split(hashed: np.ndarray, num_servers: int) -> tuple[np.ndarray, np.ndarray]:
    """``(order, bounds)``: ``hashed[order]`` sorted as unsigned, server ``s``'s ids at
    ``order[bounds[s]:bounds[s + 1]]``."""
    u = hashed.view(np.uint64)
    order = np.argsort(u, kind="stable")
    bounds = np.concatenate([[0], np.searchsorted(u[order], cuts(num_servers)), [len(u)]]).astype(np.int64)
    return order, bounds


_ACCEPTED = (Zero, One, Constant, Uniform, Normal)


def check_init(init: Initializer, dtype: Any) -> None:
    """ConfigError unless ``init`` can make rows of a table without a height."""
    if not isinstance(init, _ACCEPTED):
        raise ConfigError(f"a table without a row count takes the initializers zero, one, constant, uniform or "
                          f"normal (their values do not depend on the height), not {init.name!r}")
    if not isinstance(init, (Zero, One, Constant)) and np.dtype(dtype) not in (np.float32, np.float64):
        raise ConfigError(f"initializer {init.name!r} of a table without a row count fills float32 or float64, "
                          f"not {np.dtype(dtype)}")


@functools.lru_cache(maxsize=64)
def _steps(width: int) -> np.ndarray:
    """``(1, width)``: the golden-ratio steps of a row's draws (read-only)."""
    with np.errstate(over="ignore"):
        return _frozen((np.arange(1, width + 1, dtype=np.uint64) * _GOLDEN)[None, :])


class _RowRNG(CounterRNG):
    """CounterRNG whose draws run row-major over ``(len(streams), width)``: draw ``(r, j)`` is
    SplitMix64 of ``streams[r] + (j + 1) * golden``."""

    def __init__(self, streams: np.ndarray, width: int) -> None:
        super().__init__(0)
        self.streams, self.width = streams, width

    def _bits(self, n: int) -> np.ndarray:
        first, skip = divmod(self.start, self.width)      # draws [start, start + n): whole rows, cut
        last = (self.start + n + self.width - 1) // self.width
        self.start += n
        if self._tmp.size < n:
            self._tmp = np.empty(n, np.uint64)
        with np.errstate(over="ignore"):
            z = (self.streams[first:last, None] + _steps(self.width)).reshape(-1)[skip:skip + n]
        return mix(z.view(np.int64)).view(np.uint64)


def row_values(init: Initializer, seed: int, key: int | str, hashed: np.ndarray, width: int,
               dtype: Any) -> np.ndarray:
    """The initial rows of hashed ids ``hashed`` (``(len(hashed), width)``): a function of
    ``(seed, key, id)`` only."""
    out = np.empty((len(hashed), width), dtype)
    if not len(hashed):
        return out
    base = np.uint64(stream_of(seed, key))
    streams = mix((hashed.view(np.uint64) ^ base).view(np.int64)).view(np.uint64)
    init._fill_shaped(out.reshape(-1), _RowRNG(streams, width), out.shape)
    return out


__all__ = ["HEIGHT", "check_init", "cuts", "mix", "row_values", "server_of", "split", "unmix"]
