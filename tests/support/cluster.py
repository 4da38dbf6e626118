"""Start a real psnode job (scheduler, servers, worker scripts) on 127.0.0.1, bounded in time.

No launcher involved: this exercises psnode alone, through its env contract.  Every process's
output is read in threads from the start (:class:`tests.support.Drained`), so no process can
block on a full pipe while the test waits for another one; ``Proc.out``/``Proc.err`` hold what
it printed so far.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from psnode.config import NodeConfig, Role
from tests.support import Drained, free_listen_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
free_port = free_listen_port   # ports outside the ephemeral range: no connection can take them first


@dataclass
class Proc:
    role: str
    rank: int
    popen: subprocess.Popen
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    drained: Drained | None = None

    @property
    def code(self) -> int | None:
        return self.popen.returncode

    @property
    def out(self) -> str:
        return self.drained.out(self) if self.drained else ""

    @property
    def err(self) -> str:
        return self.drained.err(self) if self.drained else ""


@dataclass
class Job:
    job_id: str
    procs: list[Proc] = field(default_factory=list)
    scheduler: str = ""
    drained: Drained = field(default_factory=Drained)

    def add(self, proc: Proc) -> Proc:
        """Track ``proc``: its output is drained from now on."""
        proc.drained = self.drained
        self.drained.track(proc)
        self.procs.append(proc)
        return proc

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
        job.add(Proc(role, rank, p, argv, e))

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
    assert job.drained.wait([old], time.monotonic() + 10), f"{role} {rank} is still running"
    env = dict(old.env, PSNODE_RESTART_COUNT=str(count))
    p = subprocess.Popen(old.argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    return job.add(Proc(role, rank, p, old.argv, env))


def kill_and_restart_server(job: Job, rank: int) -> Proc:
    """SIGKILL server ``rank`` (its latest process), wait for its end, start its replacement
    (restart count: how many processes the rank had)."""
    procs = [p for p in job.by_role("server") if p.rank == rank]
    os.kill(procs[-1].popen.pid, signal.SIGKILL)
    procs[-1].popen.wait(10)
    return restart_worker(job, rank, len(procs), role="server")


def wait_for_file(path: Path, timeout: float = 30.0) -> None:
    """Wait (bounded) until a worker script creates ``path``."""
    wait_for(path.exists, timeout, f"{path} to appear", interval=0.02)


def wait_job(job: Job, timeout: float = 60.0) -> Job:
    """Wait for every process; on timeout kill them all and raise."""
    try:
        if not job.drained.wait(job.procs, time.monotonic() + timeout):
            raise AssertionError(f"job did not finish within {timeout} s")
    finally:
        kill_job(job)
    return job


def kill_job(job: Job) -> None:
    """Kill what is left of the job, reap it, and collect the rest of its output."""
    job.drained.finish()
    assert not [p.popen.pid for p in job.procs if alive(p.popen.pid)], "processes left"


def run_job(script: str, num_workers: int, num_servers: int, timeout: float = 60.0, **kw) -> Job:
    return wait_job(start_job(script, num_workers, num_servers, **kw), timeout)


#: Worker-script prelude of the kvstore tests: a ``kv`` (type and aggregator from argv), ``W``, ``r``
#: and ``check(got, want, what)``, which exits 3 naming a mismatch.
PRELUDE = """
import numpy as np, psnode, sys
from psnode.errors import *
kv = psnode.kv.create(sys.argv[1] if len(sys.argv) > 1 else 'dist_sync',
                      aggregator=sys.argv[2] if len(sys.argv) > 2 else 'average')
W, r = kv.num_workers, kv.rank
def check(got, want, what):
    if not np.array_equal(got, want):
        print(f"MISMATCH {what}: got {got!r} want {want!r}", flush=True); sys.exit(3)
"""


def ok(job: Job) -> None:
    """Assert that every process of ``job`` exited 0 (its description otherwise)."""
    assert [p.code for p in job.procs] == [0] * len(job.procs), job.describe()
