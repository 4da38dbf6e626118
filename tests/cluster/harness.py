"""Start a real psnode job (scheduler, servers, worker scripts) on 127.0.0.1, bounded in time.

No launcher involved: this exercises psnode alone, through its env contract.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from psnode.config import NodeConfig, Role

ROOT = Path(__file__).resolve().parents[2]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class Proc:
    role: str
    rank: int
    popen: subprocess.Popen
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    out: str = ""
    err: str = ""

    @property
    def code(self) -> int | None:
        return self.popen.returncode


@dataclass
class Job:
    job_id: str
    procs: list[Proc] = field(default_factory=list)
    scheduler: str = ""

    def by_role(self, role: str) -> list[Proc]:
        return [p for p in self.procs if p.role == role]

    @property
    def workers(self) -> list[Proc]:
        return self.by_role("worker")

    def describe(self) -> str:
        return "\n".join(f"--- {p.role} {p.rank} rc={p.code}\n{p.out}\n{p.err}" for p in self.procs)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def start_job(script: str, num_workers: int, num_servers: int, env: dict[str, str] | None = None,
              args: list[str] | None = None, tmp: Path | None = None,
              worker_env: dict[int, dict[str, str]] | None = None) -> Job:
    """Start scheduler, servers and ``num_workers`` copies of ``script`` (Python source)."""
    job = Job(job_id=f"t{uuid.uuid4().hex[:10]}")
    port = free_port()
    job.scheduler = f"127.0.0.1:{port}"
    base = dict(os.environ)
    base["PYTHONPATH"] = str(ROOT) + os.pathsep + base.get("PYTHONPATH", "")
    base.setdefault("PSNODE_HEARTBEAT_INTERVAL", "0.2")
    base.setdefault("PSNODE_REGISTER_TIMEOUT", "20")
    base.update(env or {})
    tmp = tmp or Path("/tmp")
    path = tmp / f"{job.job_id}.py"
    path.write_text(textwrap.dedent(script))

    def cfg(role: Role, rank: int | None) -> dict[str, str]:
        c = NodeConfig(role=role, scheduler_host="127.0.0.1", scheduler_port=port,
                       num_workers=num_workers, num_servers=num_servers, job_id=job.job_id,
                       host="127.0.0.1", rank=rank)
        e = dict(base)
        for k, v in c.to_env().items():
            if k not in (env or {}) and not (k.startswith("PSNODE_HEARTBEAT") or k == "PSNODE_REGISTER_TIMEOUT"):
                e[k] = v
        return e

    def spawn(role: str, rank: int, argv: list[str], e: dict[str, str]) -> None:
        p = subprocess.Popen(argv, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
        job.procs.append(Proc(role, rank, p, argv, e))

    spawn("scheduler", 0, [sys.executable, "-m", "psnode"], cfg(Role.SCHEDULER, None))
    for s in range(num_servers):
        spawn("server", s, [sys.executable, "-m", "psnode"], cfg(Role.SERVER, s))
    for w in range(num_workers):
        e = cfg(Role.WORKER, w)
        e.update((worker_env or {}).get(w, {}))
        spawn("worker", w, [sys.executable, str(path), *(args or [])], e)
    return job


def restart_worker(job: Job, rank: int, count: int, role: str = "worker") -> Proc:
    """Start a replacement for ``role`` ``rank`` (its predecessor must have exited)."""
    old = next(p for p in reversed(job.by_role(role)) if p.rank == rank)
    old.out, old.err = old.popen.communicate(timeout=10)
    env = dict(old.env, PSNODE_RESTART_COUNT=str(count))
    p = subprocess.Popen(old.argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    new = Proc(role, rank, p, old.argv, env)
    job.procs.append(new)
    return new


def wait_for_file(path: Path, timeout: float = 30.0) -> None:
    """Wait (bounded) until a worker script creates ``path``."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout} s"
        time.sleep(0.02)


def wait_job(job: Job, timeout: float = 60.0) -> Job:
    """Wait for every process; on timeout kill them all and raise."""
    deadline = time.monotonic() + timeout
    try:
        for p in job.procs:
            left = max(0.1, deadline - time.monotonic())
            try:
                p.out, p.err = p.popen.communicate(timeout=left)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"job did not finish within {timeout} s") from None
    finally:
        kill_job(job)
    return job


def kill_job(job: Job) -> None:
    for p in job.procs:
        if p.popen.poll() is None:
            p.popen.kill()
            try:
                p.out, p.err = p.popen.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                pass
    assert not [p.popen.pid for p in job.procs if alive(p.popen.pid)], "processes left"


def run_job(script: str, num_workers: int, num_servers: int, timeout: float = 60.0, **kw) -> Job:
    return wait_job(start_job(script, num_workers, num_servers, **kw), timeout)
