"""Data-parallel sharding ("by instance"): which samples each worker trains on.

Contract
--------
* ``shard_indices(n, num_parts, part, epoch, seed, shuffle, drop_last)`` is pure and
  deterministic.  The order is a permutation of ``range(n)`` that depends only on
  ``(seed, epoch)`` (identity when ``shuffle=False``), so every worker computes the same one
  without talking to the others.  Part ``p`` takes positions ``p, p + num_parts, ...`` of it:
  - ``drop_last=False``: every part gets ``ceil(n / num_parts)`` indices; the order is padded
    by wrapping around to a multiple of ``num_parts``, so parts are disjoint except for the
    padding duplicates and together they cover all ``n`` samples;
  - ``drop_last=True``: every part gets ``floor(n / num_parts)`` indices, the tail of the order
    is dropped, parts are disjoint (all empty when ``n < num_parts``).
  The permutation comes from ``np.random.default_rng([seed, epoch])`` (PCG64), identical on
  every machine with the same numpy.
* ``ShardSampler`` is a drop-in for ``torch.utils.data.distributed.DistributedSampler``
  (``sampler=`` of a DataLoader) that does not import torch.  World size and rank come from,
  in order: the arguments, ``kv.num_workers`` / ``kv.rank``, the ``WORLD_SIZE`` / ``RANK``
  environment variables (set by the launcher for every worker), else 1 / 0.
* **Elastic jobs** (``kv.elastic``: the membership may change while the job runs): a
  ``ShardSampler`` given ``kv`` re-shards at every :meth:`ShardSampler.set_epoch` over the
  members agreed for that epoch: ``kv.agreed_members()`` (a barrier of every member whose
  answer carries the member list at completion, the same for all) gives ``(generation,
  members)``; ``num_replicas`` is ``len(members)`` and the part is this worker's position in
  that sorted list, so the epoch's shards are disjoint and cover the epoch's samples (as
  above) over exactly that epoch's members.  :meth:`ShardSampler.reshard` does it at once.
  Every member must call ``set_epoch`` (it is a barrier).
* ``shard_arrays(*arrays, ...)`` returns this worker's rows of each array (same resolution of
  world size and rank); ``iterate_minibatches`` cuts arrays into batches.
* Bad arguments raise :class:`~psnode.errors.ConfigError` naming the value.

Pure apart from reading two environment variables in :func:`resolve_world`.
"""
from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from psnode.errors import ConfigError

__all__ = [
    "ShardSampler",
    "iterate_minibatches",
    "resolve_world",
    "shard_arrays",
    "shard_indices",
    "shard_size",
]


def _int(name: str, value: Any, low: int, high: int | None = None) -> int:
    """``value`` as an int in ``[low, high)``, else ConfigError naming it."""
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    if ok and value >= low and (high is None or value < high):
        return int(value)
    where = f">= {low}" if high is None else f"in [{low}, {high})"
    raise ConfigError(f"{name} must be an integer {where}, got {value!r}")


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ConfigError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def shard_size(n: int, num_parts: int, drop_last: bool = False) -> int:
    """How many indices every part gets: ``ceil`` (padded) or ``floor`` (``drop_last``)."""
    return n // num_parts if drop_last else -(-n // num_parts)


def shard_indices(n: int, num_parts: int, part: int, epoch: int = 0, seed: int = 0,
                  shuffle: bool = True, drop_last: bool = False) -> np.ndarray:
    """This part's sample indices (int64) for ``epoch``; see the module docstring."""
    n = _int("n (number of samples)", n, 1)
    num_parts = _int("num_parts", num_parts, 1)
    part = _int("part", part, 0, num_parts)
    epoch = _int("epoch", epoch, 0)
    seed = _int("seed", seed, 0)
    shuffle, drop_last = _bool("shuffle", shuffle), _bool("drop_last", drop_last)
    order = np.random.default_rng([seed, epoch]).permutation(n) if shuffle else np.arange(n, dtype=np.int64)
    total = shard_size(n, num_parts, drop_last) * num_parts
    order = order[:total] if total <= n else np.resize(order, total)  # resize wraps around
    return np.ascontiguousarray(order[part::num_parts], dtype=np.int64)


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r} is not an integer") from None


def resolve_world(num_replicas: int | None = None, rank: int | None = None, kv: Any = None,
                  env: Mapping[str, str] | None = None) -> tuple[int, int]:
    """``(num_replicas, rank)`` from the arguments, else ``kv.num_workers``/``kv.rank``, else
    env ``WORLD_SIZE``/``RANK``, else ``(1, 0)``; each of the two is resolved on its own."""
    env = os.environ if env is None else env
    if num_replicas is None:
        num_replicas = kv.num_workers if kv is not None else _env_int(env, "WORLD_SIZE")
    if rank is None:
        rank = kv.rank if kv is not None else _env_int(env, "RANK")
    num_replicas = _int("num_replicas", 1 if num_replicas is None else num_replicas, 1)
    rank = _int("rank", 0 if rank is None else rank, 0, num_replicas)
    return num_replicas, rank


def _length(dataset: Any) -> int:
    if isinstance(dataset, (int, np.integer)) and not isinstance(dataset, bool):
        return int(dataset)
    try:
        return len(dataset)
    except TypeError:
        raise ConfigError(f"dataset must be an int or have __len__, got "
                          f"{type(dataset).__name__}") from None


class ShardSampler:
    """Indices of this worker's shard, epoch by epoch (torch ``DistributedSampler`` API).

    Call :meth:`set_epoch` at the start of every epoch to get a new shuffle, as with torch.
    """

    def __init__(self, dataset: Any, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False,
                 kv: Any = None) -> None:
        self.dataset = dataset
        self.dataset_len = _int("len(dataset)", _length(dataset), 1)
        elastic = num_replicas is None and rank is None and getattr(kv, "elastic", False)
        if elastic:   # (until the first reshard: this worker's view of the members)
            members = sorted(getattr(kv, "members", [kv.rank]))
            num_replicas, rank = len(members), members.index(kv.rank) if kv.rank in members else 0
        self.num_replicas, self.rank = resolve_world(num_replicas, rank, kv)
        self.shuffle = _bool("shuffle", shuffle)
        self.seed = _int("seed", seed, 0)
        self.drop_last = _bool("drop_last", drop_last)
        self.epoch = 0
        self.kv = kv if elastic else None
        self.generation: int | None = None     # the membership generation sharded over (elastic)
        self._sized()

    def _sized(self) -> None:
        self.num_samples = shard_size(self.dataset_len, self.num_replicas, self.drop_last)
        self.total_size = self.num_samples * self.num_replicas

    def reshard(self) -> None:
        """(Elastic jobs) shard over the members agreed now: a barrier of every member
        (``kv.agreed_members()``); this worker's part is its position in the member list."""
        if self.kv is None:
            return
        generation, members = self.kv.agreed_members()
        members = sorted(members)
        if self.kv.rank not in members:
            raise ConfigError(f"worker {self.kv.rank} is not among the members {members}")
        self.generation, self.num_replicas, self.rank = generation, len(members), members.index(self.kv.rank)
        self._sized()

    def indices(self) -> np.ndarray:
        """This epoch's indices as an int64 array."""
        return shard_indices(self.dataset_len, self.num_replicas, self.rank, self.epoch,
                             self.seed, self.shuffle, self.drop_last)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices().tolist())

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose permutation the next iteration uses (an elastic job's sampler
        also re-shards over the members agreed for it: :meth:`reshard`)."""
        self.epoch = _int("epoch", epoch, 0)
        self.reshard()

    def __repr__(self) -> str:
        return (f"ShardSampler(n={self.dataset_len}, rank={self.rank}/{self.num_replicas}, "
                f"epoch={self.epoch}, shuffle={self.shuffle}, seed={self.seed}, "
                f"drop_last={self.drop_last})")


def _same_length(arrays: tuple[Any, ...]) -> tuple[np.ndarray, ...]:
    if not arrays:
        raise ConfigError("give at least one array to shard")
    out = tuple(np.asarray(a) for a in arrays)
    if any(a.ndim == 0 for a in out):
        raise ConfigError("cannot shard a 0-d array; arrays need a first (sample) dimension")
    lengths = [len(a) for a in out]
    if len(set(lengths)) > 1:
        raise ConfigError(f"arrays must have the same first dimension, got lengths {lengths}")
    return out


def shard_arrays(*arrays: Any, kv: Any = None, num_parts: int | None = None,
                 part: int | None = None, epoch: int = 0, seed: int = 0, shuffle: bool = True,
                 drop_last: bool = False) -> tuple[np.ndarray, ...]:
    """This worker's rows of every array (copies), in shard order."""
    out = _same_length(arrays)
    num_parts, part = resolve_world(num_parts, part, kv)
    idx = shard_indices(len(out[0]), num_parts, part, epoch, seed, shuffle, drop_last)
    return tuple(a[idx] for a in out)


def iterate_minibatches(*arrays: Any, batch_size: int, shuffle: bool = False, seed: int = 0,
                        epoch: int = 0, drop_last: bool = False
                        ) -> Iterator[tuple[np.ndarray, ...]]:
    """Consecutive batches ``(a[i:i+batch_size] for a in arrays)``; with ``shuffle`` the rows
    are first permuted by ``(seed, epoch)``.  The last batch may be short unless
    ``drop_last``."""
    out = _same_length(arrays)
    batch_size = _int("batch_size", batch_size, 1)
    n = len(out[0])
    if shuffle and n:
        order = shard_indices(n, 1, 0, epoch, seed, True)
        out = tuple(a[order] for a in out)
    stop = (n // batch_size) * batch_size if drop_last else n
    for lo in range(0, stop, batch_size):
        yield tuple(a[lo:lo + batch_size] for a in out)
