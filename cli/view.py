"""What ``mxdist status``, ``mxdist jobs`` and ``launch --dry-run`` show: typed views (pure: no I/O).

:mod:`mxdist.control.commands` builds them from records, the scheduler and the hosts; :mod:`mxdist.ui`
renders them; ``--json`` prints :meth:`JobView.to_dict` / :meth:`JobRow.to_dict`, whose keys
and values are the machine-readable interface (scripts and tests read them).  Above :mod:`mxdist.job`
only (the record's states; pyproject.toml's layers contract): it and :mod:`mxdist.backends` never
import each other.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from psnode.launcher import SLOW_SHARE, SLOW_WINDOW, NodeRow, excess

from .job.records import JobState


@dataclass
class MembershipView:
    """An elastic job's workers in ``mxdist status``: its bounds and target, the membership
    generation and members (live from the scheduler; None when it did not answer), and how many
    workers joined, left and were lost (the scheduler's counts when live, else the record's)."""

    min_workers: int
    max_workers: int
    target: int
    generation: int | None = None
    members: list[int] | None = None
    joined: int = 0
    left: int = 0
    lost: int = 0
    leaving: list[int] = field(default_factory=list)

    def line(self) -> str:
        """``workers: generation 3, members 0,1,2 (target 3, min 2, max 4); 1 joined, 0 left, 0 lost``."""
        where = "" if self.generation is None else \
            f"generation {self.generation}, members {','.join(map(str, self.members or [])) or 'none'} "
        text = (f"workers: {where}(target {self.target}, min {self.min_workers}, max {self.max_workers}); "
                f"{self.joined} joined, {self.left} left, {self.lost} lost")
        if self.leaving:
            text += f"; leaving: {','.join(map(str, self.leaving))}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"min_workers": self.min_workers, "max_workers": self.max_workers, "target": self.target,
                "generation": self.generation, "members": self.members, "joined": self.joined,
                "left": self.left, "lost": self.lost, "leaving": self.leaving}


def slow_lines(nodes: list[NodeRow]) -> list[str]:
    """``worker 2  slow: the others waited for it 71% of the last 30 s``, per worker marked slow
    (``NodeRow.slow``: :data:`SLOW_SHARE` of the window beyond the others, most first); then
    ``worker 2  late: ...`` per worker with pushes dropped late (backup workers, most first)."""
    slow = sorted((n for n in nodes if n.role == "worker" and n.slow), key=lambda n: -(n.waited_for or 0.0))
    lines = [f"worker {n.rank}  slow: the others waited for it {(n.waited_for or 0.0):.0%} of the last "
             f"{SLOW_WINDOW:.0f} s" for n in slow]
    late = sorted((n for n in nodes if n.role == "worker" and n.late), key=lambda n: -(n.late or 0))
    return lines + [f"worker {n.rank}  late: {n.late} pushes came after their round completed and were dropped "
                    "(backup workers)" for n in late]


def slowest(nodes: list[NodeRow], uptime: float) -> str | None:
    """The job's closing words about the worker the others waited for most over ``uptime``
    seconds, when that is :data:`SLOW_SHARE` of it beyond the other workers' mean: ``the
    others waited most for worker 2 (64% of the job)``."""
    totals = {n.rank: n.waited_for_total or 0.0 for n in nodes if n.role == "worker" and n.rank is not None}
    if not any(totals.values()) or uptime <= 0:
        return None
    top = max(totals, key=totals.__getitem__)
    share = min(1.0, totals[top] / uptime)
    beyond = excess(totals, top, totals) / uptime
    return f"the others waited most for worker {top} ({share:.0%} of the job)" if beyond >= SLOW_SHARE else None


@dataclass
class JobView:
    """One job in ``mxdist status``: its state and outcome, and a row per recorded process
    (``nodes``: live from the scheduler, checked on the hosts, or as recorded).

    ``source`` says where the rows came from; ``ended_line`` (an ended job only) is its outcome
    in words; ``backend_fields`` are what the backend adds to ``--json`` (Slurm: ``slurm_job``)
    and ``backend_title`` what it adds to the table's title.
    """

    id: str
    state: JobState
    scheduler: str
    backend: str
    security: str | None
    exit_code: int | None
    created: float
    ended: float | None
    duration: float | None
    root_cause: str | None
    consequences: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    source: str = ""
    nodes: list[NodeRow] = field(default_factory=list)
    ended_line: str | None = None
    backend_fields: Mapping[str, Any] = field(default_factory=dict)
    backend_title: str = ""
    engine: str = "psnode"                 # what runs its scheduler and servers (mxdist.planning.engines)
    membership: MembershipView | None = None   # an elastic job's workers (None: a job of fixed size)

    @property
    def active(self) -> bool:
        return self.state.active

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` form."""
        out: dict[str, Any] = {
            "id": self.id, "state": self.state.value, "scheduler": self.scheduler, "backend": self.backend,
            "engine": self.engine,
            "security": self.security, "exit_code": self.exit_code, "created": self.created, "ended": self.ended,
            "duration": self.duration, "root_cause": self.root_cause, "consequences": self.consequences,
            "notes": self.notes, **self.backend_fields, "source": self.source,
            "nodes": [n.to_dict() for n in self.nodes]}
        if self.ended_line is not None:
            out["ended_line"] = self.ended_line
        if self.membership is not None:
            out["membership"] = self.membership.to_dict()
        return out


@dataclass(frozen=True)
class PlanRow:
    """One process in ``mxdist launch --dry-run``: where it runs, what it runs, its own
    environment (secrets masked); a worker's ``gpus`` (what it sees) and ``device`` (the cuda
    device its LOCAL_RANK maps to)."""

    host: str
    role: str
    rank: int | None
    address: str
    command: str
    env: Mapping[str, str]
    gpus: str = ""
    device: str = ""


@dataclass(frozen=True)
class JobRow:
    """One job in ``mxdist jobs`` (and ``status`` when several run); a record that cannot be
    read has only its id, the state ``damaged`` and the ``problem``."""

    id: str
    state: str                        # the job's state, "... (supervisor lost)" or "damaged"
    created: float | None = None
    duration: float | None = None     # so far, while it runs
    backend: str = ""
    hosts: tuple[str, ...] = ()
    processes: int = 0
    command: tuple[str, ...] = ()
    exit_code: int | None = None
    root_cause: str | None = None
    problem: str | None = None        # why a damaged record cannot be read

    @classmethod
    def damaged(cls, job_id: str, problem: str) -> JobRow:
        return cls(job_id, "damaged", problem=problem)

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` form."""
        if self.problem is not None:
            return {"id": self.id, "state": self.state, "problem": self.problem}
        return {"id": self.id, "state": self.state, "created": self.created, "duration": self.duration,
                "backend": self.backend, "hosts": list(self.hosts), "processes": self.processes,
                "command": list(self.command), "exit_code": self.exit_code, "root_cause": self.root_cause}
