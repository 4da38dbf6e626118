"""A worker's connection to its job: requests become futures; one I/O thread owns the sockets.

The user's thread (the KVStore API) calls :meth:`Engine.submit` with a typed operation
(:mod:`psnode.protocol`) for one server; the request is queued in the
:class:`~psnode.worker.tracker.Tracker` and the I/O thread (:mod:`psnode.worker.ioloop`) is woken through an
eventfd.  The I/O thread sends queued requests in priority order, fusing those bound for the
same server into one message, within a window of bytes in flight per server.  Answers resolve
futures by request id; a future's ``on_reply`` callback (e.g. copying a pulled array into the
caller's ``out``) runs in the I/O thread before the future is set.

Nothing a worker sent is assumed delivered: the tracker resends what got no answer, keeps
pushes in its journal until a pull after them returns, and names the server when it gives up
(see :mod:`psnode.worker.tracker`).  Control requests to the scheduler (BARRIER, FINISH) are numbered
and sent again until answered.  When the job fails (a peer lost, the scheduler silent or gone)
every pending and later request raises :class:`PeerLost`; if the user's thread does not come
back to psnode within a few seconds, the process exits with status 1 so no worker outlives its
job.

A restarted worker (``mxdist launch --max-restarts``) learns from its WELCOME how many barriers
its predecessor completed: a script that resumes (``kv.num_pushes`` before its first push, see
:mod:`psnode.worker.kvstore`) continues their numbering; one that starts over replays them, and the
scheduler answers those it already completed at once.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from psnode.config import NodeConfig
from psnode.errors import PeerLost, PSError
from psnode.protocol import Command, Ok, Op
from psnode.protocol.control import Barrier, Body, Bye, Empty
from psnode.samehost.staging import Staging
from psnode.worker.futures import ControlRequest, Future
from psnode.worker.tracker import Request, Tracker, settle

EXIT_GRACE = 5.0               # seconds the user's thread has to notice a failed job
BATCH_PAYLOAD = 2 * 2**20      # a batch leaves once it holds this much data (the server starts
                               # on it while later parts are being copied)


class Engine:
    """Connection of one worker process to its job."""

    def __init__(self, cfg: NodeConfig) -> None:
        from psnode.worker.ioloop import IoLoop

        self.cfg = cfg
        self.rank = -1
        self.restarts = 0
        self.num_servers = cfg.num_servers
        self.fatal: PSError | None = None
        self.lock = threading.Lock()
        self.tracker = Tracker(cfg.num_servers, cfg.retry_timeout, cfg.max_retries, address=self._address,
                               first_id=1 + secrets.randbits(60))
        self.control_queue: deque[ControlRequest] = deque()
        self.barriers = 0                  # barriers this worker entered (numbers them)
        self.barriers_before = 0           # barriers its predecessor completed (restarts)
        self.welcome = Future()
        self.blocked: Future | None = None     # what the user's thread waits for (Engine.wait)
        self.staging: Staging | None = None   # shared-memory buffers (set with the first link)
        self.closing = False
        self.failed = False
        self._woken = False
        self.efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        # same-host links are read by the thread waiting for an answer (psnode.worker.ioloop); one
        # reader at a time; ``notify`` wakes it when the I/O thread resolved futures
        self._batching = threading.local()
        self.reader = threading.Lock()
        self.readers = 0
        self.notify = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.io = IoLoop(self)
        self._thread = threading.Thread(target=self.io.run, name="psnode-io", daemon=True)
        self._thread.start()
        try:  # the I/O thread sets rank, restarts and barriers_before, then resolves it
            self.welcome.wait(cfg.register_timeout + 5)
        except PeerLost as exc:
            raise PeerLost(f"could not join job {cfg.job_id} through the scheduler at "
                           f"{cfg.scheduler_address}: {exc}") from None

    def _address(self, server: int) -> str:
        return self.io.address(server)

    # ------------------------------------------------------------ user side
    def stage(self, server: int, key: Any, part: int, index: int, shape: tuple[int, ...],
              dtype: np.dtype, seq: int) -> np.ndarray:
        """Where to copy array ``index`` of push ``seq`` of a key part before submitting it: a
        shared-memory slot when ``server`` is on this host's link, else plain memory."""
        if self.staging is not None and self.io.same_host(server):
            slot = self.staging.slot((key, part, index), shape, dtype, seq)
            if slot is not None:
                return slot
        return np.empty(shape, dtype)

    def land(self, server: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
        """A landing area for an answer (or a request's scratch, e.g. row ids) from ``server``
        when it is on this host's link (None otherwise); it returns to the pool once the
        answer was handled."""
        if self.staging is not None and self.io.same_host(server):
            return self.staging.land(shape, np.dtype(dtype))
        return None

    def submit(self, server: int, op: Op, nbytes: int = 0, priority: int = 0,
               on_reply: Callable[[Ok], None] | None = None, reply: bool = True,
               guard: Any = None, keys: int = 1, label: str = "", auto: bool = False) -> Future | None:
        """Queue one operation for ``server`` (thread-safe).

        Returns its future, or None with ``reply=False`` (a push): the server then answers only
        if the operation fails, and that error is raised by the next call into the engine.
        """
        if self.fatal is not None or self.tracker.deferred:
            self.check()
        staging = self.staging
        if staging is not None and reply:
            areas = [a for name in _area_fields(op) if (a := getattr(op, name)) is not None and staging.owns(a)]
            if areas:
                on_reply = _releasing(on_reply, areas, staging)
        fut = Future(on_reply, server) if reply else None
        req = Request(server, op, nbytes, fut, priority, 0, guard, keys, label, auto)
        if fut is not None:
            fut.request = req
        local = server in self.io.local and self.io.same_host(server)
        batching = self._batching
        if local and getattr(batching, "depth", 0) > 0:
            batching.payload = getattr(batching, "payload", 0) + _payload(op)
            with self.lock:           # sent when the batch ends, or holds enough data
                self.tracker.add(req)
            if batching.payload >= BATCH_PAYLOAD:
                batching.payload = 0
                self.send_local()
        elif local:                   # this thread sends (no hand-over to the I/O thread)
            with self.lock:
                if self.tracker.queued:
                    self.tracker.add(req)
                    batches = self.tracker.take(time.monotonic(), self.io.local)
                else:
                    batches = self.tracker.add_now(req, time.monotonic())
            if batches:
                self.io.send(batches, io_thread=False)
        else:
            with self.lock:
                self.tracker.add(req)
                wake, self._woken = not self._woken, True
            if wake:
                os.eventfd_write(self.efd, 1)
        return fut

    def batch(self) -> _Batch:
        """Requests submitted inside go to same-host servers together when it ends (fewer,
        fuller datagrams: one per server rather than one per key part)."""
        return _Batch(self)

    def send_local(self) -> None:
        """Send what waits for same-host servers (the end of a batch)."""
        if self.io.local and self.tracker.queued:
            with self.lock:
                batches = self.tracker.take(time.monotonic(), self.io.local)
            if batches:
                self.io.send(batches, io_thread=False)

    def control(self, cmd: Command, body: Body | None = None) -> Future:
        """Send a message to the scheduler; the future resolves on its answer."""
        self.check()
        req = ControlRequest(cmd, Empty() if body is None else body)
        req.future.request = req
        with self.lock:
            self.control_queue.append(req)
        os.eventfd_write(self.efd, 1)
        return req.future

    def same_host(self, server: int) -> bool:
        """``server`` is reached over this host's shared-memory link."""
        return self.io.same_host(server)

    def count_pulls(self, n: int) -> None:
        """``n`` key parts were pulled from answers their pushes asked for (for the counters)."""
        self.tracker.pulls += n

    def protect(self, guards: list[Any], on: bool) -> None:
        """Hold back pushes of ``guards`` while this thread reads their answers in place (inside
        a batch, what it holds is sent first: those pushes are what the answers wait for)."""
        if on and getattr(self._batching, "depth", 0) > 0:
            self.send_local()
        with self.lock:
            self.tracker.protect(guards, on)

    def resume(self) -> None:
        """This (restarted) worker resumes where its predecessor stopped: its barriers continue
        the predecessor's numbering instead of replaying it."""
        with self.lock:
            self.barriers = max(self.barriers, self.barriers_before)

    def wait(self, fut: Future) -> Ok:
        """Wait for ``fut``; liveness (not a clock) bounds the wait.  An answer from a server
        on this host's link is read by this thread itself.  While it waits, the heartbeats
        say what for (:meth:`waiting`).  Inside a batch, what it holds is sent first."""
        if not fut.done:
            if getattr(self._batching, "depth", 0) > 0:
                self.send_local()
            self.blocked = fut
            try:
                while not fut.done:
                    if self.io.same_host(fut.server):
                        self.io.read_until(fut, 0.5)
                    else:
                        fut._wait(0.5)
                    if self.fatal is not None and not fut.done:
                        raise self.fatal
            finally:
                self.blocked = None
        return fut.wait(0)

    def waiting(self) -> dict[str, Any] | None:
        """What the user's thread waits for, when that is other workers (for the scheduler's
        wait-for graph, psnode.scheduler.loop): a barrier ``{"what": "barrier", "n": 1}``, or a
        pull (or init) parked on its server, ``{"what": "pull", "of": "'w'", "push": 2, "on":
        [0]}`` (psnode.worker.tracker.Tracker.blocked); None while it computes or waits for a server."""
        fut = self.blocked
        req = None if fut is None or fut.done else fut.request
        if isinstance(req, ControlRequest):
            n = req.body.n if isinstance(req.body, Barrier) else None
            if req.cmd is not Command.BARRIER or n is None:
                return None
            with self.lock:   # (a push not known to have arrived may be what the others wait for)
                settled = not self.tracker.journal.servers()
            return {"what": "barrier", "n": n} if settled else None
        if req is None:
            return None
        with self.lock:
            return self.tracker.blocked(req, self.rank)

    def check(self) -> None:
        """Raise the job's failure, or the first error of a request nobody waited for."""
        if self.fatal is not None:
            raise self.fatal
        if self.tracker.deferred:
            with self.lock:
                error = self.tracker.take_deferred()
            if error is not None:
                raise error

    def fail(self, reason: str, restart: bool = False) -> None:
        """Report this worker as failed (e.g. an uncaught exception): the job ends, naming it;
        with ``restart`` the scheduler waits for a replacement with this rank instead."""
        if self.fatal is not None or self.closing or self.failed:
            return
        self.failed = True
        with contextlib.suppress(PSError):
            self.control(Command.BYE, Bye(restart=reason) if restart else Bye(error=reason)).wait(2.0)

    def close(self, timeout: float = 30.0) -> None:
        """Tell the scheduler this worker is done, then stop the I/O thread."""
        if self.closing:
            return
        try:
            if self.fatal is None and not self.failed:
                self.control(Command.FINISH).wait(timeout)
        except PSError:
            pass
        finally:
            self.closing = True
            os.eventfd_write(self.efd, 1)
            self._thread.join(timeout)
            if self.staging is not None:
                self.staging.close()

    @property
    def retries(self) -> int:
        """Requests sent again (lost messages)."""
        return self.tracker.retries

    @property
    def stats(self) -> dict[str, Any]:
        """This worker's counters, sent with every heartbeat (read from any thread)."""
        t = self.tracker
        nbytes = self.io.bytes()
        stats: dict[str, Any] = {"pushes": t.pushes, "pulls": t.pulls, "rounds": t.journal.rounds,
                                 "bytes_in": nbytes[0], "bytes_out": nbytes[1], "retries": t.retries}
        wait = self.waiting()
        if wait is not None:
            stats["wait"] = wait
        return stats

    # ------------------------------------------------------------ I/O thread side
    def settle(self, io_thread: bool = True) -> None:
        """Resolve the futures the tracker decided on (outside the lock: callbacks copy data);
        the I/O thread wakes a thread reading the links, whose answer may be among them."""
        if self.tracker.outcomes:
            with self.lock:
                outcomes, self.tracker.outcomes = self.tracker.outcomes, []
            settle(outcomes)
            if io_thread and self.readers:
                os.eventfd_write(self.notify, 1)

    def read_wake(self) -> None:
        """Drain the eventfd, then re-arm: in the other order a submit between the two would
        leave ``_woken`` set with the eventfd empty, and its wake-up would be lost."""
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self.efd)
        with self.lock:
            self._woken = False

    def die(self, exc: PSError) -> None:
        """The job failed: fail every request, now and later; exit if the user doesn't."""
        self.fatal = exc
        self.welcome.fail(exc)
        with self.lock:
            self.tracker.fail_all(exc)
            for req in self.control_queue:
                req.future.fail(exc)
            self.control_queue.clear()
        self.settle()
        os.eventfd_write(self.notify, 1)
        print(f"psnode worker {self.rank}: {exc}", file=sys.stderr, flush=True)
        threading.Thread(target=self._exit_later, daemon=True).start()

    def _exit_later(self) -> None:
        """A failed job must not leave this process running: exit if the user doesn't."""
        time.sleep(EXIT_GRACE)
        if not self.closing:
            print(f"psnode worker {self.rank}: exiting: the job failed", file=sys.stderr, flush=True)
            os._exit(1)


class _Batch:
    """``with engine.batch():`` (see :meth:`Engine.batch`); nests."""

    __slots__ = ("e",)

    def __init__(self, engine: Engine) -> None:
        self.e = engine

    def __enter__(self) -> None:
        b = self.e._batching
        b.depth = getattr(b, "depth", 0) + 1

    def __exit__(self, *exc: Any) -> None:
        b = self.e._batching
        b.depth -= 1
        if b.depth == 0:
            self.e.send_local()


_AREAS: dict[type, tuple[str, ...]] = {}


def _area_fields(op: Op) -> tuple[str, ...]:
    """The fields of ``op``'s type that may hold a landing area (``dest``, ``rows``)."""
    names = _AREAS.get(type(op))
    if names is None:
        names = _AREAS[type(op)] = tuple(n for n in ("dest", "rows") if hasattr(op, n))
    return names


def _payload(op: Op) -> int:
    data = getattr(op, "data", None)
    return 0 if data is None else int(data.nbytes)


def _releasing(on_reply: Callable[[Ok], None] | None, areas: list[np.ndarray],
               staging: Staging) -> Callable[[Ok], None]:
    """``on_reply``, then the request's landing areas go back to the pool (a failed request's
    areas are dropped instead: its answer might still land)."""
    def done(ans: Ok) -> None:
        try:
            if on_reply is not None:
                on_reply(ans)
        finally:
            for area in areas:
                staging.release(area)
    return done


__all__ = ["EXIT_GRACE", "ControlRequest", "Engine", "Future"]
