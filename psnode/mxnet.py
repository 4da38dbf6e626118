"""``psnode.mxnet``: psnode as an MXNet 1.9 kvstore (``import psnode.mxnet``; needs ``pip install 'mxdist[mxnet]'``).

Importing this module registers three stores with MXNet's kvstore registry
(``mx.kvstore.KVStoreBase.register``), the way Horovod and BytePS plug in:

* ``mx.kv.create('psnode')``: under ``mxdist launch`` a psnode ``dist_sync`` worker of the job,
  in a process started without a launcher the in-process ``'local'`` store;
* ``mx.kv.create('psnode_async')``: ``dist_async`` under a launcher, ``'local'`` otherwise;
* ``mx.kv.create('psnode_ssp')``: ``dist_ssp`` (bounded staleness) under a launcher, with
  ``PSNode_SSP.STALENESS`` (default 3; set it before the store is created), ``'local'``
  otherwise.  Its pushes are applied by the servers' optimizer (``update_on_kvstore=True``);
  a push before ``set_optimizer`` is refused (ConfigError) while the bound is above 0.

``gluon.Trainer(net.collect_params(), 'sgd', {...}, kvstore='psnode')`` then trains through
psnode.  MXNet 1.9's Trainer creates no kvstore at all for a string naming a store when the
parameters live on one device and the name lacks ``'dist'``; so that the name works as
``'dist_sync'`` does, this module has ``mxnet.gluon.trainer`` and ``mxnet.model`` create
psnode's stores by name whatever the device count (:func:`_create_kvstore`; every other name
goes to MXNet's own function).  Passing the store itself, ``kvstore=mx.kv.create('psnode')``,
needs no such help.  A Trainer on psnode's store pushpulls every dense parameter in one call
(:func:`_one_call`), so psnode sends their requests together instead of one round trip each.

Contracts:

* One distributed store per process: every ``mx.kv.create('psnode')`` of a launched worker
  shares the worker's connection to the job (a Trainer's and the script's); ``'local'`` stores
  are independent, one per create, as MXNet's.
* ``kv.type`` is the psnode store's kind (``'dist_sync'``, ``'dist_async'`` or ``'local'``), so
  the Trainer treats it as MXNet's store of that type (async updates on the servers, no reset
  of a distributed store).
* Aggregation is MXNet's: the servers **sum** the workers' pushes (MXNet's ``dist_sync``),
  where psnode's own stores average by default.  With W workers each calling
  ``trainer.step(b)`` an update takes W times the mean gradient; ``trainer.step(W * b)`` gives
  one process's update over the W*b samples, as with MXNet.
* ``set_optimizer`` (``update_on_kvstore=True``): MXNet's SGD (momentum, wd), Adam and AdaGrad,
  with ``rescale_grad`` and ``clip_gradient``, become psnode's server-side optimizers, sent as
  their spec (data, never pickled: :func:`optimizer_spec`).  Anything psnode's servers cannot
  run exactly (another optimizer, an ``lr_scheduler``, ``multi_precision``, per-parameter
  ``lr_mult``/``wd_mult``) raises ConfigError naming it, with the fix (``update_on_kvstore=
  False`` runs MXNet's optimizer on the workers).  The optimizer's parameters are checked at
  every push: a changed learning rate or ``rescale_grad`` (``trainer.set_learning_rate``, a
  last smaller batch) is sent again, and the servers keep the optimizer states.
* Arrays cross without copies where MXNet allows it: a dense CPU NDArray is read and written
  in place through DLPack (after MXNet's engine has finished writing it, or reading it before a
  write).  Copies remain for row_sparse NDArrays (their data and indices, both ways), for
  NDArrays on a GPU (staged through host arrays), and for the arguments of a Python updater
  (``_set_updater``: ``recv`` is copied into an NDArray; the stored value is shared).
* ``is_capable('optimizer')`` is True; another capability raises ValueError, as MXNet's stores do.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import mxnet as mx
import numpy as np
from mxnet.kvstore import KVStoreBase
from mxnet.ndarray import NDArray
from mxnet.ndarray.sparse import RowSparseNDArray

from psnode import kv as kv_mod
from psnode.errors import ConfigError
from psnode.math.sparse import RowSparseArray
from psnode.worker.kvstore import KVStore

#: MXNet optimizer (class name, lower case) -> (psnode optimizer, {psnode parameter: MXNet attribute})
OPTIMIZERS: dict[str, tuple[str, dict[str, str]]] = {
    "sgd": ("sgd", {"momentum": "momentum"}),
    "adam": ("adam", {"beta1": "beta1", "beta2": "beta2", "epsilon": "epsilon"}),
    "adagrad": ("adagrad", {"eps": "float_stable_eps"}),
}
COMMON = {"learning_rate": "learning_rate", "wd": "wd", "rescale_grad": "rescale_grad",
          "clip_gradient": "clip_gradient"}

_shared: dict[str, KVStore] = {}      # the launched worker's store, by mode


def optimizer_spec(opt: Any) -> dict[str, Any]:
    """The psnode optimizer spec (:func:`psnode.math.optimizers.from_spec`) of an MXNet optimizer,
    or ConfigError naming what psnode's servers cannot run and the fix."""
    name = type(opt).__name__.lower()
    fix = "(create the Trainer with update_on_kvstore=False to run it on the workers)"
    if name not in OPTIMIZERS:
        raise ConfigError(f"MXNet optimizer {type(opt).__name__!r} has no psnode server-side equivalent: psnode runs "
                          f"{', '.join(OPTIMIZERS)} on its servers {fix}")
    if getattr(opt, "lr_scheduler", None) is not None:
        raise ConfigError(f"{type(opt).__name__} has an lr_scheduler, which psnode's servers do not run {fix}")
    if getattr(opt, "multi_precision", False):
        raise ConfigError(f"{type(opt).__name__}(multi_precision=True): psnode's servers update in the weight's "
                          f"dtype {fix}")
    for what in ("lr_mult", "wd_mult"):
        mults = {k: v for k, v in (getattr(opt, what, None) or {}).items() if v != 1.0}
        pdict = getattr(opt, "param_dict", None) or {}
        mults.update({getattr(p, "name", k): getattr(p, what) for k, p in pdict.items()
                      if getattr(p, what, 1.0) != 1.0})
        if mults:
            first = next(iter(mults.items()))
            raise ConfigError(f"parameter {first[0]!r} has {what}={first[1]}: psnode's servers run one optimizer "
                              f"for every key {fix}")
    target, extra = OPTIMIZERS[name]
    params: dict[str, Any] = {}
    for ours, theirs in {**COMMON, **extra}.items():
        value = getattr(opt, theirs)
        params[ours] = None if value is None else float(value)
    return {"name": target, "params": params}


def _dlpack(nd: NDArray, write: bool) -> np.ndarray:
    """A numpy array over ``nd``'s memory (a dense CPU NDArray), readable once MXNet's engine
    finished writing ``nd``, writable (``write``) once it also finished reading it."""
    capsule = nd.to_dlpack_for_write() if write else nd.to_dlpack_for_read()
    view = np.from_dlpack(_Capsule(capsule))
    if not write or view.flags.writeable:
        return view
    return np.asarray(_Writable(view))   # (numpy < 2 marks DLPack imports read-only)


class _Capsule:
    """The DLPack protocol over a capsule MXNet made (MXNet 1.9's NDArray has no ``__dlpack__``)."""

    def __init__(self, capsule: Any) -> None:
        self.capsule = capsule

    def __dlpack__(self, stream: Any = None) -> Any:
        return self.capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)   # kDLCPU


class _Writable:
    """The memory of ``view`` as a writable array; keeps ``view`` (and so the NDArray) alive."""

    def __init__(self, view: np.ndarray) -> None:
        self.view = view
        self.__array_interface__ = {"shape": view.shape, "typestr": view.dtype.str, "version": 3,
                                    "data": (view.ctypes.data, False), "strides": view.strides}


class _Outs:
    """Pull outputs: numpy arrays for psnode, and what copies results back into NDArrays."""

    def __init__(self) -> None:
        self.finish: list[Callable[[], None]] = []

    def array(self, nd: Any) -> Any:
        if not isinstance(nd, NDArray):
            return nd
        if isinstance(nd, RowSparseNDArray):
            holder = RowSparseArray(np.zeros((0, *nd.shape[1:]), nd.dtype), np.zeros(0, np.int64), nd.shape)
            blank = holder.data

            def back() -> None:
                if holder.data is not blank:   # (an ignored row_sparse output keeps its value)
                    nd[:] = mx.nd.sparse.row_sparse_array((holder.data, holder.indices), shape=nd.shape,
                                                          ctx=nd.context, dtype=nd.dtype)
            self.finish.append(back)
            return holder
        if nd.context.device_type != "cpu":
            host = np.empty(nd.shape, nd.dtype)
            self.finish.append(lambda: nd.__setitem__(slice(None), mx.nd.array(host, ctx=nd.context,
                                                                                dtype=nd.dtype)))
            return host
        return _dlpack(nd, write=True)

    def done(self) -> None:
        for back in self.finish:
            back()


def _value(nd: Any) -> Any:
    """A pushed or initial NDArray as psnode takes it (read-only where it is a view)."""
    if isinstance(nd, RowSparseNDArray):
        return RowSparseArray(nd.data.asnumpy(), nd.indices.asnumpy().astype(np.int64), nd.shape)
    if isinstance(nd, NDArray):
        if nd.context.device_type != "cpu":
            return nd.asnumpy()
        return _dlpack(nd, write=False)
    return nd


def _map(f: Callable[[Any], Any], x: Any) -> Any:
    return [_map(f, v) for v in x] if isinstance(x, (list, tuple)) else f(x)


def _ids(x: Any) -> Any:
    """Row ids (NDArrays or lists of them) as numpy arrays."""
    return _map(lambda v: v.asnumpy() if isinstance(v, NDArray) else v, x)


class PSNode(KVStoreBase):
    """psnode's KVStore behind MXNet's kvstore interface (the module docstring has the contracts)."""

    MODE = "dist_sync"

    def __init__(self) -> None:
        self._kv = _store(self.MODE)
        self._optimizer: Any = None      # the MXNet optimizer of set_optimizer
        self._sent: dict[str, Any] | None = None   # its spec as the servers have it
        self._updater: Any = None        # (Trainer.load_states reads _updater.optimizer)

    # ---------------------------------------------------------------- properties
    @property
    def type(self) -> str:
        return self._kv.mode

    @property
    def rank(self) -> int:
        return self._kv.rank

    @property
    def num_workers(self) -> int:
        return self._kv.num_workers

    @property
    def store(self) -> KVStore:
        """The psnode store this one drives (its numpy API)."""
        return self._kv

    @staticmethod
    def is_capable(capability: str) -> bool:
        if isinstance(capability, str) and capability.lower() == KVStoreBase.OPTIMIZER:
            return True
        raise ValueError(f"Unknown capability: {capability}")

    # ---------------------------------------------------------------- data
    def init(self, key: Any, value: Any) -> None:
        self._kv.init(key, _map(_value, value))

    def broadcast(self, key: Any, value: Any, out: Any, priority: int = 0) -> None:
        outs = _Outs()
        self._kv.broadcast(key, _map(_value, value), _map(outs.array, out), priority)
        outs.done()

    def push(self, key: Any, value: Any, priority: int = 0) -> None:
        self._refresh_optimizer()
        self._check_updates()
        self._kv.push(key, _map(_value, value), priority)

    def _check_updates(self) -> None:
        """(dist_ssp above 0) Every push is applied by the servers' optimizer on arrival: with
        none set, the stored value would become each push, not an aggregate."""
        if self._sent is None and self._kv.staleness and self._kv.mode == "dist_ssp":
            raise ConfigError("mx.kv.create('psnode_ssp') applies each push with the servers' optimizer, and none "
                              "is set: create the Trainer with update_on_kvstore=True (or call kv.set_optimizer "
                              "first), or use kvstore='psnode' to aggregate gradients")

    def pull(self, key: Any, out: Any = None, priority: int = 0, ignore_sparse: bool = True) -> None:
        if out is None:
            raise ConfigError(f"pull of key {key!r} needs out= (MXNet's rule: the NDArrays to fill)")
        outs = _Outs()
        self._kv.pull(key, _map(outs.array, out), priority, ignore_sparse=ignore_sparse)
        outs.done()

    def pushpull(self, key: Any, value: Any, out: Any = None, priority: int = 0) -> None:
        self._refresh_optimizer()
        self._check_updates()
        outs = _Outs()
        dest = _map(outs.array, value if out is None else out)
        self._kv.pushpull(key, _map(_value, value), dest, priority)
        outs.done()

    def row_sparse_pull(self, key: Any, out: Any = None, priority: int = 0, row_ids: Any = None) -> None:
        if out is None or row_ids is None:
            raise ConfigError(f"row_sparse_pull of key {key!r} needs out= and row_ids=")
        outs = _Outs()
        self._kv.row_sparse_pull(key, _map(outs.array, out), priority, _ids(row_ids))
        outs.done()

    # ---------------------------------------------------------------- updates
    def set_optimizer(self, optimizer: Any) -> None:
        """Run ``optimizer`` (an MXNet Optimizer) on psnode's servers, as its spec."""
        spec = optimizer_spec(optimizer)
        self._kv.set_optimizer(spec)
        self._optimizer, self._sent = optimizer, spec
        self._updater = _Updater(optimizer)

    def _refresh_optimizer(self) -> None:
        """Send the optimizer again when its parameters changed since (the servers keep its states)."""
        if self._optimizer is not None:
            spec = optimizer_spec(self._optimizer)
            if spec != self._sent:
                self._kv.set_optimizer(spec)
                self._sent = spec

    def _set_updater(self, updater: Callable[[Any, NDArray, NDArray], None]) -> None:
        """MXNet's Python updater ``updater(key, recv, stored)`` on NDArrays ('local' stores;
        ignored on distributed ones, as MXNet's workers ignore it)."""
        def run(key: Any, recv: Any, stored: np.ndarray) -> None:
            if isinstance(recv, RowSparseArray):
                got = mx.nd.sparse.row_sparse_array((recv.data, recv.indices), shape=recv.shape)
            else:
                got = mx.nd.array(recv, dtype=recv.dtype)
            local = mx.nd.from_dlpack(stored.__dlpack__())
            updater(key, got, local)
            local.wait_to_read()
        self._kv.set_updater(run)

    def set_gradient_compression(self, compression_params: dict[str, Any]) -> None:
        self._kv.set_gradient_compression(compression_params)

    def save_optimizer_states(self, fname: str, dump_optimizer: bool = False) -> None:
        self._kv.save_optimizer_states(fname, dump_optimizer)

    def load_optimizer_states(self, fname: str) -> None:
        self._kv.load_optimizer_states(fname)

    # ---------------------------------------------------------------- sync
    def _barrier(self) -> None:
        self._kv.barrier()

    def barrier(self) -> None:
        self._kv.barrier()

    def close(self) -> None:
        self._kv.close()


class _Updater:
    """What ``Trainer.load_states`` reads after loading: ``kvstore._updater.optimizer``."""

    def __init__(self, optimizer: Any) -> None:
        self.optimizer = optimizer


class PSNode_Async(PSNode):
    """``mx.kv.create('psnode_async')``: psnode's ``dist_async`` store under a launcher (MXNet's
    registry names a store by its class name, lower case)."""

    MODE = "dist_async"


class PSNode_SSP(PSNode):
    """``mx.kv.create('psnode_ssp')``: psnode's ``dist_ssp`` store under a launcher, bounded by
    ``STALENESS`` as it is when the store is created (psnode.server.staleness)."""

    MODE = "dist_ssp"
    STALENESS = 3


#: psnode's store kind -> the MXNet store name that makes it
_NAME_OF = {"dist_sync": "psnode", "dist_async": "psnode_async", "dist_ssp": "psnode_ssp"}


def _store(mode: str) -> KVStore:
    """The launched worker's store (one per process), or a fresh 'local' one."""
    if not os.environ.get("PSNODE_ROLE"):
        return kv_mod.create("local", aggregator="sum")
    kv = _shared.get(mode)
    if kv is None or kv._closed:
        other = next((m for m, s in _shared.items() if m != mode and not s._closed), None)
        if other is not None:
            raise ConfigError(f"this worker joined the job as {other!r} already (mx.kv.create("
                              f"{_NAME_OF[other]!r})); one process is one worker")
        staleness = PSNode_SSP.STALENESS if mode == "dist_ssp" else None
        kv = _shared[mode] = kv_mod.create(mode, aggregator="sum", staleness=staleness)
    return kv


NAMES = ("psnode", "psnode_async", "psnode_ssp")


def _with_psnode(create: Callable[..., Any]) -> Callable[..., Any]:
    """MXNet's ``_create_kvstore(kvstore, num_device, arg_params)``, making psnode's stores by
    name whatever the device count (MXNet's rule for ``update_on_kvstore`` otherwise)."""
    if getattr(create, "_psnode", False):
        return create

    def _create_kvstore(kvstore: Any, num_device: int, arg_params: Any) -> tuple[Any, bool]:
        if isinstance(kvstore, str) and kvstore.lower() in NAMES:
            kv = mx.kv.create(kvstore)
            update = bool(int(os.getenv("MXNET_UPDATE_ON_KVSTORE", "1")))
            return kv, update and kv.is_capable(KVStoreBase.OPTIMIZER)
        return create(kvstore, num_device, arg_params)
    _create_kvstore._psnode = True  # type: ignore[attr-defined]
    return _create_kvstore


def _one_call(allreduce: Callable[[Any], None]) -> Callable[[Any], None]:
    """``gluon.Trainer._allreduce_grads`` making one pushpull of every dense parameter when the
    Trainer's store is psnode's (MXNet's loop makes one call per parameter, which MXNet's
    asynchronous engine overlaps; psnode's pushpull returns with the values, so one call lets
    it send every key's request at once, small keys fused).  Other stores, and Trainers with
    row_sparse gradients, keep MXNet's loop."""
    if getattr(allreduce, "_psnode", False):
        return allreduce

    def _allreduce_grads(self: Any) -> None:
        kv = self._kvstore
        if not isinstance(kv, PSNode):
            allreduce(self)
            return
        params = [(i, p) for i, p in enumerate(self._params) if p.grad_req != "null"]
        if any(p.list_grad()[0].stype != "default" for _, p in params):
            allreduce(self)
            return
        if not params:
            return
        keys = [i for i, _ in params]
        grads = [p.list_grad() for _, p in params]
        if self._update_on_kvstore:
            kv.pushpull(keys, grads, out=[p.list_data() for _, p in params])
        else:
            kv.pushpull(keys, grads)
    _allreduce_grads._psnode = True  # type: ignore[attr-defined]
    return _allreduce_grads


def _register() -> None:
    KVStoreBase.register(PSNode)
    KVStoreBase.register(PSNode_Async)
    KVStoreBase.register(PSNode_SSP)
    from mxnet import model
    from mxnet.gluon import trainer
    model._create_kvstore = _with_psnode(model._create_kvstore)
    trainer._create_kvstore = _with_psnode(trainer._create_kvstore)
    trainer.Trainer._allreduce_grads = _one_call(trainer.Trainer._allreduce_grads)


_register()

__all__ = ["NAMES", "OPTIMIZERS", "PSNode", "PSNode_Async", "PSNode_SSP", "optimizer_spec"]
