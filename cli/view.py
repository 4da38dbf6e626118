"""What ``mxdist status``, ``mxdist jobs`` and ``launch --dry-run`` show: typed views (pure: no I/O).

:mod:`mxdist.control` builds them from records, the scheduler and the hosts; :mod:`mxdist.ui`
renders them; ``--json`` prints :meth:`JobView.to_dict` / :meth:`JobRow.to_dict`, whose keys
and values are the machine-readable interface (scripts and tests read them).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from psnode.protocol.status import NodeRow

from .jobs import JobState


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
    engine: str = "psnode"                 # what runs its scheduler and servers (mxdist.engines)

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
