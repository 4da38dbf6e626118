"""The KVStore API (MXNet-style) over a local store or a distributed job.

``create('local')`` keeps everything in this process; ``create('dist_sync')`` and
``create('dist_async')`` join the job this process was launched in (``mxdist launch``), as a
worker.  Both run the same server-side logic (:mod:`psnode.aggregation`), so ``'local'`` is the
reference: a one-worker job gives the same results.

Contracts:

* Keys are ints or strs, or lists of them with matching lists of values.
* ``init``: every worker calls it for the same keys in the same order.  The first init decides
  shape, dtype and value: rank 0's array (or the initializer's output on rank 0) is stored, and
  every worker's ``value`` (a writable ndarray) is overwritten with it, so all workers start
  equal.  Re-init with the same shape and dtype is a no-op; another one raises ShapeMismatch.
* ``push`` reads ``value`` before returning (the caller may reuse the buffer at once) and sends
  asynchronously; a list of arrays for one key is summed first.  Errors a server reports
  surface at the next call.  ``pull`` blocks until the values after this worker's last push of
  each key are in ``out``.  Higher ``priority`` requests are sent first when requests queue.
* ``dist_sync``: the value after a round is the aggregate of every active worker's push
  (``average`` divides the sum by the number of contributors) fed to the optimizer, or stored
  as is without one.  ``dist_async``: each push is applied on arrival.
"""
from __future__ import annotations

import atexit
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from psnode import failure
from psnode import initializer as init_mod
from psnode import optimizer as opt_mod
from psnode.aggregation import Store, sent
from psnode.config import Distribution, NodeConfig, Role
from psnode.errors import ConfigError, KeyNotInitialized, PeerLost, PSError, ShapeMismatch
from psnode.protocol import Command, check_key
from psnode.sharding import Placement, Placer
from psnode.sparse import RowSparseArray
from psnode.worker import ERRORS, Engine, Future

TYPES = ("local", "dist_sync", "dist_async")
AGGREGATORS = ("average", "sum")


class LocalEngine:
    """The in-process stand-in for :class:`psnode.worker.Engine`: one server, one worker."""

    def __init__(self) -> None:
        self.store = Store(1)
        self.rank = 0
        self.num_servers = 1
        self.restarts = 0

    def submit(self, server: int, op: dict[str, Any], arrays: list[np.ndarray], nbytes: int,
               priority: int = 0, on_reply: Callable[..., None] | None = None,
               reply: bool = True) -> Future | None:
        fut = Future(on_reply)
        op["id"] = 0
        for answer in self.store.handle(0, op, arrays):
            if "err" in answer.result:
                cls = ERRORS.get(str(answer.result.get("kind")), PSError)
                fut.fail(cls(str(answer.result["err"])))
            else:
                fut.set(answer.result, answer.arrays)
            if answer.entry is not None:
                sent(answer.entry, None)  # the reply's value was copied out already
        if not reply:
            if fut.error is not None:
                raise fut.error
            return None
        return fut

    def wait(self, fut: Future) -> dict[str, Any]:
        return fut.wait(0)

    def control(self, cmd: Command, body: dict[str, Any] | None = None) -> Future:
        fut = Future()
        fut.set({}, [])
        return fut

    def check(self) -> None:
        pass

    def close(self, timeout: float = 30.0) -> None:
        pass


@dataclass
class KeyInfo:
    shape: tuple[int, ...]
    dtype: np.dtype
    sparse: bool
    placement: Placement
    seq: int = 0

    def part_shape(self, lo: int, hi: int) -> tuple[int, ...]:
        if not self.placement.split:
            return self.shape
        return (hi - lo, *self.shape[1:]) if self.placement.by_rows else (hi - lo,)


def _as_list(key: Any, value: Any) -> tuple[list[Any], list[Any], bool]:
    if isinstance(key, (list, tuple)):
        values = value if isinstance(value, (list, tuple)) else [value] * len(key)
        if len(values) != len(key):
            raise ConfigError(f"{len(key)} keys but {len(values)} values")
        return list(key), list(values), True
    return [key], [value], False


class KVStore:
    """A key-value store for parameters (see the module docstring for the contracts)."""

    def __init__(self, kind: str, engine: Any, cfg: NodeConfig | None, aggregator: str) -> None:
        self.type = kind
        self._engine = engine
        self._aggregator = aggregator
        self._cfg = cfg
        self.distribution = cfg.distribution.value if cfg else Distribution.HYBRID.value
        bound = None if cfg is None or cfg.distribution is Distribution.DATA else cfg.big_array_bound
        self._placer = Placer(max(1, engine.num_servers), bound)
        self._keys: dict[Any, KeyInfo] = {}
        self._closed = False
        self._optimizer: opt_mod.Optimizer | None = None

    # ------------------------------------------------------------ properties
    @property
    def rank(self) -> int:
        return self._engine.rank

    @property
    def num_workers(self) -> int:
        return self._cfg.num_workers if self._cfg else 1

    @property
    def num_servers(self) -> int:
        return self._engine.num_servers

    @property
    def aggregator(self) -> str:
        return self._aggregator

    @property
    def restarts(self) -> int:
        """How many times this worker was restarted (0 on a first run)."""
        return self._engine.restarts

    def num_pushes(self, key: Any) -> int:
        """Pushes of ``key`` by this worker's rank that the servers have taken.

        0 in a fresh job.  A restarted worker (``mxdist launch --max-restarts``) gets its
        predecessor's count after ``init``, so a script can resume its loop at that step.
        """
        return self._info(key).seq

    # ------------------------------------------------------------ helpers
    def _wait(self, futs: Sequence[Future]) -> None:
        first: BaseException | None = None
        for fut in futs:
            try:
                self._engine.wait(fut)
            except PSError as exc:
                first = first or exc
        if first is not None:
            raise first

    def _check_acks(self) -> None:
        """Raise an error a server reported for an earlier push."""
        self._engine.check()

    def _info(self, key: Any) -> KeyInfo:
        info = self._keys.get(key)
        if info is None:
            raise KeyNotInitialized(f"key {key!r} is not initialised: call kv.init({key!r}, value) first")
        return info

    def _submit(self, server: int, op: dict[str, Any], arrays: list[np.ndarray], nbytes: int,
                priority: int, on_reply: Callable[..., None] | None = None) -> Future:
        if self._closed:
            raise PSError("this KVStore is closed")
        return self._engine.submit(server, op, arrays, nbytes, priority, on_reply)

    def _send(self, server: int, op: dict[str, Any], arrays: list[np.ndarray], priority: int) -> None:
        """Fire and forget (pushes): a failure is raised by a later call."""
        if self._closed:
            raise PSError("this KVStore is closed")
        self._engine.submit(server, op, arrays, 0, priority, None, reply=False)

    # ------------------------------------------------------------ init
    def init(self, key: Any, value: Any, initializer: Any = None, stype: str | None = None) -> None:
        """Initialise keys (see the module docstring: rank 0's value wins everywhere)."""
        keys, values, _ = _as_list(key, value)
        if isinstance(initializer, dict):
            initializer = init_mod.from_spec(initializer)
        futs: list[Future] = []
        for k, v in zip(keys, values, strict=False):
            futs.extend(self._init_one(check_key_user(k), v, initializer, stype))
        self._wait(futs)

    def _init_one(self, key: Any, value: Any, initializer: Any, stype: str | None) -> list[Future]:
        sparse = stype == "row_sparse" or isinstance(value, RowSparseArray)
        if stype not in (None, "default", "row_sparse"):
            raise ConfigError(f"stype {stype!r} for key {key!r}: use 'default' or 'row_sparse'")
        target = value if isinstance(value, np.ndarray) and value.flags.writeable else None
        arr = value.todense() if isinstance(value, RowSparseArray) else np.asarray(value)
        if arr.dtype.kind not in "fiub":
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
        self._keys[key] = info
        dest = target if target is not None else None
        futs = []
        for part in placement.parts:
            op: dict[str, Any] = {"op": "init", "k": key, "p": part.index, "dtype": arr.dtype.name,
                                  "shape": list(info.part_shape(part.lo, part.hi)),
                                  "sync": self.type != "dist_async", "agg": self._aggregator,
                                  "sparse": sparse}
            arrays = []
            if self.rank == 0:
                op["a"] = 0
                arrays = [np.array(self._region(arr, info, part.lo, part.hi), copy=True)]
            copy = self._copier(dest, info, part.lo, part.hi) if dest is not None else None

            def on_init(result: dict[str, Any], arrays: list[np.ndarray], copy: Any = copy,
                        info: KeyInfo = info) -> None:
                info.seq = max(info.seq, int(result.get("q", 0)))  # > 0 after a restart
                if copy is not None:
                    copy(result, arrays)
            futs.append(self._submit(part.server, op, arrays, 0, 1 << 30, on_init))
        return futs

    @staticmethod
    def _region(arr: np.ndarray, info: KeyInfo, lo: int, hi: int) -> np.ndarray:
        if not info.placement.split:
            return arr
        return arr[lo:hi] if info.placement.by_rows else arr.reshape(-1)[lo:hi]

    def _copier(self, dest: np.ndarray, info: KeyInfo, lo: int, hi: int) -> Callable[..., None]:
        region = self._region(dest, info, lo, hi)

        def copy(result: dict[str, Any], arrays: list[np.ndarray]) -> None:
            np.copyto(region, arrays[0].reshape(region.shape))
        return copy

    # ------------------------------------------------------------ push
    def push(self, key: Any, value: Any, priority: int = 0) -> None:
        """Send gradients (see the module docstring)."""
        self._check_acks()
        keys, values, _ = _as_list(key, value)
        for k, v in zip(keys, values, strict=False):
            info = self._info(k)
            v = self._prepare(k, info, v)
            info.seq += 1
            if isinstance(v, RowSparseArray):  # rows sorted once (stable): each part is a slice
                order = np.argsort(v.indices, kind="stable")
                ids, rows_data = v.indices[order], v.data[order]  # copies: the caller may reuse v
            for part in info.placement.parts:
                op: dict[str, Any] = {"op": "push", "k": k, "p": part.index, "q": info.seq, "a": 0}
                if isinstance(v, RowSparseArray):
                    a, b = np.searchsorted(ids, (part.lo, part.hi))
                    arrays = [rows_data[a:b], ids[a:b] - part.lo]
                    op["rows"] = 1
                else:
                    arrays = [np.array(self._region(v, info, part.lo, part.hi), copy=True)]
                self._send(part.server, op, arrays, priority)

    def _prepare(self, key: Any, info: KeyInfo, value: Any) -> np.ndarray | RowSparseArray:
        if isinstance(value, (list, tuple)):
            if not value:
                raise ShapeMismatch(f"key {key!r}: empty list of values")
            if all(isinstance(v, RowSparseArray) for v in value):
                value = RowSparseArray(np.concatenate([v.data for v in value]),
                                       np.concatenate([v.indices for v in value]), value[0].shape)
            else:
                parts = [v.todense() if isinstance(v, RowSparseArray) else np.asarray(v) for v in value]
                for p in parts:
                    self._check_shape(key, info, p.shape, p.dtype)
                value = np.sum(parts, axis=0, dtype=info.dtype)
        if isinstance(value, RowSparseArray):
            self._check_shape(key, info, value.shape, value.dtype)
            if not info.sparse:
                return value.todense()
            return value
        value = np.asarray(value)
        self._check_shape(key, info, value.shape, value.dtype)
        return value

    @staticmethod
    def _check_shape(key: Any, info: KeyInfo, shape: tuple[int, ...], dtype: np.dtype) -> None:
        if tuple(shape) != info.shape or np.dtype(dtype) != info.dtype:
            raise ShapeMismatch(f"key {key!r} holds {info.dtype}{list(info.shape)}; "
                                f"got {np.dtype(dtype)}{list(shape)}")

    # ------------------------------------------------------------ pull
    def pull(self, key: Any, out: Any = None, priority: int = 0, row_ids: Any = None,
             ignore_sparse: bool = True) -> Any:
        """Fill ``out`` (allocated if None) with the current values and return it."""
        if row_ids is not None:
            return self.row_sparse_pull(key, out=out, priority=priority, row_ids=row_ids)
        self._check_acks()
        keys, outs, many = _as_list(key, out)
        futs: list[Future] = []
        results, fixups = [], []
        for k, o in zip(keys, outs, strict=False):
            info = self._info(k)
            if o is None:
                o = np.empty(info.shape, info.dtype)
            if not isinstance(o, np.ndarray):
                raise ShapeMismatch(f"key {k!r}: out must be a numpy array, not {type(o).__name__}")
            self._check_shape(k, info, o.shape, o.dtype)
            dest = o if o.flags.c_contiguous and o.flags.writeable else np.empty_like(o, order="C")
            if dest is not o:
                fixups.append((o, dest))
            for part in info.placement.parts:
                op = {"op": "pull", "k": k, "p": part.index, "after": info.seq}
                nbytes = math.prod(info.part_shape(part.lo, part.hi)) * info.dtype.itemsize
                futs.append(self._submit(part.server, op, [], nbytes, priority,
                                         self._copier(dest, info, part.lo, part.hi)))
            results.append(o)
        self._wait(futs)
        for o, dest in fixups:
            np.copyto(o, dest)
        return results if many else results[0]

    def row_sparse_pull(self, key: Any, out: Any = None, priority: int = 0, row_ids: Any = None) -> Any:
        """Fetch only rows ``row_ids`` (duplicates and any order allowed).

        ``out`` may be a dense array of the key's full shape (only those rows are written), a
        RowSparseArray (replaced by the rows), or None (a RowSparseArray is returned).
        """
        self._check_acks()
        keys, outs, many = _as_list(key, out)
        ids_list = row_ids if isinstance(row_ids, (list, tuple)) and many else [row_ids] * len(keys)
        futs: list[Future] = []
        results = []
        for k, o, ids in zip(keys, outs, ids_list, strict=False):
            info = self._info(k)
            if ids is None:
                raise ConfigError(f"row_sparse_pull of key {k!r} needs row_ids")
            ids = np.asarray(ids).reshape(-1)
            if ids.dtype.kind not in "iu" and len(ids):
                raise ConfigError(f"row_ids for key {k!r} must be integers, not {ids.dtype}")
            uniq = _unique(ids.astype(np.int64))
            if len(uniq) and (uniq[0] < 0 or uniq[-1] >= info.shape[0]):
                bad = int(uniq[0] if uniq[0] < 0 else uniq[-1])
                raise ShapeMismatch(f"row id {bad} of key {k!r} is outside 0..{info.shape[0] - 1}")
            data = np.empty((len(uniq), *info.shape[1:]), info.dtype)
            for part in info.placement.parts:
                lo, hi = (part.lo, part.hi) if info.placement.by_rows else (0, info.shape[0])
                a, b = np.searchsorted(uniq, [lo, hi])
                if a == b:
                    continue
                rows = uniq[a:b] - lo
                op = {"op": "pull", "k": k, "p": part.index, "after": info.seq, "rows": 0}
                region = data[a:b]

                def copy(result: dict[str, Any], arrays: list[np.ndarray], region: np.ndarray = region) -> None:
                    np.copyto(region, arrays[0].reshape(region.shape))
                if not info.placement.by_rows and info.placement.split:
                    raise ConfigError(f"key {k!r} is a dense key split over servers; "
                                      "row_sparse_pull needs a row_sparse key")
                futs.append(self._submit(part.server, op, [rows], region.nbytes, priority, copy))
            results.append((k, o, uniq, data, info))
        self._wait(futs)
        final: list[Any] = []
        for k, o, uniq, data, info in results:
            if isinstance(o, np.ndarray):
                self._check_shape(k, info, o.shape, o.dtype)
                o[uniq] = data
                final.append(o)
            elif isinstance(o, RowSparseArray):
                o.data, o.indices, o.shape = data, uniq, info.shape
                final.append(o)
            else:
                final.append(RowSparseArray(data, uniq, info.shape))
        return final if many else final[0]

    def pushpull(self, key: Any, value: Any, out: Any = None, priority: int = 0) -> Any:
        """``push`` then ``pull`` (into ``out``, or back into ``value`` when out is None)."""
        self.push(key, value, priority)
        return self.pull(key, out=value if out is None else out, priority=priority)

    # ------------------------------------------------------------ optimizer
    def set_optimizer(self, optimizer: Any) -> None:
        """Run ``optimizer`` (an Optimizer or its spec dict) on the servers."""
        if isinstance(optimizer, dict):
            optimizer = opt_mod.from_spec(optimizer)
        if not isinstance(optimizer, opt_mod.Optimizer):
            raise ConfigError(f"set_optimizer takes psnode.optimizer.create(...), not {type(optimizer).__name__}")
        spec = optimizer.to_spec()
        json.dumps(spec)
        self._optimizer = optimizer
        futs = [self._submit(s, {"op": "opt", "spec": spec}, [], 0, 1 << 30)
                for s in range(max(1, self.num_servers))]
        self._wait(futs)

    def save_optimizer_states(self, fname: str, dump_optimizer: bool = False) -> None:
        """Write every server's optimizer state to ``fname`` (an .npz file), atomically."""
        self.wait_all()
        futs = [self._submit(s, {"op": "states"}, [], 0, 1 << 30) for s in range(max(1, self.num_servers))]
        self._wait(futs)
        arrays: dict[str, np.ndarray] = {}
        names: list[list[Any]] = []
        for s, fut in enumerate(futs):
            for (key, part, name), arr in zip(fut.result.get("names", []), fut.arrays, strict=False):
                arrays[f"a{len(names)}"] = np.array(arr)
                names.append([s, key, part, name])
        meta = {"names": names, "optimizer": self._optimizer.to_spec() if self._optimizer else None}
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        tmp = f"{fname}.tmp{os.getpid()}"
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)  # type: ignore[arg-type]
        os.replace(tmp, fname)

    def load_optimizer_states(self, fname: str) -> None:
        """Restore the states written by :meth:`save_optimizer_states` (same cluster shape)."""
        try:
            with np.load(fname, allow_pickle=False) as data:
                meta = json.loads(bytes(data["meta"]).decode())
                per_server: dict[int, tuple[list[Any], list[np.ndarray]]] = {}
                for i, (s, key, part, name) in enumerate(meta["names"]):
                    names, arrs = per_server.setdefault(int(s), ([], []))
                    names.append([key, part, name])
                    arrs.append(np.array(data[f"a{i}"]))
        except (OSError, KeyError, ValueError) as exc:
            raise ConfigError(f"cannot read optimizer states from {fname}: {exc}") from None
        if per_server and max(per_server) >= max(1, self.num_servers):
            raise ConfigError(f"{fname} was saved with more servers than this job has")
        futs = [self._submit(s, {"op": "load_states", "names": names}, arrs, 0, 1 << 30)
                for s, (names, arrs) in per_server.items()]
        self._wait(futs)

    # ------------------------------------------------------------ sync points
    def wait_all(self) -> None:
        """Wait until every server has handled this worker's pushes (raising their errors)."""
        if self._closed:
            return
        futs = [self._submit(s, {"op": "flush"}, [], 0, -(1 << 30)) for s in range(max(1, self.num_servers))]
        self._wait(futs)
        self._engine.check()

    def barrier(self) -> None:
        """Block until every active worker has called barrier()."""
        self.wait_all()
        self._engine.wait(self._engine.control(Command.BARRIER))

    def close(self) -> None:
        """Finish this worker: wait for its pushes, tell the scheduler, disconnect."""
        if self._closed:
            return
        try:
            if self._engine is not None and getattr(self._engine, "fatal", None) is None:
                self.wait_all()
        finally:
            self._closed = True
            self._engine.close()

    def __enter__(self) -> KVStore:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<KVStore {self.type} rank {self.rank}/{self.num_workers} "
                f"servers {self.num_servers} {self._aggregator}>")


def _unique(ids: np.ndarray) -> np.ndarray:
    """np.unique of a 1-d array (sorted, distinct), without its overhead (several times faster)."""
    ids = np.sort(ids)
    return ids[np.r_[True, ids[1:] != ids[:-1]]] if len(ids) else ids


def check_key_user(key: Any) -> Any:
    try:
        return check_key(key)
    except PSError as exc:
        raise ConfigError(str(exc)) from None


def create(name: str = "local", num_workers: int | None = None, aggregator: str = "average") -> KVStore:
    """Create a KVStore: ``'local'``, ``'dist_sync'`` or ``'dist_async'``."""
    if name not in TYPES:
        raise ConfigError(f"unknown KVStore type {name!r}: use one of {', '.join(TYPES)}")
    if aggregator not in AGGREGATORS:
        raise ConfigError(f"unknown aggregator {aggregator!r}: use 'average' or 'sum'")
    if name == "local":
        if num_workers not in (None, 1):
            raise ConfigError(f"a 'local' KVStore has one worker, not num_workers={num_workers}")
        return KVStore(name, LocalEngine(), None, aggregator)
    if not os.environ.get("PSNODE_ROLE"):
        raise ConfigError(f"kv.create({name!r}) needs a running job, and this process was not "
                          "started by a launcher. Run it with: mxdist launch -n 2 -s 1 <script.py>")
    cfg = NodeConfig.from_env()
    if cfg.role is not Role.WORKER:
        raise ConfigError(f"this process has PSNODE_ROLE={cfg.role.value}; only workers create a KVStore")
    if num_workers is not None and num_workers != cfg.num_workers:
        raise ConfigError(f"num_workers={num_workers} but the job was launched with "
                          f"{cfg.num_workers} workers (mxdist launch -n {num_workers})")
    if cfg.num_servers < 1:
        raise ConfigError("this job has no servers (-s 0); launch with -s 1 or more to use a KVStore")
    engine = Engine(cfg)
    kv = KVStore(name, engine, cfg, aggregator)
    _report_uncaught(kv, engine, cfg)
    atexit.register(kv.close)
    return kv


def _report_uncaught(kv: KVStore, engine: Engine, cfg: NodeConfig) -> None:
    """Install the worker's ``sys.excepthook`` (replacing one an earlier store installed).

    * An uncaught :class:`PeerLost` after the job ended elsewhere (a node failed or went silent,
      the job was stopped, the scheduler is gone: the engine has its fatal error) is a
      consequence: one line on stderr (``psnode worker 0: job ... ended: worker 1 ... failed:
      ValueError: ...``), no traceback, and a ``job_ended`` failure record.
    * Any other uncaught exception -- a PeerLost this worker ran into itself (a server that
      stopped answering its requests) included -- is this worker's own failure: a record (kind
      ``exception``, with the time, type, message and traceback: :mod:`psnode.failure`), the
      scheduler is told (with restarts left, ``mxdist launch --max-restarts``, the job waits
      for the replacement; otherwise it fails naming this worker), then the usual traceback.
    * After ``kv.close()`` the hook passes everything to the previous one: a finished worker's
      later exception is not a psnode failure.
    """
    previous = getattr(sys.excepthook, "_psnode_previous", sys.excepthook)

    def hook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
        if kv._closed or not isinstance(exc, Exception):
            previous(kind, exc, tb)
            return
        fatal = getattr(engine, "fatal", None)   # set once the job ended (or the scheduler is gone)
        if isinstance(exc, PeerLost) and fatal is not None:
            failure.write(cfg.error_file, "job_ended", "worker", engine.rank, cfg.host, exc=exc)
            if str(fatal) != str(exc):       # else the engine said it when the job ended
                print(f"psnode worker {engine.rank}: {exc}", file=sys.stderr, flush=True)
            return
        try:
            failure.write(cfg.error_file, "exception", "worker", engine.rank, cfg.host, exc=exc)
            engine.fail(f"{kind.__name__}: {exc}", restart=cfg.restart_count < cfg.max_restarts)
        finally:
            previous(kind, exc, tb)

    hook._psnode_previous = previous  # type: ignore[attr-defined]
    sys.excepthook = hook
