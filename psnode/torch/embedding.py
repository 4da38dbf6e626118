"""Embedding tables that live on the servers: :class:`Embedding` and :class:`EmbeddingBag`.

Usage::

    kv = psnode.kv.create('dist_sync')                        # or 'local' for one process
    emb = psnode.torch.EmbeddingBag(20_000_000, 16, mode='sum', kv=kv)
    model = nn.Sequential(...)                                # using emb like torch's module
    trainer = psnode.torch.DistributedTrainer(model, kv, psnode.optimizer.create('adagrad', learning_rate=0.1))
    for ids, y in loader:
        trainer.zero_grad()
        loss_fn(model(ids), y).backward()
        emb.prefetch(next_ids)                                # optional: the next batch's rows
        trainer.step()                                        # the rows' gradient goes as row_sparse

Contract
--------
* **The table.** The constructor calls ``kv.init(key, psnode.sparse.zeros((num_embeddings,
  embedding_dim)), psnode.init.ps_initializer(initializer, seed))``: a row_sparse key (split by
  rows over the servers when big) whose values every server computes for its own rows
  (:mod:`psnode.math.initializers`: a row's values depend only on ``(seed, key, row)``).  The
  default initializer is N(0, 1), torch's.  No worker holds the table: a worker's memory
  grows with its batch, not with ``num_embeddings``.  ``num_embeddings=None``: a table without
  a row count (``psnode.sparse.table(embedding_dim, **table)``, docs/dynamic-tables.md): any
  int64 id is a row, made on first use; ``table=`` holds its ``min_count``, ``ttl``,
  ``max_rows`` and ``absent`` options.  ``key`` defaults to
  ``"psnode.torch.<class>.<n>"``, ``n`` counting the tables created on ``kv`` (every worker
  creates them in the same order, as every worker calls ``kv.init`` in the same order).
* **forward** takes torch's arguments.  It pulls only the distinct ids of the batch
  (``kv.row_sparse_pull``; the rows after every push of this table this worker sent before,
  so in ``dist_sync`` after the last completed round) and looks them up in a leaf tensor of
  those rows; backward gives that tensor its (dense) gradient.  Ids out of range raise
  ShapeMismatch naming the id.  ``padding_idx``: as torch's, its row reads as zeros and gets
  no gradient (the servers' copy of that row is never used).  Under ``torch.no_grad()``
  nothing is recorded.
* **The gradient.** :class:`~psnode.torch.trainer.DistributedTrainer` finds these modules in
  the model and, in ``step()``, pushes each table's gradient as one row_sparse array (the
  rows of every forward since the last step, repeats summed by the servers) with the other
  parameters' gradients: the servers' optimizer updates those rows only (MXNet's lazy
  update).  A table no forward touched pushes no rows (a ``dist_sync`` round still needs
  every worker's push).  ``trainer.zero_grad()`` clears the rows' gradients.
* **Prefetch.** ``emb.prefetch(ids)``: the rows of ``ids`` (the next batch) are requested
  without waiting; the next ``forward`` with equal ids uses them.  Called between a forward
  and ``trainer.step()`` (after ``backward``, say), the request leaves right after that
  step's push, so the rows arrive while the step pulls the other parameters; called with no
  forward pending, it leaves at once.  Any later push of the table requests the rows again,
  so a forward never sees rows older than the pushes before it.  One prefetch at a time (a
  new one replaces it).
* Not in ``state_dict()``: the table is in the servers' checkpoints (``mxdist launch
  --checkpoint-dir``).  :meth:`pull_rows` reads rows (no gradient).  CPU ids only.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch as _torch
import torch.nn.functional as F

from psnode.errors import ConfigError
from psnode.math import dynrows
from psnode.math import initializers as init_mod
from psnode.math.sparse import RowSparseArray
from psnode.math.sparse import table as sparse_table
from psnode.math.sparse import zeros as sparse_zeros

__all__ = ["Embedding", "EmbeddingBag", "HeldTable", "ServerTable"]

_MODES = ("sum", "mean", "max")
_DTYPES = {_torch.float32: np.float32, _torch.float64: np.float64}
_tables: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()   # kv -> tables created on it


@dataclass
class _Lookup:
    """One forward's rows: their ids (sorted, distinct) and the leaf tensor holding them."""
    ids: np.ndarray
    rows: Any


@dataclass
class _Ahead:
    """A prefetch: the ids asked for, their distinct ids and inverse, and the rows on their way
    (None: not requested yet)."""
    ids: Any
    uniq: Any
    inverse: Any
    pending: Any = None


class ServerTable(_torch.nn.Module):
    """What :class:`Embedding` and :class:`EmbeddingBag` share: the table on the servers, the
    rows of each forward, the gradient the trainer pushes (:meth:`sparse_grad`)."""

    def __init__(self, num_embeddings: int | None, embedding_dim: int, kv: Any, key: str | None,
                 initializer: Any, seed: int, padding_idx: int | None, dtype: Any,
                 table: dict[str, Any] | None = None) -> None:
        super().__init__()
        name = type(self).__name__
        open_ended = num_embeddings is None   # (a table without a row count: psnode.sparse.table)
        if open_ended:
            num_embeddings = dynrows.HEIGHT
        elif table is not None:
            raise ConfigError(f"{name}: table= options are for a table without a row count (num_embeddings=None)")
        for what, v in (("num_embeddings", num_embeddings), ("embedding_dim", embedding_dim)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{name}: {what} must be a positive integer, not {v!r}")
        assert num_embeddings is not None
        if dtype not in _DTYPES:
            raise ConfigError(f"{name}: dtype must be torch.float32 or torch.float64, not {dtype}")
        if padding_idx is not None and not open_ended:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ConfigError(f"{name}: padding_idx {padding_idx} is outside the table's {num_embeddings} rows")
            padding_idx = padding_idx % num_embeddings
        self.num_embeddings, self.embedding_dim = int(num_embeddings), int(embedding_dim)
        self.padding_idx = padding_idx
        self.dtype = dtype
        self.shape = (self.num_embeddings, self.embedding_dim)
        if key is None:
            n = _tables.get(kv, 0)
            _tables[kv] = n + 1
            key = f"psnode.torch.{name}.{n}"
        self.key = key
        self.kv = kv
        initializer = init_mod.Normal(1.0) if initializer is None else initializer
        if isinstance(initializer, dict):
            initializer = init_mod.from_spec(initializer)
        template = sparse_table(self.embedding_dim, dtype=_DTYPES[dtype], **(table or {})) if open_ended \
            else sparse_zeros(self.shape, _DTYPES[dtype])
        kv.init(key, template, init_mod.ps_initializer(initializer, seed))
        self._lookups: list[_Lookup] = []
        self._ahead: _Ahead | None = None

    # ------------------------------------------------------------ rows
    def _distinct(self, ids: Any) -> tuple[Any, Any, Any]:
        """``(ids as an int64 CPU tensor, its sorted distinct ids, inverse of ids' shape)``."""
        if not isinstance(ids, _torch.Tensor):
            ids = _torch.as_tensor(ids)
        if ids.device.type != "cpu":
            raise ConfigError(f"{type(self).__name__}: ids are on {ids.device}; give CPU ids")
        if ids.dtype not in (_torch.int64, _torch.int32):
            raise ConfigError(f"{type(self).__name__}: ids must be int64 or int32, not {ids.dtype}")
        uniq, inverse = _torch.unique(ids, sorted=True, return_inverse=True)
        return ids, uniq, inverse

    def _fetch(self, uniq: Any) -> Any:
        return self.kv.row_sparse_fetch(self.key, uniq.numpy())

    def _rows(self, ids: Any) -> tuple[Any, Any, int | None]:
        """The leaf tensor of the batch's distinct rows, ids' inverse into it, and the row of
        ``padding_idx`` in it (None when absent); the lookup is recorded for the gradient."""
        ahead = self._ahead
        if ahead is not None and isinstance(ids, _torch.Tensor) and ahead.ids.shape == ids.shape \
                and ahead.ids.dtype == ids.dtype and _torch.equal(ahead.ids, ids):
            self._ahead = None
            uniq, inverse, pending = ahead.uniq, ahead.inverse, ahead.pending
        else:
            ids, uniq, inverse = self._distinct(ids)
            pending = None
        if pending is None:
            pending = self._fetch(uniq)
        got: RowSparseArray = pending.wait()
        rows = _torch.from_numpy(got.data)
        pad = None
        if self.padding_idx is not None:
            at = int(np.searchsorted(got.indices, self.padding_idx))
            if at < len(got.indices) and got.indices[at] == self.padding_idx:
                pad = at
                rows[at] = 0
        if _torch.is_grad_enabled():
            rows.requires_grad_(True)
            self._lookups.append(_Lookup(got.indices, rows))
        return rows, inverse, pad

    def prefetch(self, ids: Any) -> None:
        """Ask for the rows of ``ids`` now; the next forward with equal ids uses them (see the
        module docstring for when the request leaves)."""
        ids, uniq, inverse = self._distinct(ids)
        self._ahead = _Ahead(ids.clone(), uniq, inverse)
        if not self._lookups:
            self._ahead.pending = self._fetch(uniq)

    def pull_rows(self, ids: Any) -> Any:
        """The current rows of ``ids`` (a tensor of ids' shape + ``(embedding_dim,)``, no
        gradient; ``padding_idx`` reads as zeros)."""
        with _torch.no_grad():
            rows, inverse, pad = self._rows(ids)
            return F.embedding(inverse, rows, padding_idx=pad)

    # ------------------------------------------------------------ the trainer's side
    def sparse_grad(self) -> RowSparseArray:
        """The gradient of the rows looked up since the last call (repeats across forwards
        kept: the servers sum them), for the push; the lookups are forgotten."""
        lookups, self._lookups = self._lookups, []
        ids, grads = [], []
        for lk in lookups:
            g = lk.rows.grad
            if g is None:
                continue
            data = g.detach().numpy()
            if self.padding_idx is not None:
                keep = lk.ids != self.padding_idx
                ids.append(lk.ids[keep])
                grads.append(data[keep])
            else:
                ids.append(lk.ids)
                grads.append(data)
        if not ids:
            return sparse_zeros(self.shape, _DTYPES[self.dtype])
        if len(ids) == 1:
            return RowSparseArray(grads[0], ids[0], self.shape)
        return RowSparseArray(np.concatenate(grads), np.concatenate(ids), self.shape)

    def zero_grad_rows(self) -> None:
        """Clear the gradients of the rows looked up so far (``trainer.zero_grad()``)."""
        for lk in self._lookups:
            lk.rows.grad = None

    def pushed(self) -> None:
        """The trainer pushed this table's gradient: a prefetch asks again (its rows must be
        those after this push)."""
        if self._ahead is not None:
            self._ahead.pending = self._fetch(self._ahead.uniq)

    def extra_repr(self) -> str:
        pad = f", padding_idx={self.padding_idx}" if self.padding_idx is not None else ""
        return f"{self.num_embeddings}, {self.embedding_dim}{pad}, key={self.key!r} (on the servers)"


class Embedding(ServerTable):
    """``torch.nn.Embedding(num_embeddings, embedding_dim, padding_idx)`` whose weight lives on
    the servers of ``kv`` (module docstring)."""

    def __init__(self, num_embeddings: int | None, embedding_dim: int, padding_idx: int | None = None, *, kv: Any,
                 key: str | None = None, initializer: Any = None, seed: int = 0,
                 dtype: Any = _torch.float32, table: dict[str, Any] | None = None) -> None:
        super().__init__(num_embeddings, embedding_dim, kv, key, initializer, seed, padding_idx, dtype, table)

    def forward(self, input: Any) -> Any:
        rows, inverse, pad = self._rows(input)
        return F.embedding(inverse, rows, padding_idx=pad)


class EmbeddingBag(ServerTable):
    """``torch.nn.EmbeddingBag(num_embeddings, embedding_dim, mode=...)`` whose weight lives on
    the servers of ``kv`` (module docstring); ``forward(input, offsets, per_sample_weights)``
    as torch's."""

    def __init__(self, num_embeddings: int | None, embedding_dim: int, *, mode: str = "mean", kv: Any,
                 padding_idx: int | None = None, include_last_offset: bool = False, key: str | None = None,
                 initializer: Any = None, seed: int = 0, dtype: Any = _torch.float32,
                 table: dict[str, Any] | None = None) -> None:
        if mode not in _MODES:
            raise ConfigError(f"EmbeddingBag: mode must be one of {', '.join(_MODES)}, not {mode!r}")
        super().__init__(num_embeddings, embedding_dim, kv, key, initializer, seed, padding_idx, dtype, table)
        self.mode = mode
        self.include_last_offset = include_last_offset

    def forward(self, input: Any, offsets: Any = None, per_sample_weights: Any = None) -> Any:
        rows, inverse, pad = self._rows(input)
        return F.embedding_bag(inverse, rows, offsets, mode=self.mode, per_sample_weights=per_sample_weights,
                               include_last_offset=self.include_last_offset, padding_idx=pad)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, mode={self.mode!r}"


class HeldTable:
    """A torch ``nn.Embedding``/``nn.EmbeddingBag`` with ``sparse=True`` (a table this worker
    holds) under :class:`~psnode.torch.trainer.DistributedTrainer`: a row_sparse key (rank 0's
    weight stored, every worker's overwritten with it), its sparse gradient pushed as
    row_sparse, and before each forward of the module the rows of its input pulled into the
    weight (so a forward reads every update of those rows, whichever worker made it; the
    other rows of the local copy are refreshed when a forward needs them)."""

    def __init__(self, key: str, module: Any, kv: Any) -> None:
        p = module.weight
        if p.device.type != "cpu" or p.dtype not in _DTYPES or not p.is_contiguous():
            raise ConfigError(f"parameter {key!r} (sparse=True) must be a contiguous float32 or float64 CPU tensor "
                              f"(it is {p.dtype} on {p.device}); psnode.torch.Embedding keeps the table on the "
                              "servers instead")
        self.key = key
        self.module = module
        self.param = p
        self.kv = kv
        self.view = p.data.numpy()
        self.shape = tuple(p.shape)
        self._handle = module.register_forward_pre_hook(self._refresh, with_kwargs=True)

    def _refresh(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        ids = args[0] if args else kwargs.get("input")
        if ids is None:
            return
        ids = _torch.as_tensor(ids)
        self.kv.row_sparse_pull(self.key, out=self.view, row_ids=ids.detach().cpu().numpy())

    def sparse_grad(self) -> Any:
        """The weight's gradient: a RowSparseArray (torch's sparse gradient, coalesced: its
        repeats summed as torch's sparse optimizers sum them, which may round differently from
        a dense gradient), a dense array if the weight also got a dense gradient, or no rows."""
        g = self.param.grad
        if g is None:
            return sparse_zeros(self.shape, self.view.dtype)
        if g.layout == _torch.sparse_coo:
            g = g.coalesce()
            return RowSparseArray(g.values().numpy(), g.indices()[0].numpy(), self.shape)
        return g.detach().numpy()

    def zero_grad_rows(self) -> None:
        self.param.grad = None

    def pushed(self) -> None:
        pass

    def close(self) -> None:
        self._handle.remove()
