"""How to run a planned job: the launch's settings that the supervisor and its collaborators
(:mod:`.membership`, :mod:`.conclusion`) read.  A module of its own so that they and
:mod:`.supervisor` import it, not each other."""
from __future__ import annotations

from dataclasses import dataclass, field

from psnode.launcher import Mode


@dataclass
class LaunchSettings:
    """How to run a planned job (everything but the plan and the backend)."""

    run_dir: str                     # where processes write logs and rc files, on their host
    grace: float = 5.0               # TERM -> KILL
    finish_grace: float = 10.0       # at most this long for servers to end after the workers
    detach: bool = False
    quiet: bool = False
    ranks: frozenset[int] | None = None   # stream only these workers
    sync: list[tuple[str, str]] = field(default_factory=list)  # (local dir, remote dir)
    check_modules: tuple[str, ...] = ("psnode",)
    security: Mode = Mode.INSECURE   # authenticated/encrypted: write and deliver a fresh secret
    timeline_dir: str | None = None  # --timeline: where the processes append their events, on their host
    timeline_local: bool = True      # that directory is readable here (a shared file system)
