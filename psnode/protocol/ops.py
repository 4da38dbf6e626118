"""Typed data operations (worker -> server) and their answers (server -> worker).

Every field of a data message is defined here once; :mod:`psnode.protocol.codec` encodes them
(the field tables of :mod:`psnode.protocol` describe the bytes) and calls ``unwire`` to
validate what arrived: a wrong type, count or shape of a field raises :class:`ProtocolError`.
What a field *means* for a key (is the shape that of the key?) is checked by the server
(:mod:`psnode.server.store`), which answers :class:`Failed` instead of raising.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import IntEnum, IntFlag
from typing import Any, ClassVar

import numpy as np

from psnode.errors import ProtocolError
from psnode.protocol.comptag import parse_tag
from psnode.protocol.frames import DTYPES, MAX_NDIM, check_key

Key = int | str
PartKey = tuple[Key, int]   # (user key, part index)
#: Where a data operation's arrays lie in the sender's shared memory, in the order ``wire()``
#: lists them (the landing area, ``dest``, last): ``(segment, offset)`` per array, or None for
#: one to send as bytes.  Set by the worker's data path where it places the arrays (None on an
#: operation it did not place, and on every decoded one); never on the wire itself.  An operation
#: without its landing area (``without_dest``, ``resent``) reads the first entries only.
Where = tuple[tuple[int, int] | None, ...]
BUCKET = "\0bucket"         # reserved key prefix: a bucket of small keys (psnode.server.buckets)


def bucket_key(bid: int) -> str:
    """The reserved key of bucket ``bid`` (user keys never start with NUL)."""
    return f"{BUCKET}{bid}"


def bucket_of(key: Any) -> int | None:
    """The bucket number of a reserved bucket key; None for any other key."""
    if type(key) is str and key.startswith(BUCKET):
        bid = _BUCKETS.get(key)
        if bid is None:
            tail = key[len(BUCKET):]
            if not (tail.isdigit() and len(tail) < 10):
                return None
            bid = int(tail)
            if len(_BUCKETS) < 100_000:   # (bounded: keys come from the wire)
                _BUCKETS[key] = bid
        return bid
    return None


_BUCKETS: dict[str, int] = {}


class OpCode(IntEnum):
    INIT = 1
    PUSH = 2
    PULL = 3
    PUSHPULL = 4
    FLUSH = 5
    SET_OPTIMIZER = 7
    GET_STATES = 8
    LOAD_STATES = 9
    JOIN = 10
    OK = 32
    WAIT = 33
    MISSING = 34
    FAILED = 35


class Flag(IntFlag):
    RE = 1        # sent again (the first may have been lost)
    NA = 2        # push: no answer wanted unless it fails; pushpull: its answer asked durable
    SYNC = 4      # init: dist_sync rounds (else dist_async)
    SPARSE = 8    # init: a row_sparse key
    ROWS = 32     # push/pull: the last array holds row ids (row_sparse)
    GAP = 64      # wait: ``seq`` names a push of this worker the server never received
    DEST = 128    # pull/pushpull: the last array is where the server may write the answer


# the flags as plain ints: IntFlag arithmetic costs microseconds on the hot path
RE, NA, SYNC, SPARSE, ROWS, GAP, DEST = (int(f) for f in (Flag.RE, Flag.NA, Flag.SYNC, Flag.SPARSE,
                                                          Flag.ROWS, Flag.GAP, Flag.DEST))


# ------------------------------------------------------------------ validation helpers
def _int(v: Any, what: str, low: int = 0) -> int:
    if type(v) is not int or v < low:
        raise ProtocolError(f"{what} must be an integer >= {low}, not {str(v)[:40]!r}")
    return v


def _list(v: Any, what: str) -> list[Any]:
    if type(v) is not list:
        raise ProtocolError(f"{what} must be a list, not {type(v).__name__}")
    return v


def _key(v: Any) -> Key:
    return check_key(v)


def _triples(v: Any, what: str, third: str) -> list[tuple[Key, int, Any]]:
    """``[[key, part, x], ...]`` with x an int (``third='int'``), a list of ints or a str."""
    out = []
    for item in _list(v, what):
        if type(item) is not list or len(item) != 3:
            raise ProtocolError(f"{what}: bad entry {str(item)[:60]}")
        k, p, x = _key(item[0]), _int(item[1], f"{what} part"), item[2]
        if third == "int":
            x = _int(x, f"{what} number")
        elif third == "ints":
            x = [_int(q, f"{what} number", 1) for q in _list(x, what)]
        elif type(x) is not str:
            raise ProtocolError(f"{what}: name {str(x)[:40]!r} is not a string")
        out.append((k, p, x))
    return out


def _arrays(arrays: list[np.ndarray], n: int | tuple[int, int], what: str) -> None:
    lo, hi = (n, n) if isinstance(n, int) else n
    if not lo <= len(arrays) <= hi:
        raise ProtocolError(f"{what} carries {len(arrays)} arrays, not {n}")


def _comp(extra: dict[str, Any], data: np.ndarray, what: str) -> str:
    """The compression tag of a push (``extra["c"]``, "" when absent), checked against its
    payload: a valid tag in its exact form (psnode.protocol.comptag), a 1-d array of its dtype."""
    tag = extra.get("c")
    if tag is None:
        return ""
    parsed = parse_tag(tag)
    if not parsed.active:
        raise ProtocolError(f"{what}: compression tag {tag!r} (an uncompressed push has none)")
    want = parsed.payload_dtype
    if data.ndim != 1 or data.dtype != want:
        raise ProtocolError(f"{what}: a {tag} payload is 1-d {want.name}, not {data.dtype.name}{list(data.shape)}")
    return tag


def _rows(flags: int, arrays: list[np.ndarray], base: int, what: str) -> np.ndarray | None:
    """The row ids array when ROWS is set (it must be the last of exactly base + 1 arrays)."""
    if flags & ROWS:
        _arrays(arrays, base + 1, what)
        rows = arrays[-1]
        if rows.ndim != 1 or rows.dtype.kind not in "iu":
            raise ProtocolError(f"{what}: row ids must be a 1-d integer array")
        return rows
    _arrays(arrays, base, what)
    return None


# ------------------------------------------------------------------ operations
@dataclass(slots=True)
class Init:
    """Create key part ``(key, part)`` (``value``: rank 0's array) or get its value; with
    ``bucket`` >= 0 the part's value lives in that bucket at element ``offset`` (psnode.server.buckets).
    ``fill`` (instead of ``value``): the JSON spec the server computes the part's values from
    (psnode.math.initializers.FillSpec); ``bare``: answer without the value; ``join``: a joiner's
    init (never creates the key: it waits for rank 0's, like any other worker's).

    Answer: Ok with the stored value (none when ``bare``) and ``seq`` = the pushes of this
    worker's rank the part has taken (more than 0 after a restart); for a ``join`` init, the
    part's completed round instead (the joiner proposes its start round from it: :class:`Join`).
    ``staleness`` >= 0 (async parts only: dist_ssp): pulls of the part wait for that bound
    (psnode.server.staleness); -1: none.  ``backup`` > 0 (sync parts only): a round completes
    when all but that many of its workers pushed (backup workers: psnode.server.rounds).
    ``aggregation``: the name of the rule the part's rounds fold pushes by (psnode.math.aggregation;
    the server refuses a name it does not know)."""

    key: Key
    part: int
    dtype: str
    shape: tuple[int, ...]
    sync: bool = True
    aggregation: str = "average"
    sparse: bool = False
    value: np.ndarray | None = None
    id: int = 0
    re: bool = False
    bucket: int = -1
    offset: int = 0
    fill: dict[str, Any] | None = None
    bare: bool = False
    join: bool = False
    staleness: int = -1
    backup: int = 0
    code: ClassVar[OpCode] = OpCode.INIT

    def wire(self) -> tuple[int, int, int, Key, list[np.ndarray], dict[str, Any] | None]:
        flags = (RE * self.re) | (SYNC * self.sync) | (SPARSE * self.sparse)
        arrays = [] if self.value is None else [self.value]
        extra: dict[str, Any] = {"dtype": self.dtype, "shape": list(self.shape), "agg": self.aggregation}
        if self.bucket >= 0:
            extra["bucket"], extra["offset"] = self.bucket, self.offset
        if self.fill is not None:
            extra["fill"] = self.fill
        if self.bare:
            extra["bare"] = True
        if self.join:
            extra["join"] = True
        if self.staleness >= 0:
            extra["staleness"] = self.staleness
        if self.backup:
            extra["backup"] = self.backup
        return int(flags), self.part, 0, self.key, arrays, extra

    @classmethod
    def unwire(cls, flags: int, part: int, id: int, seq: int, key: Key, arrays: list[np.ndarray],
               extra: dict[str, Any]) -> Init:
        _arrays(arrays, (0, 1), "init")
        dtype, shape = extra.get("dtype"), extra.get("shape")
        if dtype not in DTYPES:
            raise ProtocolError(f"init: dtype {str(dtype)[:32]!r} is not allowed")
        if type(shape) is not list or len(shape) > MAX_NDIM:
            raise ProtocolError(f"init: bad shape {str(shape)[:60]}")
        bucket = _int(extra.get("bucket", -1), "init bucket", -1)
        offset = _int(extra.get("offset", 0), "init offset")
        fill, bare, join = extra.get("fill"), extra.get("bare", False), extra.get("join", False)
        if fill is not None and (type(fill) is not dict or arrays):
            raise ProtocolError("init: fill must be an object, sent without a value")
        if type(bare) is not bool:
            raise ProtocolError(f"init: bare must be true or false, not {str(bare)[:20]!r}")
        if type(join) is not bool:
            raise ProtocolError(f"init: join must be true or false, not {str(join)[:20]!r}")
        if join and (arrays or fill is not None):
            raise ProtocolError("init: a joiner's init carries no value and no fill")
        staleness = _int(extra.get("staleness", -1), "init staleness", -1)
        if staleness >= 0 and flags & SYNC:
            raise ProtocolError("init: a staleness bound is for async key parts only")
        backup = _int(extra.get("backup", 0), "init backup")
        if backup and not flags & SYNC:
            raise ProtocolError("init: backup workers are for sync key parts only")
        aggregation = extra.get("agg", "average")
        if type(aggregation) is not str or not 0 < len(aggregation) <= 32:
            raise ProtocolError(f"init: agg must be an aggregation rule's name, not {str(aggregation)[:40]!r}")
        return cls(key, part, dtype, tuple(_int(d, "init shape") for d in shape), bool(flags & SYNC),
                   aggregation, bool(flags & SPARSE), arrays[0] if arrays else None,
                   id, bool(flags & RE), bucket, offset, fill, bare, join, staleness, backup)


@dataclass(slots=True)
class Push:
    """Push ``seq`` (1, 2, ... per worker and key part) of a gradient: ``data`` dense, or the
    rows ``rows`` (local row ids) of a row_sparse key.  With ``na`` (the default) it is
    answered only if it fails.  ``comp`` (a dense push only): the gradient compression tag
    (psnode.protocol.comptag, e.g. ``"2bit:0.5"``); ``data`` is then that type's payload."""

    key: Key
    part: int
    seq: int
    data: np.ndarray
    rows: np.ndarray | None = None
    id: int = 0
    re: bool = False
    na: bool = True
    comp: str = ""
    at: Where | None = field(default=None, compare=False, repr=False)
    code: ClassVar[OpCode] = OpCode.PUSH

    def wire(self) -> tuple[int, int, int, Key, list[np.ndarray], dict[str, Any] | None]:
        flags = (RE * self.re) | (NA * self.na)
        if self.rows is None:
            return int(flags), self.part, self.seq, self.key, [self.data], {"c": self.comp} if self.comp else None
        return int(flags | ROWS), self.part, self.seq, self.key, [self.data, self.rows], None

    @classmethod
    def unwire(cls, flags: int, part: int, id: int, seq: int, key: Key, arrays: list[np.ndarray],
               extra: dict[str, Any]) -> Push:
        rows = _rows(flags, arrays, 1, "push")
        comp = _comp(extra, arrays[0], "push") if rows is None else ""
        return cls(key, part, _int(seq, "push sequence number", 1), arrays[0], rows, id,
                   bool(flags & RE), bool(flags & NA), comp)


def _dest(flags: int, arrays: list[np.ndarray]) -> tuple[list[np.ndarray], np.ndarray | None]:
    """Split off the landing area (DEST: the last array) from an op's arrays."""
    if flags & DEST:
        if not arrays:
            raise ProtocolError("a landing area was announced but not sent")
        return arrays[:-1], arrays[-1]
    return arrays, None


@dataclass(slots=True)
class Pull:
    """The value of a key part once this worker's push ``after`` was applied (only rows
    ``rows`` of a row_sparse key, if given).  Answer: Ok with the value, or Wait.  ``dest``
    (same-host link only): a landing area of the worker the server may write the answer into."""

    key: Key
    part: int
    after: int
    rows: np.ndarray | None = None
    id: int = 0
    re: bool = False
    dest: np.ndarray | None = None
    at: Where | None = field(default=None, compare=False, repr=False)
    code: ClassVar[OpCode] = OpCode.PULL

    def wire(self) -> tuple[int, int, int, Key, list[np.ndarray], dict[str, Any] | None]:
        flags = RE * self.re
        arrays = []
        if self.rows is not None:
            flags |= ROWS
            arrays.append(self.rows)
        if self.dest is not None:
            flags |= DEST
            arrays.append(self.dest)
        return int(flags), self.part, self.after, self.key, arrays, None

    @classmethod
    def unwire(cls, flags: int, part: int, id: int, seq: int, key: Key, arrays: list[np.ndarray],
               extra: dict[str, Any]) -> Pull:
        arrays, dest = _dest(flags, arrays)
        rows = _rows(flags, arrays, 0, "pull")
        return cls(key, part, _int(seq, "pull after"), rows, id, bool(flags & RE), dest)


@dataclass(slots=True)
class PushPull:
    """Push ``seq`` of a dense gradient and pull the value after it: one request, one answer
    (``dest`` as for Pull; ``comp`` as for Push: the answer is float32 all the same); with
    ``durable`` the answer must carry a durable watermark that covers it (as a push that asks)."""

    key: Key
    part: int
    seq: int
    data: np.ndarray
    id: int = 0
    re: bool = False
    dest: np.ndarray | None = None
    comp: str = ""
    durable: bool = False    # (the worker's journal holds ASK_DEPTH pushes: psnode.worker.journal)
    at: Where | None = field(default=None, compare=False, repr=False)
    code: ClassVar[OpCode] = OpCode.PUSHPULL

    def wire(self) -> tuple[int, int, int, Key, list[np.ndarray], dict[str, Any] | None]:
        extra = {"c": self.comp} if self.comp else None
        flags = RE * self.re | NA * self.durable
        if self.dest is None:
            return int(flags), self.part, self.seq, self.key, [self.data], extra
        return int(flags | DEST), self.part, self.seq, self.key, [self.data, self.dest], extra

    @classmethod
    def unwire(cls, flags: int, part: int, id: int, seq: int, key: Key, arrays: list[np.ndarray],
               extra: dict[str, Any]) -> PushPull:
        arrays, dest = _dest(flags, arrays)
        _arrays(arrays, 1, "pushpull")
        return cls(key, part, _int(seq, "pushpull sequence number", 1), arrays[0], id, bool(flags & RE),
                   dest, _comp(extra, arrays[0], "pushpull"), bool(flags & NA))


@dataclass(slots=True)
class Flush:
    """Answered once every earlier request of this worker that arrived was handled; ``check``
    lists ``(key, part, [seq, ...])`` pushes sent: the answer is Missing with those never
    received, or Ok: all received and, with ``durable`` (the default), durable (psnode.worker.journal;
    a check without it only looks for lost pushes)."""

    check: list[tuple[Key, int, list[int]]] = field(default_factory=list)
    id: int = 0
    re: bool = False
    durable: bool = True
    code: ClassVar[OpCode] = OpCode.FLUSH

    def wire(self) -> tuple[int, int, int, Key, list[np.ndarray], dict[str, Any] | None]:
        extra: dict[str, Any] = {"check": [list(c) for c in self.check]}
        if not self.durable:
            extra["d"] = False
        return int(RE * self.re), 0, 0, 0, [], extra

    @classmethod
    def unwire(cls, flags: int, part: int, id: int, seq: int, key: Key, arrays: list[np.ndarray],
               extra: dict[str, Any]) -> Flush:
        _arrays(arrays, 0, "flush")
        durable = extra.get("d", True)
        if type(durable) is not bool:
            raise ProtocolError(f"flush: d must be true or false, not {str(durable)[:20]!r}")
        return cls(_triples(extra.get("check", []), "flush check", "ints"), id, bool(flags & RE), durable)


@dataclass(slots=True)
class SetOptimizer:
    """Run the optimizer ``spec`` (psnode.math.optimizers's JSON spec) on this server's keys."""

    spec: dict[str, Any]
    id: int = 0
    re: bool = False
    code: ClassVar[OpCode] = OpCode.SET_OPTIMIZER

    def wire(self) -> tuple[int, int, int, Key, list[np.ndarray], dict[str, Any] | None]:
        return int(RE * self.re), 0, 0, 0, [], {"spec": self.spec}

    @classmethod
    def unwire(cls, flags: int, part: int, id: int, seq: int, key: Key, arrays: list[np.ndarray],
               extra: dict[str, Any]) -> SetOptimizer:
        _arrays(arrays, 0, "set_optimizer")
        spec = extra.get("spec")
        if type(spec) is not dict:
            raise ProtocolError("set_optimizer: the spec is not an object")
        return cls(spec, id, bool(flags & RE))


@dataclass(slots=True)
class GetStates:
    """Every key part's optimizer state.  Answer: Ok with ``names`` and one array per name."""

    id: int = 0
    re: bool = False
    code: ClassVar[OpCode] = OpCode.GET_STATES

    def wire(self) -> tuple[int, int, int, Key, list[np.ndarray], dict[str, Any] | None]:
        return int(RE * self.re), 0, 0, 0, [], None

    @classmethod
    def unwire(cls, flags: int, part: int, id: int, seq: int, key: Key, arrays: list[np.ndarray],
               extra: dict[str, Any]) -> GetStates:
        _arrays(arrays, 0, "get_states")
        return cls(id, bool(flags & RE))


@dataclass(slots=True)
class LoadStates:
    """Replace optimizer states: ``names[i] = (key, part, state name)`` for ``arrays[i]``."""

    names: list[tuple[Key, int, str]]
    arrays: list[np.ndarray]
    id: int = 0
    re: bool = False
    code: ClassVar[OpCode] = OpCode.LOAD_STATES

    def wire(self) -> tuple[int, int, int, Key, list[np.ndarray], dict[str, Any] | None]:
        return int(RE * self.re), 0, 0, 0, list(self.arrays), {"names": [list(n) for n in self.names]}

    @classmethod
    def unwire(cls, flags: int, part: int, id: int, seq: int, key: Key, arrays: list[np.ndarray],
               extra: dict[str, Any]) -> LoadStates:
        names = _triples(extra.get("names", []), "load_states names", "str")
        _arrays(arrays, len(names), "load_states")
        return cls(names, list(arrays), id, bool(flags & RE))


@dataclass(slots=True)
class Join:
    """A joiner (a worker admitted to the running job in membership ``generation``) proposes
    ``start``: its first push to key part ``(key, part)`` is round ``start`` (its push numbers
    continue from ``start - 1``).  The part accepts iff round ``start`` has not opened there
    (no push of that round taken yet), or moves a start it accepted earlier later (nothing
    pushed since).  Answer: Ok with ``seq`` = ``start`` when accepted, else the earliest start
    the part could accept now (greater than ``start``: propose it to every part)."""

    key: Key
    part: int
    start: int
    generation: int = 0
    id: int = 0
    re: bool = False
    code: ClassVar[OpCode] = OpCode.JOIN

    def wire(self) -> tuple[int, int, int, Key, list[np.ndarray], dict[str, Any] | None]:
        return int(RE * self.re), self.part, self.start, self.key, [], {"g": self.generation}

    @classmethod
    def unwire(cls, flags: int, part: int, id: int, seq: int, key: Key, arrays: list[np.ndarray],
               extra: dict[str, Any]) -> Join:
        _arrays(arrays, 0, "join")
        return cls(key, part, _int(seq, "join start", 1), _int(extra.get("g", 0), "join generation"), id,
                   bool(flags & RE))


Op = Init | Push | Pull | PushPull | Flush | SetOptimizer | GetStates | LoadStates | Join

REQUESTS: dict[int, Any] = {c.code: c for c in (Init, Push, Pull, PushPull, Flush, SetOptimizer,
                                                 GetStates, LoadStates, Join)}


def resent(op: Op) -> Op:
    """A copy of ``op`` marked as sent again (without a landing area: only the first copy of a
    request may write into one, so an answer never lands after the worker moved on)."""
    if getattr(op, "dest", None) is not None:
        return replace(op, re=True, dest=None)  # type: ignore[call-arg, arg-type]
    return replace(op, re=True)


def without_dest(op: Op) -> Op:
    """``op`` without its landing area (for TCP, where answers travel in frames)."""
    return replace(op, dest=None) if getattr(op, "dest", None) is not None else op  # type: ignore[call-arg, arg-type]


__all__ = ["BUCKET", "REQUESTS", "Flag", "Flush", "GetStates", "Init", "Join", "Key", "LoadStates", "Op", "OpCode",
           "PartKey", "Pull", "Push", "PushPull", "SetOptimizer", "Where", "bucket_key", "bucket_of", "resent",
           "without_dest"]
