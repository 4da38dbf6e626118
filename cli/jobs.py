"""The job record: what ``status``, ``stop`` and ``logs`` need to find a job again.

Layout under ``MXDIST_HOME`` (default ``~/.mxdist``)::

    jobs/<id>.json          the record (written atomically: tmp file + os.replace)
    jobs/<id>/<name>.log    one log per process (name: scheduler, server-0, worker-3, ...)
    jobs/<id>/job.key       the job's CURVE key pair (mode 0600; multi-host jobs unless --insecure)

The record holds: id, creation time, state, backend name and its connection options (no
secrets), hosts, the scheduler address, the command, the working directory, and per process
its role, rank, host, pid/pgid (the same: every process leads its own group), log paths
(local, and where it runs), rc file, state, exit code and how often the launcher restarted it.
Environment values and key material are never stored: the record names the local key file
(``key_file``), which ``status`` and ``stop`` pass to ``psnode.control``.
"""
from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any


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
    PENDING = "pending"
    RUNNING = "running"
    EXITED = "exited"      # exit code 0
    FAILED = "failed"      # non-zero exit code or signal
    STOPPED = "stopped"    # ended by the launcher or `mxdist stop`
    LOST = "lost"          # gone without a recorded exit status


@dataclass
class ProcRecord:
    """One process of a job as recorded on disk."""

    name: str
    role: str
    rank: int | None
    host: str                 # host label (key into JobRecord.hosts)
    address: str
    log: str                  # local log file
    pid: int | None = None    # also the process group id
    run_log: str = ""         # log file on the host where it runs
    rc_file: str = ""
    state: ProcState = ProcState.PENDING
    exit_code: int | None = None
    restarts: int = 0         # times the launcher restarted it (--max-restarts)

    @property
    def pgid(self) -> int | None:
        return self.pid


@dataclass
class JobRecord:
    """A launched job (see the module docstring)."""

    id: str
    command: list[str]
    backend: str
    scheduler: str
    workdir: str
    hosts: list[dict[str, Any]]
    options: dict[str, Any] = field(default_factory=dict)
    procs: list[ProcRecord] = field(default_factory=list)
    state: JobState = JobState.STARTING
    created: float = field(default_factory=time.time)
    ended: float | None = None
    launcher_pid: int = field(default_factory=os.getpid)
    key_file: str | None = None   # local copy of the job's CURVE keys (path only)
    remote_keys: dict[str, str] = field(default_factory=dict)  # host label -> key file path there

    def proc(self, name: str) -> ProcRecord:
        for p in self.procs:
            if p.name == name:
                return p
        raise KeyError(name)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, default=lambda o: o.value)

    @classmethod
    def from_json(cls, text: str) -> JobRecord:
        data = json.loads(text)
        procs = [ProcRecord(**{**p, "state": ProcState(p["state"])}) for p in data.pop("procs")]
        return cls(**{**data, "procs": procs, "state": JobState(data["state"])})


class JobNotFound(LookupError):
    pass


def home() -> Path:
    return Path(os.environ.get("MXDIST_HOME") or Path.home() / ".mxdist").expanduser().absolute()


def jobs_dir() -> Path:
    return home() / "jobs"


def new_job_id() -> str:
    """A sortable, unique id usable as PSNODE_JOB_ID: ``YYYYmmdd-HHMMSS-xxxx``."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def log_dir(job_id: str) -> Path:
    return jobs_dir() / job_id


def key_path(job_id: str) -> Path:
    """Where the launcher keeps the job's CURVE key pair on this machine."""
    return log_dir(job_id) / "job.key"


def save(record: JobRecord) -> Path:
    """Write the record atomically; create the job's log directory."""
    directory = jobs_dir()
    (directory / record.id).mkdir(parents=True, exist_ok=True, mode=0o700)
    path = directory / f"{record.id}.json"
    tmp = path.with_name(f".{record.id}.{os.getpid()}.tmp")
    tmp.write_text(record.to_json())
    os.replace(tmp, path)
    return path


def load(job_id: str) -> JobRecord:
    path = jobs_dir() / f"{job_id}.json"
    try:
        return JobRecord.from_json(path.read_text())
    except FileNotFoundError:
        raise JobNotFound(f"no job {job_id!r} in {jobs_dir()} (mxdist status lists jobs)") from None


def all_jobs() -> list[JobRecord]:
    """Every recorded job, oldest first (unreadable records are skipped)."""
    out: list[JobRecord] = []
    directory = jobs_dir()
    if not directory.is_dir():
        return out
    for path in sorted(directory.glob("*.json")):
        try:
            out.append(JobRecord.from_json(path.read_text()))
        except (ValueError, TypeError, KeyError, OSError):
            continue
    out.sort(key=lambda r: (r.created, r.id))
    return out


def resolve(job_id: str | None) -> JobRecord:
    """The named job, or the latest one."""
    if job_id:
        return load(job_id)
    jobs = all_jobs()
    if not jobs:
        raise JobNotFound(f"no jobs recorded in {jobs_dir()} (start one with mxdist launch)")
    return jobs[-1]
