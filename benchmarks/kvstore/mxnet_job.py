"""MXNet 1.9.1 as a peer: its own venv, and jobs started with the ``DMLC_*`` variables by hand.

The venv lives outside the repository (default ``~/.cache/mxdist-bench/mxnet-venv``; MXNet
1.9.1 needs numpy < 1.24, so it cannot share the project's environment) and is made on first
use: ``python -m venv`` + ``pip install mxnet==1.9.1 numpy==1.23.5`` (the package registry as
pip is configured here), then ``import mxnet`` is checked.  A ``.ready`` file marks a venv that
passed; a directory without it (an interrupted install) is made again.  When MXNet cannot be
installed or imported, :func:`mxnet_python` returns the reason in one line and the benchmark
goes on without MXNet.

A job (:func:`run_mxnet`): the scheduler and S servers are ``python -c "import mxnet"``
(``DMLC_ROLE`` scheduler/server: MXNet serves at import and exits when the workers are done),
W workers run ``benchmarks/kvstore/mxnet_peer.py``; everything on 127.0.0.1 (``DMLC_NODE_HOST``,
``DMLC_INTERFACE=lo``), ``OMP_NUM_THREADS=1`` in every process (as for gloo: 2 cores).  Every
wait is bounded; on timeout or failure only the processes started here are killed.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.cases import Case, encode_cases
from benchmarks.common import ROOT, child_env, free_port, parse_results, tail

PACKAGES = ("mxnet==1.9.1", "numpy==1.23.5")
DEFAULT_VENV = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mxdist-bench" / "mxnet-venv"
INSTALL_TIMEOUT = 900.0
EXIT_GRACE = 20.0      # seconds the scheduler and servers get to exit after the workers are done


def mxnet_python(venv: Path = DEFAULT_VENV, install: bool = True) -> tuple[str | None, str]:
    """(the venv's python, "") when ``import mxnet`` works there, else (None, one-line reason).

    Makes the venv when it is missing or unfinished and ``install`` is true."""
    py = venv / "bin" / "python"
    ready = venv / ".ready"
    if not ready.exists():
        if not install:
            return None, f"no MXNet venv at {venv} (run without --no-mxnet-install to make it)"
        if venv.exists():
            shutil.rmtree(venv)
        venv.parent.mkdir(parents=True, exist_ok=True)
        print(f"making the MXNet venv {venv} ({' '.join(PACKAGES)}) ...", flush=True)
        try:
            for argv in ([sys.executable, "-m", "venv", str(venv)],
                         [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", *PACKAGES]):
                r = subprocess.run(argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT)
                if r.returncode != 0:
                    why = tail(r.stderr or r.stdout, 1) or f"exit {r.returncode}"
                    return None, f"{' '.join(argv[:4])} ... failed: {why}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"making the venv failed: {exc}"
    try:
        r = subprocess.run([str(py), "-c", "import mxnet, numpy; print(mxnet.__version__, numpy.__version__)"],
                           capture_output=True, text=True, timeout=120, env=_clean_env())
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"import mxnet in {venv} failed: {exc}"
    if r.returncode != 0:
        return None, f"import mxnet in {venv} failed: {tail(r.stderr, 1)}"
    ready.write_text(r.stdout)
    return str(py), r.stdout.strip()


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment for MXNet processes: the repository first on PYTHONPATH (for
    benchmarks.cases), nothing of this interpreter's site-packages."""
    env = child_env(**extra)
    env["PYTHONPATH"] = str(ROOT)
    env.pop("PYTHONHOME", None)
    return env


def dmlc_env(role: str, port: int, W: int, S: int) -> dict[str, str]:
    """The variables ps-lite reads, set by hand as MXNet's own launcher would."""
    return _clean_env(DMLC_ROLE=role, DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(port),
                      DMLC_NUM_SERVER=str(S), DMLC_NUM_WORKER=str(W), DMLC_NODE_HOST="127.0.0.1",
                      DMLC_INTERFACE="lo", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def _job(py: str, W: int, S: int, worker_args: list[str], timeout: float, who: str) -> list[dict]:
    port = free_port()

    def spawn(role: str, argv: list[str]) -> subprocess.Popen[str]:
        return subprocess.Popen([py, *argv], cwd=ROOT, env=dmlc_env(role, port, W, S), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    daemons = [spawn("scheduler", ["-c", "import mxnet"])]
    daemons += [spawn("server", ["-c", "import mxnet"]) for _ in range(S)]
    workers = [spawn("worker", ["-m", "benchmarks.kvstore.mxnet_peer", *worker_args]) for _ in range(W)]
    out: list[dict] = []
    deadline = time.monotonic() + timeout
    try:
        for i, p in enumerate(workers):
            so, se = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            if p.returncode != 0:
                print(f"  {who} worker {i} exited {p.returncode}:\n{tail(se)}", file=sys.stderr)
            out.extend(parse_results(so))
        if any(p.returncode != 0 for p in workers):
            return out
        for i, p in enumerate(daemons):
            try:
                p.communicate(timeout=max(0.1, min(EXIT_GRACE, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                print(f"  {who}: {'scheduler' if i == 0 else f'server {i - 1}'} still running "
                      f"{EXIT_GRACE:.0f} s after the workers ended: killed", file=sys.stderr)
                break
    except subprocess.TimeoutExpired:
        print(f"  {who} timed out after {timeout:.0f} s", file=sys.stderr)
        out = []
    finally:
        for i, p in enumerate(daemons + workers):
            if p.poll() is None:
                p.kill()
                _, se = p.communicate()
                if not out and se.strip():
                    name = "scheduler" if i == 0 else f"server {i - 1}" if i <= S else f"worker {i - 1 - S}"
                    print(f"  {who} {name}:\n{tail(se, 5)}", file=sys.stderr)
    return out


def run_mxnet(py: str, W: int, S: int, cases: list[Case], quick: bool, timeout: float) -> list[dict]:
    """The cases on an MXNet job of W workers and S servers; the workers' records."""
    return _job(py, W, S, ["bench", encode_cases(cases), "1" if quick else "0"], timeout, f"mxnet W{W}S{S}")


def run_mxnet_launch(py: str, W: int, S: int, timeout: float) -> list[dict]:
    """Launch to first completed pull (from just before the processes start)."""
    t0 = time.time()
    return _job(py, W, S, ["launch", repr(t0)], timeout, "mxnet launch")
