"""The key store: every key part one server holds, the operations on them, and what is durable.

Pure logic (no sockets): :meth:`Store.handle` takes one typed operation (psnode.protocol) from
one worker and returns the replies it causes (possibly to other workers, e.g. pulls parked
until a round completed).  A bad operation is answered ``Failed``, never raised.  The store
creates keys, checks compression settings, answers flushes, keeps optimizer states and decides
when a checkpoint is due; the rounds of key parts are :mod:`psnode.server.rounds`'s, those of
buckets of small keys :mod:`psnode.server.buckets`'s.

Semantics (per key part held by this server):

* ``init``: the first init carrying an array (rank 0's) creates the key; inits of other workers
  carry only dtype and shape and are answered once the key exists.  Every init reply holds the
  stored value, so all workers end up with rank 0's array, except a ``bare`` one's (a worker
  with no array to copy it into: a row_sparse table is not sent back whole, and no answer
  waiting for a durable point holds a write to it).  Another shape or dtype is an error.
* ``init`` with ``fill`` (rank 0's, ``kv.init`` with ``ps_initializer``): the server computes the
  part's values itself, a bounded number of elements per :meth:`Store.fill_some` call
  (psnode.server.fills); the key exists, and its inits are answered, once they are all there.
  A ``bare`` init is answered without the value (workers that do not hold the key).
* ``push`` with per-(worker, key) sequence number ``q`` (1, 2, ...):
  - sync: push ``q`` belongs to round ``q``.  A push for a later round than the one being
    aggregated waits (a fast worker never leaks into the current round).  When every active
    worker has contributed, the round completes: the pushes folded by the part's aggregation
    rule (its init names it: psnode.math.aggregation; ``average`` divides the sum by the number
    of contributors); then the optimizer, or the value becomes the aggregate.  Every worker's
    init of a part names the same rule (another is refused: ConfigError).
  - async: applied on arrival (the optimizer, or the value becomes the push).
  - dist_ssp (an async part with a ``staleness`` bound ``s``): applied on arrival as async;
    pulls wait for the bound (below).
  - a push whose ``q`` was already accepted is a duplicate: acknowledged, not applied again.
    (Workers resend pushes a lost message or a restarted server may have missed; async pushes
    arriving out of order are applied once each, and ``pushed`` counts only the contiguous ones.)
* ``pull`` with ``after = n``: answered once the worker's push ``n`` has been applied (sync: round
  ``n`` completed), so a pull after a push always sees it.  ``rows`` selects rows (row_sparse).
  A resent pull (``re``) still parked is answered ``wait`` (the server holds it; nothing lost).
  On a dist_ssp part it also waits until every gating worker's clock (its pushes applied) is at
  least ``n - s`` (psnode.server.staleness); a joiner starts at the part's highest clock.  Every
  worker's init of a dist_ssp part names the same staleness (another is refused: ConfigError).
* ``pushpull``: a push, then a pull after it: one request and one answer per key part.
* **durability** (a server that can be restarted: ``restartable``): what a checkpoint holds
  survives the server's restart, and nothing else does (psnode.server.checkpoint: everything,
  rounds in progress and waiting pushes included).  Such a server never tells a worker what
  its checkpoint does not hold: the store asks for a checkpoint before the replies leave
  (:meth:`Store.release`) when they reveal something new -- a key created, an optimizer set,
  the push count a restarted worker resumes from (init), a flush's pushes, a push that asks
  -- and every pull's answer carries ``seq``, the worker's *durable watermark* for the key
  part (its pushes 1..seq are in the last checkpoint).  A server that cannot be restarted
  reports the pushes it received instead.  Workers keep pushes until that watermark covers
  them (psnode.worker.journal).
* row_sparse pushes carry (row ids, rows); rows are combined per round by the rule (for
  ``average``: summed and divided by the contributors, as if missing rows were zero; for
  ``max``: over the pushes holding the row), and applied lazily: only rows
  present change (without an optimizer those rows take the aggregate; others keep their value).
* Workers leave (``set_active``): rounds then complete over the workers still active.
* **Elastic membership** (:meth:`set_membership`, ``join``; who a round waits for:
  psnode.server.rounds.Rules).  A worker that joins the running job inits each key with
  ``join`` (the answer's ``seq`` is the part's completed round; a joiner never creates or
  re-initialises a key), then agrees a start round ``s`` with every part of the key (JOIN,
  a compare-and-set: accepted iff round ``s`` has not opened on the part, no push of round
  ``s`` taken yet).  Accepted, the part takes the joiner's pushes from round ``s``: its push
  count and durable watermark become ``s - 1`` (a reused rank's old state for the part is
  replaced; pushes of the old holder of the rank for earlier rounds are kept).  A member
  removed from the membership (it left gracefully or was lost) keeps every push that
  arrived: rounds it contributed to count it, later rounds complete over the rest.

**Exactly once.**  A push is applied exactly once, on every data path (TCP, the same-host link,
a bucket of small keys, each part of a split key), across any sequence of worker and server
restarts.  The worker's half is its journal (psnode.worker.journal: every push kept until a
durable watermark covers it, resent after a restart).  The server's half, held here:

1. push ``q`` of a worker to a key part is taken once, whatever copy or path it comes by
   (psnode.server.rounds; a bucket push is push ``q`` of every member, psnode.server.buckets),
   and a flush names the pushes never received, for the worker to send again;
2. a restartable server comes back as exactly its last checkpoint (psnode.server.checkpoint)
   and reports no watermark that checkpoint does not cover (durability, above): every push it
   lost in a restart is one its worker still holds and resends;
3. a restarted worker resumes from the count its init answer carries, made durable before it
   is told; its predecessor's sync pushes past a gap are dropped (:meth:`Store._accepted`), so
   the replacement pushes those steps again and no round completes without them.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from psnode.errors import PSError, kind_of
from psnode.math import aggregation as agg_mod
from psnode.math import dynrows
from psnode.math import optimizers as opt_mod
from psnode.math.initializers import FillSpec
from psnode.math.initializers import from_spec as init_from_spec
from psnode.protocol import (
    Failed,
    Flush,
    GetStates,
    Init,
    Join,
    LoadStates,
    Missing,
    Ok,
    Op,
    OpCode,
    Pull,
    Push,
    PushPull,
    SetOptimizer,
    Wait,
    bucket_of,
)
from psnode.server import dynparts
from psnode.server import staleness as bound
from psnode.server.buckets import Buckets
from psnode.server.compressed import Packed, agree, packed_push
from psnode.server.dyntable import Params
from psnode.server.fills import CopyOf, Fills
from psnode.server.keypart import Entry, Key, contiguous, fmt, forget_changes, made_from, note_touch, received
from psnode.server.replies import OpError, Reply
from psnode.server.rounds import Alloc, Rounds, Rules, Updater

#: a ``kv.init`` array past this many bytes is copied in a step at a time (psnode.server.fills)
COPY_IN_STEPS = 64 << 20

#: what a durable point makes true once complete: per key part, the pushes it holds per worker
#: and the workers' start rounds then (psnode.server.store.Store.begin_point)
Marks = dict[Key, tuple[dict[int, int], dict[int, int]]]


class Store:
    """All key parts of one server.  ``alloc(shape, dtype)`` gives the buffers values and
    aggregates live in (e.g. shared memory; default: plain numpy arrays); ``adopt(view)``
    registers a view of such a buffer that answers will carry (so it is found quickly).

    Composed of: ``rules`` (:class:`~psnode.server.rounds.Rules`: the active workers, the
    optimizer, the 'local' store's updater; written only here), ``key_rounds`` (the rounds of
    single key parts) and ``fused`` (the buckets, which push a split bucket's members through
    ``key_rounds``).  ``pushes``, ``pulls`` and ``rounds`` count both."""

    def __init__(self, num_workers: int, check_finite: bool = False, alloc: Alloc | None = None,
                 adopt: Callable[[np.ndarray], np.ndarray] | None = None, restartable: bool = False) -> None:
        self.entries: dict[Key, Entry] = {}
        self.num_workers = num_workers
        self.restartable = restartable   # its checkpoints restore it inside the job (see durability)
        self.must_persist = False        # replies waiting reveal what the last checkpoint lacks
        self.durable_rounds = 0          # ``rounds`` at the last checkpoint
        self.alloc: Alloc = alloc or (lambda shape, dtype: np.empty(shape, dtype))
        self.waiting_inits: dict[Key, list[tuple[int, Init]]] = {}
        self.events: list[str] = []  # human-readable notices (e.g. skipped non-finite rounds)
        self.settings: dict[int, str] = {}   # worker -> the compression tag of its pushes ("": none)
        self.rules = Rules(set(range(num_workers)), check_finite)
        self.key_rounds = Rounds(self.rules, self.alloc, self.events.append)
        self.fused = Buckets(self.rules, self.alloc, adopt or (lambda view: view), self.key_rounds.push,
                             awaited=self.key_rounds.awaited)
        self.filling = Fills()   # parts being computed on this server (psnode.server.fills)
        self._handlers: dict[int, Callable[[int, Any], list[Reply]]] = {
            OpCode.INIT: self._init, OpCode.PUSH: self._push, OpCode.PULL: self._pull,
            OpCode.PUSHPULL: self._pushpull, OpCode.FLUSH: self._flush,
            OpCode.SET_OPTIMIZER: self._set_optimizer, OpCode.GET_STATES: self._get_states,
            OpCode.LOAD_STATES: self._load_states, OpCode.JOIN: self._join}

    # ---------------------------------------------------------------- the rules and counters
    @property
    def active(self) -> set[int]:
        """The workers a sync round waits for (:meth:`set_active` also completes rounds)."""
        return self.rules.active

    @active.setter
    def active(self, workers: set[int]) -> None:
        self.rules.active = set(workers)

    @property
    def optimizer(self) -> opt_mod.Optimizer | None:
        return self.rules.optimizer

    @optimizer.setter
    def optimizer(self, optimizer: opt_mod.Optimizer | None) -> None:
        self.rules.optimizer = optimizer

    @property
    def updater(self) -> Updater | None:
        """A Python updater ``updater(key, recv, stored)`` ('local' stores: kv.set_updater)."""
        return self.rules.updater

    @updater.setter
    def updater(self, updater: Updater | None) -> None:
        self.rules.updater = updater

    @property
    def pushes(self) -> int:
        return self.key_rounds.pushes + self.fused.pushes

    @property
    def pulls(self) -> int:
        return self.key_rounds.pulls + self.fused.pulls

    @property
    def rounds(self) -> int:
        """Rounds completed, one per key part (a fused bucket's round counts once per member)."""
        return self.key_rounds.rounds + self.fused.rounds

    # ---------------------------------------------------------------- dispatch
    def handle(self, worker: int, op: Op) -> list[Reply]:
        """The replies ``op`` from ``worker`` causes (possibly to other workers); never raises."""
        try:
            bid = bucket_of(getattr(op, "key", None))
            if bid is not None:
                return self._bucket_op(worker, bid, op)
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
                          f"{fmt(*key)} is not initialised on this server: call kv.init first")
        if entry.bucket is not None:
            self.fused.split_member(entry)   # served on its own from now on (psnode.server.buckets)
        return entry

    def _bucket_op(self, worker: int, bid: int, op: Op) -> list[Reply]:
        if type(op) is PushPull:   # (the common round's op first)
            out = self.fused.push(worker, bid, op.seq, self._bucket_gradient(worker, bid, op))
            pulled = self.fused.pull(worker, op.id, bid, op.seq, op.re, op.dest)
            return pulled if not out else [*out, *pulled]
        if isinstance(op, Push):
            out = self.fused.push(worker, bid, op.seq, self._bucket_gradient(worker, bid, op))
            if op.na:
                return out
            self.must_persist = True   # (as _push)
            return [Reply(worker, Ok(op.id, seq=self.fused.contiguous(bid, worker)), holder=self.fused.bucket(bid)),
                    *out]
        if isinstance(op, Pull) and op.rows is None:
            return self.fused.pull(worker, op.id, bid, op.after, op.re, op.dest)
        if isinstance(op, PushPull):
            out = self.fused.push(worker, bid, op.seq, self._bucket_gradient(worker, bid, op))
            return [*out, *self.fused.pull(worker, op.id, bid, op.seq, op.re, op.dest)]
        raise OpError("ProtocolError", f"{type(op).__name__} of a bucket")

    # ---------------------------------------------------------------- init
    def _init(self, worker: int, op: Init) -> list[Reply]:
        _rule(op)   # (a rule this server does not know is refused before anything is made)
        if op.fill is not None or (op.bare and op.value is None):
            return self._init_computed(worker, op)
        key = (op.key, op.part)
        entry = self.entries.get(key)
        if entry is not None:  # (also a restarted worker: it resumes its push count)
            entry = self._entry(key)
            self._check_meta(key, entry, op.dtype, op.shape)
            self.must_persist |= entry.fresh   # (the part's creation is not durable yet)
            self._check_mode(key, entry, op)
            reply = self._init_answer(worker, op, entry)
            if getattr(reply.answer, "seq", 0):   # (a restarted worker: waits for it before now were the failover's)
                self.key_rounds.awaited.rejoined(worker)
            return [reply]
        pending = self.filling.pending.get(key)   # (a big init's array being copied in)
        if op.value is None or pending is not None:
            waiting = self.waiting_inits.setdefault(key, [])
            if op.re and (any(w == worker and o.id == op.id for w, o in waiting)
                          or (pending is not None and pending.worker == worker and pending.op.id == op.id)):
                return [Reply(worker, Wait(op.id, 0, [0]))]   # (the value comes with rank 0's init)
            waiting.append((worker, op))
            return []
        if op.value.dtype.name != op.dtype or op.value.shape != tuple(op.shape):
            raise OpError("ShapeMismatch", f"{fmt(*key)}: init array does not match its description")
        if op.bucket < 0 and op.value.nbytes > COPY_IN_STEPS:
            self.filling.start(key, self.alloc(op.value.shape, op.value.dtype), CopyOf(op.value), worker, op)
            return []   # (the part exists, and its inits are answered, once copied: fill_some)
        if op.bucket >= 0 and not op.sparse:
            try:
                value = self.fused.place(op.bucket, op.offset, op.value.shape, op.value.dtype, op.sync, _rule(op))
            except ValueError as exc:
                raise OpError("ProtocolError", f"{fmt(*key)}: {exc}") from None
        else:
            value = self.alloc(op.value.shape, op.value.dtype)
        np.copyto(value, op.value)
        entry = Entry(value=value, sparse=op.sparse, sync=op.sync, aggregation=_rule(op), staleness=op.staleness,
                      backup=op.backup)
        optimizer = self.rules.optimizer_for(entry)
        if optimizer is not None:
            entry.state = optimizer.create_state(entry.value)
        self.entries[key] = entry
        self.must_persist = True   # (a restored server must hold every key a worker was told of)
        if op.bucket >= 0 and not op.sparse:
            self.fused.join(op.bucket, key, entry, op.offset)
        out = [Reply(worker, Ok(op.id), None) if op.bare else Reply(worker, Ok(op.id, [entry.value]), entry)]
        for w, other in self.waiting_inits.pop(key, []):
            try:
                self._check_meta(key, entry, other.dtype, other.shape)
                seq = entry.round if other.join else self._accepted(entry, w)
                out.append(Reply(w, Ok(other.id, [], seq=seq)) if other.bare else
                           Reply(w, Ok(other.id, [entry.value], seq=seq), entry))
            except OpError as exc:
                out.append(Reply(w, Failed(other.id, exc.kind, str(exc))))
        return out

    # ---------------------------------------------------------------- init computed here
    def _init_computed(self, worker: int, op: Init) -> list[Reply]:
        """An init that carries ``fill`` (the values are computed here: psnode.server.fills) or
        asks for a ``bare`` answer (no value: the worker does not hold the key).  The part
        exists once its fill completes (:meth:`fill_some`); inits that arrive before wait."""
        key = (op.key, op.part)
        if key in self.entries:
            entry = self._entry(key)
            self._check_meta(key, entry, op.dtype, op.shape)
            self.must_persist |= entry.fresh   # (the part's creation is not durable yet)
            self._check_mode(key, entry, op)
            reply = self._init_answer(worker, op, entry)
            if getattr(reply.answer, "seq", 0):   # (a restarted worker: waits for it before now were the failover's)
                self.key_rounds.awaited.rejoined(worker)
            return [reply]
        if op.fill is not None and "dynamic" in op.fill:
            return self._init_dynamic(worker, key, op)
        if op.fill is None or key in self.filling.pending:
            waiting = self.waiting_inits.setdefault(key, [])
            pending = self.filling.pending.get(key)
            if op.re and (any(w == worker and o.id == op.id for w, o in waiting)
                          or (pending is not None and pending.worker == worker and pending.op.id == op.id)):
                # (answered when the part exists: made by rank 0's init, if it is not on its way)
                return [Reply(worker, Wait(op.id, 0, [0]) if pending is None else Wait(op.id))]
            waiting.append((worker, op))
            return []
        if op.value is not None or op.bucket >= 0:
            raise OpError("ProtocolError", f"{fmt(*key)}: an init computed on the server carries no value")
        try:
            spec = FillSpec.from_json(op.fill)
            spec.check(op.dtype)
        except PSError as exc:
            raise OpError("ConfigError", f"{fmt(*key)}: {exc}") from None
        if spec.start + int(np.prod(op.shape, dtype=np.int64)) > int(np.prod(spec.shape, dtype=np.int64)):
            raise OpError("ShapeMismatch", f"{fmt(*key)}: part {list(op.shape)} at {spec.start} is outside "
                                           f"the key's shape {list(spec.shape)}")
        self.filling.start(key, self.alloc(tuple(op.shape), np.dtype(op.dtype)), spec, worker, op)
        return []

    def _init_dynamic(self, worker: int, key: Key, op: Init) -> list[Reply]:
        """Rank 0's init of a part of a table without a row count (psnode.server.dynparts):
        the part exists at once, empty; the inits waiting for it are answered."""
        spec = dict(op.fill or {})
        try:
            params = Params.from_json(spec.get("dynamic"))
            init = init_from_spec(spec.get("init") or {})
            seed = spec.get("seed")
            if type(seed) is not int or seed < 0:
                raise ValueError(f"seed {seed!r} must be an integer >= 0")
            dynrows.check_init(init, op.dtype)
        except (ValueError, PSError) as exc:
            raise OpError("ConfigError", f"{fmt(*key)}: {exc}") from None
        if tuple(op.shape) != (dynrows.HEIGHT, params.width):
            raise OpError("ShapeMismatch", f"{fmt(*key)}: a table without a row count has shape "
                                           f"[None, {params.width}], not {list(op.shape)}")
        entry = dynparts.make_entry(op.key, params, init, seed, np.dtype(op.dtype), op.sync, _rule(op),
                                    op.staleness, self.rules.optimizer, self.alloc)
        self.entries[key] = entry
        self.must_persist = True   # (as _init)
        out = [self._init_answer(worker, op, entry)]
        for w, other in self.waiting_inits.pop(key, []):
            try:
                self._check_meta(key, entry, other.dtype, other.shape)
                self._check_mode(key, entry, other)
                out.append(self._init_answer(w, other, entry))
            except OpError as exc:
                out.append(Reply(w, Failed(other.id, exc.kind, str(exc))))
        return out

    def evict_some(self, budget: int = dynparts.EVICT_STEP) -> int:
        """One bounded eviction step of the tables without a row count (psnode.server.dynparts)."""
        return dynparts.evict_some(self.entries, budget, self.key_rounds.track) if self.dynamic else 0

    def table_counts(self) -> tuple[tuple[str, int, int, int, int], ...]:
        """Per table without a row count: (key, rows, admitted, evicted, dropped) (``mxdist status``)."""
        return tuple((k, c["rows"], c["admitted"], c["evicted"], c["dropped"])
                     for k, c in dynparts.counters(self.entries).items())

    def evict_due(self) -> bool:
        """Is an eviction step due (cheap)?"""
        return any(e.table is not None and dynparts.due(e) for e in self.entries.values())

    @property
    def dynamic(self) -> bool:
        """Does this server hold a part of a table without a row count?"""
        return any(e.table is not None for e in self.entries.values())

    def fill_some(self, budget: int | None = None) -> list[Reply]:
        """Compute the next ``budget`` elements of the parts being filled (psnode.server.fills;
        negative: all); each part completed becomes a key, and the inits waiting for it are
        answered."""
        out: list[Reply] = []
        for fill in self.filling.step(budget):
            op = fill.op
            entry = Entry(value=fill.value, sparse=op.sparse, sync=op.sync, aggregation=_rule(op),
                          staleness=op.staleness, backup=op.backup)
            if isinstance(fill.spec, FillSpec):
                made_from(entry, fill.spec)
            optimizer = self.rules.optimizer_for(entry)
            if optimizer is not None:
                entry.state = optimizer.create_state(entry.value)
            self.entries[fill.key] = entry
            self.must_persist = True   # (as _init)
            out.append(self._init_answer(fill.worker, op, entry))
            for w, other in self.waiting_inits.pop(fill.key, []):
                try:
                    self._check_meta(fill.key, entry, other.dtype, other.shape)
                    self._check_mode(fill.key, entry, other)
                    out.append(self._init_answer(w, other, entry))
                except OpError as exc:
                    out.append(Reply(w, Failed(other.id, exc.kind, str(exc))))
        return out

    def _init_answer(self, worker: int, op: Init, entry: Entry) -> Reply:
        """An init's Ok: the stored value (none for a ``bare`` init) and the push count (a
        joiner's: the completed round)."""
        seq = self._join_count(entry) if op.join else self._accepted(entry, worker)
        if op.bare:
            return Reply(worker, Ok(op.id, [], seq=seq))
        return Reply(worker, Ok(op.id, [entry.value], seq=seq), entry)

    def _accepted(self, entry: Entry, worker: int) -> int:
        """How many pushes of ``worker`` this key part has taken without a gap (applied, being
        summed or waiting): where a restarted worker resumes.  Its predecessor's journal died
        with it, so on a restartable server the count must be durable before it is told, and
        the predecessor's sync pushes past the gap, not applied, are dropped: the replacement
        pushes those steps again (else a round it has not pushed yet could complete)."""
        count = contiguous(entry, worker)
        queue = entry.early.get(worker)
        if queue and any(q > count for q, *_ in queue):
            entry.early[worker] = [item for item in queue if item[0] <= count]
            if not entry.early[worker]:
                del entry.early[worker]
            self.must_persist = True
        if count > entry.durable.get(worker, 0):
            self.must_persist = True
        return count

    def _join_count(self, entry: Entry) -> int:
        """What a joiner's init answers: the part's completed round (a dist_ssp part: the
        highest clock of its gating workers, psnode.server.staleness.join_clock)."""
        if entry.sync or entry.staleness < 0:
            return entry.round
        return bound.join_clock(entry.pushed, self.rules.gating(entry))

    @staticmethod
    def _check_mode(key: Key, entry: Entry, op: Init) -> None:
        """Every worker of a dist_ssp part uses its staleness (a store of another kind or bound
        is refused by name)."""
        if entry.staleness != op.staleness and (entry.staleness >= 0 or op.staleness >= 0):
            def kind(sync: bool, s: int) -> str:
                return f"dist_ssp staleness={s}" if s >= 0 else ("dist_sync" if sync else "dist_async")
            raise OpError("ConfigError", f"{fmt(*key)} was created by a {kind(entry.sync, entry.staleness)} store; "
                                         f"this worker's is {kind(op.sync, op.staleness)}: every worker must "
                                         "create the same kind of store")
        if entry.aggregation.name != op.aggregation:
            raise OpError("ConfigError", f"{fmt(*key)} was created by a store with aggregator="
                                         f"{entry.aggregation.name!r}; this worker's has aggregator="
                                         f"{op.aggregation!r}: every worker must create the same kind of store "
                                         "(a job resumed from a checkpoint keeps the checkpoint's)")
        if entry.backup != op.backup:
            raise OpError("ConfigError", f"{fmt(*key)} was created by a store with backup_workers={entry.backup}; "
                                         f"this worker's has backup_workers={op.backup}: every worker must create "
                                         "the same kind of store")

    @staticmethod
    def _check_meta(key: Key, entry: Entry, dtype: str, shape: tuple[int, ...]) -> None:
        if entry.table is not None:
            have = (dynrows.HEIGHT, entry.table.params.width)
            if entry.value.dtype.name != dtype or have != tuple(shape):
                raise OpError("ShapeMismatch", f"{fmt(*key)} was initialised as {entry.value.dtype.name}"
                                               f"[None, {have[1]}], not {dtype}{list(shape)}")
            return
        if entry.value.dtype.name != dtype or entry.value.shape != tuple(shape):
            raise OpError("ShapeMismatch",
                          f"{fmt(*key)} was initialised as {entry.value.dtype.name}"
                          f"{list(entry.value.shape)}, not {dtype}{list(shape)}")

    # ---------------------------------------------------------------- push
    def _push(self, worker: int, op: Push) -> list[Reply]:
        key = (op.key, op.part)
        data = self._gradient(worker, key, op)
        entry = self._entry(key)
        rows = op.rows
        if entry.table is not None and rows is not None and isinstance(data, np.ndarray):
            rows, data = dynparts.push_rows(entry, worker, op.seq, rows, data, self.alloc, self.key_rounds.track)
        out = self.key_rounds.push(worker, key, entry, op.seq, data, rows)
        if op.na:
            return out
        # a push that asks for its answer asks for its durability too (psnode.worker.journal)
        self.must_persist = True
        return [Reply(worker, Ok(op.id, seq=contiguous(entry, worker)), holder=entry), *out]

    def _gradient(self, worker: int, key: Key, op: Push | PushPull) -> np.ndarray | Packed:
        """A push's dense gradient: its data, or its compressed payload checked (decoded where
        it is summed: psnode.server.compressed.Packed); every worker must push with the same gradient
        compression (psnode.server.compressed.agree)."""
        if self.settings.get(worker) != op.comp:
            agree(self.settings, worker, op.comp)
        if not op.comp:
            return op.data
        entry = self._entry(key)
        return packed_push(op.comp, op.data, entry.value, fmt(*key), entry.sparse)

    def _bucket_gradient(self, worker: int, bid: int, op: Push | PushPull) -> np.ndarray:
        """:meth:`_gradient` for a bucket's push, decoded (its members may be served apart)."""
        if self.settings.get(worker) != op.comp:
            agree(self.settings, worker, op.comp)
        if not op.comp:
            return op.data
        b = self.fused.bucket(bid)
        return packed_push(op.comp, op.data, b.value[:b.used], f"the bucket of {fmt(*b.members[0].key)}").decode()

    # ---------------------------------------------------------------- pull
    def _pull(self, worker: int, op: Pull) -> list[Reply]:
        key = (op.key, op.part)
        entry = self._entry(key)
        rows = op.rows
        if entry.table is not None and rows is None:   # (an export: every trained row, as it is now)
            return [Reply(worker, Ok(op.id, dynparts.export(entry), 0))]
        if entry.table is not None and rows is not None:
            rows = dynparts.pull_rows(entry, rows, self.alloc, self.key_rounds.track, op.after, worker)
        return self.key_rounds.pull(worker, op.id, key, entry, op.after, rows, op.re, op.dest)

    def _pushpull(self, worker: int, op: PushPull) -> list[Reply]:
        key = (op.key, op.part)
        data = self._gradient(worker, key, op)
        entry = self._entry(key)
        rounds = self.key_rounds
        out = rounds.push(worker, key, entry, op.seq, data, None)
        if op.durable:
            self.must_persist = True   # (as a push that asks)
        return [*out, *rounds.pull(worker, op.id, key, entry, op.seq, None, op.re, op.dest)]

    def _flush(self, worker: int, op: Flush) -> list[Reply]:
        """Answered at once: every earlier request of this worker that arrived has been handled.

        ``check`` lists pushes the worker sent; the answer names under ``missing`` those never
        received (lost on the way), for the worker to send again.  Ok: every push listed was
        received (and, on a restartable server, is durable once the answer leaves).
        """
        missing = []
        for key, part, seqs in op.check:
            bid = bucket_of(key)
            if bid is not None:
                lost = [q for q in seqs if not self.fused.received(bid, worker, q)]
                durable = self.fused.durable(bid, worker)
            else:
                entry = self.entries.get((key, part))
                lost = [] if entry is None else [q for q in seqs if not received(entry, worker, q)]
                durable = entry.durable.get(worker, 0) if entry is not None else 0
            if lost:
                missing.append((key, part, lost))
            elif op.durable and seqs and max(seqs) > durable:
                self.must_persist = True
        return [Reply(worker, Missing(op.id, missing) if missing else Ok(op.id))]

    # ---------------------------------------------------------------- elastic membership
    def _join(self, worker: int, op: Join) -> list[Reply]:
        """A joiner's start round for a key part: the compare-and-set of the module docstring."""
        rules = self.rules
        self.must_persist = True   # (the start round agreed is told only once durable)
        if op.generation < rules.generation and worker not in rules.active:
            raise OpError("PeerLost", f"worker {worker} was removed from the job (generation {rules.generation})")
        key = (op.key, op.part)
        entry = self._entry(key)
        s = op.start
        held = entry.start.get(worker)
        if held == s and worker in rules.admitted:
            return [Reply(worker, Ok(op.id, seq=s))]   # (sent again)
        if held is not None and worker in rules.admitted and received(entry, worker, held):
            raise OpError("ProtocolError", f"worker {worker} pushed {fmt(*key)} already: its start cannot move")
        if entry.sync:   # (async parts have no rounds: the push numbers just continue from s - 1)
            opened = entry.round + 1 if entry.contributors else entry.round   # the last round opened
            if s <= opened:
                return [Reply(worker, Ok(op.id, seq=opened + 1))]
        rules.admitted[worker] = max(rules.admitted.get(worker, 0), op.generation)
        entry.start[worker] = s
        entry.pushed[worker] = entry.durable[worker] = s - 1
        entry.ahead.pop(worker, None)
        queue = [item for item in entry.early.get(worker, []) if item[0] < s]   # (a reused rank's old pushes)
        if queue:
            entry.early[worker] = queue
        else:
            entry.early.pop(worker, None)
        out = [Reply(worker, Ok(op.id, seq=s))]
        if entry.sync and held is not None:   # a start moved later: the round it held may complete
            out.extend(self.key_rounds.complete(key, entry))
            out.extend(self.key_rounds.answer_pulls(entry))
        elif entry.staleness >= 0:   # (the joiner gates the part from its start on)
            out.extend(self.key_rounds.answer_pulls(entry))
        return out

    def set_membership(self, active: set[int], generation: int = 0, joiners: set[int] | None = None) -> list[Reply]:
        """A MEMBERSHIP (psnode.server.rounds.Rules): the members, their generation (an older
        one than the last taken is ignored) and the joiners among them; completes the rounds
        that waited only for workers removed."""
        rules = self.rules
        if generation < rules.generation:
            return []
        rules.generation = generation
        rules.joiners = set(joiners or ())
        for w, g in list(rules.admitted.items()):
            if w not in active and generation >= g:   # removed after its admission
                del rules.admitted[w]
                for entry in self.entries.values():
                    entry.start.pop(w, None)
        return self.set_active(active)

    # ---------------------------------------------------------------- optimizer
    def _set_optimizer(self, worker: int, op: SetOptimizer) -> list[Reply]:
        self.fused.split_all()
        try:
            optimizer = opt_mod.from_spec(op.spec)
        except Exception as exc:  # noqa: BLE001 - validation errors go back to the worker
            raise OpError("ConfigError", str(exc)) from None
        if self.rules.optimizer is None or self.rules.optimizer.to_spec() != optimizer.to_spec():
            # the same optimizer with other parameters (a new learning rate) keeps the states
            keep = self.rules.optimizer is not None and self.rules.optimizer.name == optimizer.name \
                and self.rules.optimizer.state_names() == optimizer.state_names()
            self.rules.optimizer = optimizer
            self.must_persist = True
            for entry in [] if keep else self.entries.values():
                entry.state = optimizer.create_state(entry.value) if entry.value.dtype.kind == "f" else None
                entry.changed = True
        return [Reply(worker, Ok(op.id))]

    def state_bytes(self) -> int:
        """The bytes of every key part's value and optimizer state (what a whole copy moves)."""
        total = 0
        for entry in self.entries.values():
            total += entry.value.nbytes
            if entry.state is not None:
                total += sum(a.nbytes for a in opt_mod.state_to_arrays(entry.state).values())
        return total

    def _get_states(self, worker: int, op: GetStates) -> list[Reply]:
        """Every key part's optimizer state, as named arrays (for save_optimizer_states)."""
        self.fused.split_all()
        names, out = [], []
        for (key, part), entry in self.entries.items():
            if entry.state is None:
                continue
            for name, arr in opt_mod.state_to_arrays(entry.state).items():
                names.append((key, part, name))
                out.append(np.array(arr, copy=True))
        return [Reply(worker, Ok(op.id, out, names=names))]

    def _load_states(self, worker: int, op: LoadStates) -> list[Reply]:
        if self.rules.optimizer is None:
            raise OpError("ConfigError", "no optimizer is set: call kv.set_optimizer first")
        self.fused.split_all()
        grouped: dict[Key, dict[str, np.ndarray]] = {}
        for (k, part, name), arr in zip(op.names, op.arrays, strict=True):
            grouped.setdefault((k, part), {})[name] = np.array(arr)
        for where, named in grouped.items():
            entry = self.entries.get(where)
            if entry is None:
                raise OpError("KeyNotInitialized", f"{fmt(*where)} in the state file is not initialised")
            entry.state = opt_mod.state_from_arrays(named)
            entry.changed = True
            note_touch(entry, None)   # (its untouched rows' state is no longer zero)
        self.must_persist = True
        return [Reply(worker, Ok(op.id))]

    # ---------------------------------------------------------------- durability
    def persist_due(self, every: int) -> bool:
        """Must a checkpoint be written before the replies handled since the last one leave?
        (``every``: completed rounds between checkpoints, 0 for none by rounds.)"""
        return (self.restartable and self.must_persist) or bool(every and self.rounds - self.durable_rounds >= every)

    def point_due(self, replies: list[Reply], every: int) -> bool:
        """Must a durable point be made before ``replies`` leave (or by rounds, at all)?"""
        by_rounds = bool(every and self.rounds - self.durable_rounds >= every)
        return by_rounds or bool(replies and self.persist_due(every))

    def begin_point(self) -> Marks:
        """A durable point of the store as it is begins (its snapshot is taken now): the
        watermarks it makes true once it is complete (:meth:`end_point`).  Replies handled from
        here on that reveal something new need the next point (``must_persist``)."""
        workers = set(range(self.num_workers)) | self.rules.active | set(self.rules.admitted)
        self.fused.split_all()   # (a snapshot split them already: members hold their state)
        marks: dict[Key, tuple[dict[int, int], dict[int, int]]] = {}
        for key, entry in self.entries.items():
            pushed = dict(entry.pushed) if not entry.early and not entry.ahead else \
                {w: contiguous(entry, w) for w in workers}
            marks[key] = (pushed, dict(entry.start))
        self.must_persist = False
        self.durable_rounds = self.rounds
        return marks

    def end_point(self, marks: Marks) -> None:
        """The point begun with ``marks`` is complete (on disk, at every holder): the watermarks
        answers report move up to it (never down; a worker whose start round moved since, an
        elastic join, keeps its own)."""
        for key, (pushed, start) in marks.items():
            entry = self.entries.get(key)
            if entry is None:
                continue
            entry.fresh = False
            for w, q in pushed.items():
                if q > entry.durable.get(w, 0) and entry.start.get(w) == start.get(w):
                    entry.durable[w] = q
        self.fused.mark_durable()

    def mark_durable(self) -> None:
        """A checkpoint of the store as it is was written (or loaded): every push it holds is
        durable; the watermarks answers report move up to it."""
        self.end_point(self.begin_point())

    def stamp(self, replies: list[Reply]) -> list[Reply]:
        """(restartable) Each answer's ``seq`` set to the worker's durable watermark."""
        if self.restartable:
            for r in replies:
                if r.holder is not None:
                    r.answer.seq = r.holder.durable.get(r.worker, 0)  # type: ignore[union-attr]
        return replies

    def release(self, replies: list[Reply], every: int, checkpoint: Callable[[], None]) -> list[Reply]:
        """The replies, ready to leave: ``checkpoint()`` first when :meth:`point_due` (what
        only replies would reveal waits for the first reply that leaves: the pushes of the
        others in the round then share the checkpoint), then :meth:`stamp`."""
        if self.point_due(replies, every):
            checkpoint()
        return self.stamp(replies)

    @property
    def track_changes(self) -> bool:
        """Record the rows (or whole parts) each round changes, for copies and checkpoints that
        carry only what changed since the last one (psnode.server.keypart.note_change)."""
        return self.key_rounds.track

    @track_changes.setter
    def track_changes(self, on: bool) -> None:
        self.key_rounds.track = on

    def forget_changes(self) -> None:
        """Every copy of the store holds it as it is: changes count from here."""
        for entry in self.entries.values():
            forget_changes(entry)
            if entry.table is not None:
                entry.table.forget_gone()

    # ---------------------------------------------------------------- membership
    def set_active(self, workers: set[int]) -> list[Reply]:
        """The workers still taking part; completes rounds that only waited for leavers."""
        self.rules.active = set(workers)
        self.fused.split_all()
        out: list[Reply] = []
        rounds = self.key_rounds
        for key, entry in self.entries.items():
            if entry.sync:
                out.extend(rounds.complete(key, entry))
                out.extend(rounds.answer_pulls(entry))
            elif entry.staleness >= 0:   # (the floor may rise: psnode.server.staleness)
                out.extend(rounds.answer_pulls(entry))
        for b in self.fused.all.values():
            out.extend(self.fused.answer(b))
        return out


def _rule(op: Init) -> agg_mod.Aggregation:
    """The aggregation rule ``op`` names (psnode.math.aggregation); OpError ConfigError if unknown."""
    try:
        return agg_mod.parse(op.aggregation, f"init of {fmt(op.key, op.part)}")
    except ValueError as exc:
        raise OpError("ConfigError", f"{exc}; every worker and server must run the same psnode") from None
