"""Durable points: when a server's answers may leave, and the copies and checkpoints behind them.

A **durable point** makes the store's state as of one moment survive this server: written to
its checkpoint chain (psnode.server.chain) and acknowledged by every holder of its replicas
(psnode.server.replicas).  Only then are the pushes it holds reported durable
(psnode.server.store: :meth:`~psnode.server.store.Store.begin_point` captures the watermarks,
:meth:`~psnode.server.store.Store.end_point` makes them true), and only then may answers leave
that reveal what the point holds (a key created, a resumed push count, a flush's Ok, a push that
asked: the store's ``must_persist``).

**Off the loop.**  A point whose changes since the last one are small (ASYNC_BYTES: the rows
touched, the dense parts pushed) is taken as a copy of those changes and then written and sent
while the loop goes on serving (:meth:`Points.poll` notices its end): rounds go on, answers that
reveal nothing new leave at once with the watermarks already durable, and answers that need the
point wait for it (those that need a later one wait for the next, which begins as this one
ends, so one point serves every request that asked meanwhile).  A holder without the previous
copy gets the state whole in the same background point: a row_sparse part read in place while
the rounds write it, the rows they write saved first (keypart.RowPin) and sent once the copy
arrived, as a patch that makes it exact (:func:`_patcher`; psnode.server.replicas: fuzzy, then
patch); other big arrays pinned (the rounds copy them before they write them).  A point that
must carry state whole on disk (a chain without a base) or changes past ASYNC_BYTES (a big key
created) is taken while the loop waits, pumping its heartbeats (:meth:`Points.point`); a
holder replaced during a point gets the current state whole the same way as a new one
(:meth:`Points.poll`), beside the loop where its copies stay under ASYNC_BYTES.  Either way no
push is reported durable before every copy holds it, and the store is never read by a writer
while it changes (background points write copies; the chain's compactions are exact by
construction).  A copy that waits only for replaced holders, which hold no copy of this server
to restore from, makes the state read whole for them durable as it is read
(:meth:`Points._durable_now`).

**By rounds** (``every``, ``--checkpoint-rounds``): a point that only the count of rounds
calls for holds no answer either: it begins after the answers of the round that reached the
count left.

**On its own cadence.**  A restartable server does not wait to be asked: once an answer it
sends would report a worker's durable watermark ``LAG`` pushes behind what that answer says
applied, or that worker's pushes to dense parts not yet durable come to ``LAG_BYTES`` on this
server (what its journal holds for them: :class:`Lag`), it begins a point in the
background (or, with one under way, the next as that one ends), holding nothing: the answer
leaves at once with the watermark it has, and an answer after the point brings the new one,
so the worker's journal forgets those pushes (psnode.worker.journal) and its pushes never
wait for a point.  A point that cannot be taken in the background is not begun this way:
the worker's journal asks at its hard bound (``ASK_DEPTH``), and that answer waits.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from psnode.math import optimizers as opt_mod
from psnode.server import chain as disk
from psnode.server import checkpoint
from psnode.server.image import nbytes
from psnode.server.keypart import Entry, Pin, RowPin
from psnode.server.replicas import POLL_S, Replicator
from psnode.server.replies import Reply
from psnode.server.store import Marks, Store

ASYNC_BYTES = 64 << 20   # a point that would copy more is taken while the loop waits
LAG = 32                 # pushes an answer's watermark may lag before a point begins on its own
LAG_BYTES = 32 << 20     # or bytes of a worker's pushes to dense parts
PIN_BYTES = 1 << 20      # a key part's value or state array past this is read in place, pinned
_PART = re.compile(r"^(v|s)(\d+)(_|$)")   # a snapshot's arrays of key part i's value and state
Pump = Callable[[], None]


@dataclass
class _Point:
    """A point under way in the background: its write, whether its copy still waits for
    acknowledgements, the watermarks it makes true, the answers waiting for it and those
    waiting for the next point."""

    written: Future[None] | None
    copying: bool
    marks: Marks
    held: list[Reply]
    pins: list[Pin]
    later: list[Reply] = field(default_factory=list)


class Points:
    """One server's durable points (module docstring).  ``send`` sends answers; ``every``: rounds
    between points by rounds (0: none); ``resend_after``: a silent holder gets its copy again.
    ``chain`` and ``replicator`` are set once the server knows its rank.  Used from the server's
    loop thread only."""

    def __init__(self, store: Store, send: Callable[[list[Reply]], None], every: int, resend_after: float) -> None:
        self.store = store
        self.send = send
        self.every = every
        self.resend_after = resend_after
        self.chain: disk.Chain | None = None
        self.replicator: Replicator | None = None
        self.pending: _Point | None = None
        self.lags = Lag()       # how far the answers' watermarks lag: past its bounds a point begins
        self.wanted = False     # answers lag: the next point begins as the one under way ends
        self.stuck = False      # a point on its own could not be begun in the background

    @property
    def written(self) -> int:
        """Bytes written to checkpoints (every file)."""
        return self.chain.written if self.chain is not None else 0

    # ---------------------------------------------------------------- answers
    def reply(self, replies: list[Reply], pump: Pump) -> None:
        """Send ``replies`` once the point they need (if any) is complete."""
        store = self.store
        point = self.pending
        if point is not None:
            if replies and store.restartable and store.must_persist:
                point.later.extend(replies)   # (they reveal what this point lacks)
            elif replies:
                self.wanted = self.lags.over(replies, store.restartable) or self.wanted
                self.send(store.stamp(replies))
            return
        if replies and store.restartable and store.must_persist:   # (they reveal what the last point lacks)
            if not self._begin(replies):
                self.point(pump)
                self.send(store.stamp(replies))
            return
        soon = bool(replies) and self.lags.over(replies, store.restartable)
        if replies:
            self.send(store.stamp(replies))
        if store.point_due([], self.every):   # (by rounds: nothing waits for it)
            if not self._begin([]):
                self.point(pump)
        elif soon:
            self._soon()

    def _soon(self) -> None:
        """Begin a point in the background on this server's own cadence (the module docstring),
        holding nothing; none where it must be taken while the loop waits."""
        self.wanted = False
        if self.pending is None and not self.stuck and not self._begin([]):
            self.stuck = True   # (until a point is taken while the loop waits)

    # ---------------------------------------------------------------- in the background
    def _begin(self, held: list[Reply]) -> bool:
        """Begin a point in the background, holding ``held`` until it completes; False where it
        must be taken while the loop waits (the module docstring)."""
        chain, replicator, store = self.chain, self.replicator, self.store
        if chain is None and replicator is None:
            return False
        if chain is not None and not chain.based:
            return False
        meta, arrays = checkpoint.snapshot(store, changes_only=True)
        frozen, pins = _freeze(store, arrays)
        whole = patch = None
        if frozen is not None and replicator is not None and not replicator.ready():   # (a holder gets it whole)
            whole_meta, whole_arrays = checkpoint.snapshot(store)
            frozen_whole, more = _freeze(store, whole_arrays, rows=True)
            pins += more
            if frozen_whole is None:
                frozen = None
            else:
                whole = (whole_meta, frozen_whole)
                patch = _patcher(whole_meta, frozen_whole, [p for p in more if isinstance(p, RowPin)])
        if frozen is None or (chain is not None and not chain.appendable(nbytes(arrays))):
            for pin in pins:   # (taken while the loop waits instead)
                pin.done = True
            return False
        marks = store.begin_point()
        by_entry = {id(store.entries[k]): pushed for k, (pushed, _) in marks.items()}
        self.lags.pending = {**by_entry, **store.fused.marks_of(by_entry)}
        store.forget_changes()
        changes = (meta, frozen)
        written = chain.append(changes, store) if chain is not None else None
        if replicator is not None:
            replicator.start(changes, whole, patch)
        self.pending = _Point(written, replicator is not None, marks, list(held), pins)
        self.wanted = self.stuck = False
        if whole is not None and chain is None and replicator is not None and replicator.unowed():
            self._durable_now(self.pending, marks)
        return True

    def poll(self, pump: Pump, wait: bool = False) -> None:
        """Complete the point under way if its write and copy are done (``wait``: wait for
        them, pumping); its answers leave, and the next point begins if answers wait for it."""
        point = self.pending
        if point is None:
            return
        if point.written is not None:
            if wait:
                disk.wait(point.written, pump)
            elif not point.written.done():
                return
        if point.copying:
            assert self.replicator is not None
            done = self.replicator.poll(None, self.resend_after, POLL_S if wait else 0)
            if done is None and not wait and self._whole_beside(point):
                return
            if done is None or wait:
                # (a holder needing the state whole gets the current one, and the store waits
                # until it is acknowledged: it holds this point and more, and the next point's
                # changes build on it; beside the loop where it can be: _whole_beside)
                while done is not True:
                    done = self.replicator.poll(lambda: checkpoint.snapshot(self.store), self.resend_after, POLL_S)
                    if not done:
                        pump()
            elif not done:
                return
            point.copying = False
        if point.written is not None:
            point.written.result()   # (a failed write fails the server here)
        self.store.end_point(point.marks)
        self.lags.clear()
        for pin in point.pins:
            pin.done = True
        self.pending = None
        self.send(self.store.stamp(point.held))
        if point.later or self.store.point_due([], self.every):
            self.reply(point.later, pump)
        if self.wanted:
            self._soon()

    def _whole_beside(self, point: _Point) -> bool:
        """A holder needs the state whole during the point under way (it was replaced): the
        replicator gets the current state, read by row beside the loop and patched (it holds
        this point and more; the next point's changes build on it); False where it cannot be
        (copies past ASYNC_BYTES: the loop then waits for it)."""
        assert self.replicator is not None
        meta, arrays = checkpoint.snapshot(self.store)
        frozen, pins = _freeze(self.store, arrays, rows=True)
        if frozen is None:
            return False
        point.pins.extend(pins)
        self.replicator.rewhole((meta, frozen), _patcher(meta, frozen, [p for p in pins if isinstance(p, RowPin)]))
        if self.chain is None and self.replicator.unowed():
            self._durable_now(point, self.store.begin_point())
        return True

    def _durable_now(self, point: _Point, marks: Marks) -> None:
        """The point's copy waits only for fresh holders (Replicator.unowed: replaced, they hold
        no copy of this server that a replacement could restore) and there is no checkpoint
        chain: the state just read whole for them, ``marks``, is durable at once (the first copy
        they will hold is that state or a later one; the same holds when none of them gets it, as
        this server's loss then leaves nothing to restore either way).  The answers waiting for
        the point, all handled before that read, leave; the copy goes on."""
        self.store.end_point(marks)
        self.lags.clear()
        out, point.held, point.later = point.held + point.later, [], []
        self.send(self.store.stamp(out))

    # ---------------------------------------------------------------- while the loop waits
    def point(self, pump: Pump, final: bool = False) -> None:
        """Take a point now, the loop waiting (pumping) until it is complete (after the one
        under way, if any).  ``final`` (the job's end): on disk only, and the scheduler may be
        gone (no pumping)."""
        if final:
            pump = _idle
        self.poll(pump, wait=True)
        replicator = None if final else self.replicator
        chain = self.chain
        if chain is None and replicator is None:
            return
        store = self.store
        written = chain.point(store) if chain is not None else None   # (on the chain's thread)
        if replicator is not None:
            replicator.copy(checkpoint.snapshot(store, changes_only=True), lambda: checkpoint.snapshot(store), pump,
                            resend_after=self.resend_after)
        if chain is not None and written is not None:
            chain.wait(written, pump)
        store.forget_changes()
        store.mark_durable()
        self.lags.clear()
        self.stuck = self.wanted = False

    def now(self, pump: Pump) -> None:
        """Make a point now (a holder was replaced, or this server restored): in the background
        where it can be, else while the loop waits.  With a point under way, the next begins as
        it ends (a replaced holder gets the state whole from it: :meth:`poll`)."""
        if self.pending is not None:
            self.wanted = True
            return
        if not self._begin([]):
            self.point(pump)

    def close(self) -> None:
        if self.chain is not None:
            self.chain.close()


class Lag:
    """How far the answers' durable watermarks lag what they say applied (``seq``, before they
    are stamped), as a restartable server's own cadence of points reads it: a key part whose
    worker is ``pushes`` pushes behind, or a worker whose dense parts' pushes not yet durable
    come to ``nbytes`` on this server (the arrays its journal holds for them,
    psnode.worker.journal), is over the bound.  Kept per (worker, part) as the answers tell it,
    and forgotten as a point completes (the answers after it tell the new lag)."""

    def __init__(self, pushes: int = LAG, nbytes: int = LAG_BYTES) -> None:
        self.pushes = pushes
        self.nbytes = nbytes
        self._part: dict[tuple[int, int], int] = {}   # (worker, id of the part's entry) -> bytes behind
        self._worker: dict[int, int] = {}             # worker -> its bytes behind, every dense part
        #: the watermarks of the point under way, by id of the key part's entry or bucket: the
        #: lag is counted from them (a push it holds is not what the next point is for)
        self.pending: dict[int, dict[int, int]] = {}

    def over(self, replies: list[Reply], restartable: bool) -> bool:
        """Do ``replies`` show a lag past the bounds?  Never on a server that cannot be
        restarted (its answers report what was received)."""
        if not restartable:
            return False
        hit = False
        for r in replies:
            holder = r.holder
            if holder is None:
                continue
            durable = holder.durable.get(r.worker, 0)
            if self.pending:
                durable = max(durable, self.pending.get(id(holder), {}).get(r.worker, 0))
            behind = getattr(r.answer, "seq", 0) - durable
            if behind >= self.pushes:
                hit = True
            value = getattr(holder, "value", None)
            if value is None or getattr(holder, "sparse", False):
                continue
            lag, at = max(0, behind) * value.nbytes, (r.worker, id(holder))
            old = self._part.get(at, 0)
            if lag != old:
                self._part[at] = lag
                self._worker[r.worker] = self._worker.get(r.worker, 0) + lag - old
            if self._worker.get(r.worker, 0) >= self.nbytes:
                hit = True
        return hit

    def clear(self) -> None:
        self._part.clear()
        self._worker.clear()
        self.pending = {}


def _freeze(store: Store, arrays: dict[str, np.ndarray], rows: bool = False
            ) -> tuple[dict[str, np.ndarray] | None, list[Pin]]:
    """The arrays of a snapshot as a background point may read them while the store goes on: a
    key part's own value or optimizer state past PIN_BYTES is read in place and pinned (the
    rounds copy it before they write it: psnode.server.rounds), everything else is copied; None
    when the copies would pass ASYNC_BYTES (the point is then taken while the loop waits).
    ``rows`` (a whole copy, made exact by :func:`_patcher`): a row_sparse part's value and
    per-row state are pinned by row instead (RowPin: the rounds save the rows they write)."""
    entries = list(store.entries.values())   # (the snapshot's index order)
    out: dict[str, np.ndarray] = {}
    pins: list[Pin] = []
    by_row: dict[int, RowPin] = {}
    copied = 0
    for name, arr in arrays.items():
        m = _PART.match(name)
        entry = entries[int(m.group(2))] if m else None
        state = entry.state.arrays.values() if entry is not None and entry.state is not None else ()
        i = int(m.group(2)) if m else -1
        if rows and entry is not None and arr.nbytes > PIN_BYTES and (i in by_row or _by_row(entry)) and any(
                arr is a for a in _row_arrays(entry).values()):
            if i not in by_row:
                by_row[i] = RowPin(_row_arrays(entry), part=i)
                entry.value_sends.append(by_row[i])
                entry.state_pin = by_row[i]
                pins.append(by_row[i])
            out[name] = arr
            continue
        if entry is not None and not entry.fixed and arr.nbytes > PIN_BYTES:
            if arr is entry.value:
                pin = Pin()
                entry.value_sends.append(pin)
                pins.append(pin)
                out[name] = arr
                continue
            if any(arr is a for a in state):
                if entry.state_pin is None or entry.state_pin.done:
                    entry.state_pin = Pin()
                    pins.append(entry.state_pin)
                out[name] = arr
                continue
        copied += arr.nbytes
        if copied > ASYNC_BYTES:
            for pin in pins:   # (nothing reads them: the rounds write in place again)
                pin.done = True
            return None, []
        out[name] = np.array(arr)
    return out, pins


def _by_row(entry: Entry) -> bool:
    """May a whole copy read ``entry`` pinned by row?  A plain row_sparse part (its rounds
    write rows; a bucket member, a fixed value or a table without a row count: never)."""
    return (entry.sparse and not entry.fixed and entry.bucket is None and entry.table is None
            and entry.value.ndim >= 1 and (entry.state_pin is None or entry.state_pin.done))


def _row_arrays(entry: Entry) -> dict[str, np.ndarray]:
    """The arrays of ``entry`` whose rows a RowPin saves: the value (``v``) and each optimizer
    state array shaped like it (by the state's names)."""
    out = {"v": entry.value}
    if entry.state is not None:
        for name, arr in opt_mod.state_to_arrays(entry.state).items():
            if arr.shape == entry.value.shape:
                out[name] = arr
    return out


def _patcher(meta: dict[str, Any], arrays: dict[str, np.ndarray], pins: list[RowPin]
             ) -> Callable[[], tuple[dict[str, Any], dict[str, np.ndarray]]]:
    """What makes a whole copy read by row (``meta``, ``arrays``: :func:`_freeze` with ``rows``)
    exact, once it was read: a snapshot of changes holding, for each part pinned by row, the
    rows the rounds wrote since, as they were (their RowPin's :meth:`~RowPin.taken`); every
    other part unchanged, the rounds in progress as the copy has them.  Calling it ends the
    pins (the rounds write in place again)."""
    def patch() -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        by_part = {pin.part: pin for pin in pins}
        index, out = [], {}
        for i, item in enumerate(meta["index"]):
            item = dict(item)
            if "dynamic" in item:   # (sent again as the copy has it)
                out.update({n: a for n, a in arrays.items() if _owner(n) == i})
                index.append(item)
                continue
            item.pop("origin", None)
            item.pop("state_rows", None)
            item["changes"] = "rows"
            pin = by_part.get(i)
            if pin is not None:
                rows, saved = pin.taken()
                pin.done = True
                if len(rows):
                    out[f"k{i}"], out[f"v{i}"] = rows, saved["v"]
                    item["state_rows"] = [n for n in item["state"] if n in saved]
                    for n in item["state_rows"]:
                        out[f"s{i}_{n}"] = saved[n]
            index.append(item)
        out.update({n: a for n, a in arrays.items() if _owner(n) is None})   # (rounds in progress)
        return {**meta, "index": index}, out
    return patch


_OWNED = re.compile(r"^(?:v|k|t|x|c|u|l)(\d+)$|^s(\d+)_")   # a part's value and state (psnode.server.image)


def _owner(name: str) -> int | None:
    """The part whose value or state array ``name`` is (None: a round in progress's)."""
    m = _OWNED.match(name)
    return None if m is None else int(m.group(1) or m.group(2))


def _idle() -> None:
    pass


__all__ = ["ASYNC_BYTES", "LAG", "LAG_BYTES", "Lag", "Points"]
