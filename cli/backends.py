"""Backends: how processes are started, watched, signalled and checked on a host.

:class:`Backend` is the contract :mod:`cli.launch` and :mod:`cli.control` depend on; a backend
implements it for one way of reaching machines:

* :class:`LocalBackend` (here): this machine, in-process calls to :mod:`cli.agent`;
* :class:`cli.ssh.SshBackend`: remote hosts over SSH (paramiko), the same agent run remotely;
* :class:`cli.slurm.SlurmBackend` (``--launcher slurm``): job steps of a Slurm allocation
  (``srun`` runs here under the agent's reaper; the process itself runs under slurmstepd).

Process identity: every process leads its own process group (pid == pgid); a backend signals
groups, never single pids, so a worker's children go with it.  Exit status: ``int`` exit code,
``-N`` for "killed by signal N", ``None`` when the process vanished without a status.

Backends are constructed from plain JSON-able options (:meth:`Backend.options`) so that
``mxdist status``/``stop`` can rebuild the backend of a job from its record.
"""
from __future__ import annotations

import signal as _signal
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from cli import agent
from cli.hosts import Host
from cli.jobs import ProcRecord
from cli.plan import ProcSpec


@dataclass(frozen=True)
class ExitStatus:
    """How a process ended: ``code`` as in the module docstring."""

    code: int | None

    @property
    def ok(self) -> bool:
        return self.code == 0

    def describe(self) -> str:
        if self.code is None:
            return "ended without an exit status (killed together with its reaper?)"
        if self.code < 0:
            try:
                return f"killed by {_signal.Signals(-self.code).name}"
            except ValueError:
                return f"killed by signal {-self.code}"
        return f"exit code {self.code}"


@dataclass(frozen=True)
class Started:
    """A process a backend started: its pid (== pgid), log and rc file where it runs."""

    name: str
    pid: int
    run_log: str
    rc_file: str


@dataclass(frozen=True)
class HostProblem:
    """A preflight failure: which host, what went wrong, and what to do about it."""

    host: str
    reason: str
    fix: str


@dataclass(frozen=True)
class ProcStatus:
    alive: bool
    members: tuple[int, ...]
    code: int | None


class BackendError(RuntimeError):
    """A host could not be reached or refused an operation; the message says which and why."""


class Backend(Protocol):
    """What a launcher needs from a way of running processes on hosts.

    Host-level methods take all processes of one host at once so that remote backends can
    batch them in a single round trip; the launcher calls them per host, in parallel.
    """

    name: str

    def options(self) -> dict[str, Any]:
        """JSON-able options that :func:`make_backend` accepts to rebuild this backend."""

    def preflight(self, hosts: Sequence[Host], modules: Sequence[str],
                  env: Mapping[str, str]) -> list[HostProblem]:
        """Check every host (in parallel): reachable, authenticated, Python imports ``modules``
        (in the working directory, with ``env`` added to the host's environment)."""

    def start(self, host: Host, procs: Sequence[ProcSpec], run_dir: str) -> list[Started]:
        """Start ``procs`` on ``host`` detached, each in its own group, logging under ``run_dir``."""

    def follow(self, host: Host, proc: ProcRecord, emit: Callable[[bytes], None],
               wait: bool = True, offset: int = 0) -> ExitStatus | None:
        """Stream the process's log to ``emit``; with ``wait`` until it ends, returning its status."""

    def status(self, host: Host, procs: Sequence[ProcRecord]) -> list[ProcStatus]:
        """Liveness and recorded exit code of each process (zombies count as dead)."""

    def signal(self, host: Host, procs: Sequence[ProcRecord], signum: int) -> None:
        """Send ``signum`` to each process's group."""

    def stop(self, host: Host, procs: Sequence[ProcRecord], grace: float) -> list[int]:
        """TERM each group, KILL after ``grace`` s; return the pids still alive afterwards."""

    def close(self) -> None:
        """Release connections."""


class LocalBackend:
    """This machine: the agent's functions called in-process."""

    name = "local"

    def __init__(self, workdir: str, python: str, **_: Any) -> None:
        self.workdir = workdir
        self.python = python

    def options(self) -> dict[str, Any]:
        return {"workdir": self.workdir, "python": self.python}

    def preflight(self, hosts: Sequence[Host], modules: Sequence[str],
                  env: Mapping[str, str]) -> list[HostProblem]:
        # the launcher itself imports psnode; only the working directory can be wrong here
        result = agent.check(self.workdir, [])
        return [
            HostProblem("localhost", err, "create it or pass --workdir")
            for err in result["errors"]
        ]

    # hooks a backend that runs processes through a local launcher command (slurm) overrides
    def _argv(self, host: Host, proc: ProcSpec) -> list[str]:
        return list(proc.argv)

    def _reaper_python(self) -> str:
        return self.python

    def _exit_code(self, rc: int | None, proc: ProcRecord) -> int | None:
        return rc

    def start(self, host: Host, procs: Sequence[ProcSpec], run_dir: str) -> list[Started]:
        items = [{"name": p.name, "argv": self._argv(host, p), "env": dict(p.env)} for p in procs]
        started = agent.spawn(self.workdir, run_dir, self._reaper_python(), items)
        return [Started(s["name"], s["pid"], s["log"], s["rc"]) for s in started]

    def follow(self, host: Host, proc: ProcRecord, emit: Callable[[bytes], None],
               wait: bool = True, offset: int = 0) -> ExitStatus | None:
        assert proc.pid is not None
        result = agent.follow(proc.run_log, proc.rc_file, proc.pid, offset, wait, emit)
        if not wait and result["rc"] is None:
            return None
        return ExitStatus(self._exit_code(result["rc"], proc))

    def status(self, host: Host, procs: Sequence[ProcRecord]) -> list[ProcStatus]:
        items = agent.status([{"pid": p.pid, "rc": p.rc_file} for p in procs])
        return [ProcStatus(i["alive"], tuple(i["members"]), i["rc"]) for i in items]

    def signal(self, host: Host, procs: Sequence[ProcRecord], signum: int) -> None:
        agent.signal_groups([p.pid for p in procs if p.pid], signum)

    def stop(self, host: Host, procs: Sequence[ProcRecord], grace: float) -> list[int]:
        result = agent.stop([p.pid for p in procs if p.pid], grace)
        return sorted(pid for pids in result["left"].values() for pid in pids)

    def close(self) -> None:
        pass


def make_backend(name: str, options: dict[str, Any]) -> Backend:
    """Build a backend by name (``local``, ``ssh``, ``slurm``) from :meth:`Backend.options`-style options."""
    if name == "local":
        return LocalBackend(**options)
    if name == "ssh":
        from cli.ssh import SshBackend  # paramiko is imported only when SSH is used

        return SshBackend(**options)
    if name == "slurm":
        from cli.slurm import SlurmBackend

        return SlurmBackend(**options)
    raise BackendError(f"unknown launcher {name!r} (choose local, ssh or slurm)")


def run_per_host(hosts: Sequence[Host], fn: Callable[[Host], Any]) -> dict[str, Any]:
    """Run ``fn(host)`` for every host in parallel threads; map label -> result or exception."""
    results: dict[str, Any] = {}

    def one(host: Host) -> None:
        try:
            results[host.label] = fn(host)
        except Exception as exc:  # noqa: BLE001 - reported per host by the caller
            results[host.label] = exc

    threads = [threading.Thread(target=one, args=(h,), daemon=True) for h in hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results
