"""Elastic membership as the scheduler keeps it: generation, joiners, leavers, losses (pure).

Contracts:

* The first generation is the ``num_workers`` workers the job started with (generation 0).
  Every later change of the membership -- a worker joins, leaves gracefully, or is lost --
  bumps :attr:`ElasticRoster.generation` by one (:meth:`ElasticRoster.changed`); a worker that finishes
  (its script ended) leaves the rounds without a new generation.
* :meth:`ElasticRoster.admit` decides a joiner's rank: the launcher's (``wish``) when it is below
  ``max_workers`` and no member holds it, else the lowest rank no member holds; it refuses,
  naming why, when ``max_workers`` members are active or the wished rank is in use.
* :attr:`ElasticRoster.joiners` are the active ranks that joined the running job: servers let them
  take part in a key's rounds only from the start round their JOIN agreed with that key.
* :attr:`ElasticRoster.leaving` are the members asked to leave (LEAVE); each leaves at its next push
  by finishing; :meth:`ElasticRoster.gone` records how a member left and forgets it.
"""
from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field


@dataclass
class ElasticRoster:
    """The scheduler's elastic bookkeeping (see the module docstring)."""

    max_workers: int
    generation: int = 0
    joiners: set[int] = field(default_factory=set)
    leaving: set[int] = field(default_factory=set)
    joined: int = 0
    left: int = 0
    lost: int = 0

    def admit(self, wish: int | None, members: Collection[int]) -> int | str:
        """The rank for a joiner (``wish``: the launcher's), or why it cannot join."""
        if len(members) >= self.max_workers:
            return f"the job already has {len(members)} workers (max_workers {self.max_workers})"
        if wish is not None:
            if wish >= self.max_workers:
                return f"rank {wish} is not below max_workers {self.max_workers}"
            if wish in members:
                return f"rank {wish} is in use by a member of the job"
            return wish
        return next(r for r in range(self.max_workers) if r not in members)

    def join(self, rank: int) -> None:
        """``rank`` joined the running job."""
        self.joiners.add(rank)
        self.leaving.discard(rank)
        self.joined += 1
        self.changed()

    def ask_leave(self, ranks: Iterable[int], members: Collection[int]) -> bool:
        """Members among ``ranks`` are asked to leave; True if that changed anything."""
        new = {r for r in ranks if r in members} - self.leaving
        self.leaving |= new
        return bool(new)

    def gone(self, rank: int, how: str) -> None:
        """Member ``rank`` left the rounds: ``left`` (graceful), ``lost``, or ``finished``."""
        was_leaving = rank in self.leaving
        self.leaving.discard(rank)
        self.joiners.discard(rank)
        if how == "lost":
            self.lost += 1
            self.changed()
        elif how == "left" or was_leaving:
            self.left += 1
            self.changed()

    def changed(self) -> None:
        self.generation += 1


__all__ = ["ElasticRoster"]
