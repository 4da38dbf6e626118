"""A host's heartbeat relay, as pure state machines (no sockets, no clock of their own).

The scheduler's cost of liveness grows with the hosts of a job, not its processes: on a host
with many of the job's processes, one of them relays the others' heartbeats
(:mod:`psnode.net.relayhost` runs it in a thread with its own sockets).  Each node sends its
HEARTBEAT to the relay instead of the scheduler; once per heartbeat interval the relay sends
the scheduler ONE message, HEARTBEATS (:class:`~psnode.protocol.control.Beats`): the latest
counters of each node heard from since the last batch.  The scheduler handles each entry as a
HEARTBEAT from that node (its routing identity toward the scheduler: every node keeps its own
connection to the scheduler for everything else, so the scheduler still answers a node directly
when it must, e.g. REJOIN) and answers the batch once (HEARTBEATS_ACK); the relay then answers
HEARTBEAT_ACK to each node of that batch.

:class:`Relay` is the relay's state: it forwards only what it heard since the last batch, so a
node that stopped (dead, or hung) stops being forwarded, and the scheduler names it silent as if
it sent directly (a relayed heartbeat is at most one interval late: the heartbeat timeout is
several).  A node's counters equal to those it last sent go as its identity alone (sent whole
again every :data:`REFRESH_BATCHES` batches, and whenever the node missed a batch): an idle
node costs the scheduler a dictionary look-up, not a decode.

:class:`RelayUse` is a node's side: heartbeats go through the relay while it answers; once no
answer came through it for :data:`FALLBACK_INTERVALS` heartbeat intervals since the oldest
unanswered heartbeat, the node heartbeats directly.  That is well before the scheduler's
timeout (``heartbeat_liveness`` intervals, 5 by default), so the relay's process dying never
makes the scheduler take the others for dead; the relay's own process is watched like any other
(its own heartbeats stop).  Every :data:`RETRY_INTERVALS` intervals a fallen-back node sends one
heartbeat through the relay too (first trying to become the host's relay itself, when no process
holds its address any more): answered, it uses the relay again.  So a scheduler restarted at its
address, or a relay's lost process, costs the aggregation for a few intervals, not for the rest
of the job.  A node that went over to a standby scheduler never uses the relay again.

Barriers are counted per host the same way: a worker that heartbeats through the relay sends its
BARRIER there too, and the relay sends the scheduler one BARRIERS message
(:class:`~psnode.protocol.control.Entries`) for the entries of its host's workers, as soon as
every worker of the host it knows (each that entered a barrier through it, was heard from in
the last :data:`GONE_INTERVALS` intervals and did not say it leaves) entered the newest barrier;
at the latest :data:`BARRIER_WAIT` intervals after the oldest entry it holds (the first barrier,
before it knows the host's workers: after :data:`BARRIER_HOLD` seconds). So the last worker to
arrive is forwarded at once, and a barrier of W workers on H hosts costs the scheduler about H
messages, not W. The scheduler answers each worker directly (BARRIER_DONE),
and a worker sends its BARRIER again until answered, so a relay lost with entries in hand delays
a barrier by the worker's retry, never loses it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from psnode.protocol.control import MAX_BEATS, Beats, Counters, Entries

#: intervals without an answer through the relay before a node heartbeats directly
FALLBACK_INTERVALS = 2.5
#: intervals between a fallen-back node's tries of the relay
RETRY_INTERVALS = 10
#: batches the relay remembers while their answers are due (older ones are forgotten)
KEPT_BATCHES = 4
#: a node's unchanged counters are left out of a batch, but sent again after this many batches
REFRESH_BATCHES = 10
#: the longest a barrier entry waits at the relay for the host's other workers, in intervals
BARRIER_WAIT = 0.5
#: the same before the relay knows the host's workers (its first barrier), in seconds
BARRIER_HOLD = 0.05
#: intervals without a word from a worker before the relay stops waiting for its barrier entries
GONE_INTERVALS = 2.0
#: intervals without a word from a worker before the relay forgets it entered barriers
FORGET_INTERVALS = 10.0


def endpoint(job_id: str) -> str:
    """The relay's address on its host: an abstract unix socket, one per job per host (per
    network namespace), so the first of the job's processes to bind it is the relay."""
    return f"ipc://@psnode-{job_id}-relay"


@dataclass
class Relay:
    """The relay's state: the latest heartbeat of each node since the last batch, and the
    batches sent and not yet answered (their nodes, to answer them)."""

    interval: float
    latest: dict[bytes, Counters] = field(default_factory=dict)
    sent: dict[int, tuple[bytes, ...]] = field(default_factory=dict)   # batch -> its nodes
    told: dict[bytes, tuple[Counters, int]] = field(default_factory=dict)   # node -> counters sent, in batch
    next_batch: float = 0.0
    count: int = 0          # batches sent so far
    entries: dict[bytes, int] = field(default_factory=dict)   # worker -> barrier entered, not yet sent
    held_since: float | None = None     # when the oldest entry not yet sent arrived
    #: workers that entered barriers through the relay -> (the newest barrier they entered, when last heard)
    enterers: dict[bytes, tuple[int, float]] = field(default_factory=dict)
    first_barrier: int | None = None    # the first barrier entered through the relay (it knew no worker then)

    def beat(self, ident: bytes, stats: Counters, now: float | None = None) -> None:
        """A node's heartbeat (its routing identity toward the scheduler, its counters; ``now``:
        when, for the barrier entries it may be waited for)."""
        self.latest.pop(ident, None)   # (insertion order: the oldest first, for the bound below)
        self.latest[ident] = stats
        while len(self.latest) > MAX_BEATS:
            del self.latest[next(iter(self.latest))]
        known = self.enterers.get(ident)
        if known is not None and now is not None:
            self.enterers[ident] = (known[0], now)

    def enter(self, ident: bytes, n: int, now: float) -> None:
        """Worker ``ident`` entered its barrier ``n`` (again: the same entry)."""
        if self.held_since is None:
            self.held_since = now
        if self.first_barrier is None:
            self.first_barrier = n
        self.entries[ident] = n
        self.enterers[ident] = (max(n, self.enterers.get(ident, (0, now))[0]), now)

    def barrier_entries(self, now: float) -> Entries | None:
        """The entries to send now: every entry held, once every worker of the host the relay
        knows entered the newest barrier held (or it held one as long as it may, or holds as
        many as a message carries); None while it waits."""
        if not self.entries:
            return None
        if now < self._due() and len(self.entries) < MAX_BEATS:
            newest, live = max(self.entries.values()), now - GONE_INTERVALS * self.interval
            if newest == self.first_barrier or any(n < newest and heard >= live for n, heard in self.enterers.values()):
                return None
        entries = Entries(tuple(self.entries.items()))
        self.entries, self.held_since = {}, None
        forget = now - FORGET_INTERVALS * self.interval
        for ident in [i for i, (_, heard) in self.enterers.items() if heard < forget]:
            del self.enterers[ident]
        return entries

    def batch(self, now: float) -> Beats | None:
        """The batch to send now, if one is due and any node was heard from since the last."""
        if now < self.next_batch:
            return None
        self.next_batch = now + self.interval
        if not self.latest:
            return None
        self.count += 1
        told, beats_of = self.told, list[tuple[bytes, Counters | None]]()
        self.told = {}
        for ident, stats in self.latest.items():
            last = told.get(ident)
            if last is not None and last[0] == stats and self.count - last[1] < REFRESH_BATCHES:
                beats_of.append((ident, None))   # (unchanged: the scheduler has them)
                self.told[ident] = last
            else:
                beats_of.append((ident, stats))
                self.told[ident] = (stats, self.count)
        beats = Beats(self.count, tuple(beats_of))
        self.latest = {}
        self.sent[beats.n] = tuple(i for i, _ in beats.beats)
        for old in [n for n in self.sent if n <= beats.n - KEPT_BATCHES]:
            del self.sent[old]
        return beats

    def acked(self, n: int, unknown: tuple[bytes, ...] = ()) -> tuple[bytes, ...]:
        """The scheduler answered batch ``n``: the nodes to answer, all of the batch's but those
        it does not know (``unknown``; none for an unknown or repeated ``n``)."""
        nodes = self.sent.pop(n, ())
        if unknown:
            gone = set(unknown)
            return tuple(i for i in nodes if i not in gone)
        return nodes

    def timeout(self, now: float) -> float:
        """Seconds until the next batch is due, or the entries held must go."""
        due = self.next_batch if self.held_since is None else min(self.next_batch, self._due())
        return max(0.0, min(due - now, self.interval))

    def leaves(self, ident: bytes) -> None:
        """Worker ``ident`` enters no more barriers (it finished): it is not waited for."""
        self.enterers.pop(ident, None)

    def _due(self) -> float:
        """When the entries held go at the latest."""
        assert self.held_since is not None
        first = self.first_barrier is not None and max(self.entries.values(), default=0) <= self.first_barrier
        return self.held_since + (BARRIER_HOLD if first else BARRIER_WAIT * self.interval)


@dataclass
class RelayUse:
    """A node's choice between its host's relay and the scheduler for its heartbeats."""

    interval: float
    on: bool = True
    unanswered: float | None = None   # when the oldest heartbeat not yet answered through the relay was sent
    retry: bool = True                # off: try the relay again now and then (False: never again)
    probed: float = 0.0               # when the relay was last tried again

    def sent(self, now: float) -> None:
        """A heartbeat went to the relay."""
        if self.unanswered is None:
            self.unanswered = now

    def answered(self) -> bool:
        """The relay answered (the scheduler took this node's heartbeat); True when that puts a
        node that had fallen back on the relay again."""
        self.unanswered = None
        if self.on or not self.retry:
            return False
        self.on = True
        return True

    def held(self, seconds: float) -> None:
        """The node's own loop was held ``seconds``: that time does not count against the relay."""
        if self.unanswered is not None:
            self.unanswered += seconds

    def fall_back(self, now: float) -> bool:
        """Stop using the relay if it left a heartbeat unanswered too long; True when it just
        stopped (the node then heartbeats directly, and tries the relay again every
        :data:`RETRY_INTERVALS` intervals: :meth:`probe`)."""
        if self.on and self.unanswered is not None and now - self.unanswered > FALLBACK_INTERVALS * self.interval:
            self.on, self.unanswered, self.probed = False, None, now
            return True
        return False

    def probe(self, now: float) -> bool:
        """Should this heartbeat (sent directly) also go to the relay, to try it again?"""
        if self.on or not self.retry or now - self.probed < RETRY_INTERVALS * self.interval:
            return False
        self.probed = now
        return True

    def stop(self) -> None:
        """Never use the relay again (the node went over to a standby scheduler)."""
        self.on = self.retry = False


__all__ = ["BARRIER_HOLD", "BARRIER_WAIT", "FALLBACK_INTERVALS", "FORGET_INTERVALS", "GONE_INTERVALS", "KEPT_BATCHES",
           "REFRESH_BATCHES", "RETRY_INTERVALS", "Relay", "RelayUse", "endpoint"]
