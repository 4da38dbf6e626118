"""Backends: how processes are started, watched, signalled, checked and cleaned up on a host.

:class:`Backend` is the contract the supervisor (:mod:`mxdist.supervisor.supervisor`) and :mod:`mxdist.control.commands`
depend on; a backend implements it for one way of reaching machines:

* :class:`mxdist.backends.local.LocalBackend`: this machine, through a
  :class:`mxdist.backends.local.LocalRunner`;
* :class:`mxdist.backends.ssh.SshBackend`: remote hosts over SSH (paramiko), the same agent run remotely;
* :class:`mxdist.backends.slurm.SlurmBackend` (``--launcher slurm``): job steps of a Slurm allocation
  (``srun`` runs here under a ``LocalRunner``; the process itself runs under slurmstepd).

:mod:`mxdist.backends.registry` builds a backend by name (breaking the import cycle between this module
and the backends that use it): from a job record's options, or for a new job from a
:class:`LaunchRequest` (each backend class's ``for_launch``: the backend and the job's hosts).

**Capabilities.**  What a backend is and what only some backends can do is declared, not
probed, and never read from its name: each backend lists its :class:`Capability` values in
``capabilities``.  Some say where the processes run (this machine, a shared file system,
hosts given with ``-H``); for the others an accessor per capability (:func:`key_installer`,
:func:`syncer`, :func:`explainer`, :func:`describer`) returns the backend
typed as that capability's small protocol, or None.

Process identity: every process leads its own process group (pid == pgid); a backend signals
groups, never single pids, so a worker's children go with it.  Exit status: ``int`` exit code,
``-N`` for "killed by signal N", ``None`` when the process vanished without a status.

What every backend shares also lives here: ``-H`` read on this machine (:func:`read_hosts`) and
which of its hosts name this machine (:func:`names_this_machine`, :func:`all_here`), the host
agent's reports read into planning's values (:func:`host_gpus`), running a step on many hosts
at once (:func:`run_per_host`).

Backends are constructed from plain JSON-able options (:meth:`Backend.options`) so that
``mxdist status``/``stop`` can rebuild the backend of a job from its record.
"""
from __future__ import annotations

import os
import re
import signal as _signal
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar, Protocol, cast

from psnode.launcher import FailureRecord, from_torch, path_in, record_of, torch_path_in

from ..job.records import ProcRecord
from ..planning.gpus import NO_GPUS, Gpu, GpuSource, HostGpus, parse_visible
from ..planning.hosts import LONE_WORD, Host, HostsError, lone_word, looks_like_file, parse_host_list, parse_hosts_file
from ..planning.plan import ProcSpec
from . import agent


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
    """A process a backend started: its pid (== pgid), log and rc file where it runs, and where
    its output begins in that log (``log_offset``: the log's size before it started)."""

    name: str
    pid: int
    run_log: str
    rc_file: str
    log_offset: int = 0
    address: str | None = None   # the host:port it bound, as it announced it (a scheduler)


@dataclass(frozen=True)
class HostProblem:
    """A preflight failure: which host, what went wrong, and what to do about it."""

    host: str
    reason: str
    fix: str


@dataclass(frozen=True)
class Preflight:
    """What preflight found: the problems (none: every host is ready) and, per host label, the
    GPUs a process of the job sees there (:func:`mxdist.backends.agent.gpus`; a host missing here did not
    report them)."""

    problems: list[HostProblem] = field(default_factory=list)
    gpus: dict[str, HostGpus] = field(default_factory=dict)


# -- -H on this machine -------------------------------------------------------------------------------
# ``-H``'s value: a hosts file read, or an inline list (both parsed by mxdist.planning.hosts), and which
# of its hosts name this machine.  A host entry names this machine when it is written ``localhost``,
# ``127.0.0.1``, ``[::1]`` or this machine's own host name, with no user and no SSH port (those ask for a
# login): a job whose every host names this machine runs here without SSH, as horovodrun runs ``localhost``.

#: The names of this machine whatever it is called.
LOOPBACK = frozenset({"localhost", "127.0.0.1", "[::1]"})


def read_hosts(spec: str) -> list[Host]:
    """``-H`` value: an existing file (hosts file format), else an inline list.  A value that
    cannot be a path (too long, a NUL) is a list; a lone name that is no file is a host whose
    origin says so (:data:`mxdist.planning.hosts.LONE_WORD`)."""
    path = Path(spec).expanduser()
    try:
        is_file = path.is_file()
    except (OSError, ValueError):
        is_file = False
    if is_file:
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            why = getattr(exc, "strerror", None) or exc
            raise HostsError(f"-H {spec}: cannot read the hosts file: {why}") from None
        return parse_hosts_file(text, str(spec))
    if looks_like_file(spec) and not re.search(r"[\s;|&$`<>(){}'\"\\]", spec):
        raise HostsError(f"-H {spec}: no such hosts file (in {os.getcwd()})")
    # an inline list; shell characters make it one too, so the host check names the bad value
    hosts = parse_host_list(spec)
    return [replace(hosts[0], origin=LONE_WORD)] if lone_word(spec) else hosts


def own_names() -> frozenset[str]:
    """This machine's names: the loopback ones and its host name (whole and short), lower case."""
    name = socket.gethostname().lower()
    return LOOPBACK | {name, name.split(".")[0]}


def names_this_machine(host: Host, names: frozenset[str]) -> bool:
    """Whether ``host`` is this machine (one of ``names``) asked for without a login: no user, no port."""
    return host.user is None and host.port is None and host.name.lower() in names


def all_here(hosts: Sequence[Host]) -> bool:
    """Whether every host of ``hosts`` names this machine (:func:`names_this_machine`)."""
    names = own_names()
    return bool(hosts) and all(names_this_machine(h, names) for h in hosts)


# -- what the host agent reports ----------------------------------------------------------------------

def host_gpus(report: agent.GpusReport | None) -> HostGpus:
    """A host's GPUs (planning's :class:`~mxdist.planning.gpus.HostGpus`) from the host agent's report
    (:func:`mxdist.backends.agent.gpus`; None: no report, no GPU).  The agent's wire stops here:
    planning reads values, never the report."""
    if report is None or (not report.gpus and report.visible is None and report.error is None):
        return NO_GPUS
    listed = tuple(Gpu(str(g.index), g.name, g.memory_mib) for g in report.gpus)
    if report.visible is not None:
        return HostGpus(parse_visible(report.visible), GpuSource.ENV, listed, report.error)
    if listed:
        return HostGpus(tuple(g.index for g in listed), GpuSource.SMI, listed, report.error)
    return HostGpus(problem=report.error)


def this_machine_gpus(env: Mapping[str, str]) -> HostGpus:
    """The GPUs a process started on this machine with ``env`` (added to this environment) sees:
    the hosts of a backend whose processes run here (:attr:`Capability.THIS_MACHINE`), known
    without a preflight."""
    return host_gpus(agent.answer(agent.GpusRequest(dict(env))))


def log_exception(log: str, since: int) -> str | None:
    """``Type: message`` of the last Python traceback (or argparse error) that the log ``log``
    on this machine shows after its byte ``since`` (its last 16 KiB at most); None without one."""
    try:
        size = os.path.getsize(log) - since
    except OSError:
        return None
    return agent.last_exception(log, min(size, 16384)) if size > 0 else None


@dataclass(frozen=True)
class ProcStatus:
    alive: bool
    members: tuple[int, ...]
    code: int | None


@dataclass(frozen=True)
class RunFiles:
    """Where a process leaves its failure record (``failure``) and its torch elastic error file
    (``error_file``) in its host's run directory (:func:`run_files`)."""

    failure: str
    error_file: str


def run_files(run_dir: str, name: str) -> RunFiles:
    """The run files of the process ``name`` in its host's ``run_dir``."""
    return RunFiles(path_in(run_dir, name), torch_path_in(run_dir, name))


def spawn_item(run_dir: str, name: str, argv: Sequence[str], env: Mapping[str, str]) -> agent.SpawnItem:
    """The host agent's spawn item for the process ``name`` (its files: :func:`run_files`; a
    scheduler's address file is waited for: ``PSNODE_ADDRESS_FILE``)."""
    files = run_files(run_dir, name)
    return agent.SpawnItem(name, list(argv), dict(env), files.failure, files.error_file,
                           announce=env.get("PSNODE_ADDRESS_FILE"))


def collect_item(run_dir: str, proc: ProcRecord) -> agent.CollectItem:
    """The host agent's collect item for ``proc`` (its files: :func:`run_files`)."""
    files = run_files(run_dir, proc.name)
    return agent.CollectItem(proc.name, proc.rc_file, proc.run_log, files.failure, files.error_file)


def started(spawned: list[agent.Spawned]) -> list[Started]:
    return [Started(s.name, s.pid, s.log, s.rc, s.offset, s.address) for s in spawned]


@dataclass(frozen=True)
class Evidence:
    """What a process left behind on its host, for the root cause: its exit status and when
    it was written (``rc_time``), its failure record (:mod:`psnode.protocol.failure`), and the last
    exception line of a Python traceback at the end of its log (``exception``)."""

    code: int | None
    rc_time: float | None
    failure: FailureRecord | None     # (its JSON object, as the host read it, is read as the record)
    exception: str | None

    def __post_init__(self) -> None:
        object.__setattr__(self, "failure", record_of(self.failure))

    @classmethod
    def collected(cls, item: agent.Collected, code: int | None, run_dir: str, name: str) -> Evidence:
        """The evidence of the process ``name`` from the host agent's ``collect`` answer: its
        psnode failure record, else its torch elastic error file read as one (its ``source``
        the file)."""
        failure = record_of(item.failure) or from_torch(item.error_file, torch_path_in(run_dir, name),
                                                        item.error_time)
        return cls(code, item.rc_time, failure, item.exception)


@dataclass(frozen=True)
class BackendStatus:
    """What a backend adds to a job's status view (:class:`Describer`): ``fields`` for
    ``--json``, ``title`` for the table's title, and per process name the ``steps`` running it."""

    fields: Mapping[str, Any] = field(default_factory=dict)
    title: str = ""
    steps: Mapping[str, str] = field(default_factory=dict)


class BackendError(RuntimeError):
    """A host could not be reached or refused an operation; the message says which and why."""


@dataclass(frozen=True)
class LaunchRequest:
    """What ``mxdist launch`` asks of a backend class (``for_launch``): a backend for the job and
    its hosts; options that do not apply to the backend raise PlanError (with the fix)."""

    job_id: str
    workdir: str
    python: str                             # --python: the interpreter on remote hosts
    hosts: str | None = None                # -H as given: a hosts file or an inline list
    num_workers: int | None = None          # -n
    sync: bool = False                      # --sync was given
    environ: Mapping[str, str] = field(default_factory=dict)   # the launcher's (Slurm: the allocation)
    ssh_config: str | None = None           # LOGIN backends: how to reach and trust the hosts
    known_hosts: str | None = None
    accept_new_host_keys: bool = False
    connect_timeout: float = 10.0
    identity_file: str | None = None
    max_workers: int | None = None          # --max-workers: this machine's slots (with -n)
    discovered: tuple[Host, ...] = ()       # --host-discovery-script's first answer (instead of -H)


class Capability(str, Enum):
    THIS_MACHINE = "this_machine"  # the processes run here: their ports, GPUs and state are seen from here
    SHARED_FS = "shared_fs"        # they see this machine's files: the job's directory is their run directory
    HOSTS = "hosts"        # it runs on the hosts given with -H (the others find their own hosts)
    LOGIN = "login"        # it logs in to its hosts (-i: the private key)
    KEYS = "keys"          # KeyInstaller: deliver the job's secret file to a host that does not see ours
    SYNC = "sync"          # Syncer: copy a directory to a host
    FETCH = "fetch"        # Fetcher: read the files a job's processes left in a directory on a host
    EXPLAIN = "explain"    # Explainer: turn a connection error into a reason and a fix
    DESCRIBE = "describe"  # Describer: backend fields for the status view


class Backend(Protocol):
    """What a supervisor needs from a way of running processes on hosts.

    Host-level methods take all processes of one host at once so that remote backends can
    batch them in a single round trip; callers run them per host, in parallel.
    """

    name: str
    capabilities: ClassVar[frozenset[Capability]]
    python: str          # the interpreter that runs the job's Python processes on the hosts

    def options(self) -> dict[str, Any]:
        """JSON-able options that :func:`mxdist.backends.registry.make_backend` accepts to rebuild this backend."""

    def preflight(self, hosts: Sequence[Host], modules: Sequence[str], env: Mapping[str, str],
                  target: tuple[str, str] | None = None) -> Preflight:
        """Check every host (in parallel): reachable, authenticated, Python imports ``modules``
        (in the working directory, with ``env`` added to the host's environment), the job's
        command is there (``target``: :func:`mxdist.planning.plan.command_target`); report the GPUs a
        process with ``env`` sees on each."""

    def reachable(self, host: Host, timeout: float) -> None:
        """Return within about ``timeout`` seconds if the host answers; raise BackendError if not."""

    def disconnect(self, host: Host) -> None:
        """Drop what connects this machine to ``host`` (lost): every wait on it ends at once."""

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

    def collect(self, host: Host, procs: Sequence[ProcRecord], run_dir: str) -> list[Evidence]:
        """What each process left on the host (exit status, failure record, last exception)."""

    def cleanup(self, host: Host, job_id: str, run_dir: str) -> None:
        """Remove the job's secrets, run files and shared-memory segments from the host."""

    def close(self) -> None:
        """Release connections."""


class BackendClass(Protocol):
    """A backend class: what it is before one is made, and the two ways to make one."""

    capabilities: frozenset[Capability]

    def __call__(self, *args: Any, **kwargs: Any) -> Backend:
        """From :meth:`Backend.options` (a job's record)."""

    def for_launch(self, request: LaunchRequest) -> tuple[Backend, list[Host]]:
        """For a new job: the backend and the job's hosts."""


class KeyInstaller(Protocol):
    def install_key(self, host: Host, run_dir: str, key: bytes) -> str:
        """Write the job's secret file (``key``: its content) as ``<run_dir>/job.key``, 0600 in a
        0700 directory, on ``host`` without putting it on a command line; its absolute path."""


class Syncer(Protocol):
    def sync(self, host: Host, local_dir: str, remote_dir: str, progress: Callable[[int], None]) -> Any:
        """Copy ``local_dir`` to ``remote_dir`` on ``host``."""


@dataclass(frozen=True)
class Fetched:
    """Files read from a host: ``files``, name -> text; ``left``, the names not read (too large
    for what was left of the limit, or unreadable)."""

    files: dict[str, str]
    left: list[str]


class Fetcher(Protocol):
    def fetch(self, host: Host, directory: str, suffix: str, limit: int) -> Fetched:
        """The files ``<directory>/*<suffix>`` on ``host``, at most ``limit`` bytes in all."""


class Explainer(Protocol):
    def explain(self, label: str, host: Host, exc: BaseException) -> HostProblem:
        """A connection error as a reason and a fix."""


class Resolver(Protocol):
    def resolve(self, host: Host) -> Host:
        """``host`` with the address its processes bind to (BackendError when its name is bad)."""


class Describer(Protocol):
    def describe(self, procs: Sequence[ProcRecord]) -> BackendStatus:
        """What the backend adds to the job's status view."""


def _has(backend: Backend, capability: Capability) -> bool:
    return capability in backend.capabilities


def key_installer(backend: Backend) -> KeyInstaller | None:
    return cast(KeyInstaller, backend) if _has(backend, Capability.KEYS) else None


def syncer(backend: Backend) -> Syncer | None:
    return cast(Syncer, backend) if _has(backend, Capability.SYNC) else None


def fetcher(backend: Backend) -> Fetcher | None:
    return cast(Fetcher, backend) if _has(backend, Capability.FETCH) else None


def explainer(backend: Backend) -> Explainer | None:
    return cast(Explainer, backend) if _has(backend, Capability.EXPLAIN) else None


def resolver(backend: Backend) -> Resolver | None:
    """How a backend that runs on the hosts it is given (``-H``) finds a host's address."""
    return cast(Resolver, backend) if _has(backend, Capability.HOSTS) and hasattr(backend, "resolve") else None


def describer(backend: Backend) -> Describer | None:
    return cast(Describer, backend) if _has(backend, Capability.DESCRIBE) else None


def command_fix(problem: str, otherwise: str, remote: bool = False) -> str:
    """The fix for a preflight problem of :func:`mxdist.backends.agent.check` about the job's command
    (``remote``: on a host that is not this machine), else ``otherwise``."""
    if problem.startswith("no script"):
        return ("copy it to the same path on that host (--sync DIR copies a directory first), or pass --workdir"
                if remote else "check the path: it is relative to the working directory (--workdir)")
    if problem.startswith("no module"):
        return ("python -m runs a module of the working directory (--workdir) or of PYTHONPATH: check the name"
                + (", or copy it there (--sync DIR copies a directory first)" if remote else ""))
    if problem.startswith("no program") or "not an executable file" in problem:
        return "check the path (relative to the working directory), and chmod +x it"
    if "command not found" in problem:
        return "install it there, or give its full path"
    return otherwise


#: The pip package of each module preflight checks, where the names differ.
PIP_NAMES = {"zmq": "pyzmq", "psnode": "mxdist"}


def import_fix(python: str, missing: list[str], other: str) -> str:
    """The fix for a preflight problem ``python cannot import MODULES``: install them for that
    Python (``other``: the other way out, e.g. ``--python``)."""
    names = [PIP_NAMES.get(m, m) for m in missing]
    fix = f"install {'them' if len(names) > 1 else 'it'} for that Python: {python} -m pip install {' '.join(names)}"
    if "psnode" in missing:
        fix += " (mxdist holds psnode: pip install -e a checkout, or set PYTHONPATH to one)"
    return f"{fix}; or {other}"


class HostTimeout(BackendError):
    """A host did not answer within the time given to it."""


def run_per_host(hosts: Sequence[Host], fn: Callable[[Host], Any], timeout: float | None = None,
                 cancelled: Callable[[], bool] | None = None) -> dict[str, Any]:
    """Run ``fn(host)`` for every host in parallel threads; map label -> result or exception.

    With ``timeout``, a host that has not answered after that many seconds maps to a
    :class:`HostTimeout` (its thread is abandoned); ``cancelled`` is polled while waiting, and
    when it returns True the hosts still running map to HostTimeout at once.
    """
    results: dict[str, Any] = {}
    lock = threading.Lock()

    def one(host: Host) -> None:
        try:
            value = fn(host)
        except Exception as exc:  # noqa: BLE001 - reported per host by the caller
            value = exc
        with lock:
            results.setdefault(host.label, value)

    threads = [threading.Thread(target=one, args=(h,), daemon=True, name=f"host-{h.label}") for h in hosts]
    for t in threads:
        t.start()
    deadline = None if timeout is None else time.monotonic() + timeout
    for t in threads:
        while t.is_alive():
            left = 0.2 if deadline is None else min(0.2, deadline - time.monotonic())
            if left <= 0 or (cancelled is not None and cancelled()):
                break
            t.join(left)
    with lock:
        for h in hosts:
            if h.label not in results:
                why = "cancelled" if deadline is None or time.monotonic() < deadline else \
                    f"no answer within {timeout:g} s"
                results[h.label] = HostTimeout(f"{h.label}: {why}")
        return dict(results)
