"""A server's side of the same-host links (psnode.samehost.link): listen, admit, receive, answer.

:class:`SameHost` owns the server's arena (where its values live, so same-host workers read
them in place), the listening Unix socket, connections still in their handshake, and one
:class:`~psnode.samehost.link.Link` per admitted worker.  It plugs into the server's poll loop:
:meth:`SameHost.on_ready` turns readable sockets into data messages.  It is the one place that
decides which workers are on this host: it tells the server's routes (psnode.server.routes)
when a worker's link is admitted (replies then go over the link: :meth:`SameHost._answer`)
and when it closes.  A refused or broken connection is logged, naming the peer, and closed; it
never stops the server.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import select
import socket
from typing import Any

import numpy as np

from psnode.errors import ProtocolError
from psnode.net.security import Security
from psnode.net.transport import Poller
from psnode.protocol import Message, Ok
from psnode.samehost import handshake as shmhandshake
from psnode.samehost.link import KIND_REPLY, Link
from psnode.samehost.segments import Arena
from psnode.server.replies import Reply, fits, sent
from psnode.server.routes import Routes

log = logging.getLogger("psnode.server")


class SameHost:
    """The server's same-host links (see the module docstring)."""

    def __init__(self, job: str, host: str, port: int, num_workers: int, max_bytes: int,
                 poller: Poller, security: Security, routes: Routes) -> None:
        self.job = job
        self.routes = routes
        self.security = security
        self.num_workers = num_workers
        self.max_bytes = max_bytes
        self.poller = poller
        self.arena = Arena(f"psnode.{job}.s{port}")
        self.listener = shmhandshake.listen(job, host, port)
        poller.add(self.listener.fileno())
        self.pending: dict[int, socket.socket] = {}   # fd -> connection awaiting its HELLO
        self.links: dict[int, Link] = {}              # worker rank -> link
        self._by_fd: dict[int, int] = {}              # link fd -> worker rank
        self.writing: set[int] = set()                # fds watched for writability
        self.dropped = 0
        self._quick = select.poll()                   # the links alone (see :meth:`waiting`)

    @property
    def bytes(self) -> tuple[int, int]:
        return sum(x.bytes_in for x in self.links.values()), sum(x.bytes_out for x in self.links.values())

    def on_ready(self, ready: set[Any]) -> list[tuple[int, Message]]:
        """Admit new connections and receive every waiting data message: [(worker, message)]."""
        out: list[tuple[int, Message]] = []
        if self.listener.fileno() in ready:
            self._accept()
        for fd in [fd for fd in self.pending if fd in ready]:
            self._handshake(fd)
        for fd, worker in list(self._by_fd.items()):
            if fd not in ready:
                continue
            link = self.links[worker]
            try:
                for msg in link.recv(1):   # (the server's poll sees the rest)
                    out.append((worker, msg))
            except ProtocolError as exc:
                self.dropped += 1
                log.warning("dropped a same-host message: %s", exc)
            if fd in self.writing:
                self._flush(fd, link)
            if not link.up:
                log.info("%s closed its same-host link", link.peer)
                self._forget(worker)
        return out

    def waiting(self) -> set[int]:
        """The links with a message waiting now (a poll of the links alone, which costs a
        fraction of the server's full poll: the server asks this after handling link messages,
        since another worker's push of the same round often arrived meanwhile)."""
        return {fd for fd, _ in self._quick.poll(0)} if self._by_fd else set()

    def _accept(self) -> None:
        for _ in range(16):
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("same-host accept failed: %s", exc)
                return
            conn.setblocking(False)
            self.pending[conn.fileno()] = conn
            self.poller.add(conn.fileno())

    def _handshake(self, fd: int) -> None:
        conn = self.pending[fd]
        try:
            got = shmhandshake.welcome(conn, self.job, self.num_workers, self.arena, self.max_bytes,
                                           self.security, self._busy)
        except (ProtocolError, OSError) as exc:
            self.dropped += 1
            log.warning("refused a same-host connection: %s", exc)
            self._drop_pending(fd)
            return
        if got is None:
            return
        worker, link = got
        del self.pending[fd]
        if worker in self.links:          # a restarted worker: its new link replaces the old
            self._forget(worker)
        self.links[worker] = link
        self._by_fd[fd] = worker
        self._quick.register(fd, select.POLLIN)
        self.routes.link_up(worker, functools.partial(self._answer, link))
        log.info("%s joined over the same-host link", link.peer)

    def _busy(self, worker: int) -> bool:
        """Worker ``worker`` has a link whose process still lives (a restarted worker's
        predecessor is dead: its link gives way)."""
        link = self.links.get(worker)
        if link is None or not link.up:
            return False
        try:
            os.kill(link.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def _drop_pending(self, fd: int) -> None:
        conn = self.pending.pop(fd)
        with contextlib.suppress(KeyError, ValueError):
            self.poller.remove(fd)
        conn.close()

    def _forget(self, worker: int) -> None:
        link = self.links.pop(worker)
        self.routes.link_down(worker)
        fd = link.fileno()
        self._by_fd.pop(fd, None)
        self.writing.discard(fd)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._quick.unregister(fd)
        with contextlib.suppress(KeyError, ValueError):
            self.poller.remove(fd)
        link.close()

    def _flush(self, fd: int, link: Link) -> None:
        done = link.flush()
        if done and fd in self.writing:
            self.writing.discard(fd)
            self.poller.watch(fd, write=False)
        elif not done and fd not in self.writing:
            self.writing.add(fd)
            self.poller.watch(fd, write=True)

    def _answer(self, link: Link, replies: list[Reply]) -> list[Reply]:
        """Send a worker its replies over its ``link``: a value the worker may read in place goes
        as a reference to the arena, others are copied into the pull's landing area, small ones
        travel inline.  Returns the replies that must go over TCP (the link broke, or too big)."""
        if not link.up:
            return replies
        answers = []
        for r in replies:
            ans = r.answer
            if isinstance(ans, Ok) and ans.arrays and (r.entry is not None or r.fixed):
                value = ans.arrays[0]
                if not (r.shared and self.arena.locate(value) is not None) and r.dest is not None \
                        and fits(r.dest, value.shape, value.dtype):
                    np.copyto(r.dest, value)
                    ans.arrays = [r.dest]
            answers.append(ans)
        rest = link.send_ops(KIND_REPLY, answers)
        if not rest:
            for r in replies:
                if r.entry is not None:
                    sent(r.entry, None)
            if link.backlog:
                self._flush(link.fileno(), link)
            return rest
        left = {id(a) for a in rest}
        tcp = []
        for r in replies:
            if id(r.answer) in left:
                tcp.append(r)
            elif r.entry is not None:
                sent(r.entry, None)
        if link.backlog:
            self._flush(link.fileno(), link)
        return tcp

    def close(self) -> None:
        for worker in list(self.links):
            self._forget(worker)
        for fd in list(self.pending):
            self._drop_pending(fd)
        self.listener.close()
        self.arena.close()


__all__ = ["SameHost"]
