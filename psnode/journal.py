"""A worker's memory of what it sent and may have to send again (pure: no sockets).

Pushes travel without acknowledgement, so a worker cannot know they arrived until it sees their
effect.  :class:`PushJournal` keeps, per key part, the pushes sent but not yet known applied
(their arrays are the push's own copies, never the caller's buffer), at most ``depth`` of them:

* a pull of a key part after push ``q`` returned: pushes up to ``q`` are applied (``confirm``);
* a flush lists the unconfirmed pushes per key part (``check_list``) so a server can name those
  it never received; a resent pull parked on a server gets the ``gap`` named the same way;
* a restored server gets each key part's last confirmed push (``resync_parts``), then every
  unconfirmed push again (``replay``).

:class:`Pending` is one request that expects an answer, kept whole so it can be sent again.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Op = tuple[dict[str, Any], list[np.ndarray]]   # an operation and the arrays it refers to
PartKey = tuple[Any, int]                      # (user key, part index)


@dataclass
class Pending:
    """A sent request waiting for its answer."""

    future: Any
    server: int
    nbytes: int        # bytes it brings back (counted against the per-server window)
    op: dict[str, Any]
    arrays: list[np.ndarray]
    sent: float        # when it was last sent (monotonic seconds)
    tries: int = 0     # resends since the last sign of life


@dataclass
class _Part:
    server: int
    confirmed: int = 0
    pushes: deque[tuple[int, Op]] = field(default_factory=deque)


class PushJournal:
    """Unconfirmed pushes per key part (see the module docstring)."""

    def __init__(self, depth: int = 2) -> None:
        self.depth = depth
        self._parts: dict[PartKey, _Part] = {}

    @staticmethod
    def key_of(op: Mapping[str, Any]) -> PartKey:
        return (op["k"], int(op.get("p", 0)))

    def remember(self, server: int, op: dict[str, Any], arrays: list[np.ndarray]) -> None:
        """A push was sent; the oldest beyond ``depth`` is forgotten."""
        part = self._parts.get(self.key_of(op))
        if part is None:
            part = self._parts[self.key_of(op)] = _Part(server)
        part.pushes.append((int(op["q"]), (op, arrays)))
        if len(part.pushes) > self.depth:
            part.pushes.popleft()

    def confirm(self, key: PartKey, seq: int) -> None:
        """Pushes up to ``seq`` of ``key`` are applied (a pull after them returned)."""
        part = self._parts.get(key)
        if part is None:
            return
        part.confirmed = max(part.confirmed, seq)
        while part.pushes and part.pushes[0][0] <= seq:
            part.pushes.popleft()

    def holds(self, key: PartKey, seq: int) -> bool:
        part = self._parts.get(key)
        return part is not None and any(q == seq for q, _ in part.pushes)

    def check_list(self, server: int) -> list[list[Any]]:
        """``[key, part, [seq, ...]]`` of every unconfirmed push to ``server`` (for a flush)."""
        return [[k, p, [q for q, _ in part.pushes]] for (k, p), part in self._parts.items()
                if part.server == server and part.pushes]

    def resync_parts(self, server: int) -> list[list[Any]]:
        """``[key, part, last confirmed push]`` of every key part on ``server``."""
        return [[k, p, part.confirmed] for (k, p), part in self._parts.items() if part.server == server]

    def replay(self, server: int, wanted: Mapping[PartKey, Iterable[int]] | None = None) -> list[Op]:
        """The unconfirmed pushes to ``server`` (only ``wanted`` sequence numbers per key part, if
        given), oldest first per key part, to send again."""
        out: list[Op] = []
        for key, part in self._parts.items():
            if part.server != server or (wanted is not None and key not in wanted):
                continue
            seqs = None if wanted is None else set(wanted[key])
            out.extend(op for q, op in part.pushes if seqs is None or q in seqs)
        return out


__all__ = ["Op", "PartKey", "Pending", "PushJournal"]
