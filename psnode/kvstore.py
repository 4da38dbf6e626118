"""The KVStore API (MXNet-style) over a local store or a distributed job.

``psnode.kv.create('local')`` (psnode.kv) keeps everything in this process; ``create('dist_sync')`` and
``create('dist_async')`` join the job this process was launched in (``mxdist launch``), as a
worker.  Both run the same server-side logic (:mod:`psnode.aggregation`), so ``'local'`` is the
reference: a one-worker job gives the same results.

Contracts:

* Keys are ints or strs, or lists of them with matching lists of values, in every form MXNet's
  KVStore accepts (:mod:`psnode.forms`).
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
* ``set_gradient_compression`` (MXNet's): after ``create`` (keys may be initialised already),
  before the first push; dense float32 pushes then travel compressed with this worker's
  residuals (psnode.compression, psnode.datapath); servers decode them and aggregate float32.
  Init values and pulls are never compressed.  ``'local'`` runs the same arithmetic.
"""
from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np

from psnode import checkpoint, forms, torch_route
from psnode import initializer as init_mod
from psnode import items as items_mod
from psnode import optimizer as opt_mod
from psnode.bucketing import Bucketer
from psnode.compression import CompressionSpec
from psnode.config import Distribution, NodeConfig
from psnode.datapath import Copier, DataPath, KeyInfo, _whole_buckets
from psnode.errors import ConfigError, PSError, ShapeMismatch
from psnode.protocol import (
    DTYPES,
    Command,
    Flush,
    GetStates,
    Init,
    LoadStates,
    Ok,
    SetOptimizer,
    check_key,
)
from psnode.sharding import Placer
from psnode.sparse import RowSparseArray
from psnode.worker import Future

TYPES = ("local", "dist_sync", "dist_async")
AGGREGATORS = ("average", "sum")


class KVStore(DataPath):
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
        self._resumed = False      # a restarted worker continues its predecessor's push counts
        self._pushed = False
        self._bucketer = Bucketer()
        # a sync push over this host's link asks for its round's value at once (PushPull): the
        # pull after it then sends nothing (see _asked); (op key, part) -> (push, its future)
        self._asked: dict[tuple[Any, int], tuple[int, Future]] = {}
        self._comp: CompressionSpec | None = None   # gradient compression (psnode.datapath)
        self._residuals = {}
        self._scratch = {}
        self._torch_bufs: dict[Any, np.ndarray] = {}   # host arrays of pulls into torch tensors

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

    def _check_acks(self) -> None:
        """Raise an error a server reported for an earlier push."""
        self._engine.check()



    # ------------------------------------------------------------ init
    def init(self, key: Any, value: Any, initializer: Any = None, stype: str | None = None) -> None:
        """Initialise keys (see the module docstring: rank 0's value wins everywhere)."""
        pairs = forms.init_pairs(key, value)
        if isinstance(initializer, dict):
            initializer = init_mod.from_spec(initializer)
        futs: list[Future] = []
        for k, v in pairs:
            futs.extend(self._init_one(check_key_user(k), v, initializer, stype))
        self._wait(futs)

    def _init_one(self, key: Any, value: Any, initializer: Any, stype: str | None) -> list[Future]:
        sparse = stype == "row_sparse" or isinstance(value, RowSparseArray)
        if stype not in (None, "default", "row_sparse"):
            raise ConfigError(f"stype {stype!r} for key {key!r}: use 'default' or 'row_sparse'")
        target = value if isinstance(value, np.ndarray) and value.flags.writeable else None
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
        joined = None
        if self.type == "dist_sync" and not sparse and not placement.split:
            joined = self._bucketer.assign(key, placement.parts[0].server, arr.dtype, arr.size)
        if joined is not None:
            info.bucket = joined[0]
        self._keys[key] = info
        futs = []
        for part in placement.parts:
            op = Init(key, part.index, arr.dtype.name, info.part_shape(part), sync=self.type != "dist_async",
                      average=self._aggregator == "average", sparse=sparse)
            if joined is not None:
                op.bucket, op.offset = joined[0].bid, joined[1]
            if self.rank == 0:
                op.value = np.array(info.region(arr, part), copy=True)
            copy = self._copier(target, info, part) if target is not None else None

            def on_init(ans: Ok, copy: Copier | None = copy, info: KeyInfo = info, part: int = part.index) -> None:
                # > 0 after a restart; a split key resumes where its last part stopped (a
                # predecessor may have died between pushing two parts: the other is a duplicate)
                info.counts[part] = ans.seq
                info.taken = min(info.counts.values())
                if self._resumed:
                    info.seq = info.taken
                if copy is not None:
                    copy(ans)
            futs.append(self._submit(part.server, op, 0, 1 << 30, on_init))
        return futs


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
        self._comp = spec if spec.active else None
        self._residuals, self._scratch = {}, {}

    @property
    def gradient_compression(self) -> dict[str, Any]:
        """The settings in force, as ``set_gradient_compression`` takes them (``{'type': 'none'}``: off)."""
        return (self._comp or CompressionSpec()).to_params()

    # ------------------------------------------------------------ push
    def push(self, key: Any, value: Any, priority: int = 0) -> None:
        """Send gradients (see the module docstring; torch tensors: :mod:`psnode.torch_route`)."""
        value = torch_route.push_values(key, value, self._keys.get)
        self._check_acks()
        self._bucketer.close_all()
        items = self._plain(key, value, False)
        if items is None:
            items = []
            for k, values in forms.groups(key, value, "push")[0]:
                info = self._info(k)
                items.append((k, info, self._prepare(k, info, values)))
        if self._comp is not None:
            self._check_compressible(items)
            items = self._remote_first(items, lambda item: item[1].placement.parts[0].server)
        self._pushed = True
        whole, rest = _whole_buckets(items)
        if len(whole) == 1 and not rest:   # one request: nothing to send together
            self._push_bucket(*whole[0], priority)
            return
        with self._engine.batch():
            for bucket, members in whole:
                self._push_bucket(bucket, members, priority)
            for k, info, v in rest:
                self._push_one(k, info, v, priority)


    # ------------------------------------------------------------ pull
    def pull(self, key: Any, out: Any = None, priority: int = 0, row_ids: Any = None,
             ignore_sparse: bool = True) -> Any:
        """Fill ``out`` (allocated if None) with the current values and return it."""
        if row_ids is not None:
            return self.row_sparse_pull(key, out=out, priority=priority, row_ids=row_ids)
        host, scatters = torch_route.pull_outs(key, out, self._keys.get, self._torch_bufs)
        if scatters:   # torch tensors: pulled into host arrays, then copied to every tensor
            self.pull(key, host, priority)
            torch_route.finish(scatters)
            return out
        self._check_acks()
        items = self._plain(key, out, True)
        if items is not None:   # (the common case without the general forms' work)
            self._bucketer.close_all()
            return self._pull_items(items, [], list(out), True, priority, None)
        outs, many = forms.out_groups(key, out, "pull")
        return self._pull_into(outs, many, priority, None)

    def _prepare(self, key: Any, info: KeyInfo, values: list[Any]) -> np.ndarray | RowSparseArray:
        return items_mod.prepare(key, info, values)

    def _plain(self, key: Any, arrays: Any, writing: bool) -> list[tuple[Any, KeyInfo, Any]] | None:
        return items_mod.plain(self._keys, key, arrays, writing)

    def _targets(self, k: Any, info: KeyInfo, targets: list[Any]) -> tuple[list[Any], np.ndarray]:
        return items_mod.targets(k, info, targets)

    def _pull_into(self, outs: list[forms.Group], many: bool, priority: int,
                   pushed: dict[Any, np.ndarray | RowSparseArray] | None) -> Any:
        """Pull every key of ``outs`` (with ``pushed``: the dense gradient of each key to push
        first, fused with the pull into one request per key part, or per bucket)."""
        self._bucketer.close_all()
        results, fixups, items = [], [], []
        for k, targets in outs:
            info = self._info(k)
            done, dest = self._targets(k, info, targets)
            if len(done) > 1 or dest is not done[0]:
                fixups.append((done, dest))
            grad = None if pushed is None else pushed.get(k)
            if pushed is not None:
                self._pushed = True
            items.append((k, info, (dest, grad)))
            results.append(done if len(done) > 1 else done[0])
        return self._pull_items(items, fixups, results, many, priority, pushed)


    def row_sparse_pull(self, key: Any, out: Any = None, priority: int = 0, row_ids: Any = None) -> Any:
        """Fetch only rows ``row_ids`` (any shape; duplicates and any order allowed).

        ``out`` may be a dense array of the key's full shape (only those rows are written), a
        RowSparseArray (replaced by the rows), None (a RowSparseArray is returned), or a list
        of these; see :mod:`psnode.forms` for the forms of ``row_ids``.  Torch tensors (dense,
        the key's full shape) get the rows too (:mod:`psnode.torch_route`).
        """
        host, scatters = torch_route.pull_outs(key, out, self._keys.get, self._torch_bufs, rows=True)
        if scatters:
            self.row_sparse_pull(key, host, priority, row_ids)
            torch_route.finish(scatters)
            return out
        self._check_acks()
        outs, many = forms.out_groups(key, out, "row_sparse_pull")
        id_lists = forms.row_id_lists(outs, row_ids, many)
        futs: list[Future] = []
        fetched: dict[tuple[Any, bytes], tuple[np.ndarray, np.ndarray]] = {}
        plan: list[tuple[KeyInfo, Any, tuple[Any, bytes] | None]] = []
        with self._engine.batch():
            self._row_requests(outs, id_lists, priority, futs, fetched, plan)
        self._wait(futs)
        final: list[Any] = []
        for info, o, fetch in plan:
            if fetch is None:
                final.append(o)
                continue
            uniq, data = fetched[fetch]
            if isinstance(o, np.ndarray):
                o[uniq] = data
                final.append(o)
            elif isinstance(o, RowSparseArray):
                o.data, o.indices, o.shape = data.copy(), uniq.copy(), info.shape
                final.append(o)
            else:
                final.append(RowSparseArray(data.copy(), uniq.copy(), info.shape))
        shaped: list[Any] = []
        i = 0
        for _, targets in outs:
            group = final[i:i + len(targets)]
            i += len(targets)
            shaped.append(group if len(group) > 1 else group[0])
        return shaped if many else shaped[0]


    def pushpull(self, key: Any, value: Any, out: Any = None, priority: int = 0) -> Any:
        """``push`` then ``pull`` (into ``out``, or back into ``value`` when out is None): one
        request and one answer per dense key part."""
        dest = value if out is None else out
        host, scatters = torch_route.pull_outs(key, dest, self._keys.get, self._torch_bufs)
        value = torch_route.push_values(key, value, self._keys.get)
        if scatters:   # torch tensors (psnode.torch_route)
            self.pushpull(key, value, host, priority)
            torch_route.finish(scatters)
            return dest
        self._check_acks()
        groups, many = forms.groups(key, value, "pushpull")
        grads: dict[Any, np.ndarray | RowSparseArray] = {}
        for k, values in groups:
            grads[k] = self._prepare(k, self._info(k), values)
        if self._comp is not None:
            self._check_compressible([(k, self._info(k), g) for k, g in grads.items()])
        sparse = [k for k, g in grads.items() if isinstance(g, RowSparseArray)]
        if sparse:  # a row_sparse push, then a plain pull
            self.push(sparse, [grads.pop(k) for k in sparse], priority)
        outs, _ = forms.out_groups(key, value if out is None else out, "pushpull")
        return self._pull_into(outs, many, priority, grads)

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
        futs = [self._submit(s, SetOptimizer(spec), 0, 1 << 30) for s in range(max(1, self.num_servers))]
        self._wait(futs)

    def save_optimizer_states(self, fname: str, dump_optimizer: bool = False) -> None:
        """Write every server's optimizer state to ``fname`` (an .npz file), atomically."""
        self.wait_all()
        futs = [self._submit(s, GetStates(), 0, 1 << 30) for s in range(max(1, self.num_servers))]
        self._wait(futs)
        per_server = []
        for fut in futs:
            ans = fut.result
            assert ans is not None
            per_server.append((ans.names or [], ans.arrays))
        checkpoint.save_states(fname, per_server, self._optimizer.to_spec() if self._optimizer else None)

    def load_optimizer_states(self, fname: str) -> None:
        """Restore the states written by :meth:`save_optimizer_states` (same cluster shape)."""
        per_server = checkpoint.load_states(fname)
        if per_server and max(per_server) >= max(1, self.num_servers):
            raise ConfigError(f"{fname} was saved with more servers than this job has")
        futs = [self._submit(s, LoadStates(names, arrs), 0, 1 << 30) for s, (names, arrs) in per_server.items()]
        self._wait(futs)

    # ------------------------------------------------------------ sync points
    def wait_all(self) -> None:
        """Wait until every server has handled this worker's pushes (raising their errors)."""
        if self._closed:
            return
        futs = [self._submit(s, Flush(), 0, -(1 << 30)) for s in range(max(1, self.num_servers))]
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
            hook = sys.excepthook
            if getattr(hook, "_psnode_store", None) is self:   # give the interpreter its hook back
                sys.excepthook = hook._psnode_previous  # type: ignore[attr-defined]

    def __enter__(self) -> KVStore:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"<KVStore {self.type} rank {self.rank}/{self.num_workers} "
                f"servers {self.num_servers} {self._aggregator}>")


def check_key_user(key: Any) -> Any:
    try:
        key = check_key(key)
    except PSError as exc:
        raise ConfigError(str(exc)) from None
    if isinstance(key, str) and key.startswith("\0"):
        raise ConfigError(f"key {key!r}: keys starting with NUL are reserved")
    return key
