"""A server's route to each worker: TCP, or this host's same-host link with TCP behind it.

"Same host?" is answered once per worker, when its same-host link is admitted or closed
(:meth:`Routes.link_up`, :meth:`Routes.link_down`: psnode.server.samehost.SameHost calls
them, and nothing else changes a route).  The server sends a worker's replies through
:meth:`Routes.to` and asks nothing else.  A :class:`LinkRoute` sends over its link what the
link takes; what it does not (too big, no room, or a link that broke and is not closed yet)
goes over TCP.  One thread (the server's loop) uses the routes.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from psnode.net.transport import Channel
from psnode.protocol import PACK_BYTES, Command, Ok
from psnode.server.replies import Reply, sent

#: sends replies over one link; returns those it could not send (for TCP)
LinkSend = Callable[[list[Reply]], list[Reply]]


class WorkerRoute(Protocol):
    """How the server reaches one worker."""

    worker: int

    def send(self, replies: list[Reply]) -> None:
        """Send ``replies`` (all for this worker; a DATA_REPLY at most per transport)."""
        ...


class TcpRoute:
    """A worker reached over the server's ROUTER (identity ``w<rank>``)."""

    def __init__(self, worker: int, chan: Channel) -> None:
        self.worker = worker
        self.chan = chan
        self._to = f"w{worker}".encode()

    def send(self, replies: list[Reply]) -> None:
        """One DATA_REPLY; big values go zero-copy and are tracked (psnode.server.replies)."""
        if not replies:
            return
        for r in replies:   # a value later rounds overwrite in place: zmq gets a copy
            if r.fixed and isinstance(r.answer, Ok):
                r.answer.arrays = [np.array(a) for a in r.answer.arrays]
        entries = [r.entry for r in replies if r.entry is not None]
        track = any(r.entry is not None and isinstance(r.answer, Ok) and r.answer.arrays[0].nbytes >= PACK_BYTES
                    for r in replies)
        tracker = self.chan.send(Command.DATA_REPLY, ops=[r.answer for r in replies], to=self._to, track=track)
        for e in entries:
            sent(e, tracker if track else None)


class LinkRoute:
    """A worker on this host with an admitted same-host link (``link_send``); what the link
    does not take goes over ``tcp``."""

    def __init__(self, tcp: TcpRoute, link_send: LinkSend) -> None:
        self.worker = tcp.worker
        self.tcp = tcp
        self._link_send = link_send

    def send(self, replies: list[Reply]) -> None:
        rest = self._link_send(replies) if replies else replies
        if rest:
            self.tcp.send(rest)


class Routes:
    """Every worker's route: TCP until its same-host link is admitted, TCP again once closed."""

    def __init__(self, chan: Channel) -> None:
        self.chan = chan
        self._routes: dict[int, WorkerRoute] = {}

    def to(self, worker: int) -> WorkerRoute:
        """Worker ``worker``'s route (a worker never seen: TCP)."""
        route = self._routes.get(worker)
        if route is None:
            route = self._routes[worker] = TcpRoute(worker, self.chan)
        return route

    def link_up(self, worker: int, link_send: LinkSend) -> None:
        """Worker ``worker``'s same-host link was admitted (a restarted worker's replaces the old)."""
        self._routes[worker] = LinkRoute(TcpRoute(worker, self.chan), link_send)

    def link_down(self, worker: int) -> None:
        """Worker ``worker``'s same-host link closed: TCP from now on."""
        self._routes[worker] = TcpRoute(worker, self.chan)


__all__ = ["LinkRoute", "LinkSend", "Routes", "TcpRoute", "WorkerRoute"]
