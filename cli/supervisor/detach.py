"""``mxdist launch -d``: the job's supervisor in the background.

The same :class:`mxdist.supervisor.supervisor.Supervisor` runs in a child process of its own session (no
controlling terminal, SIGHUP ignored), stdin from /dev/null, stdout and stderr appended to
``MXDIST_HOME/jobs/<id>/supervisor.log`` (0600).  The parent returns as soon as the child holds
the job's lock and has written the record, so ``mxdist status`` and ``mxdist stop`` find the job
the moment ``launch -d`` prints its id; preflight problems then show in ``mxdist status``.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys

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
