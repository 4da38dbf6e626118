"""The workers' bounds of a job: ``-n W --min-workers M --max-workers N`` (pure: no I/O).

``1 <= M <= W <= N`` (defaults ``M = N = W``: a job of fixed size, not elastic); the hosts' slots
bound ``N`` (a hosts file's ``slots=``, a Slurm allocation's tasks per node, ``-n`` on this
machine), unless a host discovery script may add hosts later.  A launch option checked when the
job is planned (:func:`mxdist.planning.plan.make_plan`), so it lives in planning; the rules that
change a running job's membership within these bounds are :mod:`mxdist.elastic.rules`, which
raise the same :class:`ElasticError`.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .hosts import Host


class ElasticError(ValueError):
    """A membership bound or a scale request that cannot be honoured; the message names the bound."""


@dataclass(frozen=True)
class Bounds:
    """How many workers a job runs: ``initial`` (``-n``), at least ``minimum``, at most ``maximum``."""

    minimum: int
    initial: int
    maximum: int

    @property
    def elastic(self) -> bool:
        """The membership may change while the job runs."""
        return self.minimum != self.initial or self.maximum != self.initial

    def check(self, target: int) -> None:
        """Raise :class:`ElasticError` when ``target`` workers is outside ``[minimum, maximum]``."""
        if target > self.maximum:
            fix = "" if self.elastic else " (a job launched without --max-workers keeps its size)"
            raise ElasticError(f"{target} workers is above the job's --max-workers {self.maximum}{fix}")
        if target < self.minimum:
            raise ElasticError(f"{target} worker{'s' if target != 1 else ''} is below the job's "
                               f"--min-workers {self.minimum}")


def bounds(initial: int, minimum: int | None, maximum: int | None, hosts: Sequence[Host] = (),
           slots_bound: bool = False, slots_from: str = "the hosts") -> Bounds:
    """Validate ``--min-workers``/``--max-workers`` (None: ``initial``) against ``-n``; with
    ``slots_bound``, ``maximum`` must fit the ``hosts``' slots (``slots_from`` names where they
    come from; hosts from a file are named ``file:line``)."""
    low = initial if minimum is None else minimum
    high = initial if maximum is None else maximum
    if low < 1:
        raise ElasticError(f"--min-workers {low}: a job needs at least one worker")
    if low > initial:
        raise ElasticError(f"--min-workers {low} is more than the {initial} worker{'s' if initial != 1 else ''} "
                           f"it starts with (-n {initial})")
    if high < initial:
        raise ElasticError(f"--max-workers {high} is less than the {initial} workers it starts with (-n {initial})")
    result = Bounds(low, initial, high)
    if slots_bound and result.elastic and hosts:
        total = sum(h.slots for h in hosts)
        if high > total:
            listed = "; ".join(f"{h.origin + ' ' if ':' in h.origin else ''}{h.label} slots={h.slots}"
                               for h in hosts[:8]) + ("; ..." if len(hosts) > 8 else "")
            raise ElasticError(f"--max-workers {high}: {slots_from} have {total} slot{'s' if total != 1 else ''} "
                               f"in total ({listed}); give the hosts more slots (slots=N) or lower --max-workers")
    return result
