"""A worker's connection to its job: requests become futures; one I/O thread owns the sockets.

The user's thread (the KVStore API's data path, :mod:`psnode.worker.datapath`) reads once per
call where its arrays go (:attr:`Engine.places`: the servers whose same-host link is up, and
this host's shared memory, as the I/O thread last published them), places them, and hands the
call's operations over in one :meth:`Engine.send` (:class:`~psnode.worker.futures.Placed`: each
typed operation, :mod:`psnode.protocol`, with its server, whether that server is near, its
future and the places of its arrays); the engine sends them as they are, deciding nothing
again.  Each request is queued in the :class:`~psnode.worker.tracker.Tracker`; for a far server
the I/O thread (:mod:`psnode.worker.ioloop`) is woken through an eventfd.  The I/O thread sends queued requests in
priority order, fusing those bound for the same server into one message, within a window of
bytes in flight per server.  Each server is reached through its connection
(:mod:`psnode.worker.connection`, made by the I/O thread; the one place that knows whether a
server is on this host).  A request to a near server is sent by the submitting thread itself
through that connection, and its answer read by the thread that waits for it.  Answers resolve
futures by request id; a future's ``on_reply`` callback (e.g. copying a pulled array into the
caller's ``out``) runs before the future is set.  The engine and its
I/O loop share one :class:`~psnode.worker.state.EngineState` and the connections.

Nothing a worker sent is assumed delivered: the tracker resends what got no answer, keeps
pushes in its journal until a pull after them returns, and names the server when it gives up
(see :mod:`psnode.worker.tracker`).  Control requests to the scheduler (BARRIER, FINISH) are numbered
and sent again until answered.  When the job fails (a peer lost, the scheduler silent or gone)
every pending and later request raises :class:`PeerLost`; if the user's thread does not come
back to psnode within a few seconds (psnode.worker.ioloop.EXIT_GRACE), the process exits with
status 1 so no worker outlives its job.

A restarted worker (``mxdist launch --max-restarts``) learns from its WELCOME how many barriers
its predecessor completed: a script that resumes (``kv.num_pushes`` before its first push, see
:mod:`psnode.worker.kvstore`) continues their numbering; one that starts over replays them, and the
scheduler answers those it already completed at once.
"""
from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from psnode import timeline
from psnode.config import NodeConfig
from psnode.errors import PeerLost, PSError
from psnode.protocol import Command, Init, Ok, Op
from psnode.protocol.control import Barrier, Body, Bye, Counters, Empty, WaitKind, WaitReport
from psnode.samehost.staging import Places, Staging
from psnode.worker.futures import ControlRequest, Future, Notice, Placed
from psnode.worker.ioloop import IoLoop
from psnode.worker.state import EngineState
from psnode.worker.tracker import SLICE_WINDOW, Tracker

BATCH_PAYLOAD = 2 * 2**20      # a batch (``kv.batch()``) leaves once it holds this much data (the
                               # server starts on it while later calls are being copied)


class Engine:
    """Connection of one worker process to its job."""

    def __init__(self, cfg: NodeConfig) -> None:
        self.cfg = cfg
        self.num_servers = cfg.num_servers
        #: up while the job has something for the user's thread (read once per API call)
        self.notice = Notice()
        # sliced arrays: a few slices unanswered per remote server, so that no worker's parts run
        # ahead of the others' on a server (a part's answer waits for every worker's push)
        self.tracker = Tracker(cfg.num_servers, cfg.retry_timeout, cfg.max_retries, address=self._address,
                               first_id=1 + secrets.randbits(60), far_window=SLICE_WINDOW * cfg.slice_bytes,
                               near=self.same_host,
                               replaceable=cfg.register_timeout if cfg.servers_restartable else 0.0,
                               notice=self.notice)
        self.state = EngineState(self.tracker)
        self.failed = False
        self.blocked: Future | None = None     # what the user's thread waits for (Engine.wait)
        self._blocked_since = 0.0              # when it began to wait for it
                                                # its pushes, in waits that ended (Engine.wait)
        self._batching = threading.local()
        self.io = IoLoop(cfg, self.state, lambda: self.stats)
        self.conns = self.io.conns
        # where the arrays of a call's requests go: published by the I/O thread whenever a
        # server is connected or its link taken down (read once per call by the data path)
        self.places: Places = self.conns.places
        self.conns.on_places = self._new_places
        self.links = self.conns.links
        self._thread = threading.Thread(target=self.io.run, name="psnode-io", daemon=True)
        self._thread.start()
        try:  # the I/O thread sets rank, restarts and barriers_before, then resolves it
            self.state.welcome.wait(cfg.register_timeout + 5)
        except PeerLost as exc:
            raise PeerLost(f"could not join job {cfg.job_id} through the scheduler at "
                           f"{cfg.scheduler_address}: {exc}") from None

    def _address(self, server: int) -> str:
        return self.conns.address(server)

    @property
    def rank(self) -> int:
        return self.state.rank

    @property
    def restarts(self) -> int:
        """How many times this worker was restarted (its WELCOME says)."""
        return self.state.restarts

    @property
    def fatal(self) -> PSError | None:
        """The job's failure (or "this KVStore is closed"): every request raises it."""
        return self.state.fatal

    # ------------------------------------------------------------ user side
    def _new_places(self, places: Places) -> None:
        self.places = places

    def same_host(self, server: int) -> bool:
        """``server`` is reached over this host's shared-memory link."""
        return self.conns.is_near(server)

    def submit(self, server: int, op: Op, nbytes: int = 0, priority: int = 0,
               on_reply: Callable[[Ok], None] | None = None, reply: bool = True) -> Future | None:
        """Send one operation whose arrays the caller did not place (they travel as bytes):
        its future, or None with ``reply=False``."""
        placed = Placed(server, op, reply, on_reply, self.same_host(server), nbytes, priority)
        self.send([placed])
        return placed.future

    def send(self, placed: Sequence[Placed]) -> None:
        """Send the operations the data path placed (thread-safe), as they are: those for near
        servers by this thread through their connection (inside :meth:`batch`, when it ends),
        the others by the I/O thread.  A push without a future is answered only if it fails,
        and that error is raised by the next call into the engine."""
        st = self.state
        if st.fatal is not None or self.tracker.deferred:
            self.check()
        staging = self.conns.staging
        payload = 0
        far = False
        for p in placed:
            if p.areas and p.future is not None and staging is not None:
                p.future.on_reply = _releasing(p.future.on_reply, p.areas, staging)
            if p.near:
                payload += _payload(p.op)
            else:
                far = True
        batching = self._batching
        depth = getattr(batching, "depth", 0)
        with st.lock:   # (inside a batch, the near ones are sent when it ends, or holds enough data)
            batches = self.tracker.submit(placed, time.monotonic(), depth > 0, self.links.local)
            wake = far and not st.woken
            if far:
                st.woken = True
        if wake:
            st.wake()
        if batches:
            self.conns.send(batches, io_thread=False)
        elif depth > 0:
            batching.payload = getattr(batching, "payload", 0) + payload
            if batching.payload >= BATCH_PAYLOAD:
                batching.payload = 0
                self.send_local()

    def batch(self) -> _Batch:
        """Requests sent inside go to same-host servers together when it ends (fewer,
        fuller datagrams: one per server rather than one per call)."""
        return _Batch(self)

    def send_local(self) -> None:
        """Send what waits for same-host servers (the end of a batch)."""
        local = self.conns.local
        if local and self.tracker.queued:
            with self.state.lock:
                batches = self.tracker.take(time.monotonic(), local)
            if batches:
                self.conns.send(batches, io_thread=False)

    def control(self, cmd: Command, body: Body | None = None) -> Future:
        """Send a message to the scheduler; the future resolves on its answer."""
        self.check()
        req = ControlRequest(cmd, Empty() if body is None else body)
        req.future.request = req
        with self.state.lock:
            self.state.control_queue.append(req)
        self.state.wake()
        return req.future

    def barrier(self) -> None:
        """Block until every active worker entered this barrier (the scheduler answers)."""
        self.wait(self.control(Command.BARRIER))

    # ------------------------------------------------------------ membership
    @property
    def joiner(self) -> bool:
        """This worker joined the running job (after the first generation)."""
        return self.state.joiner

    @property
    def leaving(self) -> bool:
        """This worker was asked to leave (at its next push)."""
        return self.state.leaving

    def membership(self) -> tuple[int, tuple[int, ...]]:
        """The membership generation and the active workers' ranks, as last heard."""
        st = self.state
        with st.lock:
            return st.generation, st.members

    def membership_changes(self) -> list[tuple[int, tuple[int, ...]]]:
        """The membership changes (generation, members) since the last call, oldest first."""
        st = self.state
        with st.lock:
            changes, st.changes = st.changes, []
            st.lower()
        return changes

    def agreed_members(self) -> tuple[int, tuple[int, ...]]:
        """A barrier, and the membership it completed with: every worker of the barrier gets
        the same (generation, members)."""
        self.barrier()
        st = self.state
        with st.lock:
            agreed = st.agreed
        return agreed if agreed is not None else self.membership()

    def count_pulls(self, n: int) -> None:
        """``n`` key parts were pulled from answers their pushes asked for (for the counters)."""
        self.tracker.pulls += n

    def protect(self, guards: list[Any], on: bool) -> None:
        """Hold back pushes of ``guards`` while this thread reads their answers in place (inside
        a batch, what it holds is sent first: those pushes are what the answers wait for)."""
        if on and getattr(self._batching, "depth", 0) > 0:
            self.send_local()
        with self.state.lock:
            self.tracker.protect(guards, on)

    def resume(self) -> None:
        """This (restarted) worker resumes where its predecessor stopped: its barriers continue
        the predecessor's numbering instead of replaying it."""
        st = self.state
        with st.lock:
            st.barriers = max(st.barriers, st.barriers_before)

    def set_updater(self, updater: Callable[[Any, Any, np.ndarray], None] | None) -> None:
        """Nothing: a job's servers run optimizer specs, never a worker's Python code
        (psnode.worker.kvstore warns about a Python updater on a distributed store)."""

    def wait(self, fut: Future) -> Ok:
        """Wait for ``fut``; liveness (not a clock) bounds the wait.  An answer from a server
        on this host's link is read by this thread itself.  While it waits, the heartbeats
        say what for (:meth:`waiting`).  Inside a batch, what it holds is sent first."""
        if not fut.done:
            if getattr(self._batching, "depth", 0) > 0:
                self.send_local()
            self._blocked_since = time.monotonic()
            self.blocked = fut
            try:
                while not fut.done:
                    self.conns.wait(fut, 0.5)   # (reads the link, if its server has one up)
                    fatal = self.state.fatal
                    if fatal is not None and not fut.done:
                        raise fatal
            finally:
                self.blocked = None
                tl = timeline.current
                if tl is not None:
                    req = fut.request
                    what = "barrier-wait" if isinstance(req, ControlRequest) else \
                        "init-wait" if isinstance(getattr(req, "op", None), Init) else "pull-wait"
                    tl.wait(what, tl.now() - int((time.monotonic() - self._blocked_since) * 1e9),
                            getattr(req, "blockers", ()))
        return fut.wait(0)

    def waiting(self) -> WaitReport | None:
        """What the user's thread waits for, when that is other workers (for the scheduler's
        wait-for graph, psnode.scheduler.loop): a barrier, or a pull (or init) parked on its
        server (psnode.worker.tracker.Tracker.blocked), with the seconds it has waited; None
        while it computes or waits for a server."""
        fut = self.blocked
        since = self._blocked_since
        req = None if fut is None or fut.done else fut.request
        if isinstance(req, ControlRequest):
            n = req.body.n if isinstance(req.body, Barrier) else None
            if req.cmd is not Command.BARRIER or n is None:
                return None
            with self.state.lock:   # (a push not known to have arrived may be what the others wait for)
                settled = not self.tracker.journal.servers()
            return WaitReport(WaitKind.BARRIER, n=n, waited=time.monotonic() - since) if settled else None
        if req is None:
            return None
        with self.state.lock:
            wait = self.tracker.blocked(req, self.rank)
        return None if wait is None else replace(wait, waited=time.monotonic() - since)

    def check(self) -> None:
        """Raise the job's failure, or the first error of a request nobody waited for."""
        fatal = self.state.fatal
        if fatal is not None:
            raise fatal
        if self.tracker.deferred:
            with self.state.lock:
                error = self.tracker.take_deferred()
                self.state.lower()
            if error is not None:
                raise error

    def fail(self, reason: str, restart: bool = False) -> None:
        """Report this worker as failed (e.g. an uncaught exception): the job ends, naming it;
        with ``restart`` the scheduler waits for a replacement with this rank instead."""
        if self.state.fatal is not None or self.state.closing or self.failed:
            return
        self.failed = True
        with contextlib.suppress(PSError):
            self.control(Command.BYE, Bye(restart=reason) if restart else Bye(error=reason)).wait(2.0)

    def close(self, timeout: float = 30.0) -> None:
        """Tell the scheduler this worker is done, then stop the I/O thread."""
        st = self.state
        if st.closing:
            return
        try:
            if st.fatal is None and not self.failed:
                self.control(Command.FINISH).wait(timeout)
        except PSError:
            pass
        finally:
            st.closing = True
            st.wake()
            self._thread.join(timeout)
            if self.conns.staging is not None:
                self.conns.staging.close()

    @property
    def retries(self) -> int:
        """Requests sent again (lost messages)."""
        return self.tracker.retries

    @property
    def stats(self) -> Counters:
        """This worker's counters, sent with every heartbeat (read from any thread)."""
        t = self.tracker
        nbytes = self.io.bytes()
        return Counters(pushes=t.pushes, pulls=t.pulls, rounds=t.journal.rounds, bytes_in=nbytes[0],
                        bytes_out=nbytes[1], retries=t.retries, wait=self.waiting(),
                        loop_gap_us=self.io.gaps.longest_us(time.monotonic()))


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


def _payload(op: Op) -> int:
    data = getattr(op, "data", None)
    return 0 if data is None else int(data.nbytes)


def _releasing(on_reply: Callable[[Ok], None] | None, areas: Sequence[np.ndarray],
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


__all__ = ["ControlRequest", "Engine", "Future"]
