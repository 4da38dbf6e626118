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
"""
from __future__ import annotations

from dataclasses import dataclass, field

from psnode.protocol.control import MAX_BEATS, Beats, Counters

#: intervals without an answer through the relay before a node heartbeats directly
FALLBACK_INTERVALS = 2.5
#: intervals between a fallen-back node's tries of the relay
RETRY_INTERVALS = 10
#: batches the relay remembers while their answers are due (older ones are forgotten)
KEPT_BATCHES = 4
#: a node's unchanged counters are left out of a batch, but sent again after this many batches
REFRESH_BATCHES = 10


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

    def beat(self, ident: bytes, stats: Counters) -> None:
        """A node's heartbeat (its routing identity toward the scheduler, its counters)."""
        self.latest.pop(ident, None)   # (insertion order: the oldest first, for the bound below)
        self.latest[ident] = stats
        while len(self.latest) > MAX_BEATS:
            del self.latest[next(iter(self.latest))]

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
        """Seconds until the next batch is due."""
        return max(0.0, min(self.next_batch - now, self.interval))


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


__all__ = ["FALLBACK_INTERVALS", "KEPT_BATCHES", "REFRESH_BATCHES", "RETRY_INTERVALS", "Relay", "RelayUse", "endpoint"]
