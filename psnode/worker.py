"""The worker's I/O engine: one thread owns every socket; requests become futures.

The user's thread (the KVStore API) calls :meth:`Engine.submit` with an operation for one
server; the request goes into a priority queue (higher ``priority`` first, then submission
order) and the I/O thread is woken through an eventfd.  The I/O thread sends queued requests
in that order, fusing requests bound for the same server into one message, within a window of
bytes in flight per server (so a later high-priority request overtakes queued low-priority
ones).  Replies resolve futures by request id; a reply's ``on_reply`` callback (e.g. copying a
pulled array into the caller's ``out``) runs in the I/O thread before the future is set.

Nothing a worker sent is assumed delivered (a connection can break and lose messages):

* a request with no answer within ``retry_timeout`` is sent again with ``re`` (servers apply
  it once: pushes carry sequence numbers, the other operations are idempotent, and a pull still
  parked is answered ``wait``, which restarts the clock); after ``max_retries`` resends without a
  sign of life it fails with :class:`PeerLost` naming the server;
* pushes (sent without acknowledgement) stay in a :class:`psnode.journal.PushJournal` (the
  last ``JOURNAL_DEPTH`` per key part) until a pull after them returns; a
  resent pull still parked is answered ``wait`` with the ``gap`` (a push of ours the server never
  received, which is then resent), and a ``flush`` (``kv.wait_all``, barrier, close) lists them
  so the server names any it never received;
* when a server is replaced (SERVERS ``restored``), the worker reconnects, sends ``resync`` (its
  last confirmed push per key part on that server), then its journal and every unanswered
  request; while the scheduler reports the server down, its requests wait without retries.

Control requests to the scheduler (BARRIER, FINISH) are numbered and sent again every
``retry_timeout`` until answered.  The I/O thread also registers with the scheduler,
heartbeats, and watches the scheduler's liveness.  When the job fails (a peer lost, the
scheduler silent or gone) every pending and later request raises :class:`PeerLost`; if the
user's thread does not come back to psnode within a few seconds, the process exits with
status 1 so no worker outlives its job.
"""
from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from psnode import errors
from psnode.config import NodeConfig
from psnode.errors import PeerLost, PSError
from psnode.journal import Op, Pending, PushJournal
from psnode.link import SchedulerLink, lost_message
from psnode.protocol import Command, Message
from psnode.security import Security
from psnode.transport import Channel, Poller, Transport

log = logging.getLogger("psnode.worker")

WINDOW_BYTES = 64 * 2**20      # bytes in flight per server before requests wait in the queue
BATCH_BYTES = 512 * 2**10      # fuse small requests up to this size per message
BATCH_OPS = 512
EXIT_GRACE = 5.0               # seconds the user's thread has to notice a failed job
JOURNAL_DEPTH = 2              # unconfirmed pushes kept per key part for resending

ERRORS: dict[str, type[PSError]] = {
    "KeyNotInitialized": errors.KeyNotInitialized, "ShapeMismatch": errors.ShapeMismatch,
    "ConfigError": errors.ConfigError, "ProtocolError": errors.ProtocolError,
}


class Future:
    """The outcome of one request; ``wait`` raises the request's error.

    Resolved once, by one thread (the I/O thread; a second ``set``/``fail`` is ignored).  A
    lock held until then is cheaper than a threading.Event (one per request)."""

    __slots__ = ("_done", "_lock", "arrays", "error", "on_reply", "result")

    def __init__(self, on_reply: Callable[[dict[str, Any], list[np.ndarray]], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()  # released when resolved
        self._done = False
        self.result: dict[str, Any] = {}
        self.arrays: list[np.ndarray] = []
        self.error: BaseException | None = None
        self.on_reply = on_reply

    def set(self, result: dict[str, Any], arrays: list[np.ndarray]) -> None:
        if self._done:
            return
        try:
            if self.on_reply is not None:
                self.on_reply(result, arrays)
            self.result, self.arrays = result, arrays
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

    def wait(self, timeout: float | None = None) -> dict[str, Any]:
        if not self._wait(timeout):
            raise PeerLost(f"no answer within {timeout:g} s")
        if self.error is not None:
            raise self.error
        return self.result


@dataclass
class _Request:
    server: int
    op: dict[str, Any]
    arrays: list[np.ndarray]
    nbytes: int          # bytes this request will bring back (pulls); 0: not windowed
    future: Future | None  # None: fire and forget (a push); errors still come back


def _placed(op: dict[str, Any], base: int) -> dict[str, Any]:
    """A copy of ``op`` whose array indices count from ``base`` (its arrays follow others')."""
    op = dict(op)
    for name in ("a", "rows"):
        if name in op:
            op[name] += base
    return op


class Engine:
    """Connection of one worker process to its job."""

    def __init__(self, cfg: NodeConfig) -> None:
        self.cfg = cfg
        self.rank = -1
        self.num_servers = cfg.num_servers
        self.fatal: PSError | None = None
        self._ids = itertools.count(1)
        self._order = itertools.count()
        self._lock = threading.Lock()
        self._queue: list[tuple[int, int, _Request]] = []  # (-priority, order, request)
        self._woken = False
        self._deferred: list[PSError] = []  # errors of requests nobody waits for (pushes)
        self._control: deque[tuple[Command, dict[str, Any], Future]] = deque()
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._welcome = Future()
        self._closing = False
        self._failed = False
        self._channels: list[Channel] = []  # the I/O thread's server channels (counters only)
        self._journal = PushJournal(JOURNAL_DEPTH)  # pushes sent, not yet known applied
        self._down: set[int] = set()       # servers the scheduler reports down (being replaced)
        self._next_scan = 0.0
        self._next_ctrl = 0.0
        self._barriers = 0                 # barriers this worker entered (numbers them)
        self.retries = 0                   # requests sent again (lost messages)
        self._thread = threading.Thread(target=self._run, name="psnode-io", daemon=True)
        self._thread.start()
        try:
            body = self._welcome.wait(cfg.register_timeout + 5)
        except PeerLost as exc:
            raise PeerLost(f"could not join job {cfg.job_id} through the scheduler at "
                           f"{cfg.scheduler_address}: {exc}") from None
        self.rank = int(body["rank"])
        self.restarts = int(body.get("restarts", 0))

    # ------------------------------------------------------------ user side
    def submit(self, server: int, op: dict[str, Any], arrays: list[np.ndarray], nbytes: int,
               priority: int = 0, on_reply: Callable[..., None] | None = None,
               reply: bool = True) -> Future | None:
        """Queue one operation for ``server`` (thread-safe).

        Returns its future, or None with ``reply=False``: the server then answers only if the
        operation fails, and that error is raised by the next call into the engine.
        """
        self.check()
        fut = Future(on_reply) if reply else None
        op["id"] = next(self._ids)
        if not reply:
            op["na"] = 1
        req = _Request(server, op, arrays, nbytes, fut)
        with self._lock:
            heapq.heappush(self._queue, (-priority, next(self._order), req))
            wake, self._woken = not self._woken, True
        if wake:
            os.eventfd_write(self._efd, 1)
        return fut

    def control(self, cmd: Command, body: dict[str, Any] | None = None) -> Future:
        """Send a message to the scheduler; the future resolves on its answer."""
        self.check()
        fut = Future()
        with self._lock:
            self._control.append((cmd, body or {}, fut))
        os.eventfd_write(self._efd, 1)
        return fut

    def wait(self, fut: Future) -> dict[str, Any]:
        """Wait for ``fut``; liveness (not a clock) bounds the wait."""
        while not fut.done:
            fut._wait(0.5)
            if self.fatal is not None and not fut.done:
                raise self.fatal
        return fut.wait(0)

    def check(self) -> None:
        """Raise the job's failure, or the first error of a request nobody waited for."""
        if self.fatal is not None:
            raise self.fatal
        if self._deferred:
            with self._lock:
                errors_, self._deferred = self._deferred, []
            raise errors_[0]

    def fail(self, reason: str, restart: bool = False) -> None:
        """Report this worker as failed (e.g. an uncaught exception): the job ends, naming it;
        with ``restart`` the scheduler waits for a replacement with this rank instead."""
        if self.fatal is not None or self._closing or self._failed:
            return
        self._failed = True
        with contextlib.suppress(PSError):
            self.control(Command.BYE, {"restart": reason} if restart else {"error": reason}).wait(2.0)

    def close(self, timeout: float = 30.0) -> None:
        """Tell the scheduler this worker is done, then stop the I/O thread."""
        if self._closing:
            return
        try:
            if self.fatal is None and not self._failed:
                fut = self.control(Command.FINISH)
                fut.wait(timeout)
        except PSError:
            pass
        finally:
            self._closing = True
            os.eventfd_write(self._efd, 1)
            self._thread.join(timeout)

    # ------------------------------------------------------------ I/O thread
    def _run(self) -> None:
        t = Transport(self.cfg.job_id, "worker", self.cfg.max_message_bytes, Security.load(self.cfg.key_file))
        servers: list[Channel] = self._channels
        inflight: list[int] = []
        pending: dict[int, Pending] = {}  # request id -> request waiting for its answer
        # control requests to the scheduler awaiting their answer: (command, n) -> (future, body,
        # sent); sent again every retry_timeout (the scheduler answers duplicates, applies once)
        ctrl: dict[tuple[Command, int], list[Any]] = {}
        try:
            link = SchedulerLink(t, self.cfg, "worker", 0, lambda: self.stats)
            poller = Poller()
            poller.add(self._efd)
            poller.add(link.chan)
            sched = link.chan.sock
            while not self._closing:
                now = time.monotonic()
                link.tick(now)
                ready = poller.poll(link.timeout(now))
                if self._efd in ready:
                    self._read_wake()
                if sched in ready:
                    while (msg := link.recv()) is not None:
                        if msg.cmd is Command.WELCOME and not servers:
                            self.rank = int(msg.body["rank"])
                            t.sender = f"worker:{self.rank}"
                            for _, host, port in msg.body["servers"]:
                                ch = t.dealer(host, int(port), f"w{self.rank}")
                                servers.append(ch)
                                inflight.append(0)
                                poller.add(ch)
                            self._welcome.set(msg.body, [])
                        elif msg.cmd is Command.BARRIER_DONE:
                            done = msg.body.get("n")
                            for key in [k for k in ctrl if k[0] is Command.BARRIER
                                        and (not isinstance(done, int) or k[1] <= done)]:
                                ctrl.pop(key)[0].set({}, [])
                        elif msg.cmd is Command.FINISH_ACK and (Command.FINISH, 0) in ctrl:
                            ctrl.pop((Command.FINISH, 0))[0].set({}, [])
                        elif msg.cmd is Command.SERVERS:
                            self._on_servers(msg.body, t, poller, servers, pending)
                        elif msg.cmd in (Command.PEER_LOST, Command.SHUTDOWN):
                            raise PeerLost(f"job {self.cfg.job_id} ended: {lost_message(msg)}")
                for i, ch in enumerate(servers):
                    if ch.sock in ready:
                        self._on_replies(ch, i, pending, inflight)
                with self._lock:
                    control = list(self._control)
                    self._control.clear()
                for cmd, body, fut in control:
                    if cmd is Command.BARRIER:
                        self._barriers += 1
                        body["n"] = self._barriers
                    link.chan.send(cmd, body)
                    if cmd is Command.BYE:
                        fut.set({}, [])
                    else:
                        ctrl[(cmd, body.get("n", 0))] = [fut, body, now]
                if ctrl and now >= self._next_ctrl:
                    self._next_ctrl = now + max(0.02, self.cfg.retry_timeout / 4)
                    self._resend_control(link, ctrl, now)
                if servers:
                    self._flush(servers, inflight, pending)
                    if pending and now >= self._next_scan:
                        self._next_scan = now + max(0.02, self.cfg.retry_timeout / 4)
                        self._retry(now, servers, inflight, pending)
        except PSError as exc:
            self._die(exc, pending, [e[0] for e in ctrl.values()])
        except Exception as exc:  # noqa: BLE001 - never let the I/O thread vanish silently
            self._die(PSError(f"psnode I/O thread failed: {exc!r}"), pending, [e[0] for e in ctrl.values()])
        finally:
            t.close(linger_ms=500 if self.fatal is None else 0)
            if self.fatal is None:
                self.fatal = PSError("this KVStore is closed")
            for p in pending.values():
                p.future.fail(self.fatal)

    @property
    def stats(self) -> dict[str, int]:
        """Bytes this worker sent to and received from servers (read from any thread)."""
        chans = list(self._channels)
        return {"bytes_in": sum(c.bytes_in for c in chans), "bytes_out": sum(c.bytes_out for c in chans),
                "retries": self.retries}

    def _read_wake(self) -> None:
        """Drain the eventfd, then re-arm: in the other order a submit between the two would
        leave ``_woken`` set with the eventfd empty, and its wake-up would be lost."""
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self._efd)
        with self._lock:
            self._woken = False

    def _die(self, exc: PSError, pending: dict[int, Pending], *waiters: Any) -> None:
        self.fatal = exc
        self._welcome.fail(exc)
        for p in pending.values():
            p.future.fail(exc)
        for group in waiters:
            for fut in group:
                fut.fail(exc)
        with self._lock:
            for *_, req in self._queue:  # (-priority, order, request) entries
                if req.future is not None:
                    req.future.fail(exc)
            self._queue.clear()
            for *_, fut in self._control:
                fut.fail(exc)
        print(f"psnode worker {self.rank}: {exc}", file=sys.stderr, flush=True)
        threading.Thread(target=self._exit_later, daemon=True).start()

    def _exit_later(self) -> None:
        """A failed job must not leave this process running: exit if the user doesn't."""
        time.sleep(EXIT_GRACE)
        if not self._closing:
            print(f"psnode worker {self.rank}: exiting: the job failed", file=sys.stderr, flush=True)
            os._exit(1)

    def _on_replies(self, ch: Channel, server: int, pending: dict[int, Pending],
                    inflight: list[int]) -> None:
        while (got := ch.recv()) is not None:
            msg: Message = got[1]
            if msg.cmd is not Command.DATA_REPLY or not isinstance(msg.body.get("ops"), list):
                continue
            for res in msg.body["ops"]:
                if not isinstance(res, dict):
                    continue
                rid = res.get("id")
                if "wait" in res or "missing" in res:
                    self._on_notice(rid, res, server, pending, inflight)
                    continue
                entry = pending.pop(rid, None) if isinstance(rid, int) else None
                error = None
                if "err" in res:
                    cls = ERRORS.get(str(res.get("kind")), errors.RemoteError)
                    error = cls(f"server {server}: {res['err']}")
                if entry is None:
                    if error is not None and res.get("na"):  # a fire-and-forget request failed
                        with self._lock:
                            self._deferred.append(error)
                    continue  # (or a second answer to a request sent again)
                fut = entry.future
                inflight[entry.server] -= entry.nbytes
                if error is not None:
                    fut.fail(error)
                    continue
                if entry.op.get("op") == "pull":
                    self._journal.confirm(PushJournal.key_of(entry.op), int(entry.op.get("after", 0)))
                idx = res.get("a")
                count = res.get("n", 1)
                arrays = msg.arrays[idx:idx + count] if isinstance(idx, int) and isinstance(count, int) else []
                fut.set(res, arrays)

    def _flush(self, servers: list[Channel], inflight: list[int],
               pending: dict[int, Pending]) -> None:
        with self._lock:
            if not self._queue:
                return
            ready: list[_Request] = []
            held: list[tuple[int, int, _Request]] = []
            while self._queue:
                item = heapq.heappop(self._queue)
                req = item[2]
                s = req.server
                if req.nbytes and inflight[s] > 0 and inflight[s] + req.nbytes > WINDOW_BYTES:
                    held.append(item)  # a big pull waits; pushes never do (no deadlock)
                    continue
                inflight[s] += req.nbytes
                ready.append(req)
            for item in held:
                heapq.heappush(self._queue, item)
        batches: dict[int, tuple[list[dict[str, Any]], list[np.ndarray], list[int]]] = {}
        for req in ready:
            ops, arrays, size = batches.setdefault(req.server, ([], [], [0]))
            op = _placed(req.op, len(arrays))
            ops.append(op)
            arrays.extend(req.arrays)
            size[0] += sum(a.nbytes for a in req.arrays)
            if req.future is not None:
                pending[op["id"]] = Pending(req.future, req.server, req.nbytes, req.op, req.arrays,
                                             time.monotonic())
            if req.op.get("op") == "push":
                self._journal.remember(req.server, req.op, req.arrays)
            elif req.op.get("op") == "flush":
                req.op["check"] = self._journal.check_list(req.server)
                op["check"] = req.op["check"]
            if size[0] >= BATCH_BYTES or len(ops) >= BATCH_OPS:
                servers[req.server].send(Command.DATA, {"ops": ops}, arrays)
                del batches[req.server]
        for server, (ops, arrays, _) in batches.items():
            servers[server].send(Command.DATA, {"ops": ops}, arrays)

    # ------------------------------------------------------------ lost messages, restored servers
    def _on_notice(self, rid: Any, res: dict[str, Any], server: int, pending: dict[int, Pending],
                   inflight: list[int]) -> None:
        """``wait``: the server holds the request (alive, nothing lost); with ``gap``, the pull
        waits for a push of ours the server never received: resend it, or fail if the journal no
        longer has it.  ``missing``: a flush found pushes the server never received: send them,
        then the flush again."""
        entry = pending.get(rid)
        if entry is None:
            return
        entry.sent, entry.tries = time.monotonic(), 0
        gap = res.get("gap")
        if isinstance(gap, int) and entry.op.get("op") == "pull":
            key = PushJournal.key_of(entry.op)
            if self._journal.holds(key, gap):
                self.retries += 1
                self._send_batch(server, self._journal.replay(server, {key: {gap}}))
                return
            del pending[rid]
            inflight[entry.server] -= entry.nbytes
            entry.future.fail(PeerLost(
                f"push {gap} of key {key[0]!r} to server {server} was lost and can no longer be sent "
                f"again (more than {JOURNAL_DEPTH} pushes of that key without a pull in between)"))
            return
        if "missing" in res:
            wanted: dict[tuple[Any, int], set[int]] = {}
            for item in res["missing"] if isinstance(res["missing"], list) else []:
                if isinstance(item, list) and len(item) == 3 and isinstance(item[2], list):
                    wanted[(item[0], int(item[1]))] = {int(q) for q in item[2]}
            batch = self._journal.replay(server, wanted)
            entry.op["check"] = self._journal.check_list(server)
            batch.append(({**entry.op, "re": 1}, entry.arrays))
            self.retries += len(batch) - 1
            self._send_batch(server, batch)

    def _send_batch(self, server: int, batch: list[Op]) -> None:
        ops: list[dict[str, Any]] = []
        arrays: list[np.ndarray] = []
        for op, arrs in batch:
            ops.append(_placed(op, len(arrays)))
            arrays.extend(arrs)
        self._channels[server].send(Command.DATA, {"ops": ops}, arrays)

    def _resend_control(self, link: SchedulerLink, ctrl: dict[tuple[Command, int], list[Any]],
                        now: float) -> None:
        """Send BARRIER/FINISH again when unanswered for ``retry_timeout`` (lost on the way, or
        still waiting: the scheduler answers a repeat and never counts it twice)."""
        for (cmd, _), entry in ctrl.items():
            if now - entry[2] >= self.cfg.retry_timeout:
                link.chan.send(cmd, entry[1])
                entry[2] = now

    def _retry(self, now: float, servers: list[Channel], inflight: list[int],
               pending: dict[int, Pending]) -> None:
        """Send again what got no answer in time; give up after ``max_retries`` resends."""
        limit = self.cfg.retry_timeout
        resend: dict[int, list[Op]] = {}
        for rid, p in list(pending.items()):
            if p.server in self._down or now - p.sent < limit:
                continue
            if p.tries >= self.cfg.max_retries:
                del pending[rid]
                inflight[p.server] -= p.nbytes
                what = p.op.get("op", "request") + (f" of key {p.op['k']!r}" if "k" in p.op else "")
                p.future.fail(PeerLost(
                    f"server {p.server} at {servers[p.server].address} did not answer the {what} "
                    f"(request {rid}) after {p.tries} resends over {p.tries * limit + limit:.1f} s; "
                    "the server is dead or unreachable from this worker"))
                continue
            p.tries += 1
            p.sent = now
            # a pull goes again alone: if it waits for a push of ours the server never got, the
            # server's "wait" names that gap and only that push is sent again (_on_notice)
            resend.setdefault(p.server, []).append(({**p.op, "re": 1}, p.arrays))
        for server, batch in resend.items():
            self.retries += len(batch)
            log.warning("worker %d: %d request(s) to server %d got no answer in %.1f s; sending again",
                        self.rank, len(batch), server, limit)
            self._send_batch(server, batch)

    def _on_servers(self, body: dict[str, Any], t: Transport, poller: Poller, servers: list[Channel],
                    pending: dict[int, Pending]) -> None:
        """A server is down (its requests wait) or was replaced (reconnect, resync, resend)."""
        if isinstance(body.get("down"), int):
            self._down.add(body["down"])
            log.warning("worker %d: server %d is down; waiting for its replacement", self.rank, body["down"])
            return
        rank = body.get("restored")
        book = body.get("servers")
        if not isinstance(rank, int) or not isinstance(book, list) or not 0 <= rank < len(servers):
            return
        row = next((r for r in book if isinstance(r, list) and len(r) == 3 and r[0] == rank), None)
        if row is None:
            return
        old = servers[rank]
        poller.remove(old)
        old.close()
        ch = t.dealer(str(row[1]), int(row[2]), f"w{self.rank}")
        ch.bytes_in, ch.bytes_out = old.bytes_in, old.bytes_out
        servers[rank] = ch
        poller.add(ch)
        self._down.discard(rank)
        parts = self._journal.resync_parts(rank)
        ch.send(Command.DATA, {"ops": [{"op": "resync", "id": 0, "parts": parts}]})
        batch = self._journal.replay(rank)
        now = time.monotonic()
        for rid in sorted(pending):
            p = pending[rid]
            if p.server == rank:
                p.sent, p.tries = now, 0
                batch.append(({**p.op, "re": 1}, p.arrays))
        log.warning("worker %d: server %d restarted at %s:%s; resending %d request(s)",
                    self.rank, rank, row[1], row[2], len(batch))
        if batch:
            self._send_batch(rank, batch)
