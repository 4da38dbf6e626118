"""The local backend (``--launcher local``): the job's processes on this machine.

:class:`LocalRunner` answers the host agent's requests (:mod:`mxdist.backends.agent`) in this
process, for this machine: the local backend's processes, and the Slurm backend's ``srun``
lines (:mod:`mxdist.backends.slurm`).  :class:`LocalBackend` implements the
:class:`~mxdist.backends.base.Backend` contract with it; its processes see this machine's files.
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, cast

from ..job.records import ProcRecord
from ..planning.hosts import Host
from ..planning.plan import PlanError, ProcSpec
from . import agent
from .base import (
    Capability,
    Evidence,
    ExitStatus,
    HostProblem,
    LaunchRequest,
    Preflight,
    ProcStatus,
    Started,
    collect_item,
    command_fix,
    host_gpus,
    import_fix,
    names_this_machine,
    own_names,
    read_hosts,
    spawn_item,
    started,
)


class LocalRunner:
    """Processes on this machine under :mod:`mxdist.backends.agent`'s reaper: the part of a backend that
    starts, follows, checks, stops and cleans up local processes.

    ``argv`` turns a process spec into the command actually run (Slurm: an ``srun`` line);
    ``exit_code`` turns a recorded exit status into the process's (Slurm: srun's 128+N).
    """

    def __init__(self, workdir: str, reaper_python: str,
                 argv: Callable[[Host, ProcSpec], list[str]] | None = None,
                 exit_code: Callable[[int | None, ProcRecord], int | None] | None = None) -> None:
        self.workdir = workdir
        self.reaper_python = reaper_python
        self._argv = argv or (lambda host, spec: list(spec.argv))
        self._exit_code = exit_code or (lambda rc, proc: rc)

    def start(self, host: Host, procs: Sequence[ProcSpec], run_dir: str) -> list[Started]:
        items = [spawn_item(run_dir, p.name, self._argv(host, p), p.env) for p in procs]
        return started(agent.answer(agent.SpawnRequest(self.workdir, run_dir, self.reaper_python, items)))

    def follow(self, proc: ProcRecord, emit: Callable[[bytes], None], wait: bool = True,
               offset: int = 0) -> ExitStatus | None:
        assert proc.pid is not None
        result = agent.answer(agent.FollowRequest(proc.run_log, proc.rc_file, proc.pid, offset, wait), emit)
        if not wait and result.rc is None:
            return None
        return ExitStatus(self._exit_code(result.rc, proc))

    def status(self, procs: Sequence[ProcRecord]) -> list[ProcStatus]:
        items = agent.answer(agent.StatusRequest([agent.ProcRef(cast(int, p.pid), p.rc_file) for p in procs]))
        return [ProcStatus(i.alive, tuple(i.members), self._exit_code(i.rc, p))
                for i, p in zip(items, procs, strict=True)]

    def signal(self, procs: Sequence[ProcRecord], signum: int) -> None:
        agent.answer(agent.SignalRequest([p.pid for p in procs if p.pid], signum))

    def stop(self, procs: Sequence[ProcRecord], grace: float) -> list[int]:
        return agent.answer(agent.StopGroupsRequest([p.pid for p in procs if p.pid], grace)).survivors()

    def collect(self, procs: Sequence[ProcRecord], run_dir: str) -> list[Evidence]:
        items = agent.answer(agent.CollectRequest([collect_item(run_dir, p) for p in procs]))
        return [Evidence.collected(i, self._exit_code(i.rc, p), run_dir, p.name)
                for i, p in zip(items, procs, strict=True)]

    def cleanup(self, job_id: str, run_dir: str) -> None:
        agent.answer(agent.CleanupRequest(run_dir, job_id, remove_dir=False))


class LocalBackend:
    """This machine: a :class:`LocalRunner`, no connections."""

    name = "local"
    capabilities: ClassVar[frozenset[Capability]] = frozenset({Capability.THIS_MACHINE, Capability.SHARED_FS})

    def __init__(self, workdir: str, python: str, **_: Any) -> None:
        self.workdir = workdir
        self.python = python
        self.runner = LocalRunner(workdir, python)

    @classmethod
    def for_launch(cls, request: LaunchRequest) -> tuple[LocalBackend, list[Host]]:
        """This machine, running the launcher's own Python, with ``-n`` slots (default 1;
        ``--max-workers`` when more), or with the slots of ``-H``'s hosts when every one names
        this machine (:func:`mxdist.backends.base.names_this_machine`)."""
        given = read_hosts(request.hosts) if request.hosts else []
        other = [h for h in given if not names_this_machine(h, own_names())]
        if other:
            raise PlanError(f"--launcher local runs on this machine only, and -H names {other[0].label}: drop -H "
                            "or use --launcher ssh")
        if request.sync:
            raise PlanError("--sync copies to remote hosts: it needs -H with other hosts, or --launcher ssh"
                            if given else "--sync copies to remote hosts: it needs -H")
        slots = sum(h.slots for h in given) if given else max(
            request.num_workers if request.num_workers and request.num_workers > 0 else 1, request.max_workers or 0)
        return cls(request.workdir, sys.executable), [Host("localhost", address="127.0.0.1", slots=slots)]

    def options(self) -> dict[str, Any]:
        return {"workdir": self.workdir, "python": self.python}

    def preflight(self, hosts: Sequence[Host], modules: Sequence[str], env: Mapping[str, str],
                  target: tuple[str, str] | None = None) -> Preflight:
        # the launcher's own Python runs the job: a module it has imported needs no check
        result = agent.answer(agent.CheckRequest(self.workdir, [m for m in modules if m not in sys.modules],
                                                 dict(env), list(target) if target else None))

        def fix(err: str) -> str:
            if "cannot import" in err:
                return import_fix(self.python, list(result.missing or ["psnode"]),
                                  "the Python running mxdist runs the job's processes")
            return command_fix(err, "create it or pass --workdir")

        return Preflight([HostProblem("localhost", err, fix(err)) for err in result.errors],
                         {h.label: host_gpus(result.gpus) for h in hosts})

    def reachable(self, host: Host, timeout: float) -> None:
        pass

    def disconnect(self, host: Host) -> None:
        pass  # (nothing connects this machine to it)

    def start(self, host: Host, procs: Sequence[ProcSpec], run_dir: str) -> list[Started]:
        return self.runner.start(host, procs, run_dir)

    def follow(self, host: Host, proc: ProcRecord, emit: Callable[[bytes], None],
               wait: bool = True, offset: int = 0) -> ExitStatus | None:
        return self.runner.follow(proc, emit, wait, offset)

    def status(self, host: Host, procs: Sequence[ProcRecord]) -> list[ProcStatus]:
        return self.runner.status(procs)

    def signal(self, host: Host, procs: Sequence[ProcRecord], signum: int) -> None:
        self.runner.signal(procs, signum)

    def stop(self, host: Host, procs: Sequence[ProcRecord], grace: float) -> list[int]:
        return self.runner.stop(procs, grace)

    def collect(self, host: Host, procs: Sequence[ProcRecord], run_dir: str) -> list[Evidence]:
        return self.runner.collect(procs, run_dir)

    def cleanup(self, host: Host, job_id: str, run_dir: str) -> None:
        self.runner.cleanup(job_id, run_dir)

    def close(self) -> None:
        pass
