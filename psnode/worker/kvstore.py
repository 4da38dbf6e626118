"""The KVStore API (MXNet-style) over a local store or a distributed job.

``psnode.kv.create('local')`` (psnode.kv) keeps everything in this process; ``create('dist_sync')`` and
``create('dist_async')`` join the job this process was launched in (``mxdist launch``), as a
worker.  Both run the same server-side logic (:mod:`psnode.server.store`), so ``'local'`` is the
reference: a one-worker job gives the same results.

Contracts:

* Keys are ints or strs, or lists of them with matching lists of values, in every form MXNet's
  KVStore accepts (:mod:`psnode.worker.forms`).
* ``init``: every worker calls it for the same keys in the same order.  The first init decides
  shape, dtype and value: rank 0's array (or the initializer's output on rank 0) is stored, and
  every worker's ``value`` (a writable ndarray) is overwritten with it, so all workers start
  equal; but a row_sparse key's (``stype='row_sparse'``) is left as it was, as in MXNet: its
  rows are read with ``row_sparse_pull``, and no init answer carries the table.  Re-init with
  the same shape and dtype is a no-op; another one raises ShapeMismatch.
  With ``psnode.init.ps_initializer(init)`` each server computes its part of the key instead
  (psnode.math.initializers.FillSpec) and ``value`` is a template: its shape and dtype (and, a
  RowSparseArray, its stype) count, its contents are neither read nor written.
* ``push`` reads ``value`` before returning (the caller may reuse the buffer at once) and sends
  asynchronously; a list of arrays for one key is summed first.  Errors a server reports
  surface at the next call.  ``pull`` blocks until the values after this worker's last push of
  each key are in ``out``.  Higher ``priority`` requests are sent first when requests queue.
* ``dist_sync``: the value after a round is the aggregate of every active worker's push under
  the store's aggregator (``kv.aggregator``, psnode.math.aggregation: ``average`` divides the
  sum by the number of contributors, ``sum``, ``max``) fed to the optimizer, or stored as is
  without one.  ``dist_async``: each push is applied on arrival.  ``dist_ssp`` (bounded
  staleness ``s``, ``kv.staleness``): each push is applied on arrival as in dist_async, and the
  pull after this worker's push ``t`` of a key holds every active worker's pushes 1..t-s of it
  (it waits while the slowest is further behind: psnode.server.staleness); ``s = 0`` runs
  dist_sync's rounds (its values exactly, the aggregator and buckets included).
* ``dist_sync`` with ``backup_workers`` b (``kv.backup_workers``): a round of a key part
  completes when all but b of its workers pushed it, and its value is the aggregate of those
  (``average`` divides by their number); a push that comes after its round completed is
  dropped and counted (``late`` in ``mxdist status``), so the slowest b workers of each round
  never set the pace (psnode.server.rounds states the exactly-once invariant).  b = 0 is
  dist_sync exactly.
* ``set_gradient_compression`` (MXNet's): after ``create`` (keys may be initialised already),
  before the first push; dense float32 pushes then travel compressed with this worker's
  residuals (psnode.math.compression, psnode.worker.compressor); servers decode them and aggregate float32.
  Init values and pulls are never compressed.  ``'local'`` runs the same arithmetic, except
  for a list of arrays pushed for one key (one per device): there, as in MXNet's local store,
  each array is compressed with its own residual and the decoded arrays are summed (a
  distributed store sums the list first, then compresses, as MXNet's does).
* MXNet's other calls and rules: its type names (:data:`MXNET_TYPES`; ``kv.type`` is the name
  given, ``kv.mode`` the store it names), ``broadcast``, ``is_capable``, ``set_updater`` /
  ``_set_updater`` (a Python updater on 'local' stores), pulls that skip RowSparseArray outputs
  unless ``ignore_sparse=False``, and one kind of key per store (all ints or all strs).
  psnode's additions: ``row_sparse_fetch`` (a row pull that returns at once; ``.wait()`` gives
  the rows) and ``batch()`` (the requests of the calls inside leave as one message per
  same-host server).
  Deliberate differences: a second broadcast of a key gets the stored value (MXNet's native
  store refuses it; a restarted worker's needs it), ``row_sparse_pull`` fills dense outputs and
  reads dense keys too, and a Python updater on a distributed store is ignored with a warning
  (MXNet's workers ignore it silently; psnode's servers take optimizer specs, never code).
* **Elastic membership** (``kv.elastic``; docs/python-api.md "Elastic membership"): per key part
  every worker has a start round (1 for the first generation; a joiner's is agreed with every
  part of the key at its ``init``: the latest completed round + 2, or later while a part has
  opened that round), and round r completes when every member whose start is at or before r
  pushed its push r.  A joiner's ``init`` never initialises: it gets the current value, and
  ``num_pushes(key)`` is its start - 1.  ``rank`` is stable; ``num_workers``, ``generation``
  and ``members`` are the current membership; ``on_membership_change(cb)`` runs in the
  script's thread.  Asked to leave (``leaving``), the next ``push``/``pushpull`` waits for
  everything pushed, leaves and raises :class:`psnode.errors.Leave` (code 0).  A lost worker's
  pushes that reached a server are applied once; ``average`` divides by each round's
  contributors; rounds it did not push complete over the rest.
* ``save_optimizer_states`` / ``load_optimizer_states``: every server's optimizer state in one
  file (:mod:`psnode.worker.states`), loaded into a job of the same number of servers or more.

:class:`KVStore` checks what a call was given (:mod:`psnode.worker.forms`,
:mod:`psnode.worker.items`, :mod:`psnode.worker.routes`: for torch :mod:`psnode.torch.values`),
registers keys (placement, buckets: :mod:`psnode.worker.keys`) and hands the checked items to the :class:`DataPath` it
holds; the engine it is given (:class:`KVBackend`) is the job (or, for ``'local'``, this process).
"""
from __future__ import annotations

import contextlib
import difflib
import glob
import json
import math
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import numpy as np

from psnode.config import Distribution, NodeConfig
from psnode.errors import ConfigError, Leave, PSError, ShapeMismatch
from psnode.math import aggregation as agg_mod
from psnode.math import dynrows
from psnode.math import initializers as init_mod
from psnode.math import optimizers as opt_mod
from psnode.math.compression import CompressionSpec
from psnode.math.sparse import RowSparseArray
from psnode.protocol import DTYPES, Flush, GetStates, LoadStates, Op, SetOptimizer, check_key
from psnode.worker import forms, routes
from psnode.worker import items as items_mod
from psnode.worker.bucketing import Bucketer
from psnode.worker.compressor import Compressor
from psnode.worker.datapath import DataPath, Requests
from psnode.worker.futures import Future, Notice
from psnode.worker.keys import Item, KeyInfo
from psnode.worker.placement import Part, Placement, Placer
from psnode.worker.states import load_states, save_states

TYPES = ("local", "dist_sync", "dist_async", "dist_ssp")
AGGREGATORS = tuple(agg_mod.RULES)   # the aggregators' names (psnode.math.aggregation)
#: MXNet's other store type names and the psnode store each one is.  MXNet's device
#: communication (``'device'`` names) is a way to sum per-device arrays; psnode stores sum a
#: list of arrays on the host whatever the name says.
MXNET_TYPES = {
    "device": "local", "local_update_cpu": "local", "local_allreduce_cpu": "local",
    "local_allreduce_device": "local", "nccl": "local",
    "dist": "dist_sync", "dist_device_sync": "dist_sync", "dist_sync_device": "dist_sync",
    "dist_device_async": "dist_async", "dist_async_device": "dist_async",
}
#: MXNet's store types that need an NVIDIA GPU (MXNet's NCCL store).
GPU_TYPES = ("nccl",)
CAPABILITIES = ("optimizer",)


def resolve_type(name: Any) -> str:
    """The psnode store (``'local'``, ``'dist_sync'``, ``'dist_async'``) for a store type name:
    one of :data:`TYPES` or MXNet's names (:data:`MXNET_TYPES`, case-insensitive as in MXNet).
    ConfigError for another name, and for a GPU-only type where this machine has no GPU."""
    if not isinstance(name, str):
        raise ConfigError(f"a KVStore type is a string, not {type(name).__name__} {name!r}")
    low = name.lower()
    mode = low if low in TYPES else MXNET_TYPES.get(low)
    if mode is None:
        close = difflib.get_close_matches(low, [*TYPES, *MXNET_TYPES], n=1)
        guess = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"unknown KVStore type {name!r}: {guess}use one of {', '.join(TYPES)} "
                          f"(or MXNet's {', '.join(MXNET_TYPES)})")
    if low in GPU_TYPES and not _has_gpu():
        raise ConfigError(f"KVStore type {name!r} is MXNet's NCCL store and needs an NVIDIA GPU; this machine "
                          "has none (no /dev/nvidia0): use 'device' or 'local'")
    return mode


def _has_gpu() -> bool:
    return bool(glob.glob("/dev/nvidia[0-9]*"))


class KVBackend(Requests, Protocol):
    """What a KVStore needs of its engine besides requests (:class:`~psnode.worker.datapath.Requests`):
    :class:`psnode.worker.engine.Engine` (a job) or :class:`psnode.local.LocalEngine` (this process)."""

    @property
    def rank(self) -> int: ...
    @property
    def num_servers(self) -> int: ...
    @property
    def restarts(self) -> int: ...
    @property
    def fatal(self) -> PSError | None:
        """Set once the job failed or the engine closed."""

    #: Up while the job has something for the user's thread (its failure, a push's error, a
    #: membership change, a request to leave): read once per call, the engine asked only then.
    notice: Notice

    def check(self) -> None:
        """Raise the job's failure, or an error a server reported for an earlier push."""

    def barrier(self) -> None:
        """Block until every active worker entered this barrier."""

    @property
    def joiner(self) -> bool:
        """This worker joined the running job (its inits never initialise; it agrees a start
        round with every key part)."""

    @property
    def leaving(self) -> bool:
        """This worker was asked to leave at its next push."""

    def membership(self) -> tuple[int, tuple[int, ...]]:
        """(generation, sorted member ranks) as last heard."""

    def membership_changes(self) -> list[tuple[int, tuple[int, ...]]]:
        """The (generation, members) changes since the last call, oldest first."""

    def agreed_members(self) -> tuple[int, tuple[int, ...]]:
        """A barrier, and the (generation, members) it completed with (the same for all)."""

    def resume(self) -> None:
        """This restarted worker continues its predecessor's barrier numbering."""

    def set_updater(self, updater: Callable[[Any, Any, np.ndarray], None] | None) -> None:
        """Fold aggregated pushes with ``updater`` where the values are (in-process only)."""

    def close(self, timeout: float = 30.0) -> None:
        """Leave the job and stop."""


class KVStore:
    """A key-value store for parameters (see the module docstring for the contracts)."""

    def __init__(self, kind: str, engine: KVBackend, cfg: NodeConfig | None, aggregator: str,
                 name: str | None = None, staleness: int | None = None, backup_workers: int = 0) -> None:
        self.mode = kind                       # 'local', 'dist_sync', 'dist_async' or 'dist_ssp'
        #: dist_sync's backup workers: a round completes when all but this many pushed
        self.backup_workers = backup_workers if kind == "dist_sync" else 0
        #: dist_ssp's bound (None for other stores); 0 runs dist_sync's rounds
        self.staleness = staleness if kind == "dist_ssp" else None
        self._sync = kind in ("local", "dist_sync") or staleness == 0   # rounds on the servers
        self.type = name.lower() if name else kind   # the type name it was created with (MXNet's kv.type)
        self._engine = engine
        self._notice = engine.notice     # (the engine keeps the one it made)
        #: how the servers fold a round's pushes (psnode.math.aggregation)
        self._aggregation = agg_mod.parse(aggregator, "kv.create(aggregator=...)")
        self._cfg = cfg
        self.distribution = cfg.distribution.value if cfg else Distribution.HYBRID.value
        bound = None if cfg is None or cfg.distribution is Distribution.DATA else cfg.big_array_bound
        self._placer = Placer(max(1, engine.num_servers), bound, cfg.slice_bytes if cfg else 0)
        self._keys: dict[Any, KeyInfo] = {}
        self._optimizer: opt_mod.Optimizer | None = None
        self._resumed = False      # a restarted worker continues its predecessor's push counts
        self._pushed = False
        self._bucketer = Bucketer()
        self._comp = Compressor()  # gradient compression (psnode.worker.compressor)
        self._path = DataPath(engine, kind != "local" and self._sync, self._comp)
        self._torch_bufs: dict[Any, np.ndarray] = {}   # host arrays of pulls into torch tensors
        self._key_kind: type | None = None     # int or str: the kind of key the first call used
        self._updater: Callable[[Any, Any, np.ndarray], None] | None = None
        self._updater_exc: BaseException | None = None   # the updater's first exception in a call
        self._warned: set[Any] = set()         # keys whose row_sparse pull outputs were ignored
        self._on_change: list[Callable[[int, list[int]], None]] = []   # on_membership_change callbacks
        self.close_error: PSError | None = None   # what close() raised (see close)

    # ------------------------------------------------------------ properties
    @property
    def rank(self) -> int:
        return self._engine.rank

    @property
    def num_workers(self) -> int:
        """The number of workers taking part now (an elastic job's current members; else the
        job's size)."""
        if self._cfg is None:
            return 1
        if not self._cfg.elastic:
            return self._cfg.num_workers
        return len(self._engine.membership()[1])

    # ------------------------------------------------------------ elastic membership
    @property
    def elastic(self) -> bool:
        """May this job's membership change while it runs (``PSNODE_MIN_WORKERS`` below or
        ``PSNODE_MAX_WORKERS`` above ``PSNODE_NUM_WORKERS``)?  'local': False."""
        return self._cfg is not None and self._cfg.elastic

    @property
    def generation(self) -> int:
        """The membership generation: 0 for the first generation, one more after each join,
        leave or loss (as this worker last heard; 'local': 0)."""
        return self._engine.membership()[0]

    @property
    def members(self) -> list[int]:
        """The ranks of the workers taking part, sorted (as this worker last heard; 'local': [0])."""
        return list(self._engine.membership()[1])

    @property
    def leaving(self) -> bool:
        """This worker was asked to leave (``mxdist scale`` down): its next ``push`` flushes,
        leaves the job and raises :class:`psnode.errors.Leave` (code 0).  A script that checks
        it can save what it needs and call ``kv.close()`` itself."""
        return self._engine.leaving

    def on_membership_change(self, callback: Callable[[int, list[int]], None]) -> None:
        """Call ``callback(generation, members)`` after each membership change, in the script's
        thread, at its first ``push``, ``pushpull`` or ``barrier`` after the change
        was heard (changes heard together: one call each, oldest first)."""
        self._on_change.append(callback)

    def _membership_changed(self) -> None:
        """Run the callbacks of changes heard since the last call (cheap when there are none)."""
        changes = self._engine.membership_changes()
        for generation, members in changes:
            for cb in list(self._on_change):
                cb(generation, list(members))

    def agreed_members(self) -> tuple[int, list[int]]:
        """A barrier of every member, and the membership it completed with: every worker of
        the barrier gets the same ``(generation, members)`` (psnode.data.ShardSampler shards by
        it)."""
        self.wait_all()
        generation, members = self._engine.agreed_members()
        self._membership_changed()
        return generation, list(members)

    def _attend(self) -> None:
        """What the job has for this thread before a push (the engine's notice is up): leave if
        asked, run the membership callbacks, raise the job's failure or a push's error."""
        if self._engine.leaving:
            self._leave_if_asked()
        self._membership_changed()
        self._engine.check()

    def _leave_if_asked(self) -> None:
        """Graceful leave: flush what this worker pushed, leave the job, raise Leave."""
        if not self._engine.leaving or self._closed:
            return
        self.close()
        message = f"worker {self.rank} left the job (asked to leave); its pushes were applied"
        print(f"psnode {message}", file=sys.stderr, flush=True)
        raise Leave(message)

    @property
    def num_servers(self) -> int:
        return self._engine.num_servers

    @property
    def aggregator(self) -> str:
        """The aggregation rule's name (``'average'``, ``'sum'``, ...: psnode.math.aggregation)."""
        return self._aggregation.name

    @property
    def _bound(self) -> int:
        """The staleness bound the key parts of this store keep (-1: none; dist_ssp with s = 0
        runs dist_sync's rounds, which need none)."""
        return self.staleness if self.staleness is not None and not self._sync else -1

    @property
    def restarts(self) -> int:
        """How many times this worker was restarted (0 on a first run)."""
        return self._engine.restarts

    @property
    def _closed(self) -> bool:
        """Closed: every later request raises PSError (psnode.kv's excepthook passes exceptions on)."""
        return self._path.closed

    def num_pushes(self, key: Any) -> int:
        """Pushes of ``key`` by this worker's rank that the servers have taken.

        0 in a fresh job.  A restarted worker (``mxdist launch --max-restarts``) gets its
        predecessor's count after ``init``, so a script can resume its loop at that step.
        Asking before the first push means the script resumes: its pushes (and barriers)
        continue its predecessor's numbering.  A restarted script that never asks starts over
        instead: its pushes of rounds the servers already applied are recognised and not
        applied again, and its pulls get the current values, until it catches up.
        """
        info = self._info(key)
        if not self._resumed and not self._pushed:
            self._resumed = True
            for other in self._keys.values():
                other.seq = max(other.seq, other.taken)
            self._engine.resume()
        return max(info.seq, info.taken)

    # ------------------------------------------------------------ helpers
    def _info(self, key: Any) -> KeyInfo:
        return items_mod.info(self._keys, key)

    def _check_key_kind(self, key: Any) -> None:
        """MXNet's rule: one store's keys are all ints or all strs (its first call decides);
        ConfigError naming the key of the other kind, before anything is sent."""
        keys = key if isinstance(key, (list, tuple)) else (key,)
        kind = self._key_kind
        if kind is not None and all(type(k) is kind for k in keys):
            return
        for k in keys:
            k_kind = str if isinstance(k, str) else int if isinstance(k, (int, np.integer)) \
                and not isinstance(k, (bool, np.bool_)) else None
            if k_kind is None:
                continue    # (check_key_user names it)
            if kind is None:
                kind = k_kind
            elif k_kind is not kind:
                first = "this call" if self._key_kind is None else "this KVStore"
                raise ConfigError(f"key {k!r} is {'a str' if k_kind is str else 'an int'}, but {first} uses "
                                  f"{'str' if kind is str else 'int'} keys: a KVStore's keys are all ints or "
                                  "all strs (MXNet's rule)")
        self._key_kind = kind

    def _local_compressed(self) -> bool:
        return self._comp.spec is not None and self.mode == "local"

    @contextlib.contextmanager
    def _updater_errors(self) -> Iterator[None]:
        """An exception of the Python updater (set_updater) reaches the caller as itself, once
        the call's pushes are done (their rounds complete: the value is what the updater left)."""
        try:
            yield
        finally:
            exc, self._updater_exc = self._updater_exc, None
            if exc is not None:
                raise exc

    def _every_server(self, op: Callable[[], Op], priority: int) -> list[Future]:
        """Send a new ``op()`` to every server (each request is its own op: it gets its own id)
        and wait for the answers (raising the first error)."""
        futs = [self._path.request(s, op(), priority) for s in range(max(1, self.num_servers))]
        self._path.wait(futs)
        return futs

    # ------------------------------------------------------------ init
    def init(self, key: Any, value: Any, initializer: Any = None, stype: str | None = None) -> None:
        """Initialise keys (see the module docstring: rank 0's value wins everywhere)."""
        self._check_key_kind(key)
        pairs = forms.init_pairs(key, value)
        if isinstance(initializer, dict):
            initializer = init_mod.from_spec(initializer)
        futs: list[Future] = []
        new = [k for k, _ in pairs if check_key_user(k) not in self._keys]
        for k, v in pairs:
            futs.extend(self._init_one(check_key_user(k), v, initializer, stype))
        self._path.wait(futs)
        if self._engine.joiner:   # (elastic: agree a start round with every part of each new key)
            generation = self._engine.membership()[0]
            for k in new:
                self._path.join(check_key_user(k), self._keys[check_key_user(k)], generation)

    def _init_one(self, key: Any, value: Any, initializer: Any, stype: str | None) -> list[Future]:
        if isinstance(value, RowSparseArray) and value.shape and value.shape[0] == dynrows.HEIGHT \
                and not isinstance(initializer, init_mod.OnServers):   # (rows are made on the servers)
            initializer = init_mod.ps_initializer(initializer if initializer is not None else init_mod.Zero())
        if isinstance(value, RowSparseArray) and initializer is None and not len(value.indices):
            # (no rows: zeros, made on the servers: no worker sends the table, and copies,
            # checkpoints and a replacement's restore carry its spec and the rows touched)
            initializer = init_mod.ps_initializer(init_mod.Zero())
        if isinstance(initializer, init_mod.OnServers):
            return self._init_on_servers(key, value, initializer, stype)
        sparse = stype == "row_sparse" or isinstance(value, RowSparseArray)
        if stype not in (None, "default", "row_sparse"):
            raise ConfigError(f"stype {stype!r} for key {key!r}: use 'default' or 'row_sparse'")
        # (a row_sparse key's rows are read with row_sparse_pull: no init answer carries the table)
        target = value if isinstance(value, np.ndarray) and value.flags.writeable and not sparse else None
        arr = value.todense() if isinstance(value, RowSparseArray) else np.asarray(value)
        if arr.dtype.name not in DTYPES:
            raise ShapeMismatch(f"key {key!r}: dtype {arr.dtype} cannot be stored")
        info = self._keys.get(key)
        if info is not None:
            if info.shape != arr.shape or info.dtype != arr.dtype:
                raise ShapeMismatch(f"key {key!r} was initialised as {info.dtype}{list(info.shape)}; "
                                    f"re-init with {arr.dtype}{list(arr.shape)} is not allowed")
            return []
        if sparse and arr.ndim < 1:
            raise ShapeMismatch(f"row_sparse key {key!r} needs at least one dimension")
        if initializer is not None and self.rank == 0:
            if target is None:
                arr = np.array(arr, copy=True)
            initializer(arr)
        placement = self._placer.place(key, arr.shape, arr.dtype.itemsize, by_rows=sparse)
        info = KeyInfo(arr.shape, arr.dtype, sparse, placement)
        if self._sync and self.mode != "local" and not sparse and not placement.split:
            joined = self._bucketer.assign(key, placement.parts[0].server, arr.dtype, arr.size)
            if joined is not None:
                info.bucket = joined[0]
        self._keys[key] = info
        return self._path.init(key, info, sync=self._sync, aggregation=self._aggregation.name,
                               resumed=self._resumed, value=arr if self.rank == 0 else None, target=target,
                               bare=target is None,   # (nothing to copy the stored value into: not sent)
                               join=self._engine.joiner, staleness=self._bound, backup=self.backup_workers)

    def _init_on_servers(self, key: Any, value: Any, ps: init_mod.OnServers, stype: str | None) -> list[Future]:
        """``init`` with ``ps_initializer``: ``value`` is a template (its shape, dtype and,
        for a RowSparseArray, stype; never its contents, and it is not written).  Each server
        computes its part (rank 0 sends the spec: psnode.math.initializers.FillSpec), and no
        init answer carries a value: no worker ever holds the key."""
        if stype not in (None, "default", "row_sparse"):
            raise ConfigError(f"stype {stype!r} for key {key!r}: use 'default' or 'row_sparse'")
        sparse = stype == "row_sparse" or isinstance(value, RowSparseArray)
        if not isinstance(value, (np.ndarray, RowSparseArray)):
            raise ConfigError(f"key {key!r}: a server-side init takes a template of the key's shape and dtype "
                              "(psnode.sparse.zeros(shape) or psnode.kv.template(shape)), not "
                              f"{type(value).__name__}")
        shape, dtype = tuple(int(d) for d in value.shape), np.dtype(value.dtype)
        if dtype.name not in DTYPES:
            raise ShapeMismatch(f"key {key!r}: dtype {dtype} cannot be stored")
        info = self._keys.get(key)
        if info is not None:
            if info.shape != shape or info.dtype != dtype:
                raise ShapeMismatch(f"key {key!r} was initialised as {info.dtype}{list(info.shape)}; "
                                    f"re-init with {dtype}{list(shape)} is not allowed")
            return []
        if sparse and not shape:
            raise ShapeMismatch(f"row_sparse key {key!r} needs at least one dimension")
        if sparse and shape[0] == dynrows.HEIGHT and isinstance(value, RowSparseArray):
            return self._init_table(key, value, ps, shape, dtype)
        ps.part(shape).check(dtype)   # (a bad dtype or shape fails here, before anything is sent)
        placement = self._placer.place(key, shape, dtype.itemsize, by_rows=sparse)
        info = KeyInfo(shape, dtype, sparse, placement)
        self._keys[key] = info
        row = math.prod(shape[1:]) if placement.by_rows else 1

        def fill(part: Part) -> dict[str, Any]:
            return ps.part(shape, part.lo * row if placement.split else 0).to_json()
        return self._path.init(key, info, sync=self._sync, aggregation=self._aggregation.name,
                               resumed=self._resumed, fill=fill if self.rank == 0 else None, bare=True,
                               join=self._engine.joiner, staleness=self._bound, backup=self.backup_workers)

    def _init_table(self, key: Any, value: RowSparseArray, ps: init_mod.OnServers, shape: tuple[int, ...],
                    dtype: np.dtype) -> list[Future]:
        """A table without a row count (psnode.math.dynrows): one part on every server, each
        holding the ids whose hash falls in its range; no rows until they are touched."""
        if len(shape) != 2:
            raise ShapeMismatch(f"key {key!r}: a table without a row count is 2-d (None, width), not {list(shape)}")
        dynrows.check_init(ps.init, dtype)
        options = value.table or {"width": shape[1], "min_count": 1, "ttl": 0, "max_rows": 0, "absent": "init"}
        if options["width"] != shape[1]:
            raise ShapeMismatch(f"key {key!r}: table width {options['width']} differs from its shape {list(shape)}")
        parts = tuple(Part(server=s, index=s, lo=0, hi=0) for s in range(self._placer.num_servers))
        placement = Placement(key=key, parts=parts, by_rows=True)
        self._placer.placed[key] = placement
        info = KeyInfo(shape, dtype, True, placement, dynamic=True)
        self._keys[key] = info

        def fill(part: Part) -> dict[str, Any]:
            return {"init": ps.init.to_spec(), "seed": ps.seed, "dynamic": dict(options)}
        return self._path.init(key, info, sync=self._sync, aggregation=self._aggregation.name,
                               resumed=self._resumed, fill=fill if self.rank == 0 else None, bare=True,
                               join=self._engine.joiner, staleness=self._bound)

    def export(self, key: Any, path: str, since: str | None = None) -> int:
        """Write the trained rows of table ``key`` (a table without a row count) to ``path``
        as one .npz (``psnode.export``; the format: docs/dynamic-tables.md); with ``since``
        (an earlier export's file) only the rows changed after it.  The rows are read as each
        server holds them when it answers.  Returns the number of rows written."""
        info = self._info(key)
        if not info.dynamic:
            raise ConfigError(f"key {key!r} has a row count: export is for tables made with "
                              "psnode.sparse.table(width) (read a fixed table with kv.row_sparse_pull)")
        after = None
        if since is not None:
            try:
                with np.load(since) as old:
                    after, old_key = old["versions"], str(old["key"])
            except (OSError, KeyError, ValueError) as exc:
                raise ConfigError(f"export since={since!r}: not an export file ({exc})") from None
            if old_key != str(key) or len(after) != len(info.placement.parts):
                raise ConfigError(f"export since={since!r}: written for key {old_key!r} on {len(after)} servers, "
                                  f"not {key!r} on {len(info.placement.parts)}")
        parts = self._path.export_rows(key, info)
        ids, values = [], []
        for i, (hashed, rows, stamps, _version) in enumerate(parts):
            keep = slice(None) if after is None else stamps > after[i]
            ids.append(dynrows.unmix(hashed[keep]))
            values.append(rows[keep])
        all_ids = np.concatenate(ids) if ids else np.zeros(0, np.int64)
        order = np.argsort(all_ids, kind="stable")
        out: dict[str, Any] = {"ids": all_ids[order],
               "values": (np.concatenate(values) if values else np.zeros((0, info.shape[1]), info.dtype))[order],
               "versions": np.array([int(p[3][0]) for p in parts], np.int64),
               "since": after if after is not None else np.zeros(len(parts), np.int64),
               "key": np.array(str(key))}
        with open(path, "wb") as f:
            np.savez(f, **out)
        return len(order)

    # ------------------------------------------------------------ compression
    def set_gradient_compression(self, compression_params: Any) -> None:
        """Compress this worker's pushes: ``{'type': '2bit', 'threshold': 0.5}``, ``{'type':
        '1bit', 'threshold': t}``, ``{'type': 'fp16'}``, or ``{'type': 'none'}`` (off).

        MXNet's API and rule: call it after ``create`` and before the first push (keys may be
        initialised already; their initial values are never compressed), with the same
        settings on every worker (a server refuses pushes whose settings differ from another
        worker's, naming both).  Pushes of dense float32 keys then carry the compressed
        gradient (residuals kept per key on this worker, starting at zero); pushing a
        row_sparse or non-float32 key raises ConfigError naming it.  Pulls stay float32.
        """
        spec = CompressionSpec.from_params(compression_params)
        if self._pushed:
            raise ConfigError("kv.set_gradient_compression must be called before the first push (MXNet's rule: "
                              "the residuals start with the first compressed push); this worker has pushed already")
        self._comp.set(spec)

    @property
    def gradient_compression(self) -> dict[str, Any]:
        """The settings in force, as ``set_gradient_compression`` takes them (``{'type': 'none'}``: off)."""
        return (self._comp.spec or CompressionSpec()).to_params()

    # ------------------------------------------------------------ push
    def push(self, key: Any, value: Any, priority: int = 0) -> None:
        """Send gradients (see the module docstring; torch tensors: :mod:`psnode.torch.values`).
        A worker asked to leave leaves here instead (:attr:`leaving`)."""
        if self._notice.up:
            self._attend()
        self._check_key_kind(key)
        value = routes.push_values(key, value, self._keys.get)
        self._bucketer.close_all()
        if self._local_compressed():
            checked = self._comp.check_lists(forms.groups(key, value, "push")[0], self._info)
            summed: list[Item] = [(k, info, self._comp.device_sum(k, info, values)) for k, info, values in checked]
            self._pushed = True
            with self._comp.suspended(), self._updater_errors():
                self._send_pushes(summed, priority)
            return
        items = items_mod.gradients(self._keys, key, value)
        with self._updater_errors():
            self._send_pushes(items, priority)

    def _send_pushes(self, items: list[Item], priority: int) -> None:
        """Send the prepared gradients of one push call (checked for compression first)."""
        if self._comp.spec is not None:
            self._comp.check(items)
        self._pushed = True
        self._path.push(items, priority)

    # ------------------------------------------------------------ pull
    def pull(self, key: Any, out: Any = None, priority: int = 0, row_ids: Any = None,
             ignore_sparse: bool = True) -> Any:
        """Fill ``out`` (allocated if None) with the current values and return it.

        RowSparseArray outputs (MXNet's row_sparse NDArrays) are skipped with ``ignore_sparse``
        (MXNet's default: they are not changed, and a warning names the key once; use
        row_sparse_pull); with ``ignore_sparse=False`` each gets every row of the key."""
        if row_ids is not None:
            return self.row_sparse_pull(key, out=out, priority=priority, row_ids=row_ids)
        self._check_key_kind(key)
        for k in key if isinstance(key, (list, tuple)) else [key]:
            info = self._keys.get(k)
            if info is not None and info.dynamic:
                raise ConfigError(f"key {k!r} is a table without a row count: pull its rows with "
                                  f"kv.row_sparse_pull({k!r}, row_ids=ids), or all of them with psnode.export")
        host, scatters = routes.pull_outs(key, out, self._keys.get, self._torch_bufs)
        if scatters:   # torch tensors: pulled into host arrays, then copied to every tensor
            self.pull(key, host, priority)
            routes.finish(scatters)
            return out
        self._engine.check()
        items = items_mod.plain(self._keys, key, out, True)
        if items is not None:   # (the common case without the general forms' work)
            self._bucketer.close_all()
            self._path.pull(items, priority, False)
            return list(out)
        outs, many = forms.out_groups(key, out, "pull")
        dense, sparse = self._split_sparse(outs, keep=not ignore_sparse)
        if not sparse and len(dense) == len(outs):
            return self._pull_into(outs, many, priority, None)
        if dense:
            self._pull_into(dense, True, priority, None)
        for k, rsp in sparse:
            self.row_sparse_pull(k, rsp, priority, np.arange(self._info(k).shape[0]))
        return out

    def _split_sparse(self, outs: list[forms.Group], keep: bool = False
                      ) -> tuple[list[forms.Group], list[forms.Group]]:
        """``outs`` without their RowSparseArray outputs, and those (unless ignored: not
        ``keep``; a warning names each key once)."""
        dense: list[forms.Group] = []
        sparse: list[forms.Group] = []
        for k, targets in outs:
            rsp = [o for o in targets if isinstance(o, RowSparseArray)]
            if not rsp:
                dense.append((k, targets))
                continue
            if keep:
                sparse.append((k, rsp))
            elif k not in self._warned:
                self._warned.add(k)
                warnings.warn(f"psnode: pull of key {k!r} into a row_sparse output was ignored (MXNet's rule: "
                              "use kv.row_sparse_pull with row_ids, or pull with ignore_sparse=False)",
                              stacklevel=3)
            if len(rsp) < len(targets):
                dense.append((k, [o for o in targets if not isinstance(o, RowSparseArray)]))
        return dense, sparse

    def _pull_into(self, outs: list[forms.Group], many: bool, priority: int,
                   pushed: dict[Any, np.ndarray | RowSparseArray] | None) -> Any:
        """Pull every key of ``outs`` (with ``pushed``: the dense gradient of each key to push
        first, fused with the pull into one request per key part, or per bucket)."""
        self._bucketer.close_all()
        results, fixups, items = [], [], []
        for k, targets in outs:
            info = self._info(k)
            done, dest = items_mod.targets(k, info, targets)
            if len(done) > 1 or dest is not done[0]:
                fixups.append((done, dest))
            grad = None if pushed is None else pushed.get(k)
            if pushed is not None:
                self._pushed = True
            items.append((k, info, (dest, grad)))
            results.append(done if len(done) > 1 else done[0])
        self._path.pull(items, priority, pushed is not None)
        for done, dest in fixups:
            for o in done:
                if o is not dest:
                    np.copyto(o, dest)
        return results if many else results[0]

    def row_sparse_pull(self, key: Any, out: Any = None, priority: int = 0, row_ids: Any = None) -> Any:
        """Fetch only rows ``row_ids`` (any shape; duplicates and any order allowed).

        ``out`` may be a dense array of the key's full shape (only those rows are written), a
        RowSparseArray (replaced by the rows), None (a RowSparseArray is returned), or a list
        of these; see :mod:`psnode.worker.forms` for the forms of ``row_ids``.  Torch tensors (dense,
        the key's full shape) get the rows too (:mod:`psnode.torch.values`).
        """
        self._check_key_kind(key)
        host, scatters = routes.pull_outs(key, out, self._keys.get, self._torch_bufs, rows=True)
        if scatters:
            self.row_sparse_pull(key, host, priority, row_ids)
            routes.finish(scatters)
            return out
        self._engine.check()
        outs, many = forms.out_groups(key, out, "row_sparse_pull")
        id_lists = forms.row_id_lists(outs, row_ids, many)
        final = self._path.pull_rows(outs, id_lists, priority, self._info)
        shaped: list[Any] = []
        i = 0
        for _, targets in outs:
            group = final[i:i + len(targets)]
            i += len(targets)
            shaped.append(group if len(group) > 1 else group[0])
        return shaped if many else shaped[0]

    def row_sparse_fetch(self, key: Any, row_ids: Any, priority: int = 0) -> PendingRows:
        """Start fetching rows ``row_ids`` of ``key`` and return at once (a prefetch: the
        script may push, pull and compute meanwhile); ``.wait()`` returns what
        :meth:`row_sparse_pull` with ``out=None`` would have returned at the time of this call:
        the rows (sorted distinct ids) after this worker's pushes of the key sent before it."""
        self._check_key_kind(key)
        self._engine.check()
        info = self._info(key)
        if info.placement.split and not info.placement.by_rows:
            raise ConfigError(f"key {key!r} is a dense key split over servers; row_sparse_fetch needs a "
                              "row_sparse key")
        ids = forms.row_ids(row_ids, key)
        rows, futs = self._path.fetch_rows(key, info, ids, priority)
        return PendingRows(rows, futs, self._path.wait)

    def batch(self) -> contextlib.AbstractContextManager[None]:
        """``with kv.batch():`` the requests of the calls inside (pushes, ``row_sparse_fetch``)
        go to this host's servers together when the block ends: one message per server instead
        of one per call.  A call inside that waits for an answer sends what the block holds
        first.  Requests for servers on other hosts leave as usual (by priority)."""
        return self._engine.batch()

    def pushpull(self, key: Any, value: Any, out: Any = None, priority: int = 0) -> Any:
        """``push`` then ``pull`` (into ``out``, or back into ``value`` when out is None): one
        request and one answer per dense key part.  RowSparseArray outputs are not written
        (MXNet's rule, as :meth:`pull` with ``ignore_sparse``).  A worker asked to leave leaves
        here (as :meth:`push`)."""
        if self._engine.leaving:
            self._leave_if_asked()
        self._membership_changed()
        self._check_key_kind(key)
        dest = value if out is None else out
        host, scatters = routes.pull_outs(key, dest, self._keys.get, self._torch_bufs)
        value = routes.push_values(key, value, self._keys.get)
        if scatters:   # torch tensors (psnode.worker.routes)
            self.pushpull(key, value, host, priority)
            routes.finish(scatters)
            return dest
        self._engine.check()
        groups, many = forms.groups(key, value, "pushpull")
        grads: dict[Any, np.ndarray | RowSparseArray] = {}
        local_comp = self._local_compressed()
        if local_comp:
            for k, info, values in self._comp.check_lists(groups, self._info):
                grads[k] = self._comp.device_sum(k, info, values)
        else:
            for k, values in groups:
                grads[k] = items_mod.prepare(k, self._info(k), values)
        if self._comp.spec is not None:
            self._comp.check([(k, self._info(k), g) for k, g in grads.items()])
        outs, _ = forms.out_groups(key, value if out is None else out, "pushpull")
        dense, _ = self._split_sparse(outs)
        pulled = {k for k, _ in dense}
        # pushed, not pulled: row_sparse gradients (a push, then the plain pull), and keys
        # whose outputs are all row_sparse
        rest = [k for k, g in grads.items() if isinstance(g, RowSparseArray) or k not in pulled]
        with contextlib.ExitStack() as stack:
            if local_comp:
                stack.enter_context(self._comp.suspended())   # (decoded already: device_sum)
            stack.enter_context(self._updater_errors())
            if rest:
                self.push(rest, [grads.pop(k) for k in rest], priority)
            result = self._pull_into(dense, many, priority, grads) if dense else None
        if sum(len(t) for _, t in dense) == sum(len(t) for _, t in outs):
            return result
        return dest

    def broadcast(self, key: Any, value: Any, out: Any, priority: int = 0) -> Any:
        """MXNet's broadcast: rank 0's ``value`` of each key into ``out`` on every worker.

        ``init`` of the keys (rank 0's value is stored; ``value`` itself is not written), then
        ``pull`` into ``out`` (an array or a list of arrays per key, as pull takes them).  A
        key initialised already keeps its stored value, as re-init does (MXNet's native store
        refuses a second broadcast of a key; here a restarted worker's broadcast gets the
        current value)."""
        self._check_key_kind(key)
        self.init(key, _unwritable(value))
        return self.pull(key, out=out, priority=priority)

    @staticmethod
    def is_capable(capability: str) -> bool:
        """MXNet's capability query: ``'optimizer'`` (set_optimizer runs it on the servers) is
        True; another capability raises ConfigError, as MXNet's stores raise for one they do
        not know."""
        if not isinstance(capability, str) or capability.lower() not in CAPABILITIES:
            raise ConfigError(f"unknown KVStore capability {capability!r}: psnode knows {', '.join(CAPABILITIES)}")
        return True

    def set_updater(self, updater: Callable[[Any, Any, np.ndarray], None]) -> None:
        """MXNet's ``_set_updater``: ``updater(key, recv, stored)`` folds each aggregated push
        into the stored value, in place (``stored += recv`` sums the pushes), instead of an
        optimizer.  ``recv`` is a dense array (a RowSparseArray for a row_sparse key) and is
        only read; the key is the int or str the script uses.

        A Python function runs only where the values are: on a ``'local'`` store.  On a
        distributed store it is ignored with a warning, as MXNet's workers ignore it (MXNet
        runs Python updaters on its servers only through a pickled optimizer; psnode's servers
        take ``set_optimizer`` specs, never code).  ``set_optimizer`` replaces it."""
        if not callable(updater):
            raise ConfigError(f"set_updater takes a function updater(key, recv, stored), not {type(updater).__name__}")
        self._updater = updater
        if self.mode != "local":
            warnings.warn(f"psnode: kv.set_updater on a {self.type!r} store is ignored, as MXNet's distributed "
                          "workers ignore it: the servers run the optimizer of kv.set_optimizer, or store the "
                          "aggregate", stacklevel=2)
            return

        def run(key: Any, recv: Any, stored: np.ndarray) -> None:
            try:
                updater(key, recv, stored)
            except Exception as exc:   # noqa: BLE001 - raised to the caller by _updater_errors
                if self._updater_exc is None:
                    self._updater_exc = exc
        self._engine.set_updater(run)

    _set_updater = set_updater

    # ------------------------------------------------------------ optimizer
    def set_optimizer(self, optimizer: Any) -> None:
        """Run ``optimizer`` (an Optimizer or its spec dict) on the servers (replacing a
        Python updater of :meth:`set_updater`).  Called again with the same optimizer and
        other parameters (a new learning rate), the servers keep its states (momentum, ...);
        another optimizer starts from fresh states."""
        if isinstance(optimizer, dict):
            optimizer = opt_mod.from_spec(optimizer)
        if not isinstance(optimizer, opt_mod.Optimizer):
            raise ConfigError(f"set_optimizer takes psnode.optimizer.create(...), not {type(optimizer).__name__}")
        spec = optimizer.to_spec()
        json.dumps(spec)
        self._optimizer = optimizer
        if self._updater is not None:
            self._updater = None
            if self.mode == "local":
                self._engine.set_updater(None)
        self._every_server(lambda: SetOptimizer(spec), 1 << 30)

    def save_optimizer_states(self, fname: str, dump_optimizer: bool = False) -> None:
        """Write every server's optimizer state to ``fname`` (an .npz file, :mod:`psnode.worker.states`),
        atomically."""
        self.wait_all()
        per_server = []
        for fut in self._every_server(GetStates, 1 << 30):
            ans = fut.result
            assert ans is not None
            per_server.append((ans.names or [], ans.arrays))
        save_states(fname, per_server, self._optimizer.to_spec() if self._optimizer else None)

    def load_optimizer_states(self, fname: str) -> None:
        """Restore the states written by :meth:`save_optimizer_states` (same cluster shape)."""
        per_server = load_states(fname)
        if per_server and max(per_server) >= max(1, self.num_servers):
            raise ConfigError(f"{fname} was saved with more servers than this job has")
        futs = [self._path.request(s, LoadStates(names, arrs), 1 << 30) for s, (names, arrs) in per_server.items()]
        self._path.wait(futs)

    # ------------------------------------------------------------ sync points
    def wait_all(self) -> None:
        """Wait until every server has handled this worker's pushes (raising their errors)."""
        if self._closed:
            return
        self._every_server(Flush, -(1 << 30))
        self._engine.check()

    def barrier(self) -> None:
        """Block until every active worker has called barrier()."""
        self.wait_all()
        self._engine.barrier()
        self._membership_changed()

    def close(self) -> None:
        """Finish this worker: wait for its pushes, tell the scheduler, disconnect.

        A psnode error while waiting (the job ended meanwhile: PeerLost) is raised once the store
        is closed, as :attr:`close_error`; the store's ``sys.excepthook`` stays for it, so uncaught
        it reads as the same error raised by any other call."""
        if self._closed:
            return
        try:
            if self._engine.fatal is None:
                self.wait_all()
        except PSError as exc:
            self.close_error = exc
            raise
        finally:
            self._path.closed = True
            self._engine.close()
            hook = sys.excepthook
            if self.close_error is None and getattr(hook, "_psnode_store", None) is self:
                sys.excepthook = hook._psnode_previous  # type: ignore[attr-defined]   # the interpreter's, back

    def __enter__(self) -> KVStore:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        bound = "" if self.staleness is None else f" staleness {self.staleness}"
        bound += f" backup_workers {self.backup_workers}" if self.backup_workers else ""
        return (f"<KVStore {self.type}{bound} rank {self.rank}/{self.num_workers} "
                f"servers {self.num_servers} {self._aggregation.name}>")


class PendingRows:
    """Rows on their way (:meth:`KVStore.row_sparse_fetch`): :meth:`wait` returns them."""

    def __init__(self, rows: RowSparseArray, futs: list[Future], wait: Callable[[list[Future]], None]) -> None:
        self._rows = rows
        self._futs: list[Future] | None = futs
        self._waiter = wait

    @property
    def done(self) -> bool:
        """Every answer is in (``wait`` then returns without blocking)."""
        return self._futs is None or all(f.done for f in self._futs)

    def wait(self) -> RowSparseArray:
        """The rows (a RowSparseArray of the key's shape, ids sorted and distinct); raises what
        a server reported.  Further calls return the same rows."""
        if self._futs is not None:
            futs, self._futs = self._futs, None
            self._waiter(futs)
        return self._rows


def template(shape: Any, dtype: Any = np.float32) -> np.ndarray:
    """A read-only array of ``shape`` and ``dtype`` that occupies one element of memory (every
    element is that one): the value ``kv.init`` takes with a server-side initializer
    (``psnode.init.ps_initializer``), where only the shape and dtype count."""
    return np.broadcast_to(np.zeros((), dtype), tuple(int(d) for d in np.atleast_1d(shape)))


def _unwritable(value: Any) -> Any:
    """``value`` with its numpy arrays as read-only views (init then leaves them alone)."""
    if isinstance(value, np.ndarray):
        view = value.view()
        view.flags.writeable = False
        return view
    if isinstance(value, (list, tuple)):
        return type(value)(_unwritable(v) for v in value)
    return value


def check_key_user(key: Any) -> Any:
    try:
        key = check_key(key)
    except PSError as exc:
        raise ConfigError(str(exc)) from None
    if isinstance(key, str) and key.startswith("\0"):
        raise ConfigError(f"key {key!r}: keys starting with NUL are reserved")
    return key
