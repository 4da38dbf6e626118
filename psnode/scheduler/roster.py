"""The scheduler's running indexes over its nodes, so no event rescans the whole job (pure).

Without them every REGISTER counted the nodes of its role, every BARRIER rebuilt the set of
active workers, every WELCOME sorted the active ranks again, and every FINISH sent the full
active list to every server at once: O(N) work per message, O(N^2) per job-wide event (W
workers finishing cost W x S MEMBERSHIP messages of O(W) ranks each).

Contracts:

* :meth:`Roster.joined` / :meth:`Roster.left` keep the count of registered nodes per role.
* :meth:`Roster.set_state` is told every state change of a node (the scheduler routes all of
  them through it); :attr:`Roster.servers` is then exactly the live (REGISTERED or ALIVE)
  servers, :attr:`Roster.active` exactly the member workers (ident -> rank): ALIVE, or
  RESTARTING (a failed worker whose replacement is awaited: a round must not complete
  without its push, which the replacement sends), and :meth:`Roster.active_ranks` their
  sorted ranks, cached until the next change;
  :meth:`Roster.all_finished` says whether every registered worker is FINISHED.
* :meth:`Roster.want_membership` asks for a MEMBERSHIP; :meth:`Roster.take_membership` returns
  the active ranks once per batch of asks (None when nothing was asked since the last take, or
  when the last one is less than ``MEMBERSHIP_GAP`` seconds old: :meth:`Roster.membership_due`
  says when it may go).  The scheduler takes it after each turn (after draining its socket, so
  FINISHes handled in one turn cost one MEMBERSHIP per server; FINISHes trickling in cost at
  most one per server per ``MEMBERSHIP_GAP``), and with ``force`` before any message whose
  meaning depends on the servers knowing it (BARRIER_DONE, the job's end).  The content is
  always the full current list (idempotent: a server never depends on having seen an earlier
  one).  A round that only waits for leavers completes at most ``MEMBERSHIP_GAP`` later.
"""
from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass, field

from psnode.protocol.status import NodeState

MEMBERSHIP_GAP = 0.02   # seconds between two MEMBERSHIPs, unless forced


@dataclass
class Roster:
    """Counts per role, the active workers and the pending MEMBERSHIP (see the module docstring)."""

    count: dict[str, int] = field(default_factory=lambda: {"worker": 0, "server": 0})
    active: dict[bytes, int] = field(default_factory=dict)     # members (ALIVE, RESTARTING): ident -> rank
    finished: set[bytes] = field(default_factory=set)          # FINISHED workers
    servers: dict[bytes, int] = field(default_factory=dict)    # live (REGISTERED, ALIVE) servers
    _ranks: list[int] | None = None                            # sorted ranks of ``active``, cached
    _asked: bool = False
    _next: float = 0.0                                         # no MEMBERSHIP before (monotonic)

    def joined(self, role: str, ident: bytes) -> None:
        """A node entered the table (REGISTERED, or ALIVE as a restart: tell set_state too)."""
        self.count[role] = self.count.get(role, 0) + 1
        if role == "server":
            self.servers[ident] = 0

    def left(self, role: str, ident: bytes) -> None:
        """A node removed from the table (replaced by its restart)."""
        self.count[role] = self.count.get(role, 0) - 1
        self.finished.discard(ident)
        self.servers.pop(ident, None)
        if self.active.pop(ident, None) is not None:
            self._ranks = None

    def set_state(self, ident: bytes, rank: int, state: NodeState, role: str = "worker") -> None:
        """Node ``ident`` (a worker of ``rank``, or a server) is now in ``state``."""
        if role == "server":
            if state in (NodeState.REGISTERED, NodeState.ALIVE):
                self.servers[ident] = rank
            else:
                self.servers.pop(ident, None)
            return
        alive = state in (NodeState.ALIVE, NodeState.RESTARTING)
        if state == NodeState.FINISHED:
            self.finished.add(ident)
        else:
            self.finished.discard(ident)
        if alive and self.active.get(ident) != rank:
            self.active[ident] = rank
            self._ranks = None
        elif not alive and self.active.pop(ident, None) is not None:
            self._ranks = None

    def active_ranks(self) -> list[int]:
        """The ranks of the active workers, sorted (the same list object until a change)."""
        if self._ranks is None:
            self._ranks = sorted(self.active.values())
        return self._ranks

    def all_finished(self) -> bool:
        """Has every registered worker finished?"""
        return len(self.finished) == self.count["worker"]

    def want_membership(self) -> None:
        self._asked = True

    def membership_due(self) -> float | None:
        """When the asked-for MEMBERSHIP may go (monotonic seconds); None: none is asked for."""
        return self._next if self._asked else None

    def take_membership(self, now: float, force: bool = False) -> list[int] | None:
        """The active ranks to send as MEMBERSHIP at ``now``, if one was asked for since the
        last take and (unless ``force``) the gap since the last one has passed."""
        if not self._asked or (not force and now < self._next):
            return None
        self._asked = False
        self._next = now + MEMBERSHIP_GAP
        return self.active_ranks()

    def barrier_complete(self, entered: dict[bytes, int]) -> bool:
        """Has every active worker entered the barrier (``entered``: ident -> its number)?

        O(1) while fewer workers entered than are active; the O(W) subset check runs only
        when the counts allow completion (about once per barrier).
        """
        if not entered or len(entered) < len(self.active):
            return False
        return self.active.keys() <= entered.keys()


def barrier_groups(entered: Mapping[bytes, int], nodes: Container[bytes]) -> dict[int, list[bytes]]:
    """The workers a completed barrier answers, by barrier number: ``entered`` (ident -> the
    barrier it entered) less those not in ``nodes``.  One number, but for a job rebuilt by a
    take-over (workers that completed different barriers)."""
    numbers = set(entered.values())
    if len(numbers) == 1:
        return {numbers.pop(): [i for i in entered if i in nodes]}
    to: dict[int, list[bytes]] = {}
    for ident, n in entered.items():
        if ident in nodes:
            to.setdefault(n, []).append(ident)
    return to


__all__ = ["Roster", "barrier_groups"]
