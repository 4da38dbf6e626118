"""A key part's rounds on its server: pushes taken once, summed, completed, applied, and the
pulls that wait for them answered (pure: no I/O).

The semantics are those of psnode.server.store's docstring; this module is their arithmetic.
:class:`Rules` is what every round of one server follows: the workers a round waits for, the
optimizer or Python updater that folds an aggregate into a value, whether non-finite rounds
are skipped.  The store owns it and is its only writer; :class:`Rounds` and
psnode.server.buckets read it.

Contract of :class:`Rounds` (one per store; the store resolves the key part, ``entry``, and
checks what is the store's: compression settings, key creation):

* :meth:`Rounds.push` takes push ``q`` of a worker once (a duplicate, whatever path it came by,
  changes nothing: psnode.server.keypart.received): async pushes are applied at once; sync
  pushes of the round being folded contribute, later ones wait in ``early``.  Pushes fold by
  the part's rule (``entry.aggregation``: psnode.math.aggregation), in place: the first push
  is kept by reference, the second is folded into the spare buffer, and the push that
  completes the round of a mean rule also divides, chunk by chunk while in cache; a
  compressed push is decoded where it is summed (psnode.server.compressed.Packed; a rule that
  does not add decodes it first).
* :meth:`Rounds.complete` completes rounds every active worker contributed to (rows of
  row_sparse keys combined, non-finite rounds skipped when asked), answers the pulls that
  waited for them (the key part's, and its bucket's: psnode.server.keypart.Group), and lets
  waiting pushes of the next round in.  An aggregate is folded into the value by the updater,
  the optimizer, or the value becomes it (a spare buffer is swapped in: a value a send still
  reads is never written, psnode.server.replies).
* :meth:`Rounds.pull` parks a pull until the push it follows was applied (on a dist_ssp part,
  also until the slowest gating worker is within the staleness bound: psnode.server.staleness);
  a resent pull still parked is answered ``Wait`` naming the first push missing and the workers
  the round (or the bound) waits for.

**Backup workers** (``Entry.backup`` = b > 0, dist_sync only: :meth:`Rules.done`).  Round
``r`` of a key part completes when all but b of the workers it waits for pushed their push
``r``; its aggregate is of those pushes (a mean rule divides by their number).  Invariant
(exactly once): a push ``r`` is applied iff it arrived while round ``r`` was being summed; a
push ``r`` arriving after round ``r`` completed is *late*: dropped, counted
(psnode.server.awaited), and taken (``pushed`` counts it, so a resend is a duplicate, and a
restarted worker resumes after it).  So a round may drop only pushes of its own number that
came after it completed, never one it summed, and no push is applied twice: ``pushed`` and
the completed round travel together in checkpoints and replicas, and an answer that reveals a
round is preceded by a checkpoint that holds it (psnode.server.store), so a restored server
drops or sums each resent push exactly as before.  A late push is dropped rather than added
to the next round: the next round's aggregate is then a gradient at one set of parameters
(Chen et al., "Revisiting Distributed Synchronous SGD", 2016), and a persistent straggler
never feeds its stale gradient in.  b = 0 is dist_sync, bit for bit (the same code path).

Whom the others waited for (psnode.server.awaited): the push that completes a round which
lacked that one worker's push alone, and the push that lets a dist_ssp pull parked on the
bound through, are credited with the wait, O(1) per round.

Each returns the replies it causes.  The counters ``pushes``, ``pulls`` and ``rounds`` count
what went through here (a fused bucket counts its own: psnode.server.buckets).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Set
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from psnode.math import optimizers as opt_mod
from psnode.math.sparse import RowSparseArray
from psnode.math.sparse import combine_rows as _combine_rows
from psnode.protocol import Ok, Wait
from psnode.server import staleness as bound
from psnode.server.awaited import Awaited
from psnode.server.compressed import Packed
from psnode.server.keypart import Entry, Key, RowPin, first_gap, fmt, mark_async, note_change, note_touch, received
from psnode.server.replies import OpError, Reply, fits

Alloc = Callable[[tuple[int, ...], np.dtype], np.ndarray]
#: a Python updater ``updater(key, recv, stored)`` ('local' stores: kv.set_updater); it folds
#: each aggregate into the value in place, before (instead of) the optimizer
Updater = Callable[[Any, Any, np.ndarray], None]


@dataclass
class Rules:
    """What every round of one server follows (see the module docstring).

    **Who a round waits for** (:meth:`need`).  Round ``r`` of a key part completes when every
    member ``w`` whose start round there is ``<= r`` has pushed its push ``r``.  A member of
    the first generation starts at round 1 everywhere; a worker that joined the running job
    (``joiners``, from the scheduler's MEMBERSHIP) takes part in a key part only from the
    start its JOIN agreed with that part (``Entry.start``), and a JOIN makes it a member there
    even before the MEMBERSHIP naming it arrives (``admitted``: joiner -> the generation it was
    admitted in).  A member removed by a MEMBERSHIP of that generation or later (it left, was
    lost) no longer counts; its pushes that arrived are kept (they count in their rounds, and
    a mean rule divides by each round's contributors)."""

    active: set[int]                          # the members (MEMBERSHIP)
    check_finite: bool = False                # skip a round (or async push) holding inf or NaN
    optimizer: opt_mod.Optimizer | None = None
    updater: Updater | None = None
    joiners: set[int] = field(default_factory=set)          # active ranks that joined the running job
    admitted: dict[int, int] = field(default_factory=dict)  # joiner -> generation of its JOIN
    generation: int = 0                                     # of the last MEMBERSHIP taken

    def optimizer_for(self, entry: Entry) -> opt_mod.Optimizer | None:
        """Optimizers update floating-point keys; other keys take the aggregate as is."""
        return self.optimizer if entry.value.dtype.kind == "f" else None

    def need(self, entry: Entry) -> Set[int]:
        """The workers the next round of ``entry`` (``entry.round + 1``) waits for."""
        if not entry.start and not self.joiners:
            return self.active   # (every member from round 1: the common case)
        r = entry.round + 1
        need = {w for w in self.active if w not in self.joiners and w not in entry.start}
        need.update(w for w, s in entry.start.items() if s <= r)
        return need

    def gating(self, entry: Entry) -> Set[int]:
        """The workers whose clocks bound the pulls of a dist_ssp part (psnode.server.staleness):
        the members taking part there (a joiner once it agreed its start with the part)."""
        if not entry.start and not self.joiners:
            return self.active
        need = {w for w in self.active if w not in self.joiners and w not in entry.start}
        need.update(entry.start)
        return need

    def done(self, entry: Entry) -> bool:
        """Does the round of ``entry`` being summed complete: every worker it waits for pushed
        (with ``entry.backup`` = b, all but b of them: backup workers)."""
        need = self.need(entry)
        if not entry.backup:
            return need <= entry.contributors
        return len(need & entry.contributors) >= max(1, len(need) - entry.backup)

    def member(self, worker: int) -> bool:
        """Does ``worker`` take part (a member, or a joiner admitted and not removed)?"""
        return worker in self.active or worker in self.admitted


class Rounds:
    """The rounds of the key parts of one store (see the module docstring).  ``alloc(shape,
    dtype)`` gives the buffers sums live in; ``notify`` takes human-readable notices (e.g. a
    skipped non-finite round)."""

    def __init__(self, rules: Rules, alloc: Alloc, notify: Callable[[str], None],
                 awaited: Awaited | None = None) -> None:
        self.rules = rules
        self.alloc = alloc
        self.notify = notify
        #: whom the others waited for, and the late pushes dropped (psnode.server.awaited)
        self.awaited = awaited if awaited is not None else Awaited()
        self.pushes = 0
        self.pulls = 0
        self.rounds = 0
        self.track = False   # record what each aggregate changes (psnode.server.keypart.note_change)

    # ---------------------------------------------------------------- push
    def push(self, worker: int, key: Key, entry: Entry, seq: int, data: np.ndarray | Packed,
             rows: np.ndarray | None) -> list[Reply]:
        """Take push ``seq`` of ``worker`` (once); the replies it causes (completed pulls)."""
        if isinstance(data, np.ndarray):   # (a Packed one was checked by packed_push)
            self._validate_push(key, entry, data, rows)
        if received(entry, worker, seq):
            return []  # duplicate: applied once
        self.pushes += 1
        check_finite = self.rules.check_finite
        if isinstance(data, Packed) and (check_finite or not entry.sync or not entry.aggregation.additive):
            data = data.decode()   # (else a sync round decodes it where it sums it: _contribute)
        if not entry.sync:
            assert isinstance(data, np.ndarray)
            if check_finite and data.dtype.kind == "f" and not np.isfinite(data).all():
                entry.skipped += 1
                self.notify(f"{fmt(*key)}: push {seq} of worker {worker} skipped: non-finite")
            else:
                if rows is not None:
                    rows, data = _combine_rows([(rows, data)])
                self._apply(key, entry, data, rows, 1, mean=False)
            mark_async(entry, worker, seq)
            if not entry.pulls:
                return self.answer_pulls(entry)
            parked = len(entry.pulls)
            out = self.answer_pulls(entry)
            if entry.alone_at and len(entry.pulls) < parked:   # (a dist_ssp pull let through)
                self.awaited.credit(worker, entry.alone_at)
                self._stop_waiting(entry)
                self._bound_wait(entry)
            return out
        if seq <= entry.round and entry.backup:
            return self._late(entry, worker, seq, data, rows)
        if seq != entry.round + 1 or worker in entry.contributors:
            entry.early.setdefault(worker, []).append((seq, data, rows))
            return []
        self._contribute(entry, worker, seq, data, rows)
        return self.complete(key, entry)

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

    def _late(self, entry: Entry, worker: int, seq: int, data: np.ndarray | Packed,
              rows: np.ndarray | None) -> list[Reply]:
        """Push ``seq`` of ``worker`` came after its round completed without it (backup
        workers): dropped and counted, and taken (a resend of it is a duplicate).  Pushes of
        ``worker`` waiting behind it whose rounds completed too go the same way."""
        entry.early.setdefault(worker, []).append((seq, data, rows))
        queue = entry.early[worker]
        while True:
            nxt = entry.pushed.get(worker, 0) + 1
            item = next((i for i in queue if i[0] == nxt), None)
            if item is None or nxt > entry.round:
                break
            queue.remove(item)
            entry.pushed[worker] = nxt
            self.awaited.dropped(worker)
        if not queue:
            del entry.early[worker]
        return self.answer_pulls(entry)

    def _contribute(self, entry: Entry, worker: int, seq: int, data: np.ndarray | Packed,
                    rows: np.ndarray | None) -> None:
        entry.contributors.add(worker)
        if not entry.backup:   # (whom the others waited for: psnode.server.awaited)
            need = self.rules.need(entry)
            left = len(need) - len(entry.contributors)
            if left == 1:   # (the one worker it lacks: found once per round)
                self._start_waiting(entry, next(iter(need - entry.contributors), -1))
            elif left <= 0 and entry.alone_at:
                self.awaited.credit(worker, entry.alone_at)
                self._stop_waiting(entry)
        if isinstance(data, Packed):   # (dense sync, check_finite off: see push)
            self._contribute_packed(entry, data)
            entry.pushed[worker] = seq
            return
        if self.rules.check_finite and data.dtype.kind == "f" and not np.isfinite(data).all():
            entry.nonfinite.add(worker)
        entry.pushed[worker] = seq
        if rows is not None or entry.sparse:
            if rows is None:  # a dense push to a row_sparse key: every row
                rows = np.arange(entry.value.shape[0])
            entry.sparse_parts.append((rows, data))
        elif len(entry.contributors) == 1:
            entry.first = data
        else:
            # the push that completes the round of a mean rule also divides, chunk by chunk while in cache
            n = len(entry.contributors)
            rules = self.rules
            agg = entry.aggregation
            last = agg.mean and rules.done(entry) and not entry.nonfinite \
                and rules.optimizer_for(entry) is None
            scale = agg.scale(n) if last else 1.0
            if entry.first is not None:
                entry.spare = self._fresh(entry.spare, entry.spare_sends, entry.value)
                entry.spare_sends = []
                agg.fold_scaled(entry.first, data, entry.spare, scale)
                entry.first = None
            else:
                assert entry.spare is not None
                agg.fold_scaled(entry.spare, data, entry.spare, scale)
            entry.scaled = last

    def _contribute_packed(self, entry: Entry, data: Packed) -> None:
        """A compressed push into the round's sum: the first is decoded into the spare buffer,
        the others decoded and added chunk by chunk (the last one also averaging), so no push
        gets a float32 array of its own.  Values are those of decoding, then _contribute."""
        if len(entry.contributors) == 1:
            entry.spare = self._fresh(entry.spare, entry.spare_sends, entry.value)
            entry.spare_sends = []
            data.into(entry.spare)
            entry.first, entry.scaled = None, False
            return
        last = self.rules.done(entry) and entry.aggregation.mean and \
            self.rules.optimizer_for(entry) is None
        n = len(entry.contributors)
        if entry.first is not None:   # (a float32 first push: only a worker whose setting changed)
            entry.spare = self._fresh(entry.spare, entry.spare_sends, entry.value)
            entry.spare_sends = []
            np.copyto(entry.spare, entry.first)
            entry.first = None
        assert entry.spare is not None
        data.add_into(entry.spare, 1.0 / n if last else 1.0)
        entry.scaled = last

    # ---------------------------------------------------------------- completion
    def complete(self, key: Key, entry: Entry) -> list[Reply]:
        """Complete every round of ``entry`` the active workers all contributed to; the pulls
        (the key part's and its bucket's) that lets through."""
        out: list[Reply] = []
        rules = self.rules
        while entry.contributors and rules.done(entry):
            n = len(entry.contributors)
            if entry.nonfinite:
                entry.skipped += 1
                self.notify(f"{fmt(*key)}: round {entry.round + 1} skipped: non-finite "
                            f"gradient from worker(s) {sorted(entry.nonfinite)}")
                entry.nonfinite.clear()
            elif entry.sparse:
                rows, data = entry.aggregation.fold_rows(entry.sparse_parts, self._row_sum(entry))
                mean = entry.aggregation.mean
                if mean and n > 1 and data.dtype.kind == "f":   # a fresh array: in place
                    np.divide(data, n, out=data)                   # (the values of data / n)
                    mean = False
                self._apply(key, entry, data, rows, n, mean)
            else:
                agg = entry.first if entry.first is not None else entry.spare
                assert agg is not None
                entry.first = None
                self._apply(key, entry, agg, None, n, entry.aggregation.mean)
            entry.round += 1
            self.rounds += 1
            entry.contributors.clear()
            if entry.alone_at:   # (completed by a worker's loss: credited to nobody)
                self._stop_waiting(entry)
            entry.sparse_parts.clear()
            out.extend(self.answer_pulls(entry))
            if entry.bucket is not None:
                out.extend(entry.bucket.answer(rules.member))
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
               mean: bool) -> None:
        """Fold an aggregate into the value (``mean``: ``data`` is still to be divided by ``n``).

        ``data`` is either the entry's spare buffer (a fold of several pushes: scaled in place,
        then swapped with the value when there is no optimizer), a fresh array, or a received
        read-only push.  The value is never written while a zero-copy send still reads it.
        """
        if mean and n > 1:
            if data is entry.spare:
                if not entry.scaled:
                    np.multiply(data, 1.0 / n, out=data, casting="unsafe")
            else:
                data = data / n
        entry.scaled = False
        if rows is not None and not entry.sparse:
            rows = None
        updater = self.rules.updater
        note_touch(entry, rows if updater is None else None)
        if self.track:
            note_change(entry, rows)
        if updater is not None:
            value = self._own(entry)
            updater(key[0], data if rows is None else RowSparseArray(data, rows, value.shape), value)
            return
        optimizer = self.rules.optimizer_for(entry)
        if optimizer is None and rows is None and data is entry.spare and not entry.fixed:
            entry.value, entry.spare = entry.spare, entry.value
            entry.spare_sends, entry.value_sends = entry.value_sends, []
            return
        value = self._own(entry, rows)
        if optimizer is None:
            if rows is None:
                np.copyto(value, data)
            elif len(rows):
                value[rows] = data
            return
        if entry.state is None:
            entry.state = optimizer.create_state(value)
        elif entry.state_pin is not None and not entry.state_pin.done:
            if rows is not None and isinstance(entry.state_pin, RowPin):   # (rows saved by _own)
                entry.state_pin.save(rows)
            else:   # (copy on write)
                entry.state = opt_mod.OptState({k: a.copy() for k, a in entry.state.arrays.items()}, entry.state.t)
                entry.state_pin = None
        else:
            entry.state_pin = None
        if rows is None:
            optimizer.update(value, data, entry.state)
        elif len(rows):
            optimizer.update_rows(value, np.asarray(rows, np.int64), data, entry.state)

    def _own(self, entry: Entry, rows: np.ndarray | None = None) -> np.ndarray:
        """The entry's value, safe to write in place (``rows``: those rows only; copied if a send
        still reads it, but where only whole copies read it (RowPin) the rows are saved for them
        and written in place; a fixed value is never sent without a copy)."""
        reading = [t for t in entry.value_sends if not t.done]
        if not entry.fixed and (not entry.value.flags.writeable or reading):
            if rows is not None and entry.value.flags.writeable and all(isinstance(t, RowPin) for t in reading):
                for pin in reading:
                    pin.save(rows)
                entry.value_sends = reading
                return entry.value
            value = self.alloc(entry.value.shape, entry.value.dtype)
            np.copyto(value, entry.value)
            entry.value = value
        entry.value_sends = []
        return entry.value

    def _fresh(self, buf: np.ndarray | None, sends: list[Any], like: np.ndarray) -> np.ndarray:
        """``buf`` if it is writable and no send still reads it; else a new buffer like ``like``."""
        if buf is not None and buf.flags.writeable and buf.shape == like.shape and all(t.done for t in sends):
            return buf
        return self.alloc(like.shape, like.dtype)

    # ---------------------------------------------------------------- pulls
    def pull(self, worker: int, rid: int, key: Key, entry: Entry, after: int, rows: np.ndarray | None,
             re: bool, dest: np.ndarray | None = None) -> list[Reply]:
        """Park request ``rid``: a pull of ``entry`` once push ``after`` of ``worker`` was applied
        (``rows``: those rows only; ``dest``: its landing area); answered now if it was."""
        if rows is not None and (rows.ndim != 1 or rows.dtype.kind not in "iu"
                                 or (len(rows) and (rows.min() < 0 or rows.max() >= entry.value.shape[0]))):
            raise OpError("ShapeMismatch", f"{fmt(*key)}: row ids must be in 0..{entry.value.shape[0] - 1}")
        if re and any(w == worker and r == rid for w, r, *_ in entry.pulls):
            # still parked: the pull was not lost ... but it may wait for a push of this worker
            # that never came (gap), or for other workers (blockers)
            gap = first_gap(entry, worker)
            if entry.sync:
                blockers = sorted(self.rules.need(entry) - entry.contributors)
            elif entry.staleness >= 0:
                blockers = bound.blockers(entry.pushed, self.rules.gating(entry), after, entry.staleness)
            else:
                blockers = []
            return [Reply(worker, Wait(rid, gap if gap <= after else 0, blockers))]
        self.pulls += 1
        if not entry.pulls and entry.alone_at:   # (its pulls were let through by a worker's loss)
            self._stop_waiting(entry)
        entry.pulls.append((worker, rid, after, rows, dest))
        out = self.answer_pulls(entry)
        if not entry.alone_at:
            self._bound_wait(entry)
        return out

    def _start_waiting(self, entry: Entry, worker: int) -> None:
        entry.alone_at, entry.alone_for = self.awaited.now(), worker
        self.awaited.opened(worker, entry.alone_at)

    def _stop_waiting(self, entry: Entry) -> None:
        self.awaited.closed(entry.alone_for)
        entry.alone_at, entry.alone_for = 0.0, -1

    def _bound_wait(self, entry: Entry) -> None:
        """A dist_ssp part whose pulls wait for the bound: a wait for its slowest gating worker
        (psnode.server.staleness; found once per wait)."""
        if entry.pulls and entry.staleness >= 0 and not entry.sync:
            after = entry.pulls[0][2]
            slow = bound.blockers(entry.pushed, self.rules.gating(entry), after, entry.staleness)
            if slow:
                self._start_waiting(entry, slow[0])

    def answer_pulls(self, entry: Entry) -> list[Reply]:
        """The parked pulls of ``entry`` whose push was applied (a worker that left is answered
        with what there is, ``seq`` 0)."""
        out, keep = [], []
        member = self.rules.member
        staleness = -1 if entry.sync else entry.staleness
        low: int | None = None
        if staleness >= 0 and entry.pulls:
            low = bound.floor(entry.pushed, self.rules.gating(entry))
        for worker, rid, after, rows, dest in entry.pulls:
            done = entry.round if entry.sync else entry.pushed.get(worker, 0)
            if staleness >= 0 and done >= after and not bound.ready(after, staleness, done, low) \
                    and member(worker):   # (a worker that left is answered with what there is)
                keep.append((worker, rid, after, rows, dest))
                continue
            if done >= after or (entry.sync and not member(worker) and after > done):
                seq = after if done >= after else 0   # (received; restartable: stamped durable)
                if rows is None:
                    out.append(Reply(worker, Ok(rid, [entry.value], seq), entry, dest, entry.sync, False, entry))
                elif fits(dest, (len(rows), *entry.value.shape[1:]), entry.value.dtype):
                    assert dest is not None
                    np.take(entry.value, rows, axis=0, out=dest)   # straight into the landing area
                    out.append(Reply(worker, Ok(rid, [dest], seq), holder=entry))
                else:
                    out.append(Reply(worker, Ok(rid, [entry.value[rows]], seq), holder=entry))
            else:
                keep.append((worker, rid, after, rows, dest))
        entry.pulls = keep
        return out


__all__ = ["Alloc", "Rounds", "Rules", "Updater"]
