"""Reading the worker's same-host links (psnode.samehost.link), all of them together.

:class:`SameHostLinks` holds a link per server on this host, given to it
(:meth:`~SameHostLinks.add`) by the connection that opened it (psnode.worker.connection: the one
place that decides whether a server is on this host); it decides nothing about routing and
shares no state with the engine: it is told the worker's rank and whether the job failed.

Reading: the thread waiting for an answer reads the links itself
(:meth:`~SameHostLinks.read_until`; one reader at a time, ``reader``; no hand-over to the I/O
thread), and the I/O thread, each turn, drains what nobody waited for and flushes backlogs
(:meth:`~SameHostLinks.tend`).  Every answer read goes to ``on_answer(server, message,
io_thread)``.  A thread that resolved futures while another reads calls
:meth:`~SameHostLinks.wake_readers`.  A link that closed is taken down
(:meth:`~SameHostLinks.take_down`); its server is then served over TCP.  Taking one down closes
it under the reader lock (no thread polls a closed descriptor): the I/O thread wakes the reader,
which leaves, and no thread takes the reader's place again until the link is down, so the
I/O thread is never kept waiting by a thread that waits on and on.
"""
from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
import time
from collections.abc import Callable, KeysView
from typing import Any

from psnode.config import NodeConfig
from psnode.errors import ProtocolError
from psnode.protocol import Message
from psnode.samehost.link import Link
from psnode.worker.futures import Future

log = logging.getLogger("psnode.worker")

OnAnswer = Callable[[int, Message, bool], None]   # (server, message, read by the I/O thread)


class SameHostLinks:
    """A worker's links to the servers on its host (see the module docstring)."""

    def __init__(self, cfg: NodeConfig, on_answer: OnAnswer, rank: Callable[[], int],
                 failed: Callable[[], bool]) -> None:
        self.cfg = cfg
        self._rank = rank                       # this worker's rank (known after the WELCOME)
        self._failed = failed                   # the job failed: readers stop
        self.on_answer = on_answer
        self.links: dict[int, Link] = {}        # server -> its link (up, or closed and not taken down yet)
        self._all: tuple[tuple[int, Link], ...] = ()   # its items, for other threads (replaced, never changed)
        self.local: KeysView[int] = self.links.keys()   # the servers with a link (a live view)
        self.reader = threading.Lock()          # held by the thread reading the links
        self.readers = 0                        # threads in read_until
        self.downs = 0                          # links being taken down (readers keep out meanwhile)
        self.notify = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)   # wakes a reader
        self._version = 0                       # changes when a link comes or goes
        self._poll_key = -1                     # the version the reader's poll set is of
        self._poll: Any = None
        self._poll_links: dict[int, tuple[int, Link]] = {}

    # ------------------------------------------------------------ coming and going
    @property
    def rank(self) -> int:
        return self._rank()

    def add(self, server: int, link: Link) -> None:
        """(I/O thread) Read ``link``, the same-host link to ``server``
        (psnode.worker.connection opened it)."""
        self.links[server] = link
        self._changed()

    def log_no_link(self, server: int, exc: Exception) -> None:
        log.warning("worker %d: no same-host link to server %d (%s); using TCP", self._rank(), server, exc)

    def take_down(self, server: int) -> bool:
        """Close and forget the link to ``server``; False when there was none."""
        link = self.links.pop(server, None)
        if link is None:
            return False
        self._changed()
        self.downs += 1
        try:
            self.wake_readers(always=True)   # (a reader in its poll leaves: see read_until)
            with self.reader, link.send_lock:
                link.close()
        finally:
            self.downs -= 1
        return True

    def _changed(self) -> None:
        self._version += 1
        self._all = tuple(self.links.items())

    def close(self) -> None:
        """Close every link (the I/O thread ends)."""
        for link in self.links.values():
            link.close()

    def bytes(self) -> tuple[int, int]:
        """Bytes read and written over the links now up or closing."""
        links = list(self.links.values())
        return sum(x.bytes_in for x in links), sum(x.bytes_out for x in links)

    # ------------------------------------------------------------ reading
    def tend(self) -> list[int]:
        """(I/O thread) Drain what arrived while nobody was reading, flush backlogs; returns the
        servers whose link closed (for :meth:`take_down`)."""
        if self.reader.acquire(blocking=False):
            try:
                for server, link in list(self.links.items()):
                    self._read(server, link, io_thread=True)
            finally:
                self.reader.release()
        closed = []
        for server, link in list(self.links.items()):
            if link.backlog:
                link.flush()
            if not link.up:
                closed.append(server)
        return closed

    def _read(self, server: int, link: Link, io_thread: bool, limit: int = 0) -> None:
        """Handle every answer waiting on ``link`` (the first ``limit``, if given; the caller
        holds the reader lock)."""
        try:
            for msg in link.recv(limit):
                self.on_answer(server, msg, io_thread)
        except ProtocolError as exc:
            log.warning("worker %d: dropped a message: %s", self._rank(), exc)

    def wake_readers(self, always: bool = False) -> None:
        """Wake the thread reading the links (if one reads, or ``always``): futures it may wait
        for were resolved elsewhere."""
        if always or self.readers:
            os.eventfd_write(self.notify, 1)

    def read_until(self, fut: Future, budget: float) -> None:
        """(A waiting thread) Read the same-host links until ``fut`` is resolved or ``budget``
        seconds passed; if another thread reads them, wait for the future meanwhile."""
        if self.downs or (not self.reader.acquire(blocking=False) and not self.reader.acquire(timeout=0.05)):
            fut._wait(0.05)
            return
        self.readers += 1
        try:
            key = self._version
            if self._poll_key != key:   # (rebuilt only when the set of links changed)
                self._poll, self._poll_links = select.poll(), {}
                for server in sorted(self.links):
                    link = self.links[server]
                    if link.up:
                        self._poll_links[link.fileno()] = (server, link)
                        self._poll.register(link.fileno(), select.POLLIN)
                self._poll.register(self.notify, select.POLLIN)
                self._poll_key = key
            poll, links = self._poll, self._poll_links
            deadline = time.monotonic() + budget
            while not fut.done and not self._failed():
                if self.downs:   # (the I/O thread takes a link down: it waits for this lock)
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                backlog = any(link.backlog for _, link in links.values())
                for fd, _ in poll.poll(1 if backlog else int(left * 1000) + 1):
                    if fd == self.notify:
                        with contextlib.suppress(BlockingIOError):
                            os.eventfd_read(self.notify)
                    else:
                        server, link = links[fd]
                        self._read(server, link, io_thread=False, limit=1)   # (the poll sees the rest)
                        if not link.up:
                            return   # (the I/O thread takes it down; the request goes again by TCP)
                if backlog:
                    for _, link in links.values():
                        link.flush()
        finally:
            self.readers -= 1
            self.reader.release()


__all__ = ["OnAnswer", "SameHostLinks"]
