"""The worker's data path: keys into parts and buckets, parts into requests, answers into arrays.

:class:`DataPath` is what the KVStore API (:mod:`psnode.worker.kvstore`) holds to talk to the
servers: it takes prepared gradients and outputs (``(key, KeyInfo, ...)`` items: the API checked
them) and hands the engine typed requests (:mod:`psnode.protocol`), through the narrow
:class:`Requests` interface (:class:`psnode.worker.engine.Engine` for a job,
:class:`psnode.local.LocalEngine` in one process).  It does no I/O itself.

* **Same host** is decided once per call: :attr:`Requests.places` names the servers reached
  over this host's shared-memory link and gives their memory (psnode.samehost.staging.Places);
  that answer goes with every request of the call (where to stage, where answers land, which
  thread sends).  Each array put in shared memory comes with its place, written on the
  operation (``op.at``), and the landing areas a request took go with it
  (:class:`~psnode.worker.futures.Placed`): the engine and the link send them as they are.
* A call's requests are handed to the engine together, once (:meth:`Requests.send`; a call
  with much data in groups of about ``SEND_BYTES``: the server starts on the first while the
  rest is copied).
* A **push** copies each key part's gradient into a push slot (shared memory for a near
  server) and sends it; a whole bucket of small keys
  (:mod:`psnode.worker.bucketing`) goes as one request; in ``dist_sync`` a push to a near
  server asks for its round's value at once (PUSHPULL), so the pull after it sends nothing (the
  answer is a reference to the server's value, read, if the script pulls, before this worker's
  next push of the key: it cannot change before).
* A **pull** asks each key part (or bucket) for the value after this worker's last push, into a
  landing area, and copies the answer into the destination (read in place when the server's
  answer is a reference to its value: later pushes of the key wait meanwhile,
  psnode.worker.tracker).
* A **row_sparse pull** asks each row range's server for the distinct rows, and writes them
  straight into a dense ``out``.
* With **gradient compression** (:mod:`psnode.worker.compressor`) a dense push slot holds the
  payload: the part's gradient compressed with the key's residual (a bucket: with one residual
  over its members), the push carrying the spec's tag.  Parts and keys for far servers are
  compressed first (pushes and pushpulls): they travel while the rest is compressed.
* **Init** sends each key part's Init (rank 0's value, or its spec of the values a server
  computes) and copies the stored value back.

Every request raises PSError once the path is :attr:`DataPath.closed`.
"""
from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import numpy as np

from psnode.errors import ConfigError, PSError, ShapeMismatch
from psnode.math import dynrows
from psnode.math.sparse import RowSparseArray
from psnode.math.sparse import sort_rows as _sort_rows
from psnode.math.sparse import unique_rows as _unique
from psnode.protocol import Init, Join, Ok, Op, Pull, Push, PushPull
from psnode.samehost.staging import NOWHERE, Loc, Places
from psnode.worker import forms
from psnode.worker.bucketing import Bucket
from psnode.worker.compressor import Compressor
from psnode.worker.futures import Future, Placed
from psnode.worker.keys import Item, KeyInfo
from psnode.worker.placement import Part

Copier = Callable[[Ok], None]
Near = frozenset[int]
SEND_BYTES = 2 * 2**20    # a call's requests go to the engine once they hold this much data


class Requests(Protocol):
    """What the data path needs of an engine."""

    #: Where the arrays of one call's requests go: the servers reached over this host's
    #: shared-memory link, and its memory (decides staging, landing and the sending thread);
    #: read once per call.
    places: Places

    def send(self, placed: Sequence[Placed]) -> None:
        """Send the operations of one call (or a group of it), as placed."""

    def batch(self) -> AbstractContextManager[None]:
        """The requests of the calls inside leave together (``kv.batch()``)."""

    def wait(self, fut: Future) -> Ok:
        """The answer of ``fut`` (raising its error)."""

    def protect(self, guards: list[Any], on: bool) -> None:
        """Hold back pushes of ``guards`` while their answers are read in place."""

    def count_pulls(self, n: int) -> None:
        """``n`` key parts were pulled from answers their pushes asked for."""


class DataPath:
    """Requests of one KVStore and the copying of their answers (see the module docstring)."""

    def __init__(self, engine: Requests, ask_ahead: bool, comp: Compressor) -> None:
        self._engine = engine
        self._ask_ahead = ask_ahead    # dist_sync: a push to a near server asks for its round's value
        self._comp = comp
        self.closed = False
        # (op key, part) -> (push, its future): the answers pushes asked for (see _ask_ahead)
        self._asked: dict[tuple[Any, int], tuple[int, Future]] = {}
        # this thread's call: .out, its requests not yet sent (None: in no call), .payload their data
        self._calls = threading.local()

    # ------------------------------------------------------------ requests and waiting
    def request(self, server: int, op: Op, priority: int) -> Future:
        """One request whose answer the caller reads (flush, optimizer, states)."""
        places = self._open()
        try:
            return self._submit(server, op, 0, priority, near=server in places.near)
        finally:
            self._close()

    def wait(self, futs: Sequence[Future]) -> None:
        """Wait for every future; raise the first error once all are done."""
        first: BaseException | None = None
        for fut in futs:
            try:
                self._engine.wait(fut)
            except PSError as exc:
                first = first or exc
        if first is not None:
            raise first

    def _open(self) -> Places:
        """Begin a call: where its arrays go; its requests are kept until :meth:`_close`."""
        if self.closed:
            raise PSError("this KVStore is closed")
        calls = self._calls
        calls.out, calls.payload = [], 0
        return self._engine.places

    def _close(self) -> None:
        """End a call: its requests go to the engine (those kept since the last group)."""
        calls = self._calls
        out, calls.out = calls.out, None
        if out:
            self._engine.send(out)

    def _add(self, placed: Placed, op: Op) -> None:
        """``placed`` goes with this thread's call (alone when in none; the call's requests so
        far once they hold SEND_BYTES of data)."""
        calls = self._calls
        out = getattr(calls, "out", None)
        if out is None:
            self._engine.send([placed])
            return
        out.append(placed)
        data = getattr(op, "data", None)
        if data is not None:
            calls.payload += data.nbytes
            if calls.payload >= SEND_BYTES:
                calls.out, calls.payload = [], 0
                self._engine.send(out)

    def _submit(self, server: int, op: Op, nbytes: int, priority: int, on_reply: Copier | None = None,
                guard: Any = None, bucket: Bucket | None = None, auto: bool = False, near: bool = False,
                areas: tuple[np.ndarray, ...] = ()) -> Future:
        """A request whose answer is wanted: its future (the request goes with the call's)."""
        if self.closed:
            raise PSError("this KVStore is closed")
        keys, label = (1, "") if bucket is None else (len(bucket.members), bucket.label)
        placed = Placed(server, op, True, on_reply, near, nbytes, priority, guard, keys, label, auto, areas)
        self._add(placed, op)
        assert placed.future is not None
        return placed.future

    def _send(self, server: int, op: Op, priority: int, near: bool, guard: Any = None,
              bucket: Bucket | None = None) -> None:
        """Fire and forget (pushes): a failure is raised by a later call."""
        if self.closed:
            raise PSError("this KVStore is closed")
        keys, label = (1, "") if bucket is None else (len(bucket.members), bucket.label)
        self._add(Placed(server, op, False, None, near, 0, priority, guard, keys, label), op)

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

    # ------------------------------------------------------------ init
    def init(self, key: Any, info: KeyInfo, sync: bool, aggregation: str, resumed: bool,
             value: np.ndarray | None = None, target: np.ndarray | None = None,
             fill: Callable[[Part], dict[str, Any]] | None = None, bare: bool = False,
             join: bool = False, staleness: int = -1, backup: int = 0) -> list[Future]:
        """Init every part of a new key: ``value`` is rank 0's array (None elsewhere), the
        stored value is copied into ``target`` (if given); with ``bare`` (a server-side init)
        no answer carries a value and ``fill(part)`` is rank 0's spec of a part's values.  Each
        part's push count goes into ``info`` (a ``resumed`` worker's next push continues it);
        a joiner's (``join``: no value, no fill) gets each part's completed round instead
        (then :meth:`join`).  ``staleness`` >= 0: the parts' pulls wait for that bound
        (dist_ssp, async parts: psnode.server.staleness); ``backup`` > 0: the parts' rounds
        complete without that many workers (backup workers, sync parts: psnode.server.rounds)."""
        futs: list[Future] = []
        if join:
            value, fill = None, None
        places = self._open()
        try:
            self._init_parts(key, info, sync, aggregation, resumed, value, target, fill, bare, join, staleness,
                             backup, futs, places.near)
        finally:
            self._close()
        return futs

    def _init_parts(self, key: Any, info: KeyInfo, sync: bool, aggregation: str, resumed: bool,
                    value: np.ndarray | None, target: np.ndarray | None,
                    fill: Callable[[Part], dict[str, Any]] | None, bare: bool, join: bool, staleness: int,
                    backup: int, futs: list[Future], near: Near) -> None:
        for part in info.placement.parts:
            op = Init(key, part.index, info.dtype.name, info.part_shape(part), sync=sync, aggregation=aggregation,
                      sparse=info.sparse, bare=bare, join=join, staleness=staleness, backup=backup)
            if info.bucket is not None:
                op.bucket, op.offset = info.bucket.bid, info.bucket.offsets[key][0]
            if value is not None:
                op.value = np.array(info.region(value, part), copy=True)
            if fill is not None:
                op.fill = fill(part)
            copy = self._copier(target, info, part) if target is not None else None

            def on_init(ans: Ok, copy: Copier | None = copy, part: int = part.index) -> None:
                # > 0 after a restart; a split key resumes where its last part stopped (a
                # predecessor may have died between pushing two parts: the other is a duplicate)
                info.counts[part] = ans.seq
                info.taken = min(info.counts.values())
                if resumed and not join:
                    info.seq = info.taken
                if copy is not None:
                    copy(ans)
            futs.append(self._submit(part.server, op, 0, 1 << 30, on_init, near=part.server in near))

    def join(self, key: Any, info: KeyInfo, generation: int) -> int:
        """A joiner agrees its start round ``s`` with every part of ``key`` (after :meth:`init`
        with ``join``: ``info.counts`` holds each part's completed round): it proposes the
        latest completed round + 2 to every part, and a later one to all of them again while a
        part refuses (round ``s`` opened there; its answer names the earliest it accepts).
        Its push count becomes ``s - 1``; returns ``s``."""
        start = max(info.counts.values(), default=0) + 2
        while True:
            futs = [self.request(part.server, Join(key, part.index, start, generation), 0)
                    for part in info.placement.parts]
            self.wait(futs)
            want = max(self._engine.wait(f).seq for f in futs)
            if want == start:
                break
            start = want
        info.seq = info.taken = start - 1
        info.counts = {part.index: start - 1 for part in info.placement.parts}
        return start

    # ------------------------------------------------------------ push
    def push(self, items: list[Item], priority: int) -> None:
        """Send the prepared gradients of one push call (buckets whole, the rest per key part;
        the caller checked them: ``Compressor.check``)."""
        places = self._open()
        try:
            if self._comp.spec is not None:
                items = _far_first(items, lambda item: item[1].placement.parts[0].server, places.near)
            whole, rest = _whole_buckets(items)
            for bucket, members in whole:
                self._push_bucket(bucket, members, priority, places)
            for k, info, v in rest:
                self._push_one(k, info, v, priority, places)
        finally:
            self._close()

    def _push_one(self, k: Any, info: KeyInfo, v: np.ndarray | RowSparseArray, priority: int,
                  places: Places) -> None:
        info.seq += 1
        guard = self._guard(info)
        near = places.near
        if info.dynamic:
            self._push_table(k, info, v, priority, places, guard)
            return
        if isinstance(v, RowSparseArray):  # rows sorted once (stable): each part is a slice
            order, ids = _sort_rows(v.indices.astype(np.int64, copy=False), info.shape[0])
        parts: Sequence[Part] = info.placement.parts
        if self._comp.spec is not None and len(parts) > 1:
            parts = _far_first(parts, lambda p: p.server, near)
        slot = places.slot
        for part in parts:
            here = part.server in near
            if isinstance(v, RowSparseArray):   # copies: the caller may reuse v at once
                a, b = np.searchsorted(ids, (part.lo, part.hi))
                data, at = slot(part.server, k, part.index, 0, (b - a, *info.shape[1:]), info.dtype, info.seq)
                np.take(v.data, order[a:b], axis=0, out=data)
                rows, at_rows = slot(part.server, k, part.index, 1, (b - a,), np.dtype(np.int64), info.seq)
                np.subtract(ids[a:b], part.lo, out=rows, casting="unsafe")
                op = Push(k, part.index, info.seq, data, rows, at=(at, at_rows))
            else:
                tag = ""
                if self._comp.spec is None:
                    data, at = slot(part.server, k, part.index, 0, info.part_shape(part), info.dtype, info.seq)
                    np.copyto(data, info.region(v, part).reshape(data.shape))
                else:
                    data, tag, at = self._compressed(k, info, part, v, places)
                if self._ask_ahead and here:
                    fut = self._submit(part.server, PushPull(k, part.index, info.seq, data, comp=tag, at=(at,)),
                                       info.part_nbytes(part), priority, guard=guard, auto=True, near=True)
                    self._asked[(k, part.index)] = (info.seq, fut)
                    continue
                op = Push(k, part.index, info.seq, data, comp=tag, at=(at,))
            self._asked.pop((k, part.index), None)
            self._send(part.server, op, priority, here, guard)

    def _push_table(self, k: Any, info: KeyInfo, v: Any, priority: int, places: Places, guard: Any) -> None:
        """A push of a table without a row count: each server gets the rows of its ids, by
        their hash (psnode.math.dynrows), and the hashes as row ids (every part is pushed: a
        dist_sync round needs every worker's push)."""
        if not isinstance(v, RowSparseArray):
            raise ShapeMismatch(f"key {k!r} is a table without a row count: push a RowSparseArray "
                                "(psnode.sparse.row_sparse_array((rows, ids), shape=(None, width)))")
        hashed = dynrows.mix(v.indices.astype(np.int64, copy=False))
        order, bounds = dynrows.split(hashed, len(info.placement.parts))
        for part in info.placement.parts:
            a, b = int(bounds[part.index]), int(bounds[part.index + 1])
            data, at = places.slot(part.server, k, part.index, 0, (b - a, *info.shape[1:]), info.dtype, info.seq)
            np.take(v.data, order[a:b], axis=0, out=data)
            rows, at_rows = places.slot(part.server, k, part.index, 1, (b - a,), np.dtype(np.int64), info.seq)
            np.take(hashed, order[a:b], out=rows)
            self._asked.pop((k, part.index), None)
            self._send(part.server, Push(k, part.index, info.seq, data, rows, at=(at, at_rows)), priority,
                       part.server in places.near, guard)

    def _stage_bucket(self, bucket: Bucket, members: list[Item], seq: int, places: Places
                      ) -> tuple[np.ndarray, Loc | None]:
        """Every member's gradient end to end, in a push slot of the bucket (compressed: the
        payload of that, with the bucket's residual), and its place."""
        spec = self._comp.spec
        if spec is None:
            data, at = places.slot(bucket.server, bucket.key, 0, 0, (bucket.used,), bucket.dtype, seq)
        else:
            data = self._comp.scratch(bucket)
        grads = {k: v for k, _, v in members}
        np.concatenate([grads[k].reshape(-1) for k in bucket.members], out=data)
        for _, info, _ in members:
            info.seq = seq
        if spec is None:
            return data, at
        out, at = places.slot(bucket.server, bucket.key, 0, 0, (spec.packed_size(bucket.used),), spec.wire_dtype,
                              seq)
        return spec.compress(data, self._comp.residual(bucket.key, bucket.used), out), at

    def _push_bucket(self, bucket: Bucket, members: list[Item], priority: int, places: Places) -> None:
        seq = members[0][1].seq + 1
        here = bucket.server in places.near
        data, at = self._stage_bucket(bucket, members, seq, places)
        spec = self._comp.spec
        tag = "" if spec is None else spec.tag
        if self._ask_ahead and here:
            fut = self._submit(bucket.server, PushPull(bucket.key, 0, seq, data, comp=tag, at=(at,)),
                               bucket.used * bucket.dtype.itemsize, priority, bucket=bucket, auto=True, near=True)
            self._asked[(bucket.key, 0)] = (seq, fut)
            return
        self._asked.pop((bucket.key, 0), None)
        self._send(bucket.server, Push(bucket.key, 0, seq, data, comp=tag, at=(at,)), priority, here, bucket=bucket)

    def _compressed(self, k: Any, info: KeyInfo, part: Part, grad: np.ndarray, places: Places
                    ) -> tuple[np.ndarray, str, Loc | None]:
        """The push data of ``part`` of ``grad``: its payload, in a push slot, the tag and the
        slot's place."""
        spec = self._comp.spec
        assert spec is not None
        region = info.region(grad, part)
        res = self._comp.residual(k, math.prod(info.shape), info.bucket)
        if res is not None and info.placement.split:
            res = res.part(part.lo, part.hi)
        data, at = places.slot(part.server, k, part.index, 0, (spec.packed_size(region.size),), spec.wire_dtype,
                               info.seq)
        return spec.compress(region, res, data), spec.tag, at

    # ------------------------------------------------------------ pull
    def pull(self, items: list[Item], priority: int, pushing: bool) -> None:
        """Pull ``(key, info, (dest, grad))`` items into their ``dest`` (C-contiguous, the key's
        shape); with ``pushing``, ``grad`` (a dense gradient, or None) is pushed first, fused
        with the pull into one request per key part (or bucket).  Returns once every answer was
        copied (raising the first error)."""
        futs: list[Future] = []
        whole, rest = _whole_buckets(items, pushing=pushing)
        asked: list[tuple[Future, Copier, Any]] = []   # answers already asked for by the pushes
        if not rest and not pushing and all(self._asked_ahead(b, m) for b, m in whole):
            counted = self._pull_requests(whole, rest, asked, futs, priority, False, NOWHERE)   # (sends nothing)
        else:
            places = self._open()
            try:
                counted = self._pull_requests(whole, rest, asked, futs, priority, pushing, places)
            finally:
                self._close()
        if asked:   # (read in place, each as soon as it is there; later pushes of these keys wait)
            guards = [g for _, _, g in asked]
            self._engine.protect(guards, True)
            try:
                for fut, copy, _ in asked:
                    copy(self._engine.wait(fut))
            finally:
                self._engine.protect(guards, False)
            self._engine.count_pulls(counted)
        self.wait(futs)

    def _asked_ahead(self, bucket: Bucket, members: list[Item]) -> bool:
        """The answer a pull of ``bucket`` wants was asked for by this worker's last push."""
        ahead = self._asked.get((bucket.key, 0))
        return ahead is not None and ahead[0] == members[0][1].seq

    def _pull_requests(self, whole: list[tuple[Bucket, list[Item]]], rest: list[Item],
                       asked: list[tuple[Future, Copier, Any]], futs: list[Future], priority: int, pushing: bool,
                       places: Places) -> int:
        """Submit the pulls (pushpulls with ``pushing``) of :meth:`pull`; the answers pushes
        asked for already go to ``asked``.  Returns the key parts pulled that way."""
        counted = 0
        near = places.near
        for bucket, members in whole:
            ahead = None if pushing else self._asked.get((bucket.key, 0))
            if ahead is not None and ahead[0] == members[0][1].seq:
                asked.append((ahead[1], self._bucket_copier(bucket, members), (bucket.key, 0)))
                counted += len(members)
                continue
            futs.append(self._pull_bucket(bucket, members, priority, pushing, places))
        comp = self._comp.spec
        if pushing and comp is not None:
            rest = _far_first(rest, lambda item: item[1].placement.parts[0].server, near)
        for k, info, (dest, grad) in rest:
            guard = self._guard(info)
            if grad is not None:
                info.seq += 1
            parts: Sequence[Part] = info.placement.parts
            if grad is not None and comp is not None and len(parts) > 1:
                parts = _far_first(parts, lambda p: p.server, near)   # (as pushes: see _push_one)
            for part in parts:
                op: Op
                ahead = self._asked.get((k, part.index)) if grad is None else None
                if ahead is not None and ahead[0] == info.seq:
                    asked.append((ahead[1], self._copier(dest, info, part), guard or (k, part.index)))
                    counted += 1
                    continue
                shape = info.part_shape(part)
                land, at_land = places.land(part.server, shape, info.dtype)
                if grad is None:
                    op = Pull(k, part.index, info.seq, dest=land, at=(at_land,))
                else:
                    assert isinstance(grad, np.ndarray)
                    tag = ""
                    if comp is None:
                        data, at = places.slot(part.server, k, part.index, 0, shape, info.dtype, info.seq)
                        np.copyto(data, info.region(grad, part).reshape(shape))
                    else:
                        data, tag, at = self._compressed(k, info, part, grad, places)
                    op = PushPull(k, part.index, info.seq, data, dest=land, comp=tag, at=(at, at_land))
                futs.append(self._submit(part.server, op, info.part_nbytes(part), priority,
                                         self._copier(dest, info, part), guard, near=part.server in near,
                                         areas=_taken(land)))
        return counted

    @staticmethod
    def _bucket_copier(bucket: Bucket, members: list[Item]) -> Copier:
        """Copies a bucket's answer (its whole buffer) into each member's destination."""
        dests = {k: d for k, _, (d, _) in members}
        spans = [(dests[k].reshape(-1), *bucket.offsets[k]) for k in bucket.members]

        def copy(ans: Ok) -> None:
            whole = ans.arrays[0]
            for dest, offset, size in spans:
                np.copyto(dest, whole[offset:offset + size])
        return copy

    def _pull_bucket(self, bucket: Bucket, members: list[Item], priority: int, pushing: bool,
                     places: Places) -> Future:
        """One request for every member of ``bucket`` (a pull, or with ``pushing`` a pushpull);
        the answer is the bucket's buffer, copied out member by member."""
        copy = self._bucket_copier(bucket, members)
        land, at_land = places.land(bucket.server, (bucket.used,), bucket.dtype)
        op: Op
        if pushing:
            seq = members[0][1].seq + 1
            grads = [(k, info, g) for k, info, (_, g) in members]
            spec = self._comp.spec
            data, at = self._stage_bucket(bucket, grads, seq, places)
            op = PushPull(bucket.key, 0, seq, data, dest=land, comp="" if spec is None else spec.tag,
                          at=(at, at_land))
        else:
            op = Pull(bucket.key, 0, members[0][1].seq, dest=land, at=(at_land,))
        return self._submit(bucket.server, op, bucket.used * bucket.dtype.itemsize, priority, copy,
                            bucket=bucket, near=bucket.server in places.near, areas=_taken(land))

    # ------------------------------------------------------------ row_sparse pull
    def pull_rows(self, outs: list[forms.Group], id_lists: list[list[np.ndarray]], priority: int,
                  info: Callable[[Any], KeyInfo]) -> list[Any]:
        """The outputs of ``row_sparse_pull`` (one per target of ``outs``, in order), each with
        rows ``id_lists`` of its key (``info``: the key's KeyInfo): a dense target gets the rows
        written in place, a RowSparseArray target is replaced by them, None becomes a new one."""
        futs: list[Future] = []
        fetched: dict[tuple[Any, bytes], tuple[np.ndarray, np.ndarray]] = {}
        plan: list[tuple[KeyInfo, Any, tuple[Any, bytes] | None]] = []
        places = self._open()
        try:
            self._row_requests(outs, id_lists, priority, futs, fetched, plan, info, places)
        finally:
            self._close()
        self.wait(futs)
        final: list[Any] = []
        for key_info, o, fetch in plan:
            if fetch is None:
                final.append(o)
                continue
            uniq, data = fetched[fetch]
            if isinstance(o, np.ndarray):
                o[uniq] = data
                final.append(o)
            elif isinstance(o, RowSparseArray):
                o.data, o.indices, o.shape = data.copy(), uniq.copy(), key_info.shape
                final.append(o)
            else:
                final.append(RowSparseArray(data.copy(), uniq.copy(), key_info.shape))
        return final

    def _row_requests(self, outs: list[forms.Group], id_lists: list[list[np.ndarray]], priority: int,
                      futs: list[Future], fetched: dict[tuple[Any, bytes], tuple[np.ndarray, np.ndarray]],
                      plan: list[tuple[KeyInfo, Any, tuple[Any, bytes] | None]], info_of: Callable[[Any], KeyInfo],
                      places: Places) -> None:
        """Submit the requests of :meth:`pull_rows` (one per server part and distinct ids)."""
        for (k, targets), ids_per_out in zip(outs, id_lists, strict=True):
            info = info_of(k)
            if info.placement.split and not info.placement.by_rows:
                raise ConfigError(f"key {k!r} is a dense key split over servers; "
                                  "row_sparse_pull needs a row_sparse key")
            for o, ids in zip(targets, ids_per_out, strict=True):
                if isinstance(o, np.ndarray):
                    info.check(k, o.shape, o.dtype, out=True)
                    if len(targets) == 1:   # the answers go straight into its rows
                        self._fetch_rows(k, info, ids, priority, futs, places, o)
                        plan.append((info, o, None))
                        continue
                tag = (k, ids.tobytes())
                if tag not in fetched:
                    fetched[tag] = self._fetch_rows(k, info, ids, priority, futs, places)
                plan.append((info, o, tag))

    def fetch_rows(self, key: Any, info: KeyInfo, ids: np.ndarray, priority: int
                   ) -> tuple[RowSparseArray, list[Future]]:
        """Ask for rows ``ids`` of ``key`` and return at once: the rows (sorted distinct ids; their
        values once every future is answered) and the futures (``row_sparse_fetch``)."""
        futs: list[Future] = []
        places = self._open()
        try:
            uniq, data = self._fetch_rows(key, info, ids, priority, futs, places)
        finally:
            self._close()
        return RowSparseArray(data, uniq, info.shape), futs

    def _fetch_rows(self, k: Any, info: KeyInfo, ids: np.ndarray, priority: int, futs: list[Future],
                    places: Places, into: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Ask for rows ``ids`` of ``k``: (sorted distinct ids, their rows once answered); with
        ``into`` (a dense array of the key's shape) the answers are written into its rows."""
        uniq = _unique(ids)
        if info.dynamic:
            return uniq, self._fetch_table(k, info, uniq, priority, futs, places)
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
            scratch, at_rows = places.land(part.server, (b - a,), np.dtype(np.int64))
            rows = np.empty(b - a, np.int64) if scratch is None else scratch
            np.subtract(uniq[a:b], lo, out=rows)
            land, at_land = places.land(part.server, shape, info.dtype)
            op = Pull(k, part.index, info.seq, rows, dest=land, at=(at_rows, at_land))
            futs.append(self._submit(part.server, op, math.prod(shape) * info.dtype.itemsize, priority, copy,
                                     near=part.server in places.near, areas=_taken(scratch, land)))
        return uniq, data

    def export_rows(self, k: Any, info: KeyInfo) -> list[list[np.ndarray]]:
        """Every trained row of a table without a row count, per server: hashed ids, values,
        the version of each row's last change, the server's version (psnode.server.dynparts.export)."""
        got: list[list[np.ndarray]] = [[] for _ in info.placement.parts]
        futs = []
        places = self._open()
        try:
            for part in info.placement.parts:
                def copy(ans: Ok, i: int = part.index) -> None:
                    got[i] = [np.array(a) for a in ans.arrays]
                futs.append(self._submit(part.server, Pull(k, part.index, info.seq), 0, 0, copy,
                                         near=part.server in places.near))
        finally:
            self._close()
        self.wait(futs)
        return got

    def _fetch_table(self, k: Any, info: KeyInfo, uniq: np.ndarray, priority: int, futs: list[Future],
                     places: Places) -> np.ndarray:
        """Ask each server for the rows of its ids of ``uniq`` (a table without a row count);
        the rows, in the order of ``uniq``, once answered."""
        data = np.empty((len(uniq), *info.shape[1:]), info.dtype)
        hashed = dynrows.mix(uniq)
        order, bounds = dynrows.split(hashed, len(info.placement.parts))
        for part in info.placement.parts:
            a, b = int(bounds[part.index]), int(bounds[part.index + 1])
            if a == b:
                continue
            shape = (b - a, *info.shape[1:])
            where = order[a:b]
            scratch, at_rows = places.land(part.server, (b - a,), np.dtype(np.int64))
            rows = np.empty(b - a, np.int64) if scratch is None else scratch
            np.take(hashed, where, out=rows)

            def copy(ans: Ok, where: np.ndarray = where, shape: tuple[int, ...] = shape) -> None:
                data[where] = ans.arrays[0].reshape(shape)
            land, at_land = places.land(part.server, shape, info.dtype)
            op = Pull(k, part.index, info.seq, rows, dest=land, at=(at_rows, at_land))
            futs.append(self._submit(part.server, op, math.prod(shape) * info.dtype.itemsize, priority, copy,
                                     near=part.server in places.near, areas=_taken(scratch, land)))
        return data

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


def _taken(*areas: np.ndarray | None) -> tuple[np.ndarray, ...]:
    """The landing areas (and scratch) a request took from the pool (None: none taken)."""
    return tuple(a for a in areas if a is not None)


def _far_first(xs: Sequence[Any], server: Callable[[Any], int], near: Near) -> list[Any]:
    """``xs`` with those for servers off this host's link first (stable)."""
    return sorted(xs, key=lambda x: server(x) in near)


def _whole_buckets(items: list[Item], pushing: bool = True) -> tuple[list[tuple[Bucket, list[Item]]], list[Item]]:
    """Split ``(key, info, x)`` items into whole buckets (every member once, one push count,
    dense arrays: one request each) and the rest (one request per key part)."""
    found: dict[int, list[Item]] = {}
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


__all__ = ["SEND_BYTES", "Copier", "DataPath", "Near", "Requests"]
