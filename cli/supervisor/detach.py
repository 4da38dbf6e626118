"""``mxdist launch -d``: the job's supervisor in the background; and an attached launch whose
output's reader goes away (``| head -5``), which leaves its job running the same way.

:func:`detach`: the same :class:`mxdist.supervisor.supervisor.Supervisor` runs in a child process of its own session (no
controlling terminal, SIGHUP ignored), stdin from /dev/null, stdout and stderr appended to
``MXDIST_HOME/jobs/<id>/supervisor.log`` (0600).  The parent returns as soon as the child holds
the job's lock and has written the record, so ``mxdist status`` and ``mxdist stop`` find the job
the moment ``launch -d`` prints its id; preflight problems then show in ``mxdist status``.

:func:`through_pipe` (an attached launch whose stdout is a pipe): the supervisor runs in a child,
in the launch's process group (the terminal's Ctrl-C reaches it), bound to die with
its parent (``PR_SET_PDEATHSIG``: a ``kill -9`` of ``mxdist launch`` takes the supervisor with
it).  The parent is what the shell waits for: it passes SIGINT,
SIGTERM and SIGHUP on, and returns the child's exit code.  When the pipe's reader goes away
(``head`` read its lines) and no signal came, the child detaches as ``launch -d`` does (own
session, SIGHUP ignored, output to ``supervisor.log``, no longer bound to the parent) and the
parent returns at once: the prompt comes back, the job runs on, and stderr says how to follow
and stop it.  That is what a closed reader means here: the output was a view, not the job.
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import dataclasses
import os
import select
import signal
import sys
import time
from collections.abc import Callable

from ..job import records
from .supervisor import Supervisor


def detach(supervisor: Supervisor) -> None:
    """Run ``supervisor`` in a child process of its own session, output to the job directory;
    return in the parent once the child holds the job's lock and has written the record."""
    job = supervisor.record.id
    records.private_dir(records.log_dir(job))
    log = records.log_dir(job) / "supervisor.log"
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(ready_w)
        with os.fdopen(ready_r, "rb") as ready:
            ready.read(1)   # the child writes once the record is saved (or exits: EOF)
        return
    os.close(ready_r)
    code = 1
    try:
        os.setsid()
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        os.close(null)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

        def tell() -> None:
            nonlocal ready_w
            if ready_w >= 0:
                os.close(ready_w)
                ready_w = -1

        supervisor.on_save(tell)
        code = supervisor.run()
    except BaseException as exc:  # noqa: BLE001 - the child must never return into the parent's code
        with contextlib.suppress(Exception):
            print(f"mxdist supervisor: {type(exc).__name__}: {exc}", flush=True)
    finally:
        if ready_w >= 0:
            os.close(ready_w)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


_PR_SET_PDEATHSIG = 1
_PASSED_ON = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_DETACH = signal.SIGUSR1          # the parent to the child: the reader went away, go on alone


def _die_with_parent(sig: int) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)


def reader_gone(fd: int = 1, timeout: float = 0.0) -> bool:
    """Has the reader of the pipe ``fd`` gone away (a write would fail with EPIPE)?"""
    poller = select.poll()
    poller.register(fd, select.POLLERR)
    return any(ev & (select.POLLERR | select.POLLNVAL) for _, ev in poller.poll(timeout * 1000))


def through_pipe(supervisor: Supervisor, detached: Callable[[], None]) -> int:
    """Run ``supervisor`` in a child (module docstring); its exit code, or 0 once the pipe's
    reader went away and the job went on detached (``detached()`` is called first, to say so)."""
    parent = os.getpid()
    ack_r, ack_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ack_r)
        _child(supervisor, parent, ack_w)
    os.close(ack_w)
    got: list[int] = []

    def pass_on(signum: int, frame: object) -> None:
        got.append(signum)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    previous = {s: signal.signal(s, pass_on) for s in _PASSED_ON if signal.getsignal(s) is not signal.SIG_IGN}
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
            if not got and reader_gone(timeout=0.1):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, _DETACH)
                if _acknowledged(ack_r, pid, 10.0):
                    detached()
                    return 0
            else:
                time.sleep(0.1)
    finally:
        os.close(ack_r)
        for s, handler in previous.items():
            signal.signal(s, handler)


def _acknowledged(ack_r: int, pid: int, timeout: float) -> bool:
    """The child said it detached (one byte), within ``timeout``; False if it ended first."""
    ready, _, _ = select.select([ack_r], [], [], timeout)
    return bool(ready) and os.read(ack_r, 1) == b"d"


def _child(supervisor: Supervisor, parent: int, ack_w: int) -> None:
    """The supervisor's process of :func:`through_pipe`: never returns."""
    code = 1
    try:
        _die_with_parent(signal.SIGKILL)
        if os.getppid() != parent:    # the parent died before the line above
            os._exit(1)

        def go_on_alone(signum: int, frame: object) -> None:
            signal.signal(_DETACH, signal.SIG_IGN)
            _die_with_parent(0)
            os.setsid()
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            job = supervisor.record.id
            fd = os.open(records.log_dir(job) / "supervisor.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
            if supervisor.record.supervisor is not None:
                supervisor.record.supervisor = dataclasses.replace(supervisor.record.supervisor, detached=True)
            os.write(ack_w, b"d")

        signal.signal(_DETACH, go_on_alone)
        code = supervisor.run()
    except BaseException as exc:  # noqa: BLE001 - the child must never return into the parent's code
        with contextlib.suppress(Exception):
            print(f"mxdist supervisor: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    finally:
        with contextlib.suppress(Exception):
            atexit._run_exitfuncs()   # (what the launch's own exit would run: live displays stopped)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
