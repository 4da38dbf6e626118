"""The worker's same-host links (psnode.samehost.link), as its I/O loop uses them: open, read, close.

:class:`SameHostLinks` is the part of :class:`psnode.worker.ioloop.IoLoop` that deals with the links
to servers on this host: :meth:`~SameHostLinks.connect` opens one after the WELCOME (or a
server's restart), :meth:`~SameHostLinks.read_until` lets the thread waiting for an answer read
the links itself (one reader at a time: the engine's ``reader`` lock; no hand-over to the I/O
thread), :meth:`~SameHostLinks.tend_links` lets the I/O thread drain what nobody waited for,
flush backlogs and take down links that closed (:meth:`~SameHostLinks.link_down`: their server
is then served over TCP, the tracker's retries resend what was in flight).
"""
from __future__ import annotations

import contextlib
import logging
import os
import select
import time
from typing import TYPE_CHECKING, Any

from psnode.config import NodeConfig
from psnode.errors import ProtocolError
from psnode.net.transport import Transport
from psnode.protocol import Message
from psnode.samehost import handshake as shmhandshake
from psnode.samehost.link import Link

if TYPE_CHECKING:
    from psnode.worker.engine import Engine

log = logging.getLogger("psnode.worker")


class SameHostLinks:
    """Same-host link handling of the worker's I/O loop (see the module docstring)."""

    e: Engine
    cfg: NodeConfig
    t: Transport | None
    links: list[Link | None]
    local: set[int]
    _links_version: int
    _poll_key: int
    _poll: Any
    _poll_links: dict[int, tuple[int, Link]]

    def answered(self, server: int, msg: Message, io_thread: bool) -> None:
        raise NotImplementedError

    def connect(self, server: int, host: str, port: int) -> None:
        """Open the same-host link to ``server`` when it runs on this host."""
        e = self.e
        if e.staging is None or host != self.cfg.host or self.t is None:
            return
        try:
            link = shmhandshake.connect(self.cfg.job_id, e.rank, server, host, port, e.staging.out,
                                        e.staging.landing, self.cfg.max_message_bytes, self.t.security)
        except (ProtocolError, OSError) as exc:
            log.warning("worker %d: no same-host link to server %d (%s); using TCP", e.rank, server, exc)
            return
        if link is not None:
            self.links[server] = link
            self.local.add(server)
            self._links_version += 1

    def link_down(self, server: int) -> None:
        link = self.links[server]
        if link is None:
            return
        self.local.discard(server)
        self.links[server] = None
        self._links_version += 1
        with self.e.reader, link.send_lock:
            link.close()
        busy = any(p.request.server == server for p in self.e.tracker.pending.values())
        (log.warning if busy else log.info)(
            "worker %d: the same-host link to server %d closed; using TCP", self.e.rank, server)

    def tend_links(self) -> None:
        """(I/O thread) Drain what arrived while nobody was reading, flush backlogs, take down
        links that closed."""
        e = self.e
        if e.reader.acquire(blocking=False):
            try:
                for server in list(self.local):
                    link = self.links[server]
                    if link is not None:
                        self.read_link(server, link, io_thread=True)
            finally:
                e.reader.release()
        for server in list(self.local):
            link = self.links[server]
            if link is not None and link.backlog:
                link.flush()
            if link is None or not link.up:
                self.link_down(server)

    def read_link(self, server: int, link: Link, io_thread: bool, limit: int = 0) -> None:
        """Handle every answer waiting on ``link`` (the first ``limit``, if given; the caller
        holds the reader lock)."""
        try:
            for msg in link.recv(limit):
                self.answered(server, msg, io_thread)
        except ProtocolError as exc:
            log.warning("worker %d: dropped a message: %s", self.e.rank, exc)

    def read_until(self, fut: Any, budget: float) -> None:
        """(A waiting thread) Read the same-host links until ``fut`` is resolved or ``budget``
        seconds passed; if another thread reads them, wait for the future meanwhile."""
        e = self.e
        if not e.reader.acquire(blocking=False) and not e.reader.acquire(timeout=0.05):
            fut._wait(0.05)
            return
        e.readers += 1
        try:
            key = self._links_version
            if self._poll_key != key:   # (rebuilt only when the set of links changed)
                self._poll, self._poll_links = select.poll(), {}
                for server in sorted(self.local):
                    link = self.links[server]
                    if link is not None and link.up:
                        self._poll_links[link.fileno()] = (server, link)
                        self._poll.register(link.fileno(), select.POLLIN)
                self._poll.register(e.notify, select.POLLIN)
                self._poll_key = key
            poll, links = self._poll, self._poll_links
            deadline = time.monotonic() + budget
            while not fut.done and e.fatal is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                backlog = any(link.backlog for _, link in links.values())
                for fd, _ in poll.poll(1 if backlog else int(left * 1000) + 1):
                    if fd == e.notify:
                        with contextlib.suppress(BlockingIOError):
                            os.eventfd_read(e.notify)
                    else:
                        server, link = links[fd]
                        self.read_link(server, link, io_thread=False, limit=1)   # (the poll sees the rest)
                        if not link.up:
                            return   # (the I/O thread takes it down; the request goes again by TCP)
                if backlog:
                    for _, link in links.values():
                        link.flush()
        finally:
            e.readers -= 1
            e.reader.release()


__all__ = ["SameHostLinks"]
