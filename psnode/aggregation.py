"""Server-side key store: sync rounds, async apply, parked pulls, dense and row_sparse.

Pure logic (no sockets): :meth:`Store.handle` takes one typed operation (psnode.protocol) from
one worker and returns the replies it causes (possibly to other workers, e.g. pulls parked
until a round completed).  A bad operation is answered ``Failed``, never raised.

Semantics (per key part held by this server):

* ``init``: the first init carrying an array (rank 0's) creates the key; inits of other workers
  carry only dtype and shape and are answered once the key exists.  Every init reply holds the
  stored value, so all workers end up with rank 0's array.  Another shape or dtype is an error.
* ``push`` with per-(worker, key) sequence number ``q`` (1, 2, ...):
  - sync: push ``q`` belongs to round ``q``.  A push for a later round than the one being
    aggregated waits (a fast worker never leaks into the current round).  When every active
    worker has contributed, the round completes: sum, divided by the number of contributors for
    ``average``; then the optimizer, or the value becomes the aggregate.
  - async: applied on arrival (the optimizer, or the value becomes the push).
  - a push whose ``q`` was already accepted is a duplicate: acknowledged, not applied again.
    (Workers resend pushes a lost message or a restarted server may have missed; async pushes
    arriving out of order are applied once each, and ``pushed`` counts only the contiguous ones.)
* ``pull`` with ``after = n``: answered once the worker's push ``n`` has been applied (sync: round
  ``n`` completed), so a pull after a push always sees it.  ``rows`` selects rows (row_sparse).
  A resent pull (``re``) still parked is answered ``wait`` (the server holds it; nothing lost).
* ``pushpull``: a push, then a pull after it: one request and one answer per key part.
* :meth:`Store.rebase` after a server restored its shard from a checkpoint: each key part's
  round becomes the later of the checkpoint's and the workers' confirmed rounds, so pushes the
  workers resend are applied once, and rounds the checkpoint already holds are not applied twice.
* row_sparse pushes carry (row ids, rows); rows are combined per round (duplicates summed),
  averaged over the contributors as if missing rows were zero, and applied lazily: only rows
  present change (without an optimizer those rows take the aggregate; others keep their value).
* Workers leave (``set_active``): rounds then complete over the workers still active.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from psnode import optimizer as opt_mod
from psnode.errors import PSError, kind_of
from psnode.protocol import (
    Answer,
    Failed,
    Flush,
    GetStates,
    Init,
    LoadStates,
    Missing,
    Ok,
    Op,
    OpCode,
    Pull,
    Push,
    PushPull,
    Resync,
    SetOptimizer,
    Wait,
)
from psnode.sparse import combine_rows as _combine_rows

Key = tuple[Any, int]  # (user key, part index)
Alloc = Callable[[tuple[int, ...], np.dtype], np.ndarray]


@dataclass
class Reply:
    """An answer to one operation, for ``worker``.  With ``entry``, ``answer.arrays[0]`` is that
    entry's value: the sender must call :func:`sent` once the send was issued (with its
    tracker, if any)."""

    worker: int
    answer: Answer
    entry: Entry | None = None

    def __post_init__(self) -> None:
        if self.entry is not None:
            self.entry.value_sends.append(UNSENT)


def sent(entry: Entry, tracker: Any | None) -> None:
    """A reply carrying ``entry.value`` went out; ``tracker`` tells when zmq is done with it."""
    if UNSENT in entry.value_sends:
        entry.value_sends.remove(UNSENT)
    if tracker is not None:
        entry.value_sends.append(tracker)


@dataclass
class Entry:
    value: np.ndarray
    sparse: bool
    sync: bool
    average: bool
    round: int = 0
    first: np.ndarray | None = None   # the round's first dense push, by reference
    spare: np.ndarray | None = None   # buffer the next aggregate is summed into
    spare_sends: list[Any] = field(default_factory=list)
    contributors: set[int] = field(default_factory=set)
    sparse_parts: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    early: dict[int, list[tuple[int, np.ndarray, np.ndarray | None]]] = field(default_factory=dict)
    pushed: dict[int, int] = field(default_factory=dict)
    ahead: dict[int, set[int]] = field(default_factory=dict)  # async: applied beyond a gap
    pulls: list[tuple[int, int, int, np.ndarray | None]] = field(default_factory=list)
    state: Any = None
    value_sends: list[Any] = field(default_factory=list)  # zero-copy sends reading ``value``
    nonfinite: set[int] = field(default_factory=set)   # workers whose push this round was bad
    skipped: int = 0


class _Unsent:
    """Marks a value referenced by a reply not sent yet: it must not be written."""

    done = False


UNSENT = _Unsent()


class OpError(Exception):
    """A request refused; ``kind`` names the exception the worker raises."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _fmt(key: Any, part: int) -> str:
    return f"key {key!r}" + (f" part {part}" if part else "")


class Store:
    """All key parts of one server.  ``alloc(shape, dtype)`` gives the buffers values and
    aggregates live in (e.g. shared memory); default: plain numpy arrays."""

    def __init__(self, num_workers: int, check_finite: bool = False, alloc: Alloc | None = None) -> None:
        self.entries: dict[Key, Entry] = {}
        self.active: set[int] = set(range(num_workers))
        self.optimizer: opt_mod.Optimizer | None = None
        self.check_finite = check_finite
        self.alloc: Alloc = alloc or (lambda shape, dtype: np.empty(shape, dtype))
        self.waiting_inits: dict[Key, list[tuple[int, Init]]] = {}
        self.pushes = 0
        self.pulls = 0
        self.rounds = 0
        self.events: list[str] = []  # human-readable notices (e.g. skipped non-finite rounds)
        self._handlers: dict[int, Callable[[int, Any], list[Reply]]] = {
            OpCode.INIT: self._init, OpCode.PUSH: self._push, OpCode.PULL: self._pull,
            OpCode.PUSHPULL: self._pushpull, OpCode.FLUSH: self._flush, OpCode.RESYNC: self._resync,
            OpCode.SET_OPTIMIZER: self._set_optimizer, OpCode.GET_STATES: self._get_states,
            OpCode.LOAD_STATES: self._load_states}

    # ---------------------------------------------------------------- dispatch
    def handle(self, worker: int, op: Op) -> list[Reply]:
        """The replies ``op`` from ``worker`` causes (possibly to other workers); never raises."""
        try:
            handler = self._handlers.get(getattr(op, "code", -1))
            if handler is None:
                raise OpError("ProtocolError", f"unknown operation {type(op).__name__}")
            return handler(worker, op)
        except OpError as exc:
            kind, message = exc.kind, str(exc)
        except PSError as exc:  # e.g. ShapeMismatch from an optimizer
            kind, message = kind_of(exc), str(exc)
        except Exception as exc:  # noqa: BLE001 - a bad request never kills the server
            kind, message = "ProtocolError", f"malformed request: {exc!r}"
        # na: nobody waits for it; the worker raises it at its next call
        return [Reply(worker, Failed(getattr(op, "id", 0), kind, message, bool(getattr(op, "na", False))))]

    def _entry(self, key: Key) -> Entry:
        entry = self.entries.get(key)
        if entry is None:
            raise OpError("KeyNotInitialized",
                          f"{_fmt(*key)} is not initialised on this server: call kv.init first")
        return entry

    def _new(self, like: np.ndarray) -> np.ndarray:
        return self.alloc(like.shape, like.dtype)

    # ---------------------------------------------------------------- init
    def _init(self, worker: int, op: Init) -> list[Reply]:
        key = (op.key, op.part)
        entry = self.entries.get(key)
        if entry is not None:  # (also a restarted worker: it resumes its push count)
            self._check_meta(key, entry, op.dtype, op.shape)
            return [Reply(worker, Ok(op.id, [entry.value], seq=self._accepted(entry, worker)), entry)]
        if op.value is None:
            waiting = self.waiting_inits.setdefault(key, [])
            if op.re and any(w == worker and o.id == op.id for w, o in waiting):
                return [Reply(worker, Wait(op.id))]
            waiting.append((worker, op))
            return []
        if op.value.dtype.name != op.dtype or op.value.shape != tuple(op.shape):
            raise OpError("ShapeMismatch", f"{_fmt(*key)}: init array does not match its description")
        value = self._new(op.value)
        np.copyto(value, op.value)
        entry = Entry(value=value, sparse=op.sparse, sync=op.sync, average=op.average)
        optimizer = self._optimizer_for(entry)
        if optimizer is not None:
            entry.state = optimizer.create_state(entry.value)
        self.entries[key] = entry
        out = [Reply(worker, Ok(op.id, [entry.value]), entry)]
        for w, other in self.waiting_inits.pop(key, []):
            try:
                self._check_meta(key, entry, other.dtype, other.shape)
                out.append(Reply(w, Ok(other.id, [entry.value], seq=self._accepted(entry, w)), entry))
            except OpError as exc:
                out.append(Reply(w, Failed(other.id, exc.kind, str(exc))))
        return out

    @staticmethod
    def _accepted(entry: Entry, worker: int) -> int:
        """How many pushes of ``worker`` this key part has taken (applied or waiting)."""
        early = [seq for seq, *_ in entry.early.get(worker, [])]
        return max([entry.pushed.get(worker, 0), *early, *entry.ahead.get(worker, ())])

    @staticmethod
    def _check_meta(key: Key, entry: Entry, dtype: str, shape: tuple[int, ...]) -> None:
        if entry.value.dtype.name != dtype or entry.value.shape != tuple(shape):
            raise OpError("ShapeMismatch",
                          f"{_fmt(*key)} was initialised as {entry.value.dtype.name}"
                          f"{list(entry.value.shape)}, not {dtype}{list(shape)}")

    # ---------------------------------------------------------------- push
    def _push(self, worker: int, op: Push) -> list[Reply]:
        out = self._take_push(worker, (op.key, op.part), op.seq, op.data, op.rows)
        return out if op.na else [Reply(worker, Ok(op.id)), *out]

    def _take_push(self, worker: int, key: Key, seq: int, data: np.ndarray,
                   rows: np.ndarray | None) -> list[Reply]:
        """Accept push ``seq`` of ``worker`` (once); the replies it causes (completed pulls)."""
        entry = self._entry(key)
        self._validate_push(key, entry, data, rows)
        if _received(entry, worker, seq):
            return []  # duplicate: applied once
        self.pushes += 1
        if not entry.sync:
            if self.check_finite and data.dtype.kind == "f" and not np.isfinite(data).all():
                entry.skipped += 1
                self.events.append(f"{_fmt(*key)}: push {seq} of worker {worker} skipped: non-finite")
            else:
                if rows is not None:
                    rows, data = _combine_rows([(rows, data)])
                self._apply(key, entry, data, rows, 1, average=False)
            _mark_async(entry, worker, seq)
            return self._answer_pulls(entry)
        if seq != entry.round + 1 or worker in entry.contributors:
            entry.early.setdefault(worker, []).append((seq, data, rows))
            return []
        self._contribute(entry, worker, seq, data, rows)
        return self._maybe_complete(key, entry)

    def _validate_push(self, key: Key, entry: Entry, data: np.ndarray, rows: np.ndarray | None) -> None:
        want = entry.value
        if data.dtype != want.dtype:
            raise OpError("ShapeMismatch", f"{_fmt(*key)} holds {want.dtype.name}, push sent {data.dtype.name}")
        if rows is None:
            if data.shape != want.shape:
                raise OpError("ShapeMismatch",
                              f"{_fmt(*key)} has shape {list(want.shape)}, push sent {list(data.shape)}")
            return
        if not entry.sparse:
            raise OpError("ShapeMismatch", f"{_fmt(*key)} is dense; a row_sparse push was sent")
        if rows.ndim != 1 or rows.dtype.kind not in "iu" or data.shape != (len(rows), *want.shape[1:]):
            raise OpError("ShapeMismatch",
                          f"{_fmt(*key)}: row_sparse push with {len(rows)} ids and data {list(data.shape)}")
        if len(rows) and (rows.min() < 0 or rows.max() >= want.shape[0]):
            raise OpError("ShapeMismatch", f"{_fmt(*key)}: row id out of range 0..{want.shape[0] - 1}")

    def _contribute(self, entry: Entry, worker: int, seq: int, data: np.ndarray, rows: np.ndarray | None) -> None:
        entry.contributors.add(worker)
        if self.check_finite and data.dtype.kind == "f" and not np.isfinite(data).all():
            entry.nonfinite.add(worker)
        entry.pushed[worker] = seq
        if rows is not None or entry.sparse:
            if rows is None:  # a dense push to a row_sparse key: every row
                rows = np.arange(entry.value.shape[0])
            entry.sparse_parts.append((rows, data))
        elif len(entry.contributors) == 1:
            entry.first = data
        elif entry.first is not None:
            entry.spare = _fresh(entry.spare, entry.spare_sends, entry.value, self._new)
            entry.spare_sends = []
            np.add(entry.first, data, out=entry.spare)
            entry.first = None
        else:
            assert entry.spare is not None
            np.add(entry.spare, data, out=entry.spare)

    def _maybe_complete(self, key: Key, entry: Entry) -> list[Reply]:
        out: list[Reply] = []
        while entry.contributors and self.active <= entry.contributors:
            n = len(entry.contributors)
            if entry.nonfinite:
                entry.skipped += 1
                self.events.append(f"{_fmt(*key)}: round {entry.round + 1} skipped: non-finite "
                                   f"gradient from worker(s) {sorted(entry.nonfinite)}")
                entry.nonfinite.clear()
            elif entry.sparse:
                rows, data = _combine_rows(entry.sparse_parts)
                self._apply(key, entry, data, rows, n, entry.average)
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
            for w, queue in list(entry.early.items()):  # pushes waiting for this round
                for item in list(queue):
                    if item[0] == entry.round + 1 and w not in entry.contributors:
                        queue.remove(item)
                        self._contribute(entry, w, item[0], item[1], item[2])
                if not queue:
                    del entry.early[w]
        return out

    def _apply(self, key: Key, entry: Entry, data: np.ndarray, rows: np.ndarray | None, n: int,
               average: bool) -> None:
        """Fold an aggregate into the value.

        ``data`` is either the entry's spare buffer (a sum of several pushes: scaled in place,
        then swapped with the value when there is no optimizer), a fresh array, or a received
        read-only push.  The value is never written while a zero-copy send still reads it.
        """
        if average and n > 1:
            if data is entry.spare:
                np.multiply(data, 1.0 / n, out=data, casting="unsafe")
            else:
                data = data / n
        if rows is not None and not entry.sparse:
            rows = None
        optimizer = self._optimizer_for(entry)
        if optimizer is None and rows is None and data is entry.spare:
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
        """The entry's value, safe to write in place (copied if a send still reads it)."""
        if not entry.value.flags.writeable or not all(t.done for t in entry.value_sends):
            value = self._new(entry.value)
            np.copyto(value, entry.value)
            entry.value = value
        entry.value_sends = []
        return entry.value

    def _optimizer_for(self, entry: Entry) -> opt_mod.Optimizer | None:
        """Optimizers update floating-point keys; other keys take the aggregate as is."""
        return self.optimizer if entry.value.dtype.kind == "f" else None

    # ---------------------------------------------------------------- pull
    def _pull(self, worker: int, op: Pull) -> list[Reply]:
        return self._park_pull(worker, op.id, (op.key, op.part), op.after, op.rows, op.re)

    def _park_pull(self, worker: int, rid: int, key: Key, after: int, rows: np.ndarray | None,
                   re: bool) -> list[Reply]:
        entry = self._entry(key)
        if rows is not None and (rows.ndim != 1 or rows.dtype.kind not in "iu"
                                 or (len(rows) and (rows.min() < 0 or rows.max() >= entry.value.shape[0]))):
            raise OpError("ShapeMismatch", f"{_fmt(*key)}: row ids must be in 0..{entry.value.shape[0] - 1}")
        if re and any(w == worker and r == rid for w, r, *_ in entry.pulls):
            # still parked: the pull was not lost ... but it may wait for a push of this worker
            # that never came (gap), or for other workers (blockers)
            gap = _first_gap(entry, worker)
            blockers = sorted(self.active - entry.contributors) if entry.sync else []
            return [Reply(worker, Wait(rid, gap if gap <= after else 0, blockers))]
        self.pulls += 1
        entry.pulls.append((worker, rid, after, rows))
        return self._answer_pulls(entry)

    def _pushpull(self, worker: int, op: PushPull) -> list[Reply]:
        key = (op.key, op.part)
        out = self._take_push(worker, key, op.seq, op.data, None)
        return [*out, *self._park_pull(worker, op.id, key, op.seq, None, op.re)]

    def _answer_pulls(self, entry: Entry) -> list[Reply]:
        out, keep = [], []
        for worker, rid, after, rows in entry.pulls:
            done = entry.round if entry.sync else entry.pushed.get(worker, 0)
            if done >= after or (entry.sync and worker not in self.active and after > done):
                if rows is None:
                    out.append(Reply(worker, Ok(rid, [entry.value]), entry))
                else:
                    out.append(Reply(worker, Ok(rid, [entry.value[rows]])))
            else:
                keep.append((worker, rid, after, rows))
        entry.pulls = keep
        return out

    def _resync(self, worker: int, op: Resync) -> list[Reply]:
        """Only a restored server waits for resyncs (psnode.server); elsewhere a no-op."""
        return []

    def _flush(self, worker: int, op: Flush) -> list[Reply]:
        """Answered at once: every earlier request of this worker that arrived has been handled.

        ``check`` lists pushes the worker sent; the answer names under ``missing`` those never
        received (lost on the way), for the worker to send again.
        """
        missing = []
        for key, part, seqs in op.check:
            entry = self.entries.get((key, part))
            if entry is not None:
                lost = [q for q in seqs if not _received(entry, worker, q)]
                if lost:
                    missing.append((key, part, lost))
        return [Reply(worker, Missing(op.id, missing) if missing else Ok(op.id))]

    # ---------------------------------------------------------------- optimizer
    def _set_optimizer(self, worker: int, op: SetOptimizer) -> list[Reply]:
        try:
            optimizer = opt_mod.from_spec(op.spec)
        except Exception as exc:  # noqa: BLE001 - validation errors go back to the worker
            raise OpError("ConfigError", str(exc)) from None
        if self.optimizer is None or self.optimizer.to_spec() != optimizer.to_spec():
            self.optimizer = optimizer
            for entry in self.entries.values():
                entry.state = optimizer.create_state(entry.value) if entry.value.dtype.kind == "f" else None
        return [Reply(worker, Ok(op.id))]

    def _get_states(self, worker: int, op: GetStates) -> list[Reply]:
        """Every key part's optimizer state, as named arrays (for save_optimizer_states)."""
        names, out = [], []
        for (key, part), entry in self.entries.items():
            if entry.state is None:
                continue
            for name, arr in opt_mod.state_to_arrays(entry.state).items():
                names.append((key, part, name))
                out.append(np.array(arr, copy=True))
        return [Reply(worker, Ok(op.id, out, names=names))]

    def _load_states(self, worker: int, op: LoadStates) -> list[Reply]:
        if self.optimizer is None:
            raise OpError("ConfigError", "no optimizer is set: call kv.set_optimizer first")
        grouped: dict[Key, dict[str, np.ndarray]] = {}
        for (k, part, name), arr in zip(op.names, op.arrays, strict=True):
            grouped.setdefault((k, part), {})[name] = np.array(arr)
        for where, named in grouped.items():
            entry = self.entries.get(where)
            if entry is None:
                raise OpError("KeyNotInitialized", f"{_fmt(*where)} in the state file is not initialised")
            entry.state = opt_mod.state_from_arrays(named)
        return [Reply(worker, Ok(op.id))]

    # ---------------------------------------------------------------- restore
    def rebase(self, confirmed: dict[Key, dict[int, int]], num_workers: int) -> list[str]:
        """Align restored key parts with the workers' push counts (see the module docstring).

        ``confirmed[key][w]``: the last push of worker ``w`` it knows applied (its pull after it
        returned).  Returns notices for rounds the checkpoint did not hold (lost with the server).
        """
        notices = []
        for key, entry in self.entries.items():
            seen = confirmed.get(key, {})
            latest = max(seen.values(), default=0)
            if entry.sync:
                if latest > entry.round:
                    notices.append(f"{_fmt(*key)}: rounds {entry.round + 1}..{latest} were not in the "
                                   f"checkpoint; the value is that of round {entry.round}")
                entry.round = max(entry.round, latest)
                entry.pushed = dict.fromkeys(range(num_workers), entry.round)
            else:
                for w in range(num_workers):
                    mine = max(entry.pushed.get(w, 0), seen.get(w, 0))
                    if seen.get(w, 0) > entry.pushed.get(w, 0):
                        notices.append(f"{_fmt(*key)}: pushes {entry.pushed.get(w, 0) + 1}..{mine} of worker "
                                       f"{w} were not in the checkpoint")
                    entry.pushed[w] = mine
            entry.ahead.clear()
            entry.early.clear()
            entry.contributors.clear()
            entry.sparse_parts.clear()
            entry.first = None
            entry.pulls = []
        return notices

    # ---------------------------------------------------------------- membership
    def set_active(self, workers: set[int]) -> list[Reply]:
        """The workers still taking part; completes rounds that only waited for leavers."""
        self.active = set(workers)
        out: list[Reply] = []
        for key, entry in self.entries.items():
            if entry.sync:
                out.extend(self._maybe_complete(key, entry))
                out.extend(self._answer_pulls(entry))
        return out


def _received(entry: Entry, worker: int, seq: int) -> bool:
    return (seq <= entry.pushed.get(worker, 0) or seq in entry.ahead.get(worker, ())
            or any(s == seq for s, *_ in entry.early.get(worker, [])))


def _first_gap(entry: Entry, worker: int) -> int:
    """The first push sequence number of ``worker`` this key part has not received."""
    have = {s for s, *_ in entry.early.get(worker, [])} | entry.ahead.get(worker, set())
    seq = entry.pushed.get(worker, 0) + 1
    while seq in have:
        seq += 1
    return seq


def _mark_async(entry: Entry, worker: int, seq: int) -> None:
    """Record async push ``seq`` of ``worker`` as applied; ``pushed`` stays contiguous."""
    done = entry.pushed.get(worker, 0)
    if seq != done + 1:
        entry.ahead.setdefault(worker, set()).add(seq)
        return
    done = seq
    ahead = entry.ahead.get(worker)
    while ahead and done + 1 in ahead:
        ahead.discard(done + 1)
        done += 1
    entry.pushed[worker] = done


def _fresh(buf: np.ndarray | None, sends: list[Any], like: np.ndarray,
           new: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """``buf`` if it is writable and no send still reads it; else ``new(like)``."""
    if buf is not None and buf.flags.writeable and buf.shape == like.shape and all(t.done for t in sends):
        return buf
    return new(like)
