"""A key part's rounds on its server: pushes accepted once, summed, completed, applied (no I/O).

:class:`Rounds` is the half of :class:`psnode.server.store.Store` that turns accepted pushes
into values (the semantics are in :mod:`psnode.server.store`'s docstring):

* :meth:`Rounds._take_push` accepts push ``q`` of a worker once: async pushes are applied at
  once; sync pushes of the round being summed contribute, later ones wait in ``early``;
* :meth:`Rounds._contribute` sums a round in place: the first push is kept by reference, the
  second is added into the spare buffer, and the push that completes the round also averages,
  chunk by chunk while in cache (psnode.server.arith); a compressed push is decoded where it is summed;
* :meth:`Rounds._maybe_complete` completes rounds every active worker contributed to (rows of
  row_sparse keys combined, non-finite rounds skipped when asked), answers the pulls that
  waited for them, and lets waiting pushes of the next round in;
* :meth:`Rounds._apply` folds an aggregate into the value: the optimizer, or the value becomes
  it (a spare buffer is swapped in, never written while a zero-copy send still reads it).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from psnode.math import optimizers as opt_mod
from psnode.math.sparse import RowSparseArray
from psnode.math.sparse import combine_rows as _combine_rows
from psnode.server.arith import Packed, add_scaled
from psnode.server.buckets import Buckets
from psnode.server.parts import Entry, Key, OpError, Reply, fmt, fresh, mark_async, received

Alloc = Callable[[tuple[int, ...], np.dtype], np.ndarray]


class Rounds:
    """Round machinery over the store's entries (the base of :class:`psnode.server.store.Store`,
    which sets these attributes and provides ``_entry`` and ``_answer_pulls``)."""

    active: set[int]
    optimizer: opt_mod.Optimizer | None
    #: a Python updater ``updater(key, recv, stored)`` ('local' stores: kv.set_updater); it
    #: folds each aggregate into the value in place, before (instead of) the optimizer
    updater: Callable[[Any, Any, np.ndarray], None] | None = None
    check_finite: bool
    alloc: Alloc
    pushes: int
    rounds: int
    events: list[str]
    fused: Buckets

    def _entry(self, key: Key) -> Entry:
        raise NotImplementedError

    def _answer_pulls(self, entry: Entry) -> list[Reply]:
        raise NotImplementedError

    def _new(self, like: np.ndarray) -> np.ndarray:
        return self.alloc(like.shape, like.dtype)

    def _take_push(self, worker: int, key: Key, seq: int, data: np.ndarray | Packed,
                   rows: np.ndarray | None) -> list[Reply]:
        """Accept push ``seq`` of ``worker`` (once); the replies it causes (completed pulls)."""
        entry = self._entry(key)
        if isinstance(data, np.ndarray):   # (a Packed one was checked by packed_push)
            self._validate_push(key, entry, data, rows)
        if received(entry, worker, seq):
            return []  # duplicate: applied once
        self.pushes += 1
        if isinstance(data, Packed) and (self.check_finite or not entry.sync):
            data = data.decode()   # (else a sync round decodes it where it sums it: _contribute)
        if not entry.sync:
            assert isinstance(data, np.ndarray)
            if self.check_finite and data.dtype.kind == "f" and not np.isfinite(data).all():
                entry.skipped += 1
                self.events.append(f"{fmt(*key)}: push {seq} of worker {worker} skipped: non-finite")
            else:
                if rows is not None:
                    rows, data = _combine_rows([(rows, data)])
                self._apply(key, entry, data, rows, 1, average=False)
            mark_async(entry, worker, seq)
            return self._answer_pulls(entry)
        if seq != entry.round + 1 or worker in entry.contributors:
            entry.early.setdefault(worker, []).append((seq, data, rows))
            return []
        self._contribute(entry, worker, seq, data, rows)
        return self._maybe_complete(key, entry)

    def _validate_push(self, key: Key, entry: Entry, data: np.ndarray, rows: np.ndarray | None) -> None:
        want = entry.value
        if data.dtype != want.dtype:
            raise OpError("ShapeMismatch", f"{fmt(*key)} holds {want.dtype.name}, push sent {data.dtype.name}")
        if rows is None:
            if data.shape != want.shape:
                raise OpError("ShapeMismatch",
                              f"{fmt(*key)} has shape {list(want.shape)}, push sent {list(data.shape)}")
            return
        if not entry.sparse:
            raise OpError("ShapeMismatch", f"{fmt(*key)} is dense; a row_sparse push was sent")
        if rows.ndim != 1 or rows.dtype.kind not in "iu" or data.shape != (len(rows), *want.shape[1:]):
            raise OpError("ShapeMismatch",
                          f"{fmt(*key)}: row_sparse push with {len(rows)} ids and data {list(data.shape)}")
        if len(rows) and (rows.min() < 0 or rows.max() >= want.shape[0]):
            raise OpError("ShapeMismatch", f"{fmt(*key)}: row id out of range 0..{want.shape[0] - 1}")

    def _contribute(self, entry: Entry, worker: int, seq: int, data: np.ndarray | Packed,
                    rows: np.ndarray | None) -> None:
        entry.contributors.add(worker)
        if isinstance(data, Packed):   # (dense sync, check_finite off: see _take_push)
            self._contribute_packed(entry, data)
            entry.pushed[worker] = seq
            return
        if self.check_finite and data.dtype.kind == "f" and not np.isfinite(data).all():
            entry.nonfinite.add(worker)
        entry.pushed[worker] = seq
        if rows is not None or entry.sparse:
            if rows is None:  # a dense push to a row_sparse key: every row
                rows = np.arange(entry.value.shape[0])
            entry.sparse_parts.append((rows, data))
        elif len(entry.contributors) == 1:
            entry.first = data
        else:
            # the push that completes the round also averages, chunk by chunk while in cache
            n = len(entry.contributors)
            last = self.active <= entry.contributors and entry.average and not entry.nonfinite \
                and self._optimizer_for(entry) is None
            scale = 1.0 / n if last else 1.0
            if entry.first is not None:
                entry.spare = fresh(entry.spare, entry.spare_sends, entry.value, self._new)
                entry.spare_sends = []
                add_scaled(entry.first, data, entry.spare, scale)
                entry.first = None
            else:
                assert entry.spare is not None
                add_scaled(entry.spare, data, entry.spare, scale)
            entry.scaled = last

    def _contribute_packed(self, entry: Entry, data: Packed) -> None:
        """A compressed push into the round's sum: the first is decoded into the spare buffer,
        the others decoded and added chunk by chunk (the last one also averaging), so no push
        gets a float32 array of its own.  Values are those of decoding, then _contribute."""
        if len(entry.contributors) == 1:
            entry.spare = fresh(entry.spare, entry.spare_sends, entry.value, self._new)
            entry.spare_sends = []
            data.into(entry.spare)
            entry.first, entry.scaled = None, False
            return
        last = self.active <= entry.contributors and entry.average and self._optimizer_for(entry) is None
        n = len(entry.contributors)
        if entry.first is not None:   # (a float32 first push: only a worker whose setting changed)
            entry.spare = fresh(entry.spare, entry.spare_sends, entry.value, self._new)
            entry.spare_sends = []
            np.copyto(entry.spare, entry.first)
            entry.first = None
        assert entry.spare is not None
        data.add_into(entry.spare, 1.0 / n if last else 1.0)
        entry.scaled = last

    def _maybe_complete(self, key: Key, entry: Entry) -> list[Reply]:
        out: list[Reply] = []
        while entry.contributors and self.active <= entry.contributors:
            n = len(entry.contributors)
            if entry.nonfinite:
                entry.skipped += 1
                self.events.append(f"{fmt(*key)}: round {entry.round + 1} skipped: non-finite "
                                   f"gradient from worker(s) {sorted(entry.nonfinite)}")
                entry.nonfinite.clear()
            elif entry.sparse:
                rows, data = _combine_rows(entry.sparse_parts, self._row_sum(entry))
                average = entry.average
                if average and n > 1 and data.dtype.kind == "f":   # a fresh array: in place
                    np.divide(data, n, out=data)                      # (the values of data / n)
                    average = False
                self._apply(key, entry, data, rows, n, average)
            else:
                agg = entry.first if entry.first is not None else entry.spare
                assert agg is not None
                entry.first = None
                self._apply(key, entry, agg, None, n, entry.average)
            entry.round += 1
            self.rounds += 1
            entry.contributors.clear()
            entry.sparse_parts.clear()
            out.extend(self._answer_pulls(entry))
            if entry.bucket is not None:
                out.extend(self.fused.answer(entry.bucket))
            for w, queue in list(entry.early.items()):  # pushes waiting for this round
                for item in list(queue):
                    if item[0] == entry.round + 1 and w not in entry.contributors:
                        queue.remove(item)
                        self._contribute(entry, w, item[0], item[1], item[2])
                if not queue:
                    del entry.early[w]
        return out

    @staticmethod
    def _row_sum(entry: Entry) -> np.ndarray | None:
        """The entry's scratch for a round's row sums (kept across rounds: a fresh array each
        round costs page faults), big enough for every row this round's pushes hold; None
        when combine_rows would not use it (a single push, a key not floating-point) or they
        hold over half the key's rows (a fresh array then: no lasting copy)."""
        value = entry.value
        need = sum(len(r) for r, _ in entry.sparse_parts) * math.prod(value.shape[1:])
        if len(entry.sparse_parts) < 2 or value.dtype.kind != "f" or 2 * need > value.size:
            return None
        buf = entry.row_sum
        if buf is None or buf.size < need:
            buf = entry.row_sum = np.empty(need + need // 4, value.dtype)
        return buf

    def _apply(self, key: Key, entry: Entry, data: np.ndarray, rows: np.ndarray | None, n: int,
               average: bool) -> None:
        """Fold an aggregate into the value.

        ``data`` is either the entry's spare buffer (a sum of several pushes: scaled in place,
        then swapped with the value when there is no optimizer), a fresh array, or a received
        read-only push.  The value is never written while a zero-copy send still reads it.
        """
        if average and n > 1:
            if data is entry.spare:
                if not entry.scaled:
                    np.multiply(data, 1.0 / n, out=data, casting="unsafe")
            else:
                data = data / n
        entry.scaled = False
        if rows is not None and not entry.sparse:
            rows = None
        if self.updater is not None:
            value = self._own(entry)
            self.updater(key[0], data if rows is None else RowSparseArray(data, rows, value.shape), value)
            return
        optimizer = self._optimizer_for(entry)
        if optimizer is None and rows is None and data is entry.spare and not entry.fixed:
            entry.value, entry.spare = entry.spare, entry.value
            entry.spare_sends, entry.value_sends = entry.value_sends, []
            return
        value = self._own(entry)
        if optimizer is None:
            if rows is None:
                np.copyto(value, data)
            elif len(rows):
                value[rows] = data
            return
        if entry.state is None:
            entry.state = optimizer.create_state(value)
        if rows is None:
            optimizer.update(value, data, entry.state)
        elif len(rows):
            optimizer.update_rows(value, np.asarray(rows, np.int64), data, entry.state)

    def _own(self, entry: Entry) -> np.ndarray:
        """The entry's value, safe to write in place (copied if a send still reads it; a fixed
        value is never sent without a copy)."""
        if not entry.fixed and (not entry.value.flags.writeable or not all(t.done for t in entry.value_sends)):
            value = self._new(entry.value)
            np.copyto(value, entry.value)
            entry.value = value
        entry.value_sends = []
        return entry.value

    def _optimizer_for(self, entry: Entry) -> opt_mod.Optimizer | None:
        """Optimizers update floating-point keys; other keys take the aggregate as is."""
        return self.optimizer if entry.value.dtype.kind == "f" else None


__all__ = ["Alloc", "Rounds"]
