"""A table without a row count on its server: hashed id -> slot, admission and eviction
(pure: numpy, no I/O).

A dynamic table's key part (psnode.math.dynrows) holds its rows in a growable array, the
part's ``Entry.value`` (``capacity x width``), and :class:`Table`, its index: a dict from the
hashed id to the row's slot, the id of each slot (``ids``), the clock of each slot's last
touch (``last``), the free slots.  Lookups are batches (:meth:`Table.find`: one dict probe
per id, the rest vectorised).  The rounds of the part (psnode.server.rounds) work on slots:
the store translates the ids of each push and pull (psnode.server.store), so the optimizer
state (per row, like the value) and change tracking follow the slots.

**Rows made on first touch.**  A pull or push of an id without a row makes it, with the
table's initial values of that id (psnode.math.dynrows.row_values).

**Admission** (``min_count = k > 1``).  An id's occurrences are the pushes carrying it; they
are counted in a count-min sketch (:class:`Sketch`: ``depth`` rows of ``width`` saturating
uint8 counters, ``depth * width`` bytes per key part whatever the number of ids; an id's
estimate is never below its true count, so an id is admitted at its k-th occurrence or
earlier when it collides with frequent ones).  The push of an id's k-th occurrence is the
first whose gradient counts.  Before that, its gradient is dropped (counted in
``dropped``) and a pull returns the row's initial values (``absent="init"``) or zeros
(``absent="zeros"``) from a *provisional* row: one that is never trained, never copied or
checkpointed, and evicted first.

**Eviction** (:meth:`Table.victims`, in bounded steps): rows untouched for more than ``ttl``
clock ticks (the part's completed rounds, or pushes applied for an async part; a scan every
``max(1, ttl // 8)`` ticks, so at most that late), then the least recently touched rows above
``max_rows``.  Slots a round in progress or a parked pull
still refers to are never evicted.  Evicted ids are kept until the next durable point (the
copies and checkpoints delete them: psnode.server.image).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from psnode.math import dynrows
from psnode.math.initializers import Initializer

SKETCH_DEPTH = 4
SKETCH_WIDTH = 1 << 18   # counters per sketch row: 1 MiB per key part with min_count > 1
PROVISIONAL = 1 << 16    # provisional rows kept before an eviction step drops them
REMEMBERED = 2           # pulls per worker whose slots a push of the same rows reuses


@dataclass
class Params:
    """A dynamic table's settings (the JSON of its init's ``dynamic``)."""

    width: int
    min_count: int = 1
    ttl: int = 0          # 0: rows never expire
    max_rows: int = 0     # 0: no cap (rows per key part, i.e. per server)
    absent: str = "init"  # what a pull of an id not admitted yet returns: "init" | "zeros"

    def to_json(self) -> dict[str, Any]:
        return {"width": self.width, "min_count": self.min_count, "ttl": self.ttl, "max_rows": self.max_rows,
                "absent": self.absent}

    @classmethod
    def from_json(cls, spec: Any) -> Params:
        """Strict inverse of :meth:`to_json`; ValueError naming what is wrong."""
        if not isinstance(spec, dict) or set(spec) != {"width", "min_count", "ttl", "max_rows", "absent"}:
            raise ValueError(f"a dynamic table's settings are width, min_count, ttl, max_rows, absent; got {spec!r}")
        for name in ("width", "min_count", "ttl", "max_rows"):
            v = spec[name]
            if type(v) is not int or v < (1 if name in ("width", "min_count") else 0):
                raise ValueError(f"dynamic table: {name} {v!r} must be an integer >= "
                                 f"{1 if name in ('width', 'min_count') else 0}")
        if spec["min_count"] > 255:
            raise ValueError(f"dynamic table: min_count {spec['min_count']} is above 255")
        if spec["absent"] not in ("init", "zeros"):
            raise ValueError(f"dynamic table: absent {spec['absent']!r}: use 'init' or 'zeros'")
        return cls(**spec)


class Sketch:
    """A count-min sketch of int64 ids: ``depth x width`` saturating uint8 counters."""

    def __init__(self, depth: int = SKETCH_DEPTH, width: int = SKETCH_WIDTH, counts: np.ndarray | None = None) -> None:
        self.counts = np.zeros((depth, width), np.uint8) if counts is None else np.array(counts, np.uint8)
        self.salts = dynrows.mix(np.arange(1, self.counts.shape[0] + 1, dtype=np.int64)).view(np.uint64)

    def _cells(self, hashed: np.ndarray) -> np.ndarray:
        u = hashed.view(np.uint64)
        width = np.uint64(self.counts.shape[1])
        return np.stack([dynrows.mix((u ^ s).view(np.int64)).view(np.uint64) % width
                         for s in self.salts]).astype(np.int64)

    def add(self, hashed: np.ndarray) -> np.ndarray:
        """Count one occurrence of each of ``hashed`` (distinct); their estimates after it."""
        cells = self._cells(hashed)
        rows = np.arange(self.counts.shape[0])[:, None]
        c = self.counts[rows, cells]
        np.minimum(c.astype(np.int64) + 1, 255, out=c, casting="unsafe")
        self.counts[rows, cells] = c
        return self.counts[rows, cells].min(axis=0)

    def estimate(self, hashed: np.ndarray) -> np.ndarray:
        rows = np.arange(self.counts.shape[0])[:, None]
        return self.counts[rows, self._cells(hashed)].min(axis=0)


#: keys re-inserted per batch when the index grows
REHASH_STEP = 1 << 16
#: buckets a lookup reads per key in its first pass
WINDOW = 4
_WINDOW = np.arange(WINDOW, dtype=np.int64)[None, :]
#: inserts of at most this many keys, and lookups whose chains go past the window for at
#: most this many keys, go one key at a time (a batch's numpy passes cost more)
ONE_BY_ONE = 64


class HashIndex:
    """int64 key -> int64 value, open addressing in numpy arrays (linear probing, load at most
    1/2, tombstones for deletions): every operation takes a batch of keys, vectorised (one
    pass per probe step; about 1.5 probes per key on average).  Keys are table hashes (already
    well mixed: the low bits pick the bucket)."""

    EMPTY, FULL, DELETED = 0, 1, 2

    def __init__(self, size: int = 1024) -> None:
        size = 1 << max(4, (size - 1).bit_length())
        # written through at once (np.full, not np.zeros' untouched pages): an insert touches
        # buckets in random order, and taking each page on its first random touch costs tens
        # of times more (a rehash of 2 M keys: seconds instead of a fraction of one)
        self.keys = np.full(size, 0, np.int64)
        self.vals = np.full(size, 0, np.int64)
        self.state = np.full(size, 0, np.uint8)
        self.count = 0      # keys held
        self.dead = 0       # tombstones

    def __len__(self) -> int:
        return self.count

    def _probe(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(bucket of each key, or of the empty bucket that ends its chain; found?).  The first
        pass reads a window of :data:`WINDOW` buckets per key at once (most chains end there);
        the keys whose chain goes on probe step by step."""
        mask = len(self.keys) - 1
        n = len(keys)
        window = (keys[:, None] + _WINDOW) & mask
        st = self.state[window]
        hit = (st == self.FULL) & (self.keys[window] == keys[:, None])
        end = hit | (st == self.EMPTY)
        first = end.argmax(axis=1)
        every = np.arange(n)
        ended = end[every, first]
        found = hit[every, first] & ended
        pos = np.where(ended, window[every, first], (keys + WINDOW) & mask)
        todo = np.flatnonzero(~ended)
        if len(todo) <= ONE_BY_ONE:     # a few long chains: walked one at a time
            state, stored, full, empty = self.state, self.keys, self.FULL, self.EMPTY
            for i in todo.tolist():
                key, at = int(keys[i]), int(pos[i])
                while state[at] != empty and not (state[at] == full and stored[at] == key):
                    at = (at + 1) & mask
                pos[i], found[i] = at, state[at] != empty
            return pos, found
        while len(todo):
            p = pos[todo]
            st = self.state[p]
            hit = (st == self.FULL) & (self.keys[p] == keys[todo])
            found[todo[hit]] = True
            more = ~hit & (st != self.EMPTY)
            todo = todo[more]
            pos[todo] = (pos[todo] + 1) & mask
        return pos, found

    def get(self, keys: np.ndarray) -> np.ndarray:
        """The values of ``keys`` (-1 where absent)."""
        pos, found = self._probe(np.asarray(keys, np.int64))
        return np.where(found, self.vals[pos], -1)

    def add(self, keys: np.ndarray, vals: np.ndarray) -> None:
        """Insert ``keys`` (distinct, none held) with ``vals``."""
        if 2 * (self.count + self.dead + len(keys)) > len(self.keys):
            self._rehash(self.count + len(keys))
        keys = np.asarray(keys, np.int64)
        if len(keys) <= ONE_BY_ONE:
            self._add_each(keys, np.asarray(vals, np.int64))
            return
        mask = len(self.keys) - 1
        pos = keys & mask
        todo = np.arange(len(keys))
        while len(todo):
            p = pos[todo]
            free = self.state[p] != self.FULL
            cand, cp = todo[free], p[free]
            # one key per free bucket this step: the last to write its index there (a free
            # bucket's value is scratch); the others probe on
            self.vals[cp] = cand
            won = self.vals[cp] == cand
            win, wp = cand[won], cp[won]
            self.dead -= int((self.state[wp] == self.DELETED).sum())
            self.keys[wp], self.vals[wp], self.state[wp] = keys[win], vals[win], self.FULL
            left = np.ones(len(todo), bool)
            left[np.flatnonzero(free)[won]] = False
            todo = todo[left]
            pos[todo] = (pos[todo] + 1) & mask
        self.count += len(keys)

    def _add_each(self, keys: np.ndarray, vals: np.ndarray) -> None:
        """:meth:`add` of a few keys, one at a time (a batch's numpy passes cost more)."""
        mask = len(self.keys) - 1
        state, full = self.state, self.FULL
        for key, val in zip(keys.tolist(), vals.tolist(), strict=True):
            p = key & mask
            while state[p] == full:
                p = (p + 1) & mask
            if state[p] == self.DELETED:
                self.dead -= 1
            self.keys[p], self.vals[p], state[p] = key, val, full
        self.count += len(keys)

    def remove(self, keys: np.ndarray) -> None:
        """Delete ``keys`` (all held)."""
        pos, found = self._probe(np.asarray(keys, np.int64))
        pos = pos[found]
        self.state[pos] = self.DELETED
        self.count -= len(pos)
        self.dead += len(pos)

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        full = self.state == self.FULL
        return self.keys[full], self.vals[full]

    def _rehash(self, need: int) -> None:
        keys, vals = self.items()
        self.__init__(4 * max(need, 1))  # type: ignore[misc]
        for at in range(0, len(keys), REHASH_STEP):   # (small temporaries: no fresh pages each pass)
            self.add(keys[at:at + REHASH_STEP], vals[at:at + REHASH_STEP])


@dataclass
class Table:
    """The index of one dynamic key part (see the module docstring)."""

    params: Params
    init: Initializer
    seed: int
    key: int | str
    index: HashIndex = field(default_factory=HashIndex)   # hashed id -> slot
    ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))      # slot -> hashed id
    last: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))     # slot -> last touch
    trained: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))      # slot -> admitted
    held: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))         # slot -> holds a row
    stamp: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))    # slot -> version of its last change
    version: int = 0         # changes counted (exports name it: rows changed after one export)
    free: list[int] = field(default_factory=list)
    used: int = 0            # slots ever handed out (high water); the others are beyond
    clock: int = 0
    sketch: Sketch | None = None
    made: int = 0            # rows made (admitted rows; provisional ones not counted)
    admitted: int = 0        # ids admitted by the sketch (min_count > 1)
    evicted: int = 0         # rows evicted
    dropped: int = 0         # gradient rows dropped (ids not admitted)
    gone: list[np.ndarray] = field(default_factory=list)   # hashed ids evicted since the last durable point
    scanned: int = -1        # the clock of the last eviction scan
    touched: list[np.ndarray] = field(default_factory=list)   # slots touched since the last durable point
    drops: int = 0           # eviction steps taken (a slot found before one may hold another id after it)
    pulled: dict[int, list[tuple[np.ndarray, np.ndarray, int]]] = field(default_factory=dict)
    # per worker: its last pulls' (ids, slots, drops), for the push of the same rows (:meth:`recall`)

    def __post_init__(self) -> None:
        if self.params.min_count > 1 and self.sketch is None:
            self.sketch = Sketch()

    @property
    def capacity(self) -> int:
        return len(self.ids)

    @property
    def rows(self) -> int:
        """Rows held (trained and provisional)."""
        return len(self.index)

    def live_slots(self) -> np.ndarray:
        """The slots of trained rows, ascending."""
        return np.flatnonzero(self.trained[:self.used])

    def due(self) -> bool:
        """Is an eviction step due (cheap: no scan)?"""
        p = self.params
        return (bool(p.max_rows) and len(self.index) > p.max_rows) or \
            (bool(p.ttl) and self.clock - self.scanned >= max(1, p.ttl // 8)) or \
            len(self.index) - self.trained_rows() > PROVISIONAL

    def trained_rows(self) -> int:
        return self.made - self.evicted

    def lookup(self, hashed: np.ndarray) -> np.ndarray:
        """The slots of ``hashed`` (-1 where there is no row)."""
        return self.index.get(hashed)

    def remember(self, worker: int, hashed: np.ndarray, slots: np.ndarray) -> None:
        """``worker`` pulled the rows of ``hashed`` (distinct), at ``slots`` (every one held): its
        push of the same rows finds them without a lookup (:meth:`recall`).  The last
        :data:`REMEMBERED` pulls of each worker are kept (a prefetch pulls the next batch's rows
        before the push of this one's)."""
        kept = self.pulled.setdefault(worker, [])
        # copies: a pull's ids may be read in place from the worker's shared memory, which it
        # reuses once answered, and the rounds keep the slots they are given
        kept.append((hashed.copy(), slots.copy(), self.drops))
        del kept[:-REMEMBERED]

    def recall(self, worker: int, hashed: np.ndarray) -> np.ndarray | None:
        """The slots of ``hashed`` (distinct) when ``worker`` pulled exactly these rows and no
        row was dropped since (the remembered copy, taken once); else None: :meth:`lookup` them."""
        kept = self.pulled.get(worker)
        if not kept:
            return None
        for i, (ids, slots, drops) in enumerate(kept):
            if drops == self.drops and len(ids) == len(hashed) and np.array_equal(ids, hashed):
                del kept[:i + 1]
                return slots
        return None

    def grow_to(self, need: int) -> int:
        """Make room for ``need`` slots; the new capacity (the caller grows the arrays)."""
        cap = self.capacity
        if need <= cap:
            return cap
        new = max(need, 2 * cap, 64)
        self.ids = np.concatenate([self.ids, np.zeros(new - cap, np.int64)])
        self.last = np.concatenate([self.last, np.zeros(new - cap, np.int64)])
        self.trained = np.concatenate([self.trained, np.zeros(new - cap, bool)])
        self.held = np.concatenate([self.held, np.zeros(new - cap, bool)])
        self.stamp = np.concatenate([self.stamp, np.zeros(new - cap, np.int64)])
        return new

    def place(self, hashed: np.ndarray, trained: bool) -> np.ndarray:
        """New rows for ``hashed`` (distinct, none held): their slots (free ones first).  The
        caller grows the value to :attr:`capacity` and writes the rows' values."""
        n = len(hashed)
        reuse = min(n, len(self.free))
        slots = np.empty(n, np.int64)
        if reuse:
            slots[:reuse] = self.free[len(self.free) - reuse:]
            del self.free[len(self.free) - reuse:]
        fresh = n - reuse
        slots[reuse:] = np.arange(self.used, self.used + fresh)
        self.used += fresh
        self.grow_to(self.used)
        self.ids[slots] = hashed
        self.last[slots] = self.clock
        self.trained[slots] = trained
        self.held[slots] = True
        self.version += 1
        self.stamp[slots] = self.version
        self.index.add(hashed, slots)
        if trained:
            self.made += n
        return slots

    def initial(self, hashed: np.ndarray, dtype: Any, trained: bool = True) -> np.ndarray:
        """The initial rows of ``hashed`` (zeros for provisional rows with ``absent="zeros"``)."""
        if not trained and self.params.absent == "zeros":
            return np.zeros((len(hashed), self.params.width), dtype)
        return dynrows.row_values(self.init, self.seed, self.key, hashed, self.params.width, dtype)

    def drop(self, slots: np.ndarray, track: bool = True) -> np.ndarray:
        """Evict ``slots``; the hashed ids of the trained ones among them (kept for the next
        durable point: ``track``; without copies or checkpoints nothing is kept)."""
        hashed = self.ids[slots]
        self.index.remove(hashed)
        self.drops += 1
        self.free.extend(slots.tolist())
        was = hashed[self.trained[slots]]
        self.trained[slots] = False
        self.held[slots] = False
        if len(was):
            if track:
                self.gone.append(was)
            self.evicted += len(was)
        return was

    def victims(self, budget: int, busy: np.ndarray) -> np.ndarray:
        """Up to ``budget`` slots to evict now (module docstring), none of ``busy``."""
        self.scanned = self.clock
        if not len(self.index):
            return np.zeros(0, np.int64)
        slots = np.flatnonzero(self.held[:self.used])
        if len(busy):
            slots = slots[~np.isin(slots, busy)]
        prov = slots[~self.trained[slots]]
        out = [prov[:budget]]
        left = budget - len(out[0])
        rest = slots[self.trained[slots]]
        if left > 0 and self.params.ttl:
            old = rest[self.last[rest] < self.clock - self.params.ttl]
            out.append(old[:left])
            left -= len(out[-1])
            rest = rest[self.last[rest] >= self.clock - self.params.ttl]
        over = len(self.index) - sum(len(o) for o in out) - self.params.max_rows
        if left > 0 and self.params.max_rows and over > 0:
            k = min(left, over, len(rest))
            if k:
                out.append(rest[oldest(self.last[rest], k)])
        return np.concatenate(out).astype(np.int64)

    # ------------------------------------------------------------ durable state
    def meta(self) -> dict[str, Any]:
        return {"params": self.params.to_json(), "init": self.init.to_spec(), "seed": self.seed,
                "clock": self.clock, "version": self.version, "made": self.made, "admitted": self.admitted,
                "evicted": self.evicted, "dropped": self.dropped}

    def forget_gone(self) -> None:
        """A durable point holds the table as it is (evictions and touches count from here)."""
        self.gone.clear()
        self.touched.clear()

    def changed(self, slots: np.ndarray) -> None:
        """``slots`` change (a push's rows): their stamp is a new version."""
        if len(slots):
            self.version += 1
            self.stamp[slots] = self.version

    def touch(self, slots: np.ndarray, when: int, track: bool) -> None:
        """``slots`` touched at clock ``when`` (recorded for the next durable point: ``track``)."""
        self.last[slots] = np.maximum(self.last[slots], when)
        if track and len(slots):
            self.touched.append(np.array(slots, np.int64))

    def touched_slots(self) -> np.ndarray:
        """The trained slots touched since the last durable point, ascending."""
        if not self.touched:
            return np.zeros(0, np.int64)
        slots = np.unique(np.concatenate(self.touched))
        self.touched[:] = [slots]
        return slots[self.trained[slots]]

    def gone_ids(self) -> np.ndarray:
        return np.unique(np.concatenate(self.gone)) if self.gone else np.zeros(0, np.int64)


def oldest(last: np.ndarray, k: int) -> np.ndarray:
    """The positions of ``k`` smallest of ``last`` (clock ticks; ties in position order): by a
    count of each tick when the ticks span little (a clock's recent past: one pass), else by
    a partial sort."""
    if k >= len(last):
        return np.arange(len(last))
    lo = int(last.min())
    span = int(last.max()) - lo + 1
    if span > 4 * len(last):
        return np.argpartition(last, k - 1)[:k]
    below = np.cumsum(np.bincount(last - lo, minlength=span))
    cut = int(np.searchsorted(below, k))          # the tick at which the k-th smallest lies
    under = np.flatnonzero(last < lo + cut)
    at = np.flatnonzero(last == lo + cut)[:k - len(under)]
    return np.concatenate([under, at])


def grow(arr: np.ndarray, capacity: int) -> np.ndarray:
    """``arr`` (rows) with room for ``capacity`` rows (zeros past its own)."""
    if len(arr) >= capacity:
        return arr
    out = np.zeros((capacity, *arr.shape[1:]), arr.dtype)
    out[:len(arr)] = arr
    return out


__all__ = ["Params", "Sketch", "Table", "grow"]
