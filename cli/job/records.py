"""The job record: what ``status``, ``stop``, ``logs``, ``jobs`` and ``clean`` need to find a job.

Layout under ``MXDIST_HOME`` (default ``~/.mxdist``), private to its owner (directories 0700,
files 0600, here and in the run directories on remote hosts)::

    jobs/<id>.json              the record (written atomically: tmp file + os.replace)
    jobs/<id>/<name>.log        one log per process (name: scheduler, server-0, worker-3, ...)
    jobs/<id>/job.key           the job's secret (psnode.launcher; every job unless --insecure)
    jobs/<id>/supervisor.lock   held (flock) by the job's supervisor for as long as it lives
    jobs/<id>/stop.request      written by ``mxdist stop`` for the supervisor to act on (StopRequest)
    jobs/<id>/scale-<n>.request written by ``mxdist scale`` (ScaleRequest); the supervisor answers in
                                scale-<n>.answer
    jobs/<id>/supervisor.log    the output of a detached supervisor (``launch -d``)

**One writer.**  A job's record is written by its supervisor only (the attached ``mxdist
launch``, or the same supervisor detached with ``-d``).  Everyone else asks it (a stop
request) and writes the record only when the supervisor is provably gone: its lock can be
taken (the kernel drops a flock when its holder dies, ``kill -9`` included) -- and, for
records of older versions that have no lock, when the recorded pid is dead or belongs to a
process started after the record (pid + start time, never a bare pid).  Whoever takes over
holds the lock while it writes (:func:`takeover`), so two commands never finalise one job.

**Transitions** are methods of the record, the only code that sets its state fields:
:meth:`JobRecord.supervise` (the supervisor takes the job), :meth:`JobRecord.mark_running`
(every process started), :meth:`JobRecord.lose_supervisor` and
:meth:`JobRecord.run_unsupervised` (the supervisor is gone, processes still run),
:meth:`JobRecord.finish` (the final state), :meth:`JobRecord.rechecked` (hosts not verified at
the end, checked again); of an elastic job (:mod:`mxdist.elastic.rules`) :meth:`JobRecord.scale_to`,
:meth:`JobRecord.join`, :meth:`JobRecord.leaving`, :meth:`JobRecord.left`, :meth:`JobRecord.lost`
and :meth:`JobRecord.discovered` (each change kept in ``changes``); per process
:meth:`ProcRecord.started`, :meth:`ProcRecord.restarted`, :meth:`ProcRecord.exited`,
:meth:`ProcRecord.stopped`, :meth:`ProcRecord.placed`, :meth:`ProcRecord.seen`.  Saving is
separate (:func:`save`), done by whoever holds the job (above).

**Final states** are written once (:meth:`JobRecord.finish`, from a :class:`JobOutcome`):
``succeeded``, ``failed`` (with the root cause), ``stopped``; with the exit code, the end time
(duration = ended - created), and, when the supervisor died first, ``supervisor_lost``.  Hosts
whose processes or clean-up could not be checked at the end are listed in ``unverified`` (host
-> reason); ``status`` and ``stop`` check them again.  The job's secrets are gone by then
(``remote_keys`` empty; :func:`discard_key` removes the launcher's copy).

**Tolerant reading.**  Records of older versions, partial records (fields missing) and
unknown fields load with defaults; a record that is not JSON or not an object raises
:class:`DamagedRecord` naming the file and the problem, never a traceback.

Environment values and secrets are never stored: the record names the local secret file
(``key_file``, a path), which ``status`` and ``stop`` pass to :func:`psnode.launcher.status`.

This module imports nothing but the standard library (and :mod:`psnode.files`, which does
the same) at run time, so any Python can read and
check records (tests/cluster/test_launch_privacy.py does, as another user).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import shutil
import socket
import stat
import time
from collections.abc import Collection, Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import Any, Protocol

from psnode.files import write_atomic

RECORD_VERSION = 2
UNVERIFIED = "not verified (its host could not be reached)"   # a root cause's consequence (mxdist.job.rootcause)
RECHECKED = "stopped when its host was checked again"          # the same, once its host answered
LOST_NOTE = "the supervisor was lost (killed?): the processes ran on unsupervised"
_home: Path | None = None


class JobState(str, Enum):
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"

    @property
    def active(self) -> bool:
        return self in (JobState.STARTING, JobState.RUNNING)


class ProcState(str, Enum):
    PENDING = "pending"      # not started (yet)
    RUNNING = "running"
    EXITED = "exited"        # exit code 0
    FAILED = "failed"        # non-zero exit code or signal, on its own
    STOPPED = "stopped"      # ended by the supervisor or `mxdist stop`
    LOST = "lost"            # gone without a recorded exit status
    UNKNOWN = "unknown"      # its host could not be reached: not verified


@dataclass
class ProcRecord:
    """One process of a job as recorded on disk."""

    name: str
    role: str
    rank: int | None
    host: str                 # host label (key into JobRecord.hosts)
    address: str = ""
    log: str = ""             # local log file (a copy, for remote processes)
    pid: int | None = None    # also the process group id
    run_log: str = ""         # log file on the host where it runs
    rc_file: str = ""
    state: ProcState = ProcState.PENDING
    exit_code: int | None = None
    restarts: int = 0         # times the supervisor restarted it (--max-restarts)
    ended: float | None = None

    @property
    def pgid(self) -> int | None:
        return self.pid

    # -- transitions ------------------------------------------------------------------------------

    def started(self, pid: int, run_log: str, rc_file: str) -> None:
        """It runs: as ``pid`` (its group), logging to ``run_log``, its exit status to ``rc_file``."""
        self.pid, self.run_log, self.rc_file = pid, run_log, rc_file
        self.state, self.exit_code, self.ended = ProcState.RUNNING, None, None

    def restarted(self, pid: int, run_log: str, rc_file: str) -> None:
        """It runs again (one more restart), as :meth:`started`."""
        self.restarts += 1
        self.started(pid, run_log, rc_file)

    def exited(self, code: int | None, when: float) -> None:
        """It ended by itself with ``code`` (None: no exit status): exited, failed or lost."""
        self.exit_code, self.ended = code, when
        self.state = ProcState.EXITED if code == 0 else ProcState.LOST if code is None else ProcState.FAILED

    def stopped(self, verified: bool) -> None:
        """The supervisor or ``mxdist stop`` stopped it: ``stopped`` if it ran or had not started
        (an ended process keeps its state); ``unknown`` when its host could not be checked."""
        if not verified:
            self.state = ProcState.UNKNOWN
        elif self.state in (ProcState.RUNNING, ProcState.PENDING):
            self.state = ProcState.STOPPED

    def placed(self, host: str, address: str) -> None:
        """It is to run (again, as a new worker of an elastic job) on ``host``: pending, no restarts yet."""
        self.host, self.address, self.restarts = host, address, 0
        self.state, self.pid, self.exit_code, self.ended = ProcState.PENDING, None, None, None

    def seen(self, state: ProcState, code: int | None = None, when: float | None = None) -> None:
        """A check on its host found it in ``state``; with the exit status it left, if any."""
        if code is not None:
            self.exit_code, self.ended = code, when
        self.state = state


@dataclass
class Owner:
    """The job's supervisor process, which owns the job: pid, its start time (clock ticks since
    boot, /proc/PID/stat field 22) and host; ``detached`` for ``launch -d``."""

    pid: int
    start_ticks: int | None
    host: str
    detached: bool = False

    @classmethod
    def this_process(cls, detached: bool = False) -> Owner:
        pid = os.getpid()
        return cls(pid, proc_start_ticks(pid), socket.gethostname(), detached)

    @property
    def alive(self) -> bool:
        """Its process still runs on this machine: the same pid with the same start time."""
        return self.start_ticks is not None and proc_start_ticks(self.pid) == self.start_ticks


def proc_start_ticks(pid: int) -> int | None:
    """A live process's start time in clock ticks since boot (/proc/PID/stat field 22); None if
    it is gone (a zombie counts as gone)."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
        parts = data[data.rindex(")") + 2:].split()
        return None if parts[0] == "Z" else int(parts[19])
    except (OSError, ValueError, IndexError):
        return None


class Change(str, Enum):
    """A change of an elastic job's workers (:mod:`mxdist.elastic.rules`)."""

    JOINED = "joined"        # started by ``mxdist scale`` while the job ran
    LEFT = "left"            # left at a round boundary (``mxdist scale`` down), exit code 0
    LOST = "lost"            # failed with no restart left; the job went on without it
    MOVED = "moved"          # restarted with its rank on ``host``: its own host did not answer (a
    #                          worker, or a server whose state has replicas: ``MemberChange.role``)


@dataclass
class MemberChange:
    """One change of the job's members: which, where, when, and why (a lost worker's exit);
    ``role``: a worker's, or a moved server's."""

    change: Change
    rank: int
    host: str
    when: float
    why: str = ""
    role: str = "worker"

    @property
    def who(self) -> str:
        """``worker 3``, ``server 1``."""
        return f"{self.role} {self.rank}"


@dataclass
class Elastic:
    """An elastic job's bounds (``--min-workers``, ``--max-workers``), the worker count asked
    for last (``target``), the ranks asked to leave that have not left yet, and its host
    discovery script (None: the hosts given at launch)."""

    min_workers: int
    max_workers: int
    target: int
    leaving: list[int] = field(default_factory=list)
    discovery: str | None = None


class Verdict(Protocol):
    """What a record keeps of a verdict on a failed job's processes
    (:class:`mxdist.job.rootcause.RootCause`): its recorded form and the failures it caused."""

    @property
    def consequences(self) -> tuple[str, ...]: ...

    def recorded(self) -> Cause: ...


@dataclass(frozen=True)
class JobOutcome:
    """How a job ended, for :meth:`JobRecord.finish`: its final state and exit code, the hosts
    not verified at its end (label -> why), who stopped it, and its root cause: a verdict on
    its processes (``cause``), or a ``headline`` alone when it failed before any process could
    (preflight, start, the supervisor itself).  ``ended``: when (None: now)."""

    state: JobState
    exit_code: int
    unverified: Mapping[str, str] = field(default_factory=dict)
    stopped_by: str | None = None
    cause: Verdict | None = None
    headline: str | None = None
    ended: float | None = None
    supervisor_lost: bool = False      # the supervisor was gone before the end

    def __post_init__(self) -> None:
        if self.state.active:
            raise ValueError(f"a job ends succeeded, failed or stopped, not {self.state.value}")


@dataclass(frozen=True)
class Cause:
    """A failed job's root cause as recorded: a verdict on its processes
    (:meth:`mxdist.job.rootcause.RootCause.recorded`: the process ``name``, its ``reason``, when it
    failed, and the torch elastic error file it was read from, if one), or a ``headline`` alone
    (``reason`` None) when the job failed before any process could.  On disk (:meth:`to_json`):
    ``{"headline", "name"}``, and for a verdict ``"reason"``, ``"time"`` (``"source"`` when set)."""

    headline: str
    name: str | None = None
    reason: str | None = None
    time: float | None = None
    source: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"headline": self.headline, "name": self.name}
        if self.reason is not None:
            out.update(reason=self.reason, time=self.time)
        return {**out, "source": self.source} if self.source else out

    @classmethod
    def from_json(cls, data: Any) -> Cause | None:
        """The cause in a record's ``root_cause`` (None: none, or no headline in it)."""
        if not isinstance(data, dict) or not isinstance(data.get("headline"), str):
            return None
        name, reason, when, source = data.get("name"), data.get("reason"), data.get("time"), data.get("source")
        return cls(data["headline"], name if isinstance(name, str) else None,
                   reason if isinstance(reason, str) else None,
                   float(when) if isinstance(when, (int, float)) else None,
                   source if isinstance(source, str) else None)


@dataclass
class JobRecord:
    """A launched job (see the module docstring)."""

    id: str
    command: list[str]
    backend: str
    scheduler: str = ""
    workdir: str = ""
    hosts: list[dict[str, Any]] = field(default_factory=list)
    options: dict[str, Any] = field(default_factory=dict)
    procs: list[ProcRecord] = field(default_factory=list)
    state: JobState = JobState.STARTING
    created: float = field(default_factory=time.time)
    ended: float | None = None
    exit_code: int | None = None
    version: int = RECORD_VERSION
    supervisor: Owner | None = None
    launcher_pid: int | None = None      # version 1 records only
    run_dir: str = ""                    # on every host (may start with ~ on remote ones)
    security: str = ""                   # the job's mode: authenticated, encrypted, insecure ("": older)
    engine: str = "psnode"               # what ran its scheduler and servers (mxdist.planning.engines)
    key_file: str | None = None          # the launcher's copy of the job's secret (path only)
    remote_keys: dict[str, str] = field(default_factory=dict)  # host label -> key file path there
    root_cause: Cause | None = None
    consequences: list[str] = field(default_factory=list)
    stopped_by: str | None = None
    supervisor_lost: bool = False
    unverified: dict[str, str] = field(default_factory=dict)   # host label -> why not checked
    notes: list[str] = field(default_factory=list)
    elastic: Elastic | None = None       # None: a job of fixed size
    changes: list[MemberChange] = field(default_factory=list)   # its workers' joins, leaves, losses
    failover: str | None = None          # the host whose standby scheduler took the job over (the last)
    failovers: list[str] = field(default_factory=list)   # the hosts whose standbys took it over, in order
    timeline: str | None = None          # --timeline: where the job's merged trace is written
    replicas: int = 1                    # --replicas: copies of each server's state (psnode.server.replicas)

    def proc(self, name: str) -> ProcRecord:
        for p in self.procs:
            if p.name == name:
                return p
        raise KeyError(name)

    @property
    def duration(self) -> float | None:
        return None if self.ended is None else max(0.0, self.ended - self.created)

    # -- transitions (the module docstring) --------------------------------------------------------

    def supervise(self, supervisor: Owner, run_dir: str) -> None:
        """``supervisor`` owns the job from now on; its processes keep run files in ``run_dir``."""
        self.supervisor, self.run_dir = supervisor, run_dir

    def keep_key(self, path: str) -> None:
        """The launcher's copy of the job's secret is at ``path``."""
        self.key_file = path

    def keys_on_hosts(self, paths: Mapping[str, str]) -> None:
        """The job's secret was delivered to these hosts (label -> its path there)."""
        self.remote_keys = dict(paths)

    def mark_running(self) -> None:
        """Every process of the job started."""
        self._still_active("start")
        self.state = JobState.RUNNING

    def note(self, text: str) -> None:
        """A note for ``mxdist status`` (once)."""
        if text not in self.notes:
            self.notes.append(text)

    def lose_supervisor(self) -> None:
        """The supervisor is gone (provably: :mod:`mxdist.control.takeover`) before the job ended."""
        self.note(LOST_NOTE)
        self.supervisor_lost = True

    def run_unsupervised(self, unverified: Mapping[str, str]) -> None:
        """Without its supervisor, processes still run or their hosts (``unverified``: label ->
        why) could not be checked: the job stays ``running``."""
        self._still_active("run unsupervised")
        self.unverified = dict(unverified)
        self.state = JobState.RUNNING

    def finish(self, end: JobOutcome) -> None:
        """The final state, written once; the job's secrets on its hosts are gone."""
        self._still_active("finish")
        self.state, self.exit_code, self.stopped_by = end.state, end.exit_code, end.stopped_by
        self.ended = time.time() if end.ended is None else end.ended
        self.unverified = dict(end.unverified)
        self.remote_keys = {}
        self.supervisor_lost = self.supervisor_lost or end.supervisor_lost
        if end.cause is not None:
            self.root_cause, self.consequences = end.cause.recorded(), list(end.cause.consequences)
        elif end.headline is not None:
            self.root_cause = Cause(end.headline)

    # -- elastic membership (mxdist.elastic.rules) --------------------------------------------------------

    def scale_to(self, target: int) -> None:
        """``mxdist scale``: the job is to run ``target`` workers."""
        self._still_active("scale")
        if self.elastic is None:
            raise ValueError(f"job {self.id} has a fixed size")
        self.elastic.target = target

    def join(self, name: str, rank: int, host: str, address: str, log: str, when: float) -> ProcRecord:
        """A worker joins the running job as ``name`` (a rank that left or was lost is taken
        again under its name: its log continues); it is pending until :meth:`ProcRecord.started`."""
        self._still_active("add a worker to")
        try:
            proc = self.proc(name)
        except KeyError:
            proc = ProcRecord(name=name, role="worker", rank=rank, host=host, address=address, log=log)
            self.procs.append(proc)
        proc.placed(host, address)
        self.changes.append(MemberChange(Change.JOINED, rank, host, when))
        return proc

    def leaving(self, ranks: Collection[int]) -> None:
        """These workers were asked to leave at their next round boundary."""
        if self.elastic is not None:
            self.elastic.leaving = sorted({*self.elastic.leaving, *ranks})

    def left(self, proc: ProcRecord, when: float) -> None:
        """``proc``, asked to leave, ended with exit code 0."""
        if self.elastic is not None and proc.rank in self.elastic.leaving:
            self.elastic.leaving.remove(proc.rank)
        self.changes.append(MemberChange(Change.LEFT, proc.rank or 0, proc.host, when))

    def lost(self, proc: ProcRecord, why: str, when: float) -> None:
        """``proc`` failed with no restart left; the job goes on without it."""
        if self.elastic is not None and proc.rank in self.elastic.leaving:
            self.elastic.leaving.remove(proc.rank)
        self.changes.append(MemberChange(Change.LOST, proc.rank or 0, proc.host, when, why))

    def failed_over(self, standby: ProcRecord, address: str, why: str, when: float) -> None:
        """The scheduler was lost (``why``); the standby ``standby`` at ``address`` takes the job
        over: the launcher's questions (status, leave, lost) go there from now on."""
        self.scheduler, self.failover = address, standby.host
        self.failovers.append(standby.host)
        at = time.strftime("%H:%M:%S", time.localtime(when))
        self.note(f"the scheduler {why}; the standby scheduler on {standby.host} ({address}) took the job over "
                  f"at {at}")

    def add_standby(self, name: str, rank: int, host: str, address: str, log: str) -> ProcRecord:
        """A new standby scheduler ``name`` on ``host`` (started after a failover); pending until
        :meth:`ProcRecord.started`."""
        self._still_active("add a standby scheduler to")
        proc = ProcRecord(name=name, role="scheduler", rank=rank, host=host, address=address, log=log)
        self.procs.append(proc)
        return proc

    def moved(self, proc: ProcRecord, host: str, address: str, why: str, when: float) -> None:
        """``proc`` restarts with its rank on ``host``: its own host did not answer (``why``)."""
        proc.host, proc.address = host, address
        self.changes.append(MemberChange(Change.MOVED, proc.rank or 0, host, when, why, proc.role))

    def discovered(self, hosts: list[dict[str, Any]]) -> None:
        """The host discovery script's hosts, as they are now."""
        self.hosts = hosts

    def count(self, change: Change) -> int:
        """How many times the job's workers changed this way."""
        return sum(1 for c in self.changes if c.change is change)

    def rechecked(self, answered: Collection[str], unverified: Mapping[str, str]) -> None:
        """An ended job's hosts not verified at its end were checked again: the processes on the
        hosts that ``answered`` (their stop) are ``stopped``, and so say the root cause's
        consequences; ``unverified`` what is left."""
        for p in self.procs:
            if p.pid and p.host in answered and p.state is ProcState.UNKNOWN:
                p.state = ProcState.STOPPED
        ends = tuple(f" on {label}: {UNVERIFIED}" for label in answered)
        self.consequences = [line[:-len(UNVERIFIED)] + RECHECKED if line.endswith(ends) else line
                             for line in self.consequences]
        self.unverified = dict(unverified)

    def _still_active(self, what: str) -> None:
        if not self.state.active:
            raise ValueError(f"job {self.id} is {self.state.value}: cannot {what} it (a final state is written once)")

    def to_json(self) -> str:
        data = asdict(self)
        data["root_cause"] = self.root_cause.to_json() if self.root_cause is not None else None
        return json.dumps(data, indent=2, default=lambda o: o.value)

    @classmethod
    def from_json(cls, text: str, where: str = "record") -> JobRecord:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise DamagedRecord(f"{where}: not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise DamagedRecord(f"{where}: not a JSON object")
        try:
            return cls._from_dict(data)
        except (TypeError, ValueError, KeyError) as exc:
            raise DamagedRecord(f"{where}: {type(exc).__name__}: {exc}") from None

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> JobRecord:
        known = {f.name for f in fields(cls)}
        raw = {k: v for k, v in data.items() if k in known}
        for required in ("id", "backend"):
            if not isinstance(raw.get(required), str) or not raw[required]:
                raise ValueError(f"field {required!r} is missing")
        raw.setdefault("command", [])
        raw["version"] = int(raw.get("version") or 1)
        procs = []
        proc_fields = {f.name for f in fields(ProcRecord)}
        for item in raw.get("procs") or []:
            p = {k: v for k, v in item.items() if k in proc_fields}
            p["state"] = _enum(ProcState, p.get("state"), ProcState.UNKNOWN)
            procs.append(ProcRecord(**p))
        raw["procs"] = procs
        raw["state"] = _enum(JobState, raw.get("state"), JobState.RUNNING)
        sup = raw.get("supervisor")
        raw["supervisor"] = Owner(**sup) if isinstance(sup, dict) else None
        el = raw.get("elastic")
        raw["elastic"] = Elastic(**{k: v for k, v in el.items() if k in {f.name for f in fields(Elastic)}}) \
            if isinstance(el, dict) else None
        raw["root_cause"] = Cause.from_json(raw.get("root_cause"))
        known = {f.name for f in fields(MemberChange)}
        raw["changes"] = [MemberChange(**{**{k: v for k, v in c.items() if k in known}, "change": Change(c["change"])})
                          for c in raw.get("changes") or []
                          if isinstance(c, dict) and c.get("change") in {x.value for x in Change}]
        return cls(**raw)


def _enum(cls: type[Enum], value: Any, fallback: Enum) -> Any:
    try:
        return cls(value)
    except ValueError:
        return fallback


class JobNotFound(LookupError):
    pass


class DamagedRecord(ValueError):
    """A record that cannot be read as one (bad JSON, missing fields); the message names it."""


# -- places ------------------------------------------------------------------------------------

def use_home(path: str | os.PathLike[str] | None) -> None:
    """Set MXDIST_HOME for this process (the CLI does, from --home / MXDIST_HOME)."""
    global _home
    _home = Path(path).expanduser().absolute() if path else None


def home() -> Path:
    if _home is not None:
        return _home
    return (Path.home() / ".mxdist").absolute()


def jobs_dir() -> Path:
    return home() / "jobs"


def new_job_id() -> str:
    """A sortable, unique id usable as PSNODE_JOB_ID: ``YYYYmmdd-HHMMSS-xxxx``."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def log_dir(job_id: str) -> Path:
    return jobs_dir() / job_id


def record_path(job_id: str) -> Path:
    return jobs_dir() / f"{job_id}.json"


def key_path(job_id: str) -> Path:
    """Where the launcher keeps the job's secret file on this machine (:mod:`mxdist.supervisor.preflight`)."""
    return log_dir(job_id) / "job.key"


def discard_key(job_id: str) -> None:
    """Remove the launcher's copy of the job's secret (when the job is over)."""
    with contextlib.suppress(OSError):
        key_path(job_id).unlink()


def stop_request_path(job_id: str) -> Path:
    return log_dir(job_id) / "stop.request"


@dataclass(frozen=True)
class StopRequest:
    """``mxdist stop``'s request (:func:`stop_request_path`): end the job, giving its processes
    ``grace`` seconds (None: the supervisor's own); who asked (``pid``) and when.  On disk:
    ``{"grace", "time", "pid"}``."""

    grace: float | None = None
    time: float | None = None
    pid: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"grace": self.grace, "time": self.time, "pid": self.pid}

    @classmethod
    def from_json(cls, data: Any) -> StopRequest:
        """Any content asks to stop: what is not a number of its fields reads as None."""
        if not isinstance(data, dict):
            return cls()
        grace, when, pid = data.get("grace"), data.get("time"), data.get("pid")

        def number(x: Any) -> float | None:
            if isinstance(x, bool) or not isinstance(x, (int, float, str)):
                return None
            try:
                return float(x)
            except ValueError:
                return None

        return cls(number(grace), number(when), pid if isinstance(pid, int) and not isinstance(pid, bool) else None)

    @classmethod
    def read(cls, path: Path) -> StopRequest:
        """The request at ``path`` (which exists; unreadable or not JSON: a stop all the same)."""
        try:
            return cls.from_json(json.loads(path.read_text()))
        except (OSError, ValueError):
            return cls()


@dataclass(frozen=True)
class ScaleRequest:
    """``mxdist scale``'s request (:func:`scale_request_path`): run ``target`` workers (with
    ``dry_run``: say how, change nothing); when it was asked.  On disk: ``{"target", "dry_run",
    "time"}``."""

    target: int
    dry_run: bool = False
    time: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"target": self.target, "dry_run": self.dry_run, "time": self.time}

    @classmethod
    def from_json(cls, data: Any) -> ScaleRequest:
        """KeyError, TypeError or ValueError (its message says which field) when ``data`` asks
        for no worker count."""
        if not isinstance(data, dict):
            raise TypeError(f"not a JSON object: {data!r}"[:200])
        when = data.get("time")
        return cls(int(data["target"]), bool(data.get("dry_run")),
                   float(when) if isinstance(when, (int, float)) and not isinstance(when, bool) else None)


def scale_request_path(job_id: str, token: str) -> Path:
    """Where ``mxdist scale`` asks the supervisor (``token``: the request's own name)."""
    return log_dir(job_id) / f"scale-{token}.request"


def scale_answer_path(request: Path) -> Path:
    """Where the supervisor answers the scale request at ``request``."""
    return request.with_suffix(".answer")


def scale_requests(job_id: str) -> list[Path]:
    """The scale requests waiting for the supervisor, oldest first."""
    try:
        paths = list(log_dir(job_id).glob("scale-*.request"))
    except OSError:
        return []
    return sorted(paths, key=_mtime)


def private_dir(path: Path) -> Path:
    """Create ``path`` and its missing parents under MXDIST_HOME with mode 0700; tighten
    MXDIST_HOME (when it is the user's own, not a shared sticky directory such as /tmp) and the
    jobs directory to 0700 if they were looser."""
    base = home()
    for d in (base, base / "jobs"):
        if path == d or d in path.parents:
            d.mkdir(mode=0o700, exist_ok=True, parents=d == base)
            st = d.stat()
            if st.st_mode & 0o077 and st.st_uid == os.getuid() and not st.st_mode & stat.S_ISVTX:
                os.chmod(d, 0o700)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def save(record: JobRecord) -> Path:
    """Write the record atomically (0600); create the job's private directory."""
    private_dir(log_dir(record.id))
    path = record_path(record.id)
    write_atomic(path, record.to_json())
    return path


def load(job_id: str) -> JobRecord:
    path = record_path(job_id)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise JobNotFound(f"no job {job_id!r} in {jobs_dir()} (mxdist jobs lists them)") from None
    except PermissionError:
        raise JobNotFound(f"cannot read {path}: permission denied (another user's job?)") from None
    return JobRecord.from_json(text, str(path))


def listing() -> list[tuple[str, JobRecord | DamagedRecord]]:
    """Every record, oldest first: (job id, record or why it cannot be read)."""
    directory = jobs_dir()
    try:
        paths = sorted(directory.glob("*.json"))
    except PermissionError:
        raise JobNotFound(f"cannot read {directory}: permission denied (another user's?)") from None
    out: list[tuple[str, JobRecord | DamagedRecord]] = []
    for path in paths:
        try:
            out.append((path.stem, JobRecord.from_json(path.read_text(), str(path))))
        except DamagedRecord as exc:
            out.append((path.stem, exc))
        except OSError as exc:
            out.append((path.stem, DamagedRecord(f"{path}: {exc.strerror or exc}")))

    def key(item: tuple[str, JobRecord | DamagedRecord]) -> tuple[float, str]:
        rec = item[1]
        return (rec.created if isinstance(rec, JobRecord) else _mtime(directory / f"{item[0]}.json"), item[0])

    return sorted(out, key=key)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def all_jobs() -> list[JobRecord]:
    """Every readable record, oldest first."""
    if not jobs_dir().is_dir():
        return []
    return [rec for _, rec in listing() if isinstance(rec, JobRecord)]


def resolve(job_id: str | None) -> JobRecord:
    """The named job, or the latest one (damaged records raise DamagedRecord)."""
    if job_id:
        return load(job_id)
    if not jobs_dir().is_dir():
        raise JobNotFound(f"no jobs recorded in {jobs_dir()} (start one with mxdist launch)")
    items = listing()
    if not items:
        raise JobNotFound(f"no jobs recorded in {jobs_dir()} (start one with mxdist launch)")
    rec = items[-1][1]
    if isinstance(rec, DamagedRecord):
        raise rec
    return rec


def remove(job_id: str) -> None:
    """Delete a job's record and directory here (logs, keys)."""
    with contextlib.suppress(FileNotFoundError):
        record_path(job_id).unlink()
    shutil.rmtree(log_dir(job_id), ignore_errors=True)


# -- the supervisor's lock -----------------------------------------------------------------------

def lock_path(job_id: str) -> Path:
    return log_dir(job_id) / "supervisor.lock"


class Lock:
    """An exclusive flock on a job's lock file, held until :meth:`release` (or process death)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def release(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = -1


def try_lock(job_id: str) -> Lock | None:
    """Take the job's lock without waiting; None if someone (its supervisor) holds it."""
    private_dir(log_dir(job_id))
    fd = os.open(lock_path(job_id), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return Lock(fd)


@contextlib.contextmanager
def takeover(job_id: str) -> Iterator[JobRecord | None]:
    """The record, for a writer other than the supervisor: yields it while holding the job's
    lock, or None when the supervisor holds the lock (then it owns the record)."""
    lock = try_lock(job_id)
    if lock is None:
        yield None
        return
    try:
        yield load(job_id)
    finally:
        lock.release()
