"""A restarted scheduler rebuilds the job from what its live nodes report (pure: no I/O, no clock).

The scheduler holds no state that the live nodes cannot give back.  A scheduler started with
``restart_count > 0`` (the launcher restarted it at its address: :mod:`mxdist.job.lifecycle`)
answers any node it does not know with REJOIN; a node that was welcomed by its predecessor
registers again with its rank and what it knows (:class:`psnode.protocol.control.Rejoin`).
:class:`Rebuild` collects those reports for at most the heartbeat timeout, or until every
node it expects reported (:meth:`Rebuild.complete`), and then :meth:`Rebuild.plan` says what
the job is.

Contracts:

* Every server lives until the job ends, so every server rank ``0 .. num_servers - 1`` is
  expected.  The members (workers in the rounds) are the servers' view: the servers hear every
  MEMBERSHIP before the workers do, and within one generation the active set only shrinks (a
  worker finishing leaves it; a join, leave or loss bumps the generation), so the view is the
  intersection of the servers' active sets at the highest generation any server reports.
  Without a server's report, the rejoined workers are the members.
* A rejoined worker is a member when the servers' view lists it, or when it reports a higher
  generation than any server (it joined and the servers had not heard yet); otherwise it has
  finished (its FINISH was handled but not acknowledged: it sends it again).
* A member or server that did not report is *missing*: the scheduler keeps its place as a node
  silent since the restart, so the usual rules apply (restarted by the launcher, lost from an
  elastic job, or the job fails naming it).
* The generation is the highest any node reports; the joiners are the members that report
  joining, and those the servers' view lists as joined.
* Registrations of nodes never welcomed (``fresh``: a replacement, a joiner, or every node when
  the job had not started) are held and handled after the plan, in their order.
* Barriers: a worker that enters barrier ``n`` while a first-generation worker has completed
  its ``n``-th is answered at once (:func:`done_elsewhere`): the previous scheduler completed it
  and died before every answer left.  First-generation workers number their barriers alike.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from psnode.protocol.control import Register, Rejoin


@dataclass(frozen=True)
class RebuildPlan:
    """The job as rebuilt: the workers that are members, those that finished, the expected
    nodes that did not report (``(role, rank)``), the generation and the joiners."""

    members: frozenset[int]
    finished: frozenset[int]
    missing: tuple[tuple[str, int], ...]
    generation: int
    joiners: frozenset[int]


@dataclass
class Rebuild:
    """The reports of the live nodes (see the module docstring)."""

    num_servers: int
    nodes: dict[tuple[str, int], tuple[bytes, Register]] = field(default_factory=dict)
    fresh: dict[bytes, Register] = field(default_factory=dict)

    def rejoin(self, ident: bytes, body: Register) -> str | None:
        """Take a rejoining node's report; why it is refused (its rank reported by another), or None."""
        assert body.rank is not None and body.rejoin is not None
        key = (body.role, body.rank)
        have = self.nodes.get(key)
        if have is not None and have[0] != ident:
            return f"{body.role} {body.rank} already rejoined (pid {have[1].pid})"
        self.nodes[key] = (ident, body)
        return None

    def knows(self, ident: bytes) -> bool:
        return ident in self.fresh or any(i == ident for i, _ in self.nodes.values())

    @property
    def started(self) -> bool:
        """Had the job started (some node was welcomed by the previous scheduler)?"""
        return bool(self.nodes)

    def _reports(self, role: str) -> dict[int, Rejoin]:
        out: dict[int, Rejoin] = {}
        for (r, rank), (_, body) in self.nodes.items():
            if r == role and body.rejoin is not None:
                out[rank] = body.rejoin
        return out

    def _servers_view(self) -> tuple[int, set[int], set[int]] | None:
        """(generation, active, joined) as the servers know it; None without a server's report."""
        servers = self._reports("server")
        if not servers:
            return None
        top = max(r.generation for r in servers.values())
        latest = [r for r in servers.values() if r.generation == top]
        active = set(latest[0].active).intersection(*(r.active for r in latest[1:]))
        joined = set().union(*(r.joined for r in latest))
        return top, active, joined

    def complete(self) -> bool:
        """Has every expected node reported (every server, every member in the servers' view)?
        A replacement that registered for a rank (its predecessor lost with the scheduler)
        accounts for that rank."""
        servers = self._reports("server").keys() | self._replacing("server")
        if any(r not in servers for r in range(self.num_servers)):
            return False
        view = self._servers_view()
        workers = self._reports("worker").keys() | self._replacing("worker")
        return view is None or view[1] <= workers

    def _replacing(self, role: str) -> set[int]:
        """The ranks that fresh registrations of ``role`` ask for (replacements)."""
        return {b.rank for b in self.fresh.values() if b.role == role and b.rank is not None}

    def plan(self) -> RebuildPlan:
        """What the job is, from the reports so far (see the module docstring)."""
        workers = self._reports("worker")
        servers = self._reports("server")
        view = self._servers_view()
        if view is None:
            members, top, joined = set(workers), 0, set[int]()
        else:
            top, active, joined = view
            members = active | {r for r, w in workers.items() if w.generation > top}
        generation = max([top, *(w.generation for w in workers.values()), *(s.generation for s in servers.values())])
        missing = [("server", r) for r in range(self.num_servers) if r not in servers]
        missing += [("worker", r) for r in sorted(members) if r not in workers]
        joiners = {r for r in members if (r in workers and workers[r].joiner) or r in joined}
        return RebuildPlan(frozenset(members), frozenset(set(workers) - members), tuple(missing), generation,
                    frozenset(joiners))


def done_elsewhere(n: int, completed: Iterable[int]) -> bool:
    """Is barrier ``n`` complete, given the barriers the first-generation workers completed?"""
    return any(c >= n for c in completed)


__all__ = ["Rebuild", "RebuildPlan", "done_elsewhere"]
