"""A ``sitecustomize`` that takes each scheduler's planned port just before the scheduler binds
it: what another user's process does on a shared host.

:func:`port_taker` writes it to a directory for the job's ``PYTHONPATH`` (``-e PYTHONPATH=DIR``;
psnode's exit guard runs it after its own).  In a Python started with ``PSNODE_ROLE=scheduler``
(the scheduler, before its ``-m psnode`` runs) it first starts a holder:
a process in a session of its own (not the job's) that binds and listens on the address in
``PSNODE_SCHEDULER`` (a real socket, not a mock) and sleeps.  Each address is taken once; the
holders' pids and addresses are in ``DIR/held-*`` (:func:`holders`), for the test to check that
the port stayed taken during the job, and to end them by pid (:func:`release`).
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import textwrap
from pathlib import Path

from tests.support import wait_for
from tests.support.cli import ROOT

_SCRIPT = textwrap.dedent('''\
    import os, socket, time
    HELD = {held!r}
    where = os.environ.get("PSNODE_SCHEDULER", "")
    if os.environ.get("PSNODE_ROLE") == "scheduler" and where:
        mark = os.path.join(HELD, "held-" + where.replace(":", "_"))
        try:
            fd = os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            fd = None
        if fd is not None:
            host, _, port = where.rpartition(":")
            sock = socket.socket()
            sock.bind((host, int(port)))
            sock.listen(1)
            if os.fork() == 0:           # the holder, in a session of its own: keeps the port until killed
                os.setsid()
                os.write(fd, ("%d %s\\n" % (os.getpid(), where)).encode())
                os.close(fd)
                while True:
                    time.sleep(60)
            os.close(fd)
            sock.close()                 # (the holder's copy stays open and listening)
            while os.path.getsize(mark) == 0:
                time.sleep(0.005)
''')


def port_taker(directory: Path) -> str:
    """Write the ``sitecustomize`` to ``directory``; the ``PYTHONPATH`` for the job's processes
    (``directory``, then the project)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(_SCRIPT.format(held=str(directory)))
    return os.pathsep.join([str(directory), str(ROOT)])


def holders(directory: Path) -> dict[str, int]:
    """Address -> pid of the holder that took it."""
    out = {}
    for mark in directory.glob("held-*"):
        pid, where = mark.read_text().split()
        out[where] = int(pid)
    return out


def taken(address: str) -> bool:
    """Is ``host:port`` bound by someone (a bind there fails)?"""
    host, _, port = address.rpartition(":")
    with socket.socket() as s:
        try:
            s.bind((host, int(port)))
        except OSError:
            return True
    return False


def release(directory: Path) -> None:
    """End every holder (by pid) and wait until it is gone."""
    for pid in holders(directory).values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda pid=pid: not _alive(pid), 10, f"holder {pid} to end")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


__all__ = ["holders", "port_taker", "release", "taken"]
