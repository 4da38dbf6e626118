"""The hand-off between the worker's API stack and its transport, and what comes back:
:class:`Placed` (one data operation, resolved by the data path), :class:`Future` (its outcome,
resolved by request id), :class:`Notice` (the job has something for the user's thread, outside
any future) and :class:`ControlRequest` (BARRIER, FINISH, BYE to the scheduler, sent again until
answered).

A future is resolved once, by one thread (the one that read its answer, psnode.worker.ioloop): its
``on_reply`` callback (e.g. copying a pulled array into the caller's ``out``) runs first, then
waiters are released; ``wait`` raises the request's error.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from psnode.errors import PeerLost
from psnode.protocol import Command, Ok
from psnode.protocol.control import Barrier, Body, Empty


class Future:
    """The outcome of one request; ``wait`` raises the request's error.

    Resolved once, by one thread (the I/O thread; a second ``set``/``fail`` is ignored).  A
    lock held until then is cheaper than a threading.Event (one per request)."""

    __slots__ = ("_done", "_lock", "error", "on_reply", "request", "result", "server")

    def __init__(self, on_reply: Callable[[Ok], None] | None = None, server: int = -1) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()  # released when resolved
        self._done = False
        self.server = server
        self.result: Ok | None = None
        self.error: BaseException | None = None
        self.on_reply = on_reply
        self.request: Any = None   # what it answers (for the wait reports of psnode.worker.engine)

    def set(self, result: Ok) -> None:
        if self._done:
            return
        try:
            if self.on_reply is not None:
                self.on_reply(result)
            self.result = result
        except Exception as exc:  # noqa: BLE001 - e.g. a bad array in a reply
            self.error = exc
        self._done = True
        self._lock.release()

    def fail(self, exc: BaseException) -> None:
        if not self._done:
            self.error = exc
            self._done = True
            self._lock.release()

    @property
    def done(self) -> bool:
        return self._done

    def _wait(self, timeout: float | None) -> bool:
        """True once resolved (within ``timeout`` seconds; None: no limit)."""
        if self._done:
            return True
        if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
            return False
        self._lock.release()  # let other waiters through too
        return True

    def wait(self, timeout: float | None = None) -> Ok:
        if not self._wait(timeout):
            raise PeerLost(f"no answer within {timeout:g} s")
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


class Placed:
    """One data operation for one server, resolved by the data path (psnode.worker.datapath)
    and handed to the engine (psnode.worker.engine.Engine.send), which sends it as it is.

    ``near``: ``server`` is reached over this host's link (asked once per call); ``op``'s arrays
    carry their places (``op.at``); ``areas``: the landing areas (and scratch) it took, back to
    the pool once ``future`` is answered.  ``future`` is made with it, calling ``on_reply`` with
    the answer first, unless ``reply`` is False: a push answered only if it fails.
    ``nbytes``: what its answer brings back; ``guard``: what a push must not overtake a pull of;
    ``keys`` and ``label``: the key parts it stands for and its name, for counters and messages;
    ``auto``: a push's answer asked for in advance (not a pull)."""

    __slots__ = ("areas", "auto", "future", "guard", "keys", "label", "nbytes", "near", "op", "priority",
                 "server")

    def __init__(self, server: int, op: Any, reply: bool = True, on_reply: Callable[[Ok], None] | None = None,
                 near: bool = False, nbytes: int = 0, priority: int = 0, guard: Any = None, keys: int = 1,
                 label: str = "", auto: bool = False, areas: tuple[Any, ...] = ()) -> None:
        self.server = server
        self.op = op
        self.future = Future(on_reply, server) if reply else None
        self.near = near
        self.nbytes = nbytes
        self.priority = priority
        self.guard = guard
        self.keys = keys
        self.label = label
        self.auto = auto
        self.areas = areas


class Notice:
    """Raised (``up``) while the job has something for the user's thread that no future
    carries: its failure, an error a server reported for a push nobody waits for, a membership
    change not yet seen, or a request to leave.  The transport raises it after it recorded the
    news (psnode.worker.state); the engine lowers it once the user's thread took every piece
    that can be taken (a failure and a request to leave stay).  The API reads it once per call
    and asks the engine only when it is up (psnode.worker.kvstore)."""

    __slots__ = ("up",)

    def __init__(self) -> None:
        self.up = False


@dataclass
class ControlRequest:
    """A message to the scheduler awaiting its answer (BARRIER n, FINISH), sent again every
    ``retry_timeout`` until answered (the scheduler answers repeats, counts them once)."""

    cmd: Command
    body: Body = field(default_factory=Empty)
    future: Future = field(default_factory=Future)
    sent: float = 0.0

    @property
    def slot(self) -> tuple[Command, int]:
        return (self.cmd, (self.body.n or 0) if isinstance(self.body, Barrier) else 0)


__all__ = ["ControlRequest", "Future", "Notice", "Placed"]
