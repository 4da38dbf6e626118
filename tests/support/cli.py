"""Helpers for tests that run the ``mxdist`` CLI as a user would (a subprocess) and check
that nothing of a job is left running.  Used by every tier that launches jobs through the CLI
(cluster, ssh, slurm, terminal, mxnet, stress).

Every wait is bounded; a timeout fails the test with what was awaited.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.support import wait_for

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
__all__ = ["ROOT", "assert_nothing_left", "cli_env", "kill_cli", "latest", "records", "run_cli",
           "start_cli", "wait_for"]


def cli_env(home: Path, **extra: str) -> dict[str, str]:
    """Environment for the CLI: a private MXDIST_HOME, the project importable, wide output."""
    env = dict(os.environ)
    env.update(MXDIST_HOME=str(home), PYTHONPATH=str(ROOT), COLUMNS="200", NO_COLOR="1",
               PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def run_cli(args: list[str], env: dict[str, str], timeout: float = 90.0) -> subprocess.CompletedProcess[str]:
    """Run ``mxdist ARGS`` to completion (bounded); stdout and stderr captured as text."""
    return subprocess.run([PY, "-m", "mxdist", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def start_cli(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([PY, "-m", "mxdist", *args], env=env, cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def records(home: Path) -> list[dict[str, Any]]:
    jobs = home / "jobs"
    if not jobs.is_dir():
        return []
    out = [json.loads(p.read_text()) for p in jobs.glob("*.json")]
    return sorted(out, key=lambda r: r["created"])


def latest(home: Path) -> dict[str, Any]:
    recs = records(home)
    assert recs, f"no job recorded in {home}"
    return recs[-1]


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) pids whose process group is ``pgid``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            data = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = data[data.rindex(")") + 2:].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(entry))
    return found


def job_pids(home: Path) -> list[int]:
    return [p["pid"] for r in records(home) for p in r["procs"] if p.get("pid")]


def left_over(home: Path) -> dict[int, list[int]]:
    return {g: m for g in job_pids(home) if (m := group_members(g))}


def secrets_left(home: Path) -> list[str]:
    """Secret files of ended jobs recorded in ``home`` that still exist: the launcher's copy
    (``jobs/<id>/job.key``) and, for a run dir given as an absolute path (every SSH-testbed
    host's, on this machine), ``<run dir>/job.key``."""
    left = []
    for rec in records(home):
        if rec["state"] in ("starting", "running"):
            continue
        paths = [home / "jobs" / rec["id"] / "job.key"]
        if rec.get("run_dir", "").startswith("/"):
            paths.append(Path(rec["run_dir"]) / "job.key")
        left += [str(p) for p in paths if p.exists()]
    return left


def assert_nothing_left(home: Path, timeout: float = 10.0) -> None:
    """Every process group of every job recorded in ``home`` is gone (zombies count as gone),
    and no ended job's secret file is left (:func:`secrets_left`).

    On timeout the survivors are killed (so later tests are not disturbed) and the test fails.
    """
    deadline = time.monotonic() + timeout
    while (left := left_over(home)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if left:
        for pgid in left:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except OSError:
                pass
        raise AssertionError(f"processes of the job still running: {left}")
    assert not (secrets := secrets_left(home)), f"secret files of ended jobs left: {secrets}"


def kill_cli(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)
