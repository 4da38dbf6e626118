"""A worker's memory of what it sent and may have to send again (pure: no sockets).

**Exactly once.**  A push is applied exactly once, on every data path (TCP, the same-host
link, a bucket of small keys, each part of a split key), across any sequence of worker and
server restarts.  What makes it hold:

1. *Numbering.*  Push ``q`` of a worker to a key part is ``(worker, key part, q)``; a server
   takes each once, whatever copy or path it comes by (psnode.server.rounds), a bucket push being
   push ``q`` of every member (psnode.server.buckets).
2. *Durability.*  A server survives its restart only as its last checkpoint, which holds its
   whole state, rounds in progress included (psnode.server.checkpoint).  Every answer to a pull (and
   to a push that asks) carries the worker's **durable watermark** for the key part: its
   pushes 1..seq are in that checkpoint (a server that cannot be restarted: received).
3. *This journal* keeps every push sent until the watermark covers it -- no depth, no window
   that runs out -- so whatever a restored server lacks, the worker still holds: it resends
   all of it (:meth:`PushJournal.replay`) and every unanswered request, and duplicates are
   taken once.  Its arrays are the pushes' own copies (a same-host push slot is reused only
   when :attr:`PushJournal.releases` says so, psnode.samehost.staging).
4. *Restarted workers.*  A replacement resumes from the count its servers answer at init;
   a restartable server writes a checkpoint before it tells a count its last one lacks, so a
   push that only a dead worker held is never skipped (psnode.server.store: durability).  A
   worker that finishes flushes first: a flush's Ok says every push it listed is durable.
5. *Members.*  A worker being replaced stays a member of the rounds (psnode.scheduler.roster): a round
   never completes without its push.

When a server asks for a push this journal no longer holds, that push exists nowhere: the
server lost what it reported durable.  The request fails with :class:`~psnode.errors.DataLost`
and the job ends, naming the key (a restart cannot bring the push back).

Kept per key part: the pushes, ``confirmed`` (applied: a pull after them returned) and
``durable`` (the watermark).  A flush lists the unforgotten pushes (:meth:`check_list`) so a
server can name those it never received; a parked pull's ``gap`` is sent again the same way.

**Bounded, without waiting.**  A restartable server makes durable points on its own, in the
background, once the answers it sends would report a worker's watermark a few pushes behind
(psnode.server.points: ``LAG``); the answers leave at once with the watermark they have, and
the next answer after the point brings the new one.  So pushes keep flowing while a point is
under way, and a part's journal holds the pushes of about one point.  The hard bound: a part
holding :data:`ASK_DEPTH` pushes, or :data:`ASK_BYTES` of arrays (pushes without pulls, or
points slower than the rounds), has its next push ask for its answer (:meth:`asks`): that
answer waits for a durable point that covers it, so the journal never holds more than about
``ASK_DEPTH`` pushes or ``ASK_BYTES`` per key part (plus what is in flight meanwhile).
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from psnode.protocol import PartKey, Push, PushPull

Sent = Push | PushPull

ASK_DEPTH = 64          # pushes a key part's journal holds before the next push asks to be made durable
ASK_BYTES = 64 << 20    # or bytes of its pushes' arrays


@dataclass
class _Part:
    server: int
    confirmed: int = 0
    durable: int = 0
    pushes: deque[Sent] = field(default_factory=deque)
    nbytes: int = 0       # of the pushes' arrays


def _nbytes(op: Sent) -> int:
    rows = getattr(op, "rows", None)
    return int(op.data.nbytes) + (int(rows.nbytes) if rows is not None else 0)


class PushJournal:
    """Pushes not yet durable, per key part (see the module docstring)."""

    def __init__(self, depth: int = ASK_DEPTH, limit_bytes: int = ASK_BYTES) -> None:
        self._parts: dict[PartKey, _Part] = {}
        #: key part -> its pushes up to this are applied and durable (nobody reads their arrays
        #: again): published for the same-host push slots (psnode.samehost.staging), which read it
        self.releases: dict[PartKey, int] = {}
        self.rounds = 0    # the highest push of any key part known applied
        self.depth = depth              # the hard bound (ASK_DEPTH, ASK_BYTES)
        self.limit_bytes = limit_bytes

    def remember(self, server: int, op: Sent) -> bool:
        """A push was sent.  Returns whether it should ask for its answer, one that waits for a
        durable point (its key part now holds ``depth`` pushes or ``limit_bytes``: the hard bound)."""
        key = (op.key, op.part)
        part = self._parts.get(key)
        if part is None:
            part = self._parts[key] = _Part(server)
        part.pushes.append(op)
        part.nbytes += _nbytes(op)
        return len(part.pushes) >= self.depth or part.nbytes >= self.limit_bytes

    def depth_of(self, key: PartKey) -> tuple[int, int]:
        """The pushes ``key``'s journal holds, and their bytes."""
        part = self._parts.get(key)
        return (0, 0) if part is None else (len(part.pushes), part.nbytes)

    def settle(self, key: PartKey, applied: int, durable: int) -> None:
        """An answer said: pushes up to ``applied`` of ``key`` are applied (a pull after them
        returned; 0: nothing said) and up to ``durable`` survive the server's restart (forgotten)."""
        part = self._parts.get(key)
        if part is None:
            return
        if applied > part.confirmed:
            part.confirmed = applied
            if applied > self.rounds:
                self.rounds = applied
        if durable > part.durable:
            part.durable = durable
            pushes = part.pushes
            while pushes and pushes[0].seq <= durable:
                part.nbytes -= _nbytes(pushes.popleft())
        released = min(part.confirmed, part.durable)
        if released > self.releases.get(key, 0):
            self.releases[key] = released

    def confirmed(self, key: PartKey) -> int:
        part = self._parts.get(key)
        return 0 if part is None else part.confirmed

    def released(self, key: PartKey) -> int:
        """Pushes up to this of ``key`` are applied and durable: nobody reads their arrays again."""
        return self.releases.get(key, 0)

    def holds(self, key: PartKey, seq: int) -> bool:
        part = self._parts.get(key)
        return part is not None and any(op.seq == seq for op in part.pushes)

    def check_list(self, server: int) -> list[tuple[Any, int, list[int]]]:
        """``(key, part, [seq, ...])`` of every push to ``server`` not known durable (for a flush)."""
        return [(k, p, [op.seq for op in part.pushes]) for (k, p), part in self._parts.items()
                if part.server == server and part.pushes]

    def servers(self) -> set[int]:
        """The servers this journal holds pushes for."""
        return {part.server for part in self._parts.values() if part.pushes}

    def replay(self, server: int, wanted: Mapping[PartKey, Iterable[int]] | None = None) -> list[Sent]:
        """The pushes to ``server`` not known durable (only ``wanted`` sequence numbers per key
        part, if given), oldest first per key part, to send again."""
        out: list[Sent] = []
        for key, part in self._parts.items():
            if part.server != server or (wanted is not None and key not in wanted):
                continue
            seqs = None if wanted is None else set(wanted[key])
            out.extend(op for op in part.pushes if seqs is None or op.seq in seqs)
        return out


__all__ = ["ASK_BYTES", "ASK_DEPTH", "PushJournal", "Sent"]
