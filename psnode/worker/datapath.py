"""The worker's data path under the KVStore API: key parts, buckets and requests (no I/O).

:class:`DataPath` (the base of :class:`psnode.worker.kvstore.KVStore`) turns prepared gradients and
outputs into the engine's typed requests (:mod:`psnode.protocol`) and copies answers out:

* a **push** copies each key part's gradient into a slot the engine gives (shared memory on
  this host's link, psnode.samehost.staging) and sends it; a whole bucket of small keys (psnode.server.buckets)
  goes as one request; in ``dist_sync`` over this host's link a push asks for its round's
  value at once (PUSHPULL), so the pull after it sends nothing (:attr:`DataPath._asked`);
* a **pull** asks each key part (or bucket) for the value after this worker's last push, into a
  landing area, and copies the answer into ``out`` (read in place when the server's answer is
  a reference to its value: later pushes of the key wait meanwhile, psnode.worker.tracker);
* a **row_sparse pull** asks each row range's server for the distinct rows, and writes them
  straight into a dense ``out``.
* with **gradient compression** (``kv.set_gradient_compression``, psnode.math.compression) a dense
  push slot holds the payload instead: the part's gradient compressed with the key's residual
  (a split key's part with its slice of it; a bucket with one residual over its members, each
  member's residual a view of it), the push carrying the spec's tag.  The journal keeps that
  payload, so a resend never compresses again (the residual advances once per push).  Parts
  and keys for other hosts are compressed first (pushes and pushpulls): they travel while the
  rest is compressed.

Requests of one call leave together (``engine.batch``).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from psnode.errors import ConfigError, KeyNotInitialized, PSError, ShapeMismatch
from psnode.math.compression import CompressionSpec, Residual
from psnode.math.sparse import RowSparseArray
from psnode.math.sparse import sort_rows as _sort_rows
from psnode.math.sparse import unique_rows as _unique
from psnode.protocol import Ok, Op, Pull, Push, PushPull
from psnode.worker import forms
from psnode.worker.bucketing import Bucket, Bucketer
from psnode.worker.engine import Future
from psnode.worker.items import check_shape
from psnode.worker.placement import Part, Placement

Copier = Callable[[Ok], None]
Item = tuple[Any, "KeyInfo", Any]


@dataclass
class KeyInfo:
    shape: tuple[int, ...]
    dtype: np.dtype
    sparse: bool
    placement: Placement
    seq: int = 0        # pushes of this key sent by this worker (numbers the next push)
    taken: int = 0      # pushes of this rank every part's server had taken at init (restarts)
    counts: dict[int, int] = field(default_factory=dict)   # part -> its server's count at init
    bucket: Bucket | None = None   # the bucket it shares with other small keys (psnode.server.buckets)

    def part_shape(self, part: Part) -> tuple[int, ...]:
        if not self.placement.split:
            return self.shape
        return (part.hi - part.lo, *self.shape[1:]) if self.placement.by_rows else (part.hi - part.lo,)

    def region(self, arr: np.ndarray, part: Part) -> np.ndarray:
        """The part of ``arr`` (of the key's shape) that ``part`` holds."""
        if not self.placement.split:
            return arr
        return arr[part.lo:part.hi] if self.placement.by_rows else arr.reshape(-1)[part.lo:part.hi]

    def part_nbytes(self, part: Part) -> int:
        return math.prod(self.part_shape(part)) * self.dtype.itemsize


class DataPath:
    """Request building and answer copying for :class:`psnode.worker.kvstore.KVStore`."""

    mode: str
    _engine: Any
    _keys: dict[Any, KeyInfo]
    _closed: bool
    _bucketer: Bucketer
    _asked: dict[tuple[Any, int], tuple[int, Future]]
    _comp: CompressionSpec | None = None        # gradient compression (None: off)
    _residuals: dict[Any, Residual]             # key (or bucket key) -> its residual
    _scratch: dict[Any, np.ndarray]             # bucket key -> its gradient, before compression

    def _info(self, key: Any) -> KeyInfo:
        info = self._keys.get(key)
        if info is None:
            raise KeyNotInitialized(f"key {key!r} is not initialised: call kv.init({key!r}, value) first")
        return info

    _check_shape = staticmethod(check_shape)

    def _wait(self, futs: Sequence[Future]) -> None:
        first: BaseException | None = None
        for fut in futs:
            try:
                self._engine.wait(fut)
            except PSError as exc:
                first = first or exc
        if first is not None:
            raise first

    def _submit(self, server: int, op: Op, nbytes: int, priority: int,
                on_reply: Copier | None = None, guard: Any = None, bucket: Bucket | None = None,
                auto: bool = False) -> Future:
        if self._closed:
            raise PSError("this KVStore is closed")
        keys, label = (1, "") if bucket is None else (len(bucket.members), bucket.label)
        return self._engine.submit(server, op, nbytes, priority, on_reply, guard=guard, keys=keys, label=label,
                                   auto=auto)

    def _ask_ahead(self, server: int) -> bool:
        """Whether a push to ``server`` asks for its round's value at once: dist_sync over this
        host's link, where the answer is a reference to the server's value (read, if the script
        pulls, before this worker's next push of the key: it cannot change before)."""
        return self.mode == "dist_sync" and self._engine.same_host(server)

    def _send(self, server: int, op: Op, priority: int, guard: Any = None, bucket: Bucket | None = None) -> None:
        """Fire and forget (pushes): a failure is raised by a later call."""
        if self._closed:
            raise PSError("this KVStore is closed")
        keys, label = (1, "") if bucket is None else (len(bucket.members), bucket.label)
        self._engine.submit(server, op, 0, priority, None, reply=False, guard=guard, keys=keys, label=label)

    @staticmethod
    def _guard(info: KeyInfo) -> Any:
        """What a push of the key must not overtake a pull of (its bucket, for a member)."""
        return None if info.bucket is None else (info.bucket.key, 0)

    @staticmethod
    def _copier(dest: np.ndarray, info: KeyInfo, part: Part) -> Copier:
        region = info.region(dest, part)

        def copy(ans: Ok) -> None:
            np.copyto(region, ans.arrays[0].reshape(region.shape))
        return copy

    def _push_one(self, k: Any, info: KeyInfo, v: np.ndarray | RowSparseArray, priority: int) -> None:
        info.seq += 1
        guard = self._guard(info)
        if isinstance(v, RowSparseArray):  # rows sorted once (stable): each part is a slice
            order, ids = _sort_rows(v.indices.astype(np.int64, copy=False), info.shape[0])
        parts: Sequence[Part] = info.placement.parts
        if self._comp is not None and len(parts) > 1:
            parts = self._remote_first(parts, lambda p: p.server)
        for part in parts:
            stage = self._engine.stage
            if isinstance(v, RowSparseArray):   # copies: the caller may reuse v at once
                a, b = np.searchsorted(ids, (part.lo, part.hi))
                data = stage(part.server, k, part.index, 0, (b - a, *info.shape[1:]), info.dtype, info.seq)
                np.take(v.data, order[a:b], axis=0, out=data)
                rows = stage(part.server, k, part.index, 1, (b - a,), np.dtype(np.int64), info.seq)
                np.subtract(ids[a:b], part.lo, out=rows, casting="unsafe")
                op = Push(k, part.index, info.seq, data, rows)
            else:
                tag = ""
                if self._comp is None:
                    data = stage(part.server, k, part.index, 0, info.part_shape(part), info.dtype, info.seq)
                    np.copyto(data, info.region(v, part).reshape(data.shape))
                else:
                    data, tag = self._compressed(k, info, part, v)
                if self._ask_ahead(part.server):
                    fut = self._submit(part.server, PushPull(k, part.index, info.seq, data, comp=tag),
                                       info.part_nbytes(part), priority, guard=guard, auto=True)
                    self._asked[(k, part.index)] = (info.seq, fut)
                    continue
                op = Push(k, part.index, info.seq, data, comp=tag)
            self._asked.pop((k, part.index), None)
            self._send(part.server, op, priority, guard)

    def _stage_bucket(self, bucket: Bucket, members: list[tuple[Any, KeyInfo, Any]], seq: int) -> np.ndarray:
        """Every member's gradient end to end, in a push slot of the bucket (compressed: the
        payload of that, with the bucket's residual)."""
        spec = self._comp
        if spec is None:
            data = self._engine.stage(bucket.server, bucket.key, 0, 0, (bucket.used,), bucket.dtype, seq)
        else:
            data = self._scratch.get(bucket.key)
            if data is None:
                data = self._scratch[bucket.key] = np.empty(bucket.used, bucket.dtype)
        grads = {k: v for k, _, v in members}
        np.concatenate([grads[k].reshape(-1) for k in bucket.members], out=data)
        for _, info, _ in members:
            info.seq = seq
        if spec is None:
            return data
        out = self._engine.stage(bucket.server, bucket.key, 0, 0, (spec.packed_size(bucket.used),),
                                 spec.wire_dtype, seq)
        return spec.compress(data, self._residual(bucket.key, bucket.used), out)

    def _push_bucket(self, bucket: Bucket, members: list[tuple[Any, KeyInfo, Any]], priority: int) -> None:
        seq = members[0][1].seq + 1
        data = self._stage_bucket(bucket, members, seq)
        tag = "" if self._comp is None else self._comp.tag
        if self._ask_ahead(bucket.server):
            fut = self._submit(bucket.server, PushPull(bucket.key, 0, seq, data, comp=tag),
                               bucket.used * bucket.dtype.itemsize, priority, bucket=bucket, auto=True)
            self._asked[(bucket.key, 0)] = (seq, fut)
            return
        self._asked.pop((bucket.key, 0), None)
        self._send(bucket.server, Push(bucket.key, 0, seq, data, comp=tag), priority, bucket=bucket)

    # ------------------------------------------------------------ gradient compression
    def _residual(self, key: Any, size: int) -> Residual | None:
        """The residual of ``key`` (a user key, or a bucket's key for the whole bucket), zero
        at first; a bucket member's is a view of its bucket's.  None: the type keeps none."""
        spec = self._comp
        if spec is None or not spec.thresholded:
            return None
        res: Residual | None = self._residuals.get(key)
        if res is None:
            info = self._keys.get(key)
            bucket = info.bucket if info is not None else None
            if bucket is not None:
                whole = self._residual(bucket.key, bucket.used)
                assert whole is not None
                offset, n = bucket.offsets[key]
                res = whole.part(offset, offset + n)
            else:
                res = Residual(np.zeros(size, np.float32))
            self._residuals[key] = res
        return res

    def _compressed(self, k: Any, info: KeyInfo, part: Part, grad: np.ndarray) -> tuple[np.ndarray, str]:
        """The push data of ``part`` of ``grad``: its payload, in a push slot, and the tag."""
        spec = self._comp
        assert spec is not None
        region = info.region(grad, part)
        res = self._residual(k, math.prod(info.shape))
        if res is not None and info.placement.split:
            res = res.part(part.lo, part.hi)
        data = self._engine.stage(part.server, k, part.index, 0, (spec.packed_size(region.size),),
                                  spec.wire_dtype, info.seq)
        return spec.compress(region, res, data), spec.tag

    def _remote_first(self, xs: Sequence[Any], server: Callable[[Any], int]) -> list[Any]:
        """``xs`` with those for servers off this host's link first (stable)."""
        same = self._engine.same_host
        return sorted(xs, key=lambda x: same(server(x)))

    def _check_compressible(self, items: list[tuple[Any, KeyInfo, Any]]) -> None:
        """ConfigError naming the first key gradient compression cannot push (row_sparse, not
        float32), before anything is sent."""
        spec = self._comp
        if spec is not None:
            for k, info, v in items:
                spec.check_key(k, info.dtype, info.sparse or isinstance(v, RowSparseArray))

    def _pull_items(self, items: list[tuple[Any, KeyInfo, Any]], fixups: list[tuple[list[Any], np.ndarray]],
                    results: list[Any], many: bool, priority: int,
                    pushed: dict[Any, np.ndarray | RowSparseArray] | None) -> Any:
        """Submit and wait for the pulls of ``_pull_into``'s items ``(key, info, (dest, grad))``."""
        futs: list[Future] = []
        whole, rest = _whole_buckets(items, pushing=pushed is not None)
        asked: list[tuple[Future, Copier, Any]] = []   # answers already asked for by the pushes
        if not rest and pushed is None and all(self._asked_ahead(b, m) for b, m in whole):
            counted = self._pull_requests(whole, rest, asked, futs, priority, False)   # (sends nothing)
        else:
            with self._engine.batch():
                counted = self._pull_requests(whole, rest, asked, futs, priority, pushed is not None)
        if asked:   # (read in place, each as soon as it is there; later pushes of these keys wait)
            guards = [g for _, _, g in asked]
            self._engine.protect(guards, True)
            try:
                for fut, copy, _ in asked:
                    copy(self._engine.wait(fut))
            finally:
                self._engine.protect(guards, False)
            self._engine.count_pulls(counted)
        self._wait(futs)
        for done, dest in fixups:
            for o in done:
                if o is not dest:
                    np.copyto(o, dest)
        return results if many else results[0]

    def _asked_ahead(self, bucket: Bucket, members: list[tuple[Any, KeyInfo, Any]]) -> bool:
        """The answer a pull of ``bucket`` wants was asked for by this worker's last push."""
        ahead = self._asked.get((bucket.key, 0))
        return ahead is not None and ahead[0] == members[0][1].seq

    def _pull_requests(self, whole: list[tuple[Bucket, list[tuple[Any, KeyInfo, Any]]]],
                       rest: list[tuple[Any, KeyInfo, Any]], asked: list[tuple[Future, Copier, Any]],
                       futs: list[Future], priority: int, pushing: bool) -> int:
        """Submit the pulls (pushpulls with ``pushing``) of ``_pull_into``; the answers pushes
        asked for already go to ``asked``.  Returns the key parts pulled that way."""
        counted = 0
        for bucket, members in whole:
            ahead = None if pushing else self._asked.get((bucket.key, 0))
            if ahead is not None and ahead[0] == members[0][1].seq:
                asked.append((ahead[1], self._bucket_copier(bucket, members), (bucket.key, 0)))
                counted += len(members)
                continue
            futs.append(self._pull_bucket(bucket, members, priority, pushing))
        if pushing and self._comp is not None:
            rest = self._remote_first(rest, lambda item: item[1].placement.parts[0].server)
        for k, info, (dest, grad) in rest:
            guard = self._guard(info)
            if grad is not None:
                info.seq += 1
            parts: Sequence[Part] = info.placement.parts
            if grad is not None and self._comp is not None and len(parts) > 1:
                parts = self._remote_first(parts, lambda p: p.server)   # (as pushes: see _push_one)
            for part in parts:
                op: Op
                ahead = self._asked.get((k, part.index)) if grad is None else None
                if ahead is not None and ahead[0] == info.seq:
                    asked.append((ahead[1], self._copier(dest, info, part), guard or (k, part.index)))
                    counted += 1
                    continue
                shape = info.part_shape(part)
                land = self._engine.land(part.server, shape, info.dtype)
                if grad is None:
                    op = Pull(k, part.index, info.seq, dest=land)
                else:
                    assert isinstance(grad, np.ndarray)
                    tag = ""
                    if self._comp is None:
                        data = self._engine.stage(part.server, k, part.index, 0, shape, info.dtype, info.seq)
                        np.copyto(data, info.region(grad, part).reshape(shape))
                    else:
                        data, tag = self._compressed(k, info, part, grad)
                    op = PushPull(k, part.index, info.seq, data, dest=land, comp=tag)
                futs.append(self._submit(part.server, op, info.part_nbytes(part), priority,
                                         self._copier(dest, info, part), guard))
        return counted

    @staticmethod
    def _bucket_copier(bucket: Bucket, members: list[tuple[Any, KeyInfo, Any]]) -> Copier:
        """Copies a bucket's answer (its whole buffer) into each member's destination."""
        dests = {k: d for k, _, (d, _) in members}
        spans = [(dests[k].reshape(-1), *bucket.offsets[k]) for k in bucket.members]

        def copy(ans: Ok) -> None:
            whole = ans.arrays[0]
            for dest, offset, size in spans:
                np.copyto(dest, whole[offset:offset + size])
        return copy

    def _pull_bucket(self, bucket: Bucket, members: list[tuple[Any, KeyInfo, Any]], priority: int,
                     pushing: bool) -> Future:
        """One request for every member of ``bucket`` (a pull, or with ``pushing`` a pushpull);
        the answer is the bucket's buffer, copied out member by member."""
        copy = self._bucket_copier(bucket, members)
        land = self._engine.land(bucket.server, (bucket.used,), bucket.dtype)
        op: Op
        if pushing:
            seq = members[0][1].seq + 1
            grads = [(k, info, g) for k, info, (_, g) in members]
            op = PushPull(bucket.key, 0, seq, self._stage_bucket(bucket, grads, seq), dest=land,
                          comp="" if self._comp is None else self._comp.tag)
        else:
            op = Pull(bucket.key, 0, members[0][1].seq, dest=land)
        return self._submit(bucket.server, op, bucket.used * bucket.dtype.itemsize, priority, copy,
                            bucket=bucket)

    def _row_requests(self, outs: list[forms.Group], id_lists: list[list[np.ndarray]], priority: int,
                      futs: list[Future], fetched: dict[tuple[Any, bytes], tuple[np.ndarray, np.ndarray]],
                      plan: list[tuple[KeyInfo, Any, tuple[Any, bytes] | None]]) -> None:
        """Submit the requests of ``row_sparse_pull`` (one per server part and distinct ids)."""
        for (k, targets), ids_per_out in zip(outs, id_lists, strict=True):
            info = self._info(k)
            if info.placement.split and not info.placement.by_rows:
                raise ConfigError(f"key {k!r} is a dense key split over servers; "
                                  "row_sparse_pull needs a row_sparse key")
            for o, ids in zip(targets, ids_per_out, strict=True):
                if isinstance(o, np.ndarray):
                    self._check_shape(k, info, o.shape, o.dtype, out=True)
                    if len(targets) == 1:   # the answers go straight into its rows
                        self._fetch_rows(k, info, ids, priority, futs, o)
                        plan.append((info, o, None))
                        continue
                tag = (k, ids.tobytes())
                if tag not in fetched:
                    fetched[tag] = self._fetch_rows(k, info, ids, priority, futs)
                plan.append((info, o, tag))

    def _fetch_rows(self, k: Any, info: KeyInfo, ids: np.ndarray, priority: int,
                    futs: list[Future], into: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Ask for rows ``ids`` of ``k``: (sorted distinct ids, their rows once answered); with
        ``into`` (a dense array of the key's shape) the answers are written into its rows."""
        uniq = _unique(ids)
        if len(uniq) and (uniq[0] < 0 or uniq[-1] >= info.shape[0]):
            bad = int(uniq[0] if uniq[0] < 0 else uniq[-1])
            raise ShapeMismatch(f"row id {bad} of key {k!r} is outside 0..{info.shape[0] - 1}")
        data = np.empty((0 if into is not None else len(uniq), *info.shape[1:]), info.dtype)
        for part in info.placement.parts:
            lo, hi = (part.lo, part.hi) if info.placement.by_rows else (0, info.shape[0])
            a, b = np.searchsorted(uniq, [lo, hi])
            if a == b:
                continue
            shape = (int(b - a), *info.shape[1:])
            copy = self._row_copier(into, uniq[a:b], data[a:b], shape)
            rows = self._engine.land(part.server, (b - a,), np.dtype(np.int64))
            if rows is None:
                rows = np.empty(b - a, np.int64)
            np.subtract(uniq[a:b], lo, out=rows)
            land = self._engine.land(part.server, shape, info.dtype)
            op = Pull(k, part.index, info.seq, rows, dest=land)
            futs.append(self._submit(part.server, op, math.prod(shape) * info.dtype.itemsize, priority, copy))
        return uniq, data

    @staticmethod
    def _row_copier(into: np.ndarray | None, rows: np.ndarray, region: np.ndarray,
                    shape: tuple[int, ...]) -> Copier:
        """Where an answer of rows goes: straight into ``into``'s rows, or into ``region``."""
        def copy(ans: Ok) -> None:
            if into is not None:
                into[rows] = ans.arrays[0].reshape(shape)
            else:
                np.copyto(region, ans.arrays[0].reshape(region.shape))
        return copy


def _whole_buckets(items: list[tuple[Any, KeyInfo, Any]], pushing: bool = True
                   ) -> tuple[list[tuple[Bucket, list[tuple[Any, KeyInfo, Any]]]], list[tuple[Any, KeyInfo, Any]]]:
    """Split ``(key, info, x)`` items into whole buckets (every member once, one push count,
    dense arrays: one request each) and the rest (one request per key part)."""
    found: dict[int, list[tuple[Any, KeyInfo, Any]]] = {}
    rest = []
    for item in items:
        b = item[1].bucket
        x = item[2]
        dense = x[1] if isinstance(x, tuple) else x
        if b is None or (pushing and not isinstance(dense, np.ndarray)):
            rest.append(item)
        else:
            found.setdefault(b.bid, []).append(item)
    whole = []
    for members in found.values():
        b = members[0][1].bucket
        assert b is not None
        seqs = {info.seq for _, info, _ in members}
        if len(members) == len(b.members) and len(seqs) == 1 and {k for k, _, _ in members} == b.offsets.keys():
            whole.append((b, members))
        else:
            rest.extend(members)
    return whole, rest


__all__ = ["Copier", "DataPath", "KeyInfo"]
