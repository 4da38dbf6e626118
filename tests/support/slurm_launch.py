"""Running ``mxdist --launcher slurm`` inside a real allocation (tests/slurm, tests/terminal):
``salloc`` to completion, the job's processes by ``PSNODE_JOB_ID``, and the check that nothing
of a job is left in the queue or on the host."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.cli import cli_env

MXDIST = [sys.executable, "-m", "mxdist"]


def write(tmp_path: Path, name: str, text: str) -> str:
    """Write ``text`` to ``tmp_path/name``; ``name`` (a path relative to the allocation's cwd)."""
    (tmp_path / name).write_text(text)
    return name


def env_for(cluster, home: Path) -> dict[str, str]:
    """The CLI environment for ``home`` with ``cluster``'s Slurm on PATH."""
    return cluster.env(cli_env(home))


def salloc(cluster, alloc: list[str], home: Path, cwd: Path, *command: str,
           timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``salloc ALLOC COMMAND`` to completion: COMMAND runs with the allocation in its env."""
    return subprocess.run(["salloc", *alloc, "--immediate=30", *command], env=env_for(cluster, home),
                          cwd=cwd, capture_output=True, text=True, timeout=timeout)


def job_processes(job_id: str) -> list[int]:
    """Live pids whose environment carries PSNODE_JOB_ID=job_id."""
    marker = f"PSNODE_JOB_ID={job_id}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if marker in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                if Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(entry))
        except OSError:
            continue
    return found


def mxdist_steps(cluster) -> list[str]:
    """The queued steps of ``cluster`` that run mxdist."""
    return [s for s in cluster.steps() if " mxdist." in s]


def assert_nothing_left(cluster, job_id: str, timeout: float = 15.0) -> None:
    """Wait until no mxdist step is queued and no process of ``job_id`` runs; kill and fail otherwise."""
    deadline = time.monotonic() + timeout
    while (steps := mxdist_steps(cluster)) or job_processes(job_id):
        if time.monotonic() > deadline:
            for pid in job_processes(job_id):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            raise AssertionError(f"left of job {job_id}: steps {steps}, pids {job_processes(job_id)}")
        time.sleep(0.1)
