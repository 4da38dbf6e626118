"""Buckets: many small keys of one server pushed and pulled as one (pure: no sockets).

Workers put small dense keys of a dist_sync job into **buckets** when they are initialised
(psnode.worker.bucketing: the same buckets on every worker, in init order).  On the server a bucket is
one contiguous value buffer; its members' values are views into it.  A worker that pushes (or
pulls) every member of a bucket at once sends one operation for the whole bucket, under the
reserved key :func:`psnode.protocol.bucket_key` (``\\0bucket<n>``): its data is the members'
arrays end to end.

Meaning: a bucket push ``q`` is push ``q`` of every member, a bucket pull ``after q`` a pull of
every member after its push ``q``, exactly.  What makes it fast is that while every member is
in the same state (same round, pushes and contributors; nothing parked or early: *fused*), the
bucket keeps that state once and sums, averages and applies the optimizer to the whole buffer
with one numpy call each.  Any operation on a single member (or a bucket push while members
disagree) first *splits* the bucket: each member gets the bucket's state (views of its
buffers), and from then on the members are served one by one by the rounds of single key parts
(psnode.server.rounds).  A bucket fuses again when a bucket operation finds its members in one
state.

:class:`Buckets` is given what it needs, nothing more: the store's :class:`~psnode.server.rounds.Rules`
(read only), the allocator of the store's buffers, ``adopt`` (registers the view answers
carry) and ``push_member`` (a member's push through the rounds of single key parts:
:meth:`psnode.server.rounds.Rounds.push`).  It counts its own pushes, pulls and rounds (one
per member, as if each member had been served alone).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from psnode.math import optimizers as opt_mod
from psnode.math.aggregation import AVERAGE, Aggregation
from psnode.protocol import Ok, Wait
from psnode.server.awaited import Awaited
from psnode.server.keypart import Entry, Key, contiguous, first_gap, received
from psnode.server.replies import OpError, Reply
from psnode.server.rounds import Alloc, Rules

#: a member's push through the rounds of single key parts: (worker, key, entry, seq, data, rows)
PushMember = Callable[[int, Key, Entry, int, np.ndarray, None], list[Reply]]


@dataclass
class Member:
    """A key part whose value is ``value[offset:offset + size]`` of its bucket."""

    key: Key
    entry: Entry
    offset: int
    size: int

    @property
    def span(self) -> slice:
        return slice(self.offset, self.offset + self.size)


@dataclass
class FusedBucket:
    """One bucket: its buffer, its members, and their common state while fused."""

    bid: int
    value: np.ndarray              # 1-d, capacity elements; members' values are views
    members: list[Member] = field(default_factory=list)
    used: int = 0                  # elements covered by members
    fused: bool = False
    sync: bool = True
    aggregation: Aggregation = AVERAGE
    # the members' common state while fused
    round: int = 0
    pushed: dict[int, int] = field(default_factory=dict)
    contributors: set[int] = field(default_factory=set)
    first: np.ndarray | None = None        # the round's first push, by reference
    acc: np.ndarray | None = None          # sum buffer (capacity elements)
    summed: bool = False                   # acc holds the round's sum
    stored: bool = False                   # the round's mean is in value already
    early: dict[int, list[tuple[int, np.ndarray]]] = field(default_factory=dict)
    state: Any = None                      # optimizer state over value[:used]
    view: np.ndarray | None = None         # value[:used], the array answers carry
    # bucket pulls parked (either mode): (worker, request id, after, landing area)
    pulls: list[tuple[int, int, int, np.ndarray | None]] = field(default_factory=list)
    durable: dict[int, int] = field(default_factory=dict)   # worker -> pushes the last checkpoint holds
    alone_at: float = 0.0                  # when the round began to wait for one worker alone
    alone_for: int = -1                    # that worker

    def answer(self, member: Callable[[int], bool]) -> list[Reply]:
        """Bucket pulls whose members all reached their push (the answer: the whole buffer);
        a worker that left (``member(w)`` false) is answered with what there is, ``seq`` 0."""
        if not self.pulls:
            return []
        out, keep = [], []
        for worker, rid, after, dest in self.pulls:
            done = self.round if self.fused else min(m.entry.round for m in self.members)
            if done >= after or (not member(worker) and after > done):
                view = self.view if self.view is not None else self.value[:self.used]
                out.append(Reply(worker, Ok(rid, [view], after if done >= after else 0), dest=dest, shared=True,
                                 fixed=True, holder=self))
            else:
                keep.append((worker, rid, after, dest))
        self.pulls = keep
        return out


class Buckets:
    """The buckets of one store (see the module docstring)."""

    def __init__(self, rules: Rules, alloc: Alloc, adopt: Callable[[np.ndarray], np.ndarray],
                 push_member: PushMember, capacity_bytes: int = 4 * 2**20, awaited: Awaited | None = None) -> None:
        self.rules = rules
        #: whom the others waited for (psnode.server.awaited; the store's, shared with its rounds)
        self.awaited = awaited if awaited is not None else Awaited()
        self.alloc = alloc
        self.adopt = adopt
        self.push_member = push_member
        self.capacity_bytes = capacity_bytes
        self.all: dict[int, FusedBucket] = {}
        self.pushes = 0
        self.pulls = 0
        self.rounds = 0

    # ------------------------------------------------------------ membership
    def place(self, bid: int, offset: int, shape: tuple[int, ...], dtype: np.dtype, sync: bool,
              aggregation: Aggregation) -> np.ndarray:
        """The view of bucket ``bid`` a new member's value lives in (bucket made if needed)."""
        size = int(np.prod(shape, dtype=np.int64))
        b = self.all.get(bid)
        if b is None:
            cap = max(self.capacity_bytes // dtype.itemsize, offset + size)
            b = self.all[bid] = FusedBucket(bid, self.alloc((cap,), dtype), sync=sync, aggregation=aggregation)
        if b.value.dtype != dtype or offset < b.used or offset + size > len(b.value) \
                or b.sync != sync or b.aggregation != aggregation:
            raise ValueError(f"member at {offset} ({size} {dtype}) does not fit bucket {bid}")
        return b.value[offset:offset + size].reshape(shape)

    def join(self, bid: int, key: Key, entry: Entry, offset: int) -> None:
        b = self.all[bid]
        self.split(b)
        b.members.append(Member(key, entry, offset, entry.value.size))
        b.used = offset + entry.value.size
        b.view = self.adopt(b.value[:b.used])
        entry.bucket, entry.fixed = b, True

    # ------------------------------------------------------------ modes
    def split(self, b: FusedBucket) -> None:
        """Give every member the bucket's state and serve them one by one (see above)."""
        if not b.fused:
            return
        b.fused = False
        for m in b.members:
            e, sl, shape = m.entry, m.span, m.entry.value.shape
            e.round, e.pushed, e.contributors = b.round, dict(b.pushed), set(b.contributors)
            e.first = e.spare = None
            e.alone_at, e.alone_for = b.alone_at, b.alone_for   # (the bucket's wait: one per member)
            if b.alone_at:
                self.awaited.opened(b.alone_for, b.alone_at)
            if b.first is not None:
                e.first = b.first[sl].reshape(shape)
            elif b.summed:
                assert b.acc is not None
                e.spare = b.acc[sl].reshape(shape)
            e.early = {w: [(q, d[sl].reshape(shape), None) for q, d in items] for w, items in b.early.items()}
            if b.state is not None:
                e.state = opt_mod.OptState({n: a[sl].reshape(shape) for n, a in b.state.arrays.items()},
                                           b.state.t)
        b.first, b.summed, b.early, b.contributors = None, False, {}, set()
        if b.alone_at:
            self.awaited.closed(b.alone_for)
            b.alone_at, b.alone_for = 0.0, -1

    def split_member(self, entry: Entry) -> None:
        """Serve ``entry``, a member of a bucket, on its own from now on."""
        self.split(cast(FusedBucket, entry.bucket))

    def split_all(self) -> None:
        for b in self.all.values():
            self.split(b)

    def _fuse(self, b: FusedBucket) -> bool:
        """Fuse ``b`` when its members are in one quiet state; True if it is fused."""
        if b.fused:
            return True
        if not b.members or self.rules.check_finite or self.rules.joiners or self.rules.admitted:
            return False   # (members of an elastic job's joiners: served one by one, Rules.need)
        head = b.members[0].entry
        for m in b.members:
            e = m.entry
            if (e.round != head.round or e.pushed != head.pushed or e.contributors or e.early or e.pulls
                    or e.first is not None or e.sparse or not e.sync or e.backup):
                return False
        optimizer = self.rules.optimizer_for(head)
        if optimizer is not None and not self._fuse_state(b, optimizer):
            return False
        b.round, b.pushed, b.contributors = head.round, dict(head.pushed), set()
        b.first, b.summed, b.early, b.fused = None, False, {}, True
        return True

    def _fuse_state(self, b: FusedBucket, optimizer: opt_mod.Optimizer) -> bool:
        """Members' optimizer states as views of one bucket state (copied in when they are not)."""
        states = [m.entry.state for m in b.members]
        if any(s is None for s in states) or len({s.t for s in states}) != 1:
            return False
        names = optimizer.state_names()
        if b.state is None or len(next(iter(b.state.arrays.values()), ())) != b.used \
                or set(b.state.arrays) != set(names):
            b.state = opt_mod.OptState({n: self.alloc((b.used,), b.value.dtype) for n in names})
        b.state.t = states[0].t
        for m in b.members:
            e = m.entry
            for n in names:
                whole = b.state.arrays[n]
                if e.state.arrays[n].base is not whole:
                    whole[m.span] = e.state.arrays[n].reshape(-1)
                    e.state.arrays[n] = whole[m.span].reshape(e.value.shape)
        return True

    # ------------------------------------------------------------ operations
    def bucket(self, bid: int) -> FusedBucket:
        b = self.all.get(bid)
        if b is None or not b.members:
            raise OpError("KeyNotInitialized", f"bucket {bid} is not initialised on this server")
        return b

    def push(self, worker: int, bid: int, seq: int, data: np.ndarray) -> list[Reply]:
        b = self.bucket(bid)
        if data.dtype != b.value.dtype or data.shape != (b.used,):
            raise OpError("ShapeMismatch", f"bucket {bid} holds {b.used} {b.value.dtype.name}; "
                                           f"push sent {list(data.shape)} {data.dtype.name}")
        if not self._fuse(b):   # the exact way: member by member
            out: list[Reply] = []
            for m in b.members:
                out.extend(self.push_member(worker, m.key, m.entry, seq, data[m.span].reshape(m.entry.value.shape),
                                            None))
            return [*out, *b.answer(self.rules.member)]
        if seq <= b.pushed.get(worker, 0) or (b.early and any(q == seq for q, _ in b.early.get(worker, []))):
            return []   # duplicate
        self.pushes += len(b.members)
        if seq != b.round + 1 or worker in b.contributors:
            b.early.setdefault(worker, []).append((seq, data))
            return []
        self._contribute(b, worker, seq, data)
        return self._complete(b)

    def _contribute(self, b: FusedBucket, worker: int, seq: int, data: np.ndarray) -> None:
        b.contributors.add(worker)
        b.pushed[worker] = seq
        left = len(self.rules.active) - len(b.contributors)   # (psnode.server.awaited)
        if left == 1:   # (the one worker it lacks: found once per round)
            b.alone_at, b.alone_for = self.awaited.now(), next(iter(self.rules.active - b.contributors), -1)
            self.awaited.opened(b.alone_for, b.alone_at)
        elif left <= 0 and b.alone_at:
            self.awaited.credit(worker, b.alone_at)
            self.awaited.closed(b.alone_for)
            b.alone_at, b.alone_for = 0.0, -1
        if len(b.contributors) == 1:
            b.first = data
            return
        if b.acc is None:
            b.acc = self.alloc((len(b.value),), b.value.dtype)
        acc = b.acc[:b.used]
        rules = self.rules
        n = len(b.contributors)
        # the push that completes the round of a mean rule also divides into the value, chunk by chunk
        agg = b.aggregation
        last = rules.active <= b.contributors and agg.mean and rules.optimizer_for(b.members[0].entry) is None
        to = b.value[:b.used] if last else None
        agg.fold_scaled(b.first if b.first is not None else acc, data, acc, agg.scale(n) if last else 1.0, to)
        b.first, b.summed, b.stored = None, True, last

    def _complete(self, b: FusedBucket) -> list[Reply]:
        out: list[Reply] = []
        rules = self.rules
        while b.contributors and rules.active <= b.contributors:
            n = len(b.contributors)
            value = b.value[:b.used]
            first = b.first
            agg: np.ndarray = first if first is not None else b.acc[:b.used]   # type: ignore[index]
            optimizer = rules.optimizer_for(b.members[0].entry)
            scale = b.aggregation.scale(n)
            if b.stored:
                b.stored = False
            elif optimizer is None:
                if scale != 1.0:
                    np.multiply(agg, scale, out=value, casting="unsafe")   # divide and store: one pass
                else:
                    np.copyto(value, agg)
            else:
                if scale != 1.0:
                    agg = agg * scale if first is not None else np.multiply(agg, scale, out=agg, casting="unsafe")
                optimizer.update(value, agg, b.state)
            b.round += 1
            self.rounds += len(b.members)
            b.contributors.clear()
            b.first, b.summed = None, False
            if b.alone_at:   # (completed by a worker's loss: credited to nobody)
                self.awaited.closed(b.alone_for)
                b.alone_at, b.alone_for = 0.0, -1
            out.extend(b.answer(self.rules.member))
            for w, items in list(b.early.items()):
                for item in list(items):
                    if item[0] == b.round + 1 and w not in b.contributors:
                        items.remove(item)
                        self._contribute(b, w, item[0], item[1])
                if not items:
                    del b.early[w]
        return out

    def pull(self, worker: int, rid: int, bid: int, after: int, re: bool, dest: np.ndarray | None) -> list[Reply]:
        b = self.bucket(bid)
        self._fuse(b)
        if re and any(w == worker and r == rid for w, r, *_ in b.pulls):
            return [self._wait(b, worker, rid, after)]
        self.pulls += len(b.members)
        b.pulls.append((worker, rid, after, dest))
        return b.answer(self.rules.member)

    def _wait(self, b: FusedBucket, worker: int, rid: int, after: int) -> Reply:
        if b.fused:
            gap = b.pushed.get(worker, 0) + 1
            have = {q for q, _ in b.early.get(worker, [])}
            while gap in have:
                gap += 1
            blockers = sorted(self.rules.active - b.contributors)
        else:
            gap = min(first_gap(m.entry, worker) for m in b.members)
            blockers = sorted(set().union(*(self.rules.need(m.entry) - m.entry.contributors for m in b.members)))
        return Reply(worker, Wait(rid, gap if gap <= after else 0, blockers))

    def answer(self, b: FusedBucket) -> list[Reply]:
        """Bucket pulls of ``b`` its members' rounds let through (:meth:`FusedBucket.answer`)."""
        return b.answer(self.rules.member)

    def received(self, bid: int, worker: int, seq: int) -> bool:
        """Push ``seq`` of ``worker`` was taken by every member of bucket ``bid`` (or it has none)."""
        b = self.all.get(bid)
        if b is None or not b.members:
            return True
        if b.fused:
            return seq <= b.pushed.get(worker, 0) or any(q == seq for q, _ in b.early.get(worker, []))
        return all(received(m.entry, worker, seq) for m in b.members)

    def contiguous(self, bid: int, worker: int) -> int:
        """Pushes of ``worker`` every member of bucket ``bid`` holds without a gap."""
        b = self.bucket(bid)
        if b.fused:
            have = {q for q, _ in b.early.get(worker, [])}
            n = b.pushed.get(worker, 0)
            while n + 1 in have:
                n += 1
            return n
        return min(contiguous(m.entry, worker) for m in b.members)

    def durable(self, bid: int, worker: int) -> int:
        b = self.all.get(bid)
        return 0 if b is None else b.durable.get(worker, 0)

    def mark_durable(self) -> None:
        """(After a checkpoint: members carry their watermarks) each bucket's is its members' lowest."""
        for b in self.all.values():
            if b.members:
                workers = set().union(*(m.entry.durable for m in b.members))
                b.durable = {w: min(m.entry.durable.get(w, 0) for m in b.members) for w in workers}

    def marks_of(self, by_entry: dict[int, dict[int, int]]) -> dict[int, dict[int, int]]:
        """Each bucket's watermarks (by id of the bucket) from its members' (``by_entry``: by id
        of the member's entry): their lowest, as :meth:`mark_durable`."""
        out = {}
        for b in self.all.values():
            if b.members:
                got = [by_entry.get(id(m.entry), {}) for m in b.members]
                out[id(b)] = {w: min(g.get(w, 0) for g in got) for w in set().union(*got)}
        return out

    def members(self, bid: int) -> list[Key]:
        b = self.all.get(bid)
        return [] if b is None else [m.key for m in b.members]


__all__ = ["Buckets", "FusedBucket", "Member"]
