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
   when :meth:`PushJournal.released`, psnode.samehost.staging).
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
A part holding :data:`ASK_DEPTH` pushes (pushes without pulls, or a server that checkpoints
rarely) has its next push ask for its answer (:meth:`asks`): the answer moves the watermark,
and a restartable server checkpoints for it, so the journal stays bounded.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from psnode.protocol import PartKey, Push, PushPull

Sent = Push | PushPull

ASK_DEPTH = 4   # pushes a key part's journal holds before the next push asks to be made durable


@dataclass
class _Part:
    server: int
    confirmed: int = 0
    durable: int = 0
    pushes: deque[Sent] = field(default_factory=deque)


class PushJournal:
    """Pushes not yet durable, per key part (see the module docstring)."""

    def __init__(self) -> None:
        self._parts: dict[PartKey, _Part] = {}
        self.rounds = 0    # the highest push of any key part known applied

    def remember(self, server: int, op: Sent) -> None:
        """A push was sent."""
        key = (op.key, op.part)
        part = self._parts.get(key)
        if part is None:
            part = self._parts[key] = _Part(server)
        part.pushes.append(op)

    def asks(self, key: PartKey) -> bool:
        """Should the push just remembered for ``key`` ask for its answer (it holds ASK_DEPTH)?"""
        part = self._parts.get(key)
        return part is not None and len(part.pushes) >= ASK_DEPTH

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
                pushes.popleft()

    def confirmed(self, key: PartKey) -> int:
        part = self._parts.get(key)
        return 0 if part is None else part.confirmed

    def released(self, key: PartKey) -> int:
        """Pushes up to this of ``key`` are applied and durable: nobody reads their arrays again."""
        part = self._parts.get(key)
        return 0 if part is None else min(part.confirmed, part.durable)

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


__all__ = ["ASK_DEPTH", "PushJournal", "Sent"]
