"""Helpers every test tier shares: bounded waits, free listening ports, drained pipes, and
requirements that skip on a developer's machine but fail under CI.

* :func:`wait_for` is the one polling loop of the test suite: every wait has a deadline, and a
  timeout fails the test naming what was awaited (and, if given, what the processes printed).
* :func:`free_listen_port` picks ports the way the launcher does (outside the kernel's range for
  outgoing connections, checked to bind), so no connection of a parallel test can take a port
  between the moment a test chooses it and the moment a scheduler or slurmctld binds it.
* :class:`Drained` reads every process's stdout and stderr in threads, so no process ever
  blocks on a full pipe while the test waits for another one.
* :func:`require` skips a test whose outside prerequisite is missing, except under CI
  (environment variable ``CI`` set, as ``.ci/run`` does), where a skip would hide a broken setup.
* :func:`interruptible` gives the test process SIGINT's default handling, so every process a
  test starts (``mxdist`` in every tier, through subprocess, a pty or ``salloc``) begins with
  SIGINT as a terminal's foreground job has it, even when the suite itself was started with
  SIGINT ignored (a script's background job): mxdist keeps an ignored SIGINT ignored, as
  ``nohup`` wants, so a Ctrl-C test would otherwise wait for nothing.

Every helper more than one test module uses lives in this package (test modules import no other
test module; tests/unit/test_test_layout.py checks it):

* ``cli`` -- ``mxdist`` as a subprocess, job records, nothing of a job left running;
* ``cluster`` -- a psnode job started through the env contract, no launcher (also the
  benchmarks' harness), and the kvstore tests' worker prelude;
* ``terminal`` -- a command in a real pty and the screen it draws;
* ``slurm``, ``slurm_launch`` -- a real Slurm cluster, and ``mxdist`` inside its allocations;
* ``faults``, ``storm`` -- the fault tests' training script and helpers, and the restart storm
  (benchmarks/faults/soak.py runs it N times);
* ``intruders`` (+ ``outsider.py``), ``orphans`` -- attacks on a job, and a job whose supervisor
  was killed;
* ``elastic``, ``scheduler_restart``, ``server_restore``, ``torch_trainer``, ``examples``,
  ``compression_cases`` -- jobs and references shared by the local, SSH, fault and GPU tiers;
* ``mxnet_engine``, ``mxnet_port`` -- the MXNet engine tests' scripts, and MXNet's test
  helpers on numpy arrays;
* ``ports`` -- a ``sitecustomize`` that takes each scheduler's planned port (a real listening
  socket) just before the scheduler binds it, for the busy-port tests of every backend.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO, Any

import pytest

from mxdist.supervisor.setup import free_listen_port


def wait_for(pred: Callable[[], Any], timeout: float, what: str, interval: float = 0.05,
             describe: Callable[[], str] | None = None, poll: Callable[[], None] | None = None) -> Any:
    """Call ``pred`` until it returns something truthy (returned), at most ``timeout`` seconds.

    ``poll`` runs between tries (e.g. to record exits); ``describe`` adds context to the failure.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = "\n" + describe() if describe is not None else ""
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{extra}")
        if poll is not None:
            poll()
        time.sleep(interval)


def free_listen_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct free ports, chosen as :func:`free_listen_port` chooses one."""
    ports: list[int] = []
    while len(ports) < count:
        ports.append(free_listen_port(host, avoid=frozenset(ports)))
    return ports


def interruptible() -> None:
    """SIGINT handled by Python in this process (KeyboardInterrupt), whatever it inherited: every
    process started from here, after its exec, has SIGINT at the default (module docstring)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def require(missing: str | None, fix: str) -> None:
    """Skip the calling test (or fixture) when ``missing`` names a missing prerequisite; under CI
    fail instead, saying what ``.ci/run`` must install."""
    if not missing:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{missing}: CI must provide it ({fix}; .ci/run does)")
    pytest.skip(f"{missing}: {fix}")


class Drained:
    """Reads the output of processes in threads and records when each one exited.

    ``procs`` are objects with a ``popen`` attribute (the harness's ``Proc``) or Popen objects.
    """

    def __init__(self, procs: Sequence[Any] = ()) -> None:
        self._out: dict[int, list[str]] = {}
        self._err: dict[int, list[str]] = {}
        self.exited: dict[int, float] = {}
        self._popens: list[subprocess.Popen[str]] = []
        self._tracked: list[Any] = []
        self._threads: list[threading.Thread] = []
        for p in procs:
            self.track(p)

    @staticmethod
    def _popen(p: Any) -> subprocess.Popen[str]:
        return p if isinstance(p, subprocess.Popen) else p.popen

    def track(self, p: Any) -> None:
        popen = self._popen(p)
        pid = popen.pid
        self._popens.append(popen)
        self._tracked.append(p)
        self._out[pid], self._err[pid] = [], []
        for stream, buf in ((popen.stdout, self._out[pid]), (popen.stderr, self._err[pid])):
            if stream is None:
                continue
            t = threading.Thread(target=self._pump, args=(stream, buf), daemon=True)
            t.start()
            self._threads.append(t)

    @staticmethod
    def _pump(stream: IO[str], buf: list[str]) -> None:
        for line in iter(stream.readline, ""):
            buf.append(line)

    def out(self, p: Any) -> str:
        return "".join(self._out[self._popen(p).pid])

    def err(self, p: Any) -> str:
        return "".join(self._err[self._popen(p).pid])

    def poll(self) -> None:
        now = time.monotonic()
        for popen in self._popens:
            if popen.pid not in self.exited and popen.poll() is not None:
                self.exited[popen.pid] = now

    def wait(self, procs: Sequence[Any], deadline: float) -> bool:
        """Wait until every one of ``procs`` exited or ``deadline`` (monotonic) passed; True if all did."""
        pids = [self._popen(p).pid for p in procs]
        while True:
            self.poll()
            if all(pid in self.exited for pid in pids):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)

    def finish(self) -> None:
        """Kill whatever is left (SIGCONT first: a stopped process must be able to die), reap it,
        and let the reader threads drain what was written."""
        for popen in self._popens:
            if popen.poll() is None:
                try:
                    os.kill(popen.pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                popen.kill()
            try:
                popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        for t in self._threads:
            t.join(timeout=2)

    def describe(self, procs: Sequence[Any] | None = None) -> str:
        """What each of ``procs`` (default: every tracked process) printed, with its exit code."""
        parts = []
        for p in self._tracked if procs is None else procs:
            popen = self._popen(p)
            who = f"{p.role} {p.rank} " if hasattr(p, "role") else ""
            parts.append(f"--- {who}pid {popen.pid} rc={popen.returncode}\n{self.out(p)}\n{self.err(p)}")
        return "\n".join(parts)
