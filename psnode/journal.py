"""A worker's memory of what it sent and may have to send again (pure: no sockets).

Pushes travel without acknowledgement, so a worker cannot know they arrived until it sees their
effect.  :class:`PushJournal` keeps, per key part, the pushes sent but not yet known applied
(their arrays are the push's own copies, never the caller's buffer), at most ``depth`` of them:

* a pull of a key part after push ``q`` returned: pushes up to ``q`` are applied (``confirm``);
* a flush lists the unconfirmed pushes per key part (``check_list``) so a server can name those
  it never received; a resent pull parked on a server gets the ``gap`` named the same way;
* a restored server gets each key part's last confirmed push (``resync_parts``), then every
  unconfirmed push again (``replay``).
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from psnode.protocol import PartKey, Push, PushPull

Sent = Push | PushPull


@dataclass
class _Part:
    server: int
    confirmed: int = 0
    pushes: deque[Sent] = field(default_factory=deque)


class PushJournal:
    """Unconfirmed pushes per key part (see the module docstring)."""

    def __init__(self, depth: int = 2) -> None:
        self.depth = depth
        self._parts: dict[PartKey, _Part] = {}
        self.rounds = 0    # the highest push of any key part known applied

    def remember(self, server: int, op: Sent) -> None:
        """A push was sent; the oldest beyond ``depth`` is forgotten."""
        key = (op.key, op.part)
        part = self._parts.get(key)
        if part is None:
            part = self._parts[key] = _Part(server)
        part.pushes.append(op)
        if len(part.pushes) > self.depth:
            part.pushes.popleft()

    def confirm(self, key: PartKey, seq: int) -> None:
        """Pushes up to ``seq`` of ``key`` are applied (a pull after them returned)."""
        part = self._parts.get(key)
        if part is None:
            return
        if seq > part.confirmed:
            part.confirmed = seq
            if seq > self.rounds:
                self.rounds = seq
        while part.pushes and part.pushes[0].seq <= seq:
            part.pushes.popleft()

    def confirmed(self, key: PartKey) -> int:
        part = self._parts.get(key)
        return 0 if part is None else part.confirmed

    def holds(self, key: PartKey, seq: int) -> bool:
        part = self._parts.get(key)
        return part is not None and any(op.seq == seq for op in part.pushes)

    def check_list(self, server: int) -> list[tuple[Any, int, list[int]]]:
        """``(key, part, [seq, ...])`` of every unconfirmed push to ``server`` (for a flush)."""
        return [(k, p, [op.seq for op in part.pushes]) for (k, p), part in self._parts.items()
                if part.server == server and part.pushes]

    def resync_parts(self, server: int) -> list[tuple[Any, int, int]]:
        """``(key, part, last confirmed push)`` of every key part on ``server``."""
        return [(k, p, part.confirmed) for (k, p), part in self._parts.items() if part.server == server]

    def replay(self, server: int, wanted: Mapping[PartKey, Iterable[int]] | None = None) -> list[Sent]:
        """The unconfirmed pushes to ``server`` (only ``wanted`` sequence numbers per key part, if
        given), oldest first per key part, to send again."""
        out: list[Sent] = []
        for key, part in self._parts.items():
            if part.server != server or (wanted is not None and key not in wanted):
                continue
            seqs = None if wanted is None else set(wanted[key])
            out.extend(op for op in part.pushes if seqs is None or op.seq in seqs)
        return out


__all__ = ["PushJournal", "Sent"]
