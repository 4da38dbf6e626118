"""What a worker's two threads share: the user's thread (:mod:`psnode.worker.engine`) and the
I/O thread (:mod:`psnode.worker.ioloop`).

:class:`EngineState` is the one object both hold.  Its ``lock`` guards the tracker (every call
into it), the control queue, ``woken`` and the barrier count; the other fields have one writer:
the I/O thread sets ``rank``, ``restarts``, ``barriers_before`` and ``joiner`` before it
resolves ``welcome`` (the user's thread reads them only after that), and ``fatal`` when the job
fails; the user's thread sets ``closing``.  The membership (``generation``, ``members``,
``leaving``, ``changes``: membership changes the user's thread has not seen yet, ``agreed``: the
membership the last barrier completed with, the same for every worker) is written by
the I/O thread and read by the user's thread, both under the lock; the I/O thread raises the
tracker's :class:`~psnode.worker.futures.Notice` after it set any of them, or ``fatal``, and
the user's thread lowers it (:meth:`EngineState.lower`).  A thread hands work to the I/O
thread by queueing it under the lock, then :meth:`EngineState.wake` (an eventfd the I/O thread
polls).
"""
from __future__ import annotations

import os
import threading
from collections import deque
from dataclasses import dataclass, field

from psnode.errors import PSError
from psnode.worker.futures import ControlRequest, Future, Notice
from psnode.worker.tracker import Tracker


def _eventfd() -> int:
    return os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)


@dataclass(eq=False)
class EngineState:
    """The state a worker's user thread and I/O thread share (see the module docstring)."""

    tracker: Tracker
    lock: threading.Lock = field(default_factory=threading.Lock)
    control_queue: deque[ControlRequest] = field(default_factory=deque)   # for the I/O thread to send
    welcome: Future = field(default_factory=Future)   # resolved once the job's WELCOME arrived
    rank: int = -1
    restarts: int = 0
    barriers: int = 0                  # barriers this worker entered (numbers them)
    barriers_before: int = 0           # barriers its predecessor completed (restarts)
    fatal: PSError | None = None       # the job's failure (or "closed"): every request raises it
    closing: bool = False              # the user's thread closes the engine: the I/O thread stops
    woken: bool = False                # a wake-up for queued requests is pending (lock)
    joiner: bool = False               # joined the running job (its WELCOME says)
    generation: int = 0                # the membership generation (lock)
    members: tuple[int, ...] = ()      # the active workers' ranks, sorted (lock)
    leaving: bool = False              # asked to leave at its next push (lock)
    changes: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)   # (generation, members) (lock)
    agreed: tuple[int, tuple[int, ...]] | None = None   # the last barrier's (generation, members) (lock)
    efd: int = field(default_factory=_eventfd)   # the I/O thread's wake-up

    @property
    def notice(self) -> Notice:
        """Raised after ``fatal``, ``leaving`` or ``changes`` is set, and by the tracker after a
        deferred error (psnode.worker.futures.Notice)."""
        return self.tracker.notice

    def lower(self) -> None:
        """Lower the notice, unless something the user's thread has not taken is left (a
        failure and a request to leave always are).  A writer raises it after its news, so
        news recorded meanwhile keeps it up."""
        notice = self.tracker.notice
        notice.up = False
        if self.fatal is not None or self.leaving or self.changes or self.tracker.deferred:
            notice.up = True

    def wake(self) -> None:
        """Wake the I/O thread (it polls ``efd``)."""
        os.eventfd_write(self.efd, 1)


__all__ = ["EngineState"]
