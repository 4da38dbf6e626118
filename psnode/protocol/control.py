"""Typed control bodies: the ``"b"`` object of every control message, one frozen dataclass each.

Senders build the dataclass and send ``body.to_body()``; a receiver decodes a message once
(:func:`decode`, or ``Class.from_body``), which checks every field: a missing field without a
default, a wrong type or a number out of range raises :class:`ProtocolError` naming the command
and the field.  Unknown fields are ignored.  Roles log and drop a message that fails to decode.

=============== ===================== =====================================================
command         body                  from -> to
=============== ===================== =====================================================
REGISTER        :class:`Register`     node -> scheduler (again until welcomed)
REJOIN          :class:`Empty`        restarted scheduler -> a node it does not know
WELCOME         :class:`Welcome`      scheduler -> node (again for a repeated REGISTER)
HEARTBEAT       :class:`Heartbeat`    node -> scheduler, every ``heartbeat_interval``
HEARTBEAT_ACK   :class:`Empty`        scheduler -> node (or a host's relay -> node)
HEARTBEATS      :class:`Beats`        a host's relay -> scheduler, every ``heartbeat_interval``
HEARTBEATS_ACK  :class:`BeatsAck`     scheduler -> relay
BARRIER         :class:`Barrier`      worker -> scheduler, or its host's relay (again until answered)
BARRIERS        :class:`Entries`      a host's relay -> scheduler, once the host's workers entered
BARRIER_DONE    :class:`BarrierDone`  scheduler -> worker
FINISH          :class:`Empty`        worker -> scheduler (again until answered)
FINISH_ACK      :class:`Empty`        scheduler -> worker
MEMBERSHIP      :class:`Membership`   scheduler -> servers and workers (every change)
SERVERS         :class:`Servers`      scheduler -> workers
SHUTDOWN        :class:`JobEnd`       scheduler -> nodes (the job ends; ``ok``: it succeeded)
PEER_LOST       :class:`JobEnd`       scheduler -> nodes (the job failed: ``node`` names who)
BYE             :class:`Bye`          node -> scheduler
STATUS          :class:`Empty`        ``mxdist status`` -> scheduler
STATUS_REPLY    :class:`StatusAnswer` scheduler -> ``mxdist status``
STOP            :class:`Stop`         ``mxdist stop`` -> scheduler
STOP_ACK        :class:`Empty`        scheduler -> ``mxdist stop``
LEAVE           :class:`ScaleDown`    launcher -> scheduler (``mxdist scale`` down)
LEAVE_ACK       :class:`Empty`        scheduler -> launcher
LOST            :class:`Lost`         launcher -> scheduler (a worker died, not restarted)
LOST_ACK        :class:`Empty`        scheduler -> launcher
=============== ===================== =====================================================

DATA and DATA_REPLY carry typed operations instead (:mod:`psnode.protocol.ops`): as control
messages they do not decode.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any

from psnode.errors import ProtocolError
from psnode.protocol.frames import Command, Message
from psnode.protocol.status import NodeRow

RANKS = 2**31           # ranks, pids and counts of nodes are below this
MAX_HOST = 255          # characters of a host name or address
_MAX_COUNT = 2**63      # counters
_NO = object()          # no default: the field is required
_ADDRESS = 300          # characters of a host:port
MAX_IMPLIED = 2**20     # workers a WELCOME without ``active`` may imply (all active)
MAX_ON = 4096           # workers one wait report names
MAX_OF = 300            # characters of what a wait report's pull is of



class WaitKind(str, Enum):
    """What a worker's user thread waits in, when that is other workers."""

    BARRIER = "barrier"
    PULL = "pull"
    INIT = "init"


@dataclass(frozen=True)
class WaitReport:
    """What a worker's user thread waits for, when that is other workers
    (psnode.scheduler.waitfor): barrier ``n`` (``what=BARRIER``), or the pull (or init,
    ``what=INIT``) of ``of`` after its push ``push``, whose round lacks the pushes of the
    workers ``on`` (at least one, at most :data:`MAX_ON`); ``waited``: seconds the thread has
    waited so far.  On the wire: ``{"what": "barrier", "n": 1, "s": 3.5}`` or
    ``{"what": "pull", "of": "'w'", "push": 2, "on": [0], "s": 3.5}`` (``on`` sorted, without
    repeats, once decoded)."""

    what: WaitKind
    n: int = 0
    of: str = ""
    push: int = 0
    on: tuple[int, ...] = ()
    waited: float = 0.0

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"what": self.what.value, "s": round(self.waited, 3)}
        if self.what is WaitKind.BARRIER:
            body["n"] = self.n
        else:
            body.update({"of": self.of, "push": self.push, "on": list(self.on)})
        return body

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> WaitReport:
        """The report, checked: a wrong ``what``, a missing or out-of-range field raises
        :class:`ProtocolError` naming it."""
        w = "heartbeat wait"
        raw_what = _str(body, w, "what", limit=16)
        try:
            what = WaitKind(raw_what)
        except ValueError:
            kinds = ", ".join(k.value for k in WaitKind)
            raise ProtocolError(f"{w}: what must be one of {kinds}, not {raw_what!r}") from None
        waited = _field(body, w, "s", 0.0)
        if type(waited) not in (int, float) or not math.isfinite(waited) or waited < 0:
            raise ProtocolError(f"{w}: s must be a non-negative number of seconds, not {str(waited)[:40]!r}")
        if what is WaitKind.BARRIER:
            return cls(what, n=_int(body, w, "n"), waited=float(waited))
        on = _ranks(body, w, "on")
        if not 0 < len(on) <= MAX_ON:
            raise ProtocolError(f"{w}: on must list 1 to {MAX_ON} ranks, not {len(on)}")
        return cls(what, of=_str(body, w, "of", limit=MAX_OF), push=_int(body, w, "push", default=0),
                   on=tuple(sorted(set(on))), waited=float(waited))

    @property
    def episode(self) -> tuple[str, int, str, int]:
        """What it waits in, apart from whom and for how long (one wait, across heartbeats)."""
        return self.what.value, self.n, self.of, self.push


# ------------------------------------------------------------------ field checks
def _field(body: Mapping[str, Any], what: str, name: str, default: Any) -> Any:
    if name in body:
        return body[name]
    if default is _NO:
        raise ProtocolError(f"{what}: {name} is missing")
    return default


def _int(body: Mapping[str, Any], what: str, name: str, low: int = 0, high: int = RANKS,
         default: Any = _NO) -> int:
    v = _field(body, what, name, default)
    if type(v) is not int or not low <= v < high:
        raise ProtocolError(f"{what}: {name} must be an integer in [{low}, {high}), not {str(v)[:40]!r}")
    return v


def _opt_int(body: Mapping[str, Any], what: str, name: str) -> int | None:
    return None if body.get(name) is None else _int(body, what, name)


def _str(body: Mapping[str, Any], what: str, name: str, limit: int | None = None, default: Any = _NO) -> str:
    v = _field(body, what, name, default)
    if type(v) is not str or (limit is not None and len(v) > limit):
        longest = "" if limit is None else f" of at most {limit} characters"
        raise ProtocolError(f"{what}: {name} must be a string{longest}, not {str(v)[:40]!r}")
    return v


def _opt_str(body: Mapping[str, Any], what: str, name: str) -> str | None:
    return None if body.get(name) is None else _str(body, what, name)


def _bool(body: Mapping[str, Any], what: str, name: str, default: Any = _NO) -> bool:
    v = _field(body, what, name, default)
    if type(v) is not bool:
        raise ProtocolError(f"{what}: {name} must be true or false, not {str(v)[:40]!r}")
    return v


def _list(body: Mapping[str, Any], what: str, name: str, default: Any = _NO) -> list[Any]:
    v = _field(body, what, name, default)
    if type(v) is not list:
        raise ProtocolError(f"{what}: {name} must be a list, not {type(v).__name__}")
    return v


def _ranks(body: Mapping[str, Any], what: str, name: str) -> tuple[int, ...]:
    ranks = _list(body, what, name)
    if not all(type(r) is int and 0 <= r < RANKS for r in ranks):
        raise ProtocolError(f"{what}: {name} must list ranks, not {str(ranks)[:60]}")
    return tuple(ranks)


def _object(v: Any, what: str) -> dict[str, Any]:
    if type(v) is not dict:
        raise ProtocolError(f"{what} must be an object, not {type(v).__name__}")
    return v


# ------------------------------------------------------------------ bodies
@dataclass(frozen=True)
class Empty:
    """No fields (FINISH, STATUS, the acknowledgements)."""

    def to_body(self) -> dict[str, Any]:
        return {}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Empty:
        return cls()


@dataclass(frozen=True)
class Rejoin:
    """What a welcomed node tells a restarted scheduler (REGISTER after REJOIN), from which it
    rebuilds its state (:mod:`psnode.scheduler.rebuild`): how often this rank was
    ``restarts``-ed, the ``barriers`` a worker completed, whether it is a ``joiner``, and the
    membership as the node knows it: ``generation``, the ``active`` workers and those that
    ``joined`` the running job (a server's view is the one the scheduler trusts: servers hear
    every MEMBERSHIP first)."""

    restarts: int = 0
    barriers: int = 0
    joiner: bool = False
    generation: int = 0
    active: tuple[int, ...] = ()
    joined: tuple[int, ...] = ()

    def to_body(self) -> dict[str, Any]:
        return {"restarts": self.restarts, "barriers": self.barriers, "joiner": self.joiner,
                "generation": self.generation, "active": list(self.active), "joined": list(self.joined)}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Rejoin:
        w = "register: rejoin"
        return cls(_int(body, w, "restarts", default=0), _int(body, w, "barriers", high=_MAX_COUNT, default=0),
                   _bool(body, w, "joiner", default=False), _int(body, w, "generation", high=_MAX_COUNT, default=0),
                   _ranks(body, w, "active") if "active" in body else (),
                   _ranks(body, w, "joined") if "joined" in body else ())


@dataclass(frozen=True)
class Register:
    """A node joins: its ``role`` (``worker`` or ``server``), where it serves (a server's
    ``host:port``; a worker's port is 0), its ``pid``, and the ``rank`` the launcher gave it
    (None: any).  ``rejoin`` (a node already in the job, answering a restarted scheduler's
    REJOIN): ``rank`` is its rank in the job, and :class:`Rejoin` what it knows."""

    role: str
    host: str
    port: int
    pid: int
    rank: int | None = None
    rejoin: Rejoin | None = None
    replica: int = 0

    def to_body(self) -> dict[str, Any]:
        body = {"role": self.role, "host": self.host, "port": self.port, "pid": self.pid, "rank": self.rank}
        if self.rejoin is not None:
            body["rejoin"] = self.rejoin.to_body()
        if self.replica:
            body["replica"] = self.replica
        return body

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Register:
        role = body.get("role")
        if role not in ("worker", "server"):
            raise ProtocolError(f"register: role must be 'worker' or 'server', not {str(role)[:40]!r}")
        rejoin = None
        if body.get("rejoin") is not None:
            rejoin = Rejoin.from_body(_object(body["rejoin"], "register: rejoin"))
            if body.get("rank") is None:
                raise ProtocolError("register: a rejoining node must give its rank")
        return cls(role, _str(body, "register", "host", MAX_HOST), _int(body, "register", "port", high=65536),
                   _int(body, "register", "pid"), _opt_int(body, "register", "rank"), rejoin,
                   _int(body, "register", "replica", high=65536, default=0))


@dataclass(frozen=True)
class ServerAddress:
    """One entry of the address book: server ``rank`` serves at ``host:port``, and its replica
    keeper (psnode.server.replicas) listens at ``host:replica`` (0: it keeps none) (in a book on
    the wire, :func:`book_body`: ``rank host port`` or ``rank host port replica``)."""

    rank: int
    host: str
    port: int
    replica: int = 0

    def to_body(self) -> list[Any]:
        return [self.rank, self.host, self.port, self.replica] if self.replica else [self.rank, self.host, self.port]

    @classmethod
    def from_body(cls, entry: Any, what: str) -> ServerAddress:
        if not (type(entry) is list and len(entry) in (3, 4) and type(entry[0]) is int and 0 <= entry[0] < RANKS
                and type(entry[1]) is str and len(entry[1]) <= MAX_HOST
                and type(entry[2]) is int and 0 < entry[2] < 65536
                and (len(entry) == 3 or (type(entry[3]) is int and 0 <= entry[3] < 65536))):
            raise ProtocolError(f"{what}: bad server address {str(entry)[:80]} (not [rank, host, port(, replica)])")
        return cls(entry[0], entry[1], entry[2], entry[3] if len(entry) == 4 else 0)


_last_book: tuple[tuple[ServerAddress, ...], str] = ((), "")   # the last book converted, and its wire form


def book_body(servers: tuple[ServerAddress, ...]) -> str:
    """The wire form of the address book ``servers``: one string, ``rank host port[ replica]``
    per server, ``;`` between them (a thousand servers' book is copied into each of thousands of
    WELCOMEs as one string, not encoded entry by entry); the same book (the same tuple, as the
    scheduler hands to every WELCOME of a job's start) is converted once."""
    global _last_book
    last = _last_book
    if last[0] is servers:
        return last[1]
    text = ";".join(" ".join(str(f) for f in s.to_body()) for s in servers)
    _last_book = (servers, text)
    return text


_last_ranks: tuple[tuple[int, ...], int, bool] = ((), 0, True)   # the last ranks _every_rank judged


def _every_rank(active: tuple[int, ...], workers: int) -> bool:
    """Is ``active`` exactly ranks 0..workers-1?  (The same tuple, as the scheduler hands to
    every WELCOME of a job's start, is judged once.)"""
    global _last_ranks
    last = _last_ranks
    if last[0] is active and last[1] == workers:
        return last[2]
    every = len(active) == workers and active == tuple(range(workers))
    _last_ranks = (active, workers, every)
    return every


def _book(body: dict[str, Any], what: str) -> tuple[ServerAddress, ...]:
    text = _str(body, what, "servers")
    if not text:
        return ()
    return tuple(ServerAddress.from_body([int(f) if f.isdigit() and len(f) < 12 else f for f in entry.split(" ")],
                                         what) for entry in text.split(";"))


@dataclass(frozen=True)
class Welcome:
    """The job is complete (or this node replaces one): the node's ``rank``, the address book
    ``servers`` (by rank), the scheduler's ``pid``, the job's size, the ``active`` workers'
    ranks, how often this rank was restarted, ``restore`` (a replaced server loads its last
    checkpoint), ``barriers`` (the barriers this rank completed before its restart), the
    membership ``generation``, ``joiner`` (this worker joins a running job: its kv.init never
    initialises, it joins the rounds) and ``joined`` (the active workers that joined the running
    job: they take part in a key's rounds from the start round they agreed with it)."""

    rank: int
    servers: tuple[ServerAddress, ...]
    pid: int
    num_workers: int
    num_servers: int
    active: tuple[int, ...]
    restarts: int = 0
    restore: bool = False
    barriers: int = 0
    generation: int = 0
    joiner: bool = False
    joined: tuple[int, ...] = ()
    standby: str = ""        # the standby scheduler's host:port ("": none known to the scheduler)

    def to_body(self) -> dict[str, Any]:
        body = {"rank": self.rank, "servers": book_body(self.servers), "pid": self.pid,
                "num_workers": self.num_workers, "num_servers": self.num_servers,
                "restarts": self.restarts, "restore": self.restore, "barriers": self.barriers}
        if not _every_rank(self.active, self.num_workers):
            body["active"] = list(self.active)   # (left out: every rank of the job, the common case)
        if self.generation or self.joiner or self.joined:   # (an elastic job's fields)
            body.update(generation=self.generation, joiner=self.joiner, joined=list(self.joined))
        if self.standby:
            body["standby"] = self.standby
        return body

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Welcome:
        w = "welcome"
        rank, book, pid, workers = _int(body, w, "rank"), _book(body, w), _int(body, w, "pid"), _int(body, w,
                                                                                                 "num_workers")
        if "active" not in body and workers > MAX_IMPLIED:
            raise ProtocolError(f"{w}: active left out with {workers} workers (at most {MAX_IMPLIED})")
        active = _ranks(body, w, "active") if "active" in body else tuple(range(workers))
        return cls(rank, book, pid, workers,
                   _int(body, w, "num_servers"), active, _int(body, w, "restarts", default=0),
                   _bool(body, w, "restore", default=False), _int(body, w, "barriers", high=_MAX_COUNT, default=0),
                   _int(body, w, "generation", high=_MAX_COUNT, default=0), _bool(body, w, "joiner", default=False),
                   _ranks(body, w, "joined") if "joined" in body else (),
                   _str(body, w, "standby", _ADDRESS, default=""))


def wait_report(raw: Any) -> WaitReport | None:
    """A heartbeat's wait report (:meth:`WaitReport.from_body`); None when absent or malformed
    (then the worker counts as not waiting: it never takes part in a deadlock verdict, and
    its heartbeat still counts)."""
    if not isinstance(raw, dict):
        return None
    try:
        return WaitReport.from_body(raw)
    except ProtocolError:
        return None


def awaited(raw: Any) -> tuple[tuple[int, float], ...]:
    """A heartbeat's ``awaited``: ``[[rank, seconds], ...]``, checked; malformed pairs are
    left out (at most 4096)."""
    if not isinstance(raw, list):
        return ()
    out = []
    for pair in raw[:4096]:
        if (isinstance(pair, list) and len(pair) == 2 and _rank(pair[0]) and type(pair[1]) in (int, float)
                and math.isfinite(pair[1]) and pair[1] >= 0):
            out.append((pair[0], float(pair[1])))
    return tuple(out)


def late_counts(raw: Any) -> tuple[tuple[int, int], ...]:
    """A heartbeat's ``late``: ``[[rank, pushes], ...]``, checked; malformed pairs are left out
    (at most 4096)."""
    if not isinstance(raw, list):
        return ()
    return tuple((p[0], p[1]) for p in raw[:4096] if isinstance(p, list) and len(p) == 2 and _rank(p[0])
                 and type(p[1]) is int and 0 <= p[1] <= _MAX_COUNT)


def _rank(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < RANKS


@dataclass(frozen=True)
class Counters:
    """A node's counters, sent with each heartbeat (``rounds``: completed sync rounds; ``wait``:
    what a worker's user thread waits for, :func:`wait_report`; a server's ``awaited``: per worker, the
    seconds its key parts waited for that worker alone, of which ``waiting`` is the part still in
    progress, and ``late``: per worker, its pushes dropped for coming after their round
    completed, psnode.server.awaited)."""

    pushes: int = 0
    pulls: int = 0
    rounds: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    retries: int = 0
    dropped: int = 0
    refused: int = 0
    wait: WaitReport | None = None
    awaited: tuple[tuple[int, float], ...] = ()
    waiting: tuple[tuple[int, float], ...] = ()
    late: tuple[tuple[int, int], ...] = ()
    # big state and loop health: a server's values and optimizer state (bytes), the bytes it
    # sent to the holders of its replicas and wrote to checkpoints (in all), per holder how many
    # copies it is behind the latest (psnode.server.replicas); every node's longest gap between
    # two turns of its loop over the last window (psnode.loopgap), microseconds
    state_bytes: int = 0
    copied: int = 0
    checkpointed: int = 0
    loop_gap_us: int = 0
    lag: tuple[tuple[int, ...], ...] = ()   # (holder, copies behind[, whole copy's bytes acknowledged, its bytes])
    # tables without a row count (psnode.server.dyntable), per key: rows held, ids admitted,
    # rows evicted, gradient rows dropped (ids not admitted yet)
    tables: tuple[tuple[str, int, int, int, int], ...] = ()

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"pushes": self.pushes, "pulls": self.pulls, "rounds": self.rounds,
                                "bytes_in": self.bytes_in, "bytes_out": self.bytes_out, "retries": self.retries,
                                "dropped": self.dropped, "refused": self.refused}
        if self.wait is not None:
            body["wait"] = self.wait.to_body()
        if self.awaited:
            body["awaited"] = [[r, round(s, 4)] for r, s in self.awaited]
        if self.waiting:
            body["waiting"] = [[r, round(s, 4)] for r, s in self.waiting]
        if self.late:
            body["late"] = [[r, n] for r, n in self.late]
        for name in _BIG_STATE:
            if getattr(self, name):
                body[name] = getattr(self, name)
        if self.lag:
            body["lag"] = [list(t) for t in self.lag]
        if self.tables:
            body["tables"] = [list(t) for t in self.tables]
        return body

    @classmethod
    def from_body(cls, stats: dict[str, Any]) -> Counters:
        counts = {}
        for name in _COUNTERS:   # (every node's heartbeat, every second: _int's checks inline)
            v = stats.get(name, 0)
            counts[name] = v if type(v) is int and 0 <= v < _MAX_COUNT else \
                _int(stats, "heartbeat stats", name, high=_MAX_COUNT, default=0)
        return cls(**counts, wait=wait_report(stats.get("wait")), awaited=awaited(stats.get("awaited")),
                   waiting=awaited(stats.get("waiting")), late=late_counts(stats.get("late")),
                   lag=holder_lag(stats.get("lag")), tables=table_counts(stats.get("tables")))


_BIG_STATE = ("state_bytes", "copied", "checkpointed", "loop_gap_us")
_COUNTERS = tuple(f.name for f in fields(Counters)
                  if f.name not in ("wait", "awaited", "waiting", "late", "lag", "tables"))


def table_counts(raw: Any) -> tuple[tuple[str, int, int, int, int], ...]:
    """A heartbeat's ``tables``: ``[[key, rows, admitted, evicted, dropped], ...]``, checked;
    malformed entries are left out (at most 256)."""
    if not isinstance(raw, list):
        return ()
    out = []
    for t in raw[:256]:
        if isinstance(t, list) and len(t) == 5 and isinstance(t[0], str) and len(t[0]) <= 200 and \
                all(type(n) is int and 0 <= n <= _MAX_COUNT for n in t[1:]):
            out.append((t[0], t[1], t[2], t[3], t[4]))
    return tuple(out)


def holder_lag(raw: Any) -> tuple[tuple[int, ...], ...]:
    """A heartbeat's ``lag``: ``[[holder rank, copies behind], ...]``, a holder getting the state
    whole with ``[.., bytes of it acknowledged, its bytes]``; checked, malformed entries are
    left out (at most 4096)."""
    if not isinstance(raw, list):
        return ()
    return tuple(tuple(t) for t in raw[:4096]
                 if isinstance(t, list) and len(t) in (2, 4) and _rank(t[0])
                 and all(type(n) is int and 0 <= n <= _MAX_COUNT for n in t[1:]) and (len(t) == 2 or t[2] <= t[3]))


@dataclass(frozen=True)
class Heartbeat:
    """A node is alive; its counters (the scheduler's ``mxdist status`` rows)."""

    stats: Counters = field(default_factory=Counters)

    def to_body(self) -> dict[str, Any]:
        return {"stats": self.stats.to_body()}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Heartbeat:
        return cls(Counters.from_body(_object(body.get("stats", {}), "heartbeat: stats")))


MAX_BEATS = 4096   # heartbeats one HEARTBEATS batch carries
MAX_IDENT = 255    # characters of a node's routing identity


@dataclass(frozen=True)
class Beats:
    """The heartbeats a host's relay collected from its nodes over one interval
    (psnode.net.relay): batch number ``n`` and, per node, its routing identity toward the
    scheduler and its counters, or None where they are those the relay last sent for it
    (unchanged).  The scheduler handles each as a HEARTBEAT from that node and answers the
    batch once (HEARTBEATS_ACK ``n``).  On the wire:
    ``{"n": 7, "beats": [["worker-12-ab12cd34", {stats}], ["server-3-9f00aa11"], ...]}``; a
    malformed entry makes the whole batch malformed."""

    n: int
    beats: tuple[tuple[bytes, Counters | None], ...] = ()

    def to_body(self) -> dict[str, Any]:
        return {"n": self.n, "beats": [[i.decode("ascii")] if s is None else [i.decode("ascii"), s.to_body()]
                                       for i, s in self.beats]}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Beats:
        n = _int(body, "heartbeats", "n", high=_MAX_COUNT)
        raw = _list(body, "heartbeats", "beats")
        if len(raw) > MAX_BEATS:
            raise ProtocolError(f"heartbeats: {len(raw)} beats, more than {MAX_BEATS}")
        beats: list[tuple[bytes, Counters | None]] = []
        for entry in raw:
            if type(entry) is not list or not 1 <= len(entry) <= 2 or type(entry[0]) is not str \
                    or not 0 < len(entry[0]) <= MAX_IDENT or not entry[0].isascii():
                raise ProtocolError(f"heartbeats: an entry must be [identity] or [identity, stats], "
                                    f"not {str(entry)[:60]}")
            stats = None if len(entry) == 1 else Counters.from_body(_object(entry[1], "heartbeats: stats"))
            beats.append((entry[0].encode("ascii"), stats))
        return cls(n, tuple(beats))


@dataclass(frozen=True)
class BeatsAck:
    """The scheduler took HEARTBEATS batch ``n``: the relay answers its nodes, but those the
    scheduler does not know (``unknown``: it would not answer their own HEARTBEAT either)."""

    n: int
    unknown: tuple[bytes, ...] = ()

    def to_body(self) -> dict[str, Any]:
        return {"n": self.n, **({"unknown": [i.decode("ascii") for i in self.unknown]} if self.unknown else {})}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> BeatsAck:
        unknown = body.get("unknown", [])
        if type(unknown) is not list or len(unknown) > MAX_BEATS or not all(
                type(i) is str and 0 < len(i) <= MAX_IDENT and i.isascii() for i in unknown):
            raise ProtocolError(f"heartbeats_ack: unknown must list node identities, not {str(unknown)[:60]}")
        return cls(_int(body, "heartbeats_ack", "n", high=_MAX_COUNT), tuple(i.encode("ascii") for i in unknown))


@dataclass(frozen=True)
class Barrier:
    """Worker enters its barrier number ``n`` (1, 2, ... per worker; None: its next)."""

    n: int | None = None

    def to_body(self) -> dict[str, Any]:
        return {} if self.n is None else {"n": self.n}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Barrier:
        return cls(None if body.get("n") is None else _int(body, "barrier", "n", 1))


@dataclass(frozen=True)
class Entries:
    """The barrier entries a host's relay collected from its workers (psnode.net.relay): per
    worker, its routing identity toward the scheduler and the number of the barrier it entered.
    The scheduler handles each as a BARRIER from that worker and answers the relay nothing: each
    worker's BARRIER_DONE goes to it directly, and a worker sends its BARRIER again until
    answered.  On the wire: ``{"entries": [["worker-12-ab12cd34", 3], ...]}``; a malformed entry
    makes the whole message malformed."""

    entries: tuple[tuple[bytes, int], ...] = ()

    def to_body(self) -> dict[str, Any]:
        return {"entries": [[i.decode("ascii"), n] for i, n in self.entries]}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Entries:
        raw = _list(body, "barriers", "entries")
        if len(raw) > MAX_BEATS:
            raise ProtocolError(f"barriers: {len(raw)} entries, more than {MAX_BEATS}")
        entries: list[tuple[bytes, int]] = []
        for entry in raw:
            if type(entry) is not list or len(entry) != 2 or type(entry[0]) is not str \
                    or not 0 < len(entry[0]) <= MAX_IDENT or not entry[0].isascii() \
                    or type(entry[1]) is not int or not 1 <= entry[1] <= _MAX_COUNT:
                raise ProtocolError(f"barriers: an entry must be [identity, barrier number], not {str(entry)[:60]}")
            entries.append((entry[0].encode("ascii"), entry[1]))
        return cls(tuple(entries))


@dataclass(frozen=True)
class BarrierDone:
    """Every active worker entered barrier ``n`` (this worker's barriers up to ``n`` are done);
    ``members``: the active workers when it completed, and their ``generation`` (the same for
    every worker of the barrier: an agreed view of the membership)."""

    n: int
    members: tuple[int, ...] = ()
    generation: int = 0

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"n": self.n}
        if self.members:
            body.update(members=list(self.members), generation=self.generation)
        return body

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> BarrierDone:
        w = "barrier_done"
        return cls(_int(body, w, "n"), _ranks(body, w, "members") if "members" in body else (),
                   _int(body, w, "generation", high=_MAX_COUNT, default=0))


@dataclass(frozen=True)
class Membership:
    """The ranks of the ``active`` workers, always the full list (psnode.scheduler.roster), as of
    membership ``generation`` (bumped by the scheduler on every join, leave or loss; a receiver
    ignores one older than what it has); ``joined``: the active workers that joined the running
    job (their start round per key is their JOIN's); ``leave``: workers asked to leave at their
    next push (graceful leave)."""

    active: tuple[int, ...]
    generation: int = 0
    joined: tuple[int, ...] = ()
    leave: tuple[int, ...] = ()

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"active": list(self.active)}
        if self.generation or self.joined or self.leave:   # (an elastic job's fields)
            body.update(generation=self.generation, joined=list(self.joined), leave=list(self.leave))
        return body

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Membership:
        w = "membership"
        return cls(_ranks(body, w, "active"), _int(body, w, "generation", high=_MAX_COUNT, default=0),
                   _ranks(body, w, "joined") if "joined" in body else (),
                   _ranks(body, w, "leave") if "leave" in body else ())


@dataclass(frozen=True)
class Servers:
    """A server changed: ``down`` is down (requests to it wait), or ``restored`` was replaced and
    serves at its entry of the address book ``servers`` (reconnect, resend).  Exactly one of
    ``down`` and ``restored`` is set."""

    down: int | None = None
    restored: int | None = None
    servers: tuple[ServerAddress, ...] = ()

    def to_body(self) -> dict[str, Any]:
        if self.down is not None:
            return {"down": self.down}
        return {"servers": book_body(self.servers), "restored": self.restored}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Servers:
        down, restored = _opt_int(body, "servers", "down"), _opt_int(body, "servers", "restored")
        if (down is None) == (restored is None):
            raise ProtocolError("servers: exactly one of down and restored must be set")
        if down is not None:
            return cls(down=down)
        book = _book(body, "servers")
        if not any(s.rank == restored for s in book):
            raise ProtocolError(f"servers: restored server {restored} is not in the address book")
        return cls(restored=restored, servers=book)

    def address(self) -> ServerAddress:
        """The restored server's address."""
        return next(s for s in self.servers if s.rank == self.restored)


@dataclass(frozen=True)
class JobEnd:
    """The job ends (SHUTDOWN; ``ok``: it succeeded) or failed (PEER_LOST, and SHUTDOWN without
    ``ok``): ``reason`` for the user, ``node`` the row of the node that failed, when one did."""

    ok: bool = False
    reason: str = "the job ended"
    node: NodeRow | None = None

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"ok": self.ok, "reason": self.reason}
        if self.node is not None:
            body["node"] = self.node.to_dict()
        return body

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> JobEnd:
        node = body.get("node")
        return cls(_bool(body, "job end", "ok", default=False), _str(body, "job end", "reason", default=cls.reason),
                   None if node is None else NodeRow.from_dict(_object(node, "job end: node")))


@dataclass(frozen=True)
class Bye:
    """A node leaves: normally (no fields), failed (``error``: the job ends, naming it), or
    failed to be restarted (``restart``: the scheduler waits for its replacement)."""

    error: str | None = None
    restart: str | None = None

    def to_body(self) -> dict[str, Any]:
        if self.restart is not None:
            return {"restart": self.restart}
        return {} if self.error is None else {"error": self.error}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Bye:
        return cls(_opt_str(body, "bye", "error"), _opt_str(body, "bye", "restart"))


@dataclass(frozen=True)
class Stop:
    """End the job (``mxdist stop``), for ``reason``."""

    reason: str = "stopped by mxdist stop"

    def to_body(self) -> dict[str, Any]:
        return {"reason": self.reason}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Stop:
        return cls(_str(body, "stop", "reason", default=cls.reason))


@dataclass(frozen=True)
class Standby:
    """A standby scheduler at ``address`` (``host:port``): sent by the standby to the scheduler
    it stands by for (answered STANDBY_ACK), and by that scheduler to each of its nodes, which go
    over to it once their scheduler is silent for the heartbeat timeout."""

    address: str

    def to_body(self) -> dict[str, Any]:
        return {"address": self.address}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Standby:
        address = _str(body, "standby", "address", _ADDRESS)
        if ":" not in address:
            raise ProtocolError(f"standby: address must be host:port, not {address[:40]!r}")
        return cls(address)


@dataclass(frozen=True)
class ScaleDown:
    """Workers ``ranks`` leave the job gracefully at their next push (``mxdist scale`` down)."""

    ranks: tuple[int, ...]

    def to_body(self) -> dict[str, Any]:
        return {"ranks": list(self.ranks)}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> ScaleDown:
        ranks = _ranks(body, "leave", "ranks")
        if not ranks or len(ranks) > 4096:
            raise ProtocolError("leave: ranks must list 1 to 4096 ranks")
        return cls(ranks)


@dataclass(frozen=True)
class Lost:
    """Worker ``rank``'s process died and will not be restarted: it leaves the membership at
    once.  With ``restart`` (its ``restarts``-th replacement's process, counted as the scheduler
    counts them, died and its launcher starts another), the scheduler awaits the replacement at
    once instead of when the heartbeats stop; a report about an earlier process is ignored."""

    rank: int
    reason: str = "its process died"
    restart: bool = False
    restarts: int = 0

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"rank": self.rank, "reason": self.reason}
        if self.restart:
            body.update(restart=True, restarts=self.restarts)
        return body

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Lost:
        restart = body.get("restart", False)
        if not isinstance(restart, bool):
            raise ProtocolError("lost: restart must be true or false")
        return cls(_int(body, "lost", "rank"), _str(body, "lost", "reason", 500, default=cls.reason), restart,
                   _int(body, "lost", "restarts", high=_MAX_COUNT, default=0))


@dataclass(frozen=True)
class StatusAnswer:
    """The scheduler's node table: the ``job`` id, seconds since the scheduler started, whether
    the job ``started`` (every node registered), connections the scheduler ``refused``, one
    row per node (:class:`psnode.protocol.status.NodeRow`), the membership ``generation`` (0
    until the first change), the active workers' ranks ``members`` (sorted), and how many
    workers ``joined`` the running job, ``left`` it gracefully and were ``lost``; the longest
    gap between two turns of the scheduler's own loop over the last window (``loop_gap``,
    seconds: psnode.loopgap), and the heartbeats and barrier entries that reached it through
    hosts' relays (``relayed``, ``relayed_barriers``, since it started: psnode.net.relay)."""

    job: str
    uptime: float
    started: bool
    refused: int
    nodes: tuple[NodeRow, ...] = ()
    generation: int = 0
    members: tuple[int, ...] = ()
    joined: int = 0
    left: int = 0
    lost: int = 0
    loop_gap: float = 0.0
    relayed: int = 0
    relayed_barriers: int = 0

    def to_body(self) -> dict[str, Any]:
        return {"job": self.job, "uptime": self.uptime, "started": self.started, "refused": self.refused,
                "nodes": [n.to_dict() for n in self.nodes], "generation": self.generation,
                "members": list(self.members), "joined": self.joined, "left": self.left, "lost": self.lost,
                **({"loop_gap": self.loop_gap} if self.loop_gap else {}),
                **({"relayed": self.relayed} if self.relayed else {}),
                **({"relayed_barriers": self.relayed_barriers} if self.relayed_barriers else {})}

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> StatusAnswer:
        what = "status_reply"
        uptime = _field(body, what, "uptime", _NO)
        if type(uptime) not in (int, float) or not math.isfinite(uptime) or uptime < 0:
            raise ProtocolError(f"{what}: uptime must be a number of seconds, not {str(uptime)[:40]!r}")
        rows = [NodeRow.from_dict(_object(r, f"{what}: a node")) for r in _list(body, what, "nodes")]
        counts = [_int(body, what, name, high=_MAX_COUNT, default=0) for name in ("generation", "joined", "left",
                                                                                  "lost", "relayed",
                                                                                  "relayed_barriers")]
        members = tuple(sorted(_ranks(body, what, "members"))) if "members" in body else ()
        gap = body.get("loop_gap", 0.0)
        gap = float(gap) if type(gap) in (int, float) and math.isfinite(gap) and gap >= 0 else 0.0
        return cls(_str(body, what, "job"), float(uptime), _bool(body, what, "started"),
                   _int(body, what, "refused", high=_MAX_COUNT), tuple(rows), counts[0], members, counts[1],
                   counts[2], counts[3], loop_gap=gap, relayed=counts[4],
                   relayed_barriers=counts[5])


@dataclass(frozen=True)
class Replica:
    """A replica message's body (REPLICA_PUT, _ACK, _GET, _STATE: psnode.server.replicas):
    the state of server ``rank``, as of its ``seq``-th copy (0: none held).  PUT and STATE carry
    the state as arrays, the first one its JSON index.  A PUT whose ``base`` is not 0 carries
    only the changes since copy ``base`` (psnode.server.image); an ACK with ``whole`` says the
    holder cannot apply them (it lacks that copy) and needs the state whole.  A whole PUT with
    ``fuzzy`` was read from the live arrays while the rounds went on: the holder keeps it but
    neither serves it nor counts it held until the PUT with ``patch`` (same ``seq``: the rows
    written meanwhile, as they were) makes it exact; its ACK says ``fuzzy`` until then.

    A state given whole may travel in ``chunks`` messages (psnode.server.chunks), ``chunk``
    its index: a PUT or STATE carries one chunk (chunk 0 the layout first), an ACK with
    ``chunks`` says how many of copy ``seq``'s chunks the holder took (``chunk``), and a GET with
    ``chunk`` asks for that chunk of copy ``seq`` (a STATE with seq 0: that copy is gone).

    An ACK with ``busy`` refuses a whole copy for now (the holder's own server is restoring: its
    link is busy with that); the holder asks for it (an ACK with ``whole``) once it is free."""

    rank: int
    seq: int = 0
    base: int = 0
    whole: bool = False
    fuzzy: bool = False
    patch: bool = False
    chunk: int = 0
    chunks: int = 0
    busy: bool = False

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"rank": self.rank, "seq": self.seq}
        if self.base:
            body["base"] = self.base
        if self.whole:
            body["whole"] = True
        if self.fuzzy:
            body["fuzzy"] = True
        if self.patch:
            body["patch"] = True
        if self.chunk:
            body["chunk"] = self.chunk
        if self.chunks:
            body["chunks"] = self.chunks
        if self.busy:
            body["busy"] = True
        return body

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Replica:
        return cls(_int(body, "replica", "rank"), _int(body, "replica", "seq", high=2**62, default=0),
                   _int(body, "replica", "base", high=2**62, default=0),
                   _bool(body, "replica", "whole", default=False),
                   _bool(body, "replica", "fuzzy", default=False),
                   _bool(body, "replica", "patch", default=False),
                   _int(body, "replica", "chunk", high=2**40, default=0),
                   _int(body, "replica", "chunks", high=2**40, default=0),
                   _bool(body, "replica", "busy", default=False))


Body = (Empty | Register | Welcome | Heartbeat | Beats | BeatsAck | Barrier | Entries | BarrierDone | Membership
        | Servers | JobEnd | Bye | Stop | StatusAnswer | ScaleDown | Lost | Replica | Standby)

#: the body of each control command
BODIES: dict[Command, Any] = {
    Command.REGISTER: Register, Command.WELCOME: Welcome, Command.HEARTBEAT: Heartbeat,
    Command.HEARTBEAT_ACK: Empty, Command.HEARTBEATS: Beats, Command.HEARTBEATS_ACK: BeatsAck,
    Command.BARRIER: Barrier, Command.BARRIERS: Entries, Command.BARRIER_DONE: BarrierDone,
    Command.FINISH: Empty, Command.FINISH_ACK: Empty, Command.MEMBERSHIP: Membership, Command.SERVERS: Servers,
    Command.SHUTDOWN: JobEnd, Command.PEER_LOST: JobEnd, Command.BYE: Bye, Command.STATUS: Empty,
    Command.STATUS_REPLY: StatusAnswer, Command.STOP: Stop, Command.STOP_ACK: Empty,
    Command.LEAVE: ScaleDown, Command.LEAVE_ACK: Empty, Command.LOST: Lost, Command.LOST_ACK: Empty,
    Command.REJOIN: Empty, Command.REPLICA_PUT: Replica, Command.REPLICA_ACK: Replica,
    Command.REPLICA_GET: Replica, Command.REPLICA_STATE: Replica,
    Command.STANDBY: Standby, Command.STANDBY_ACK: Empty,
}


@dataclass(frozen=True)
class Control:
    """A decoded control message: its command, its typed body and who sent it."""

    cmd: Command
    body: Body
    sender: str = ""


def decode_body(cmd: Command, body: dict[str, Any]) -> Body:
    """The typed body of command ``cmd``; raises ProtocolError naming the bad field."""
    cls = BODIES.get(cmd)
    if cls is None:
        raise ProtocolError(f"{cmd.value} is not a control command")
    body_of: Body = cls.from_body(body)
    return body_of


def decode(msg: Message) -> Control:
    """``msg`` (a decoded control message) with its typed body; raises ProtocolError."""
    return Control(msg.cmd, decode_body(msg.cmd, msg.body), msg.sender)


__all__ = ["BODIES", "Barrier", "BarrierDone", "Beats", "BeatsAck", "Body", "Bye", "Control", "Counters", "Empty",
           "Entries", "Heartbeat",
           "JobEnd", "Lost", "Membership", "Register", "Rejoin", "Replica", "ScaleDown", "ServerAddress", "Servers",
           "Standby", "StatusAnswer", "Stop", "WaitKind", "WaitReport", "Welcome", "awaited", "decode",
           "decode_body", "late_counts", "wait_report"]
