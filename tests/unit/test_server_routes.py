"""A server's routes (psnode.server.routes): TCP for every worker until its same-host link is
admitted; then the link first and TCP for what it does not take; TCP again once it closes.
Real ZeroMQ channels on loopback."""
from __future__ import annotations

import time

import numpy as np

from psnode.net.security import Security
from psnode.net.transport import Channel, Transport
from psnode.protocol import Command, Message, Ok
from psnode.server.replies import Reply
from psnode.server.routes import LinkRoute, Routes, TcpRoute


def _recv(chan: Channel, timeout: float = 10.0) -> Message:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = chan.recv()
        if got is not None:
            return got[1]
        time.sleep(0.01)
    raise AssertionError(f"nothing arrived in {timeout} s")


def test_a_workers_route_is_decided_when_its_link_is_admitted_or_closed() -> None:
    server = Transport("jr", "server", 2**22, Security.insecure())
    worker = Transport("jr", "worker", 2**22, Security.insecure())
    try:
        router, port = server.router("127.0.0.1", 0)
        w0 = worker.dealer("127.0.0.1", port, "w0")
        w0.send(Command.DATA, {})                    # (the ROUTER learns the identity w0)
        _wait_routed(router)
        routes = Routes(router)
        assert isinstance(routes.to(0), TcpRoute) and routes.to(0) is routes.to(0)

        routes.to(0).send([Reply(0, Ok(1, [np.arange(3.0)]))])
        msg = _recv(w0)
        assert msg.cmd is Command.DATA_REPLY and [op.id for op in msg.ops or []] == [1]
        assert (msg.ops or [])[0].arrays[0].tolist() == [0.0, 1.0, 2.0]

        taken: list[list[int]] = []

        def link_send(replies: list[Reply]) -> list[Reply]:   # the link takes ids below 10
            taken.append([r.answer.id for r in replies])
            return [r for r in replies if r.answer.id >= 10]

        routes.link_up(0, link_send)
        assert isinstance(routes.to(0), LinkRoute) and isinstance(routes.to(1), TcpRoute)
        routes.to(0).send([Reply(0, Ok(2)), Reply(0, Ok(11, [np.ones(2)])), Reply(0, Ok(3))])
        assert taken == [[2, 11, 3]]
        msg = _recv(w0)
        assert [op.id for op in msg.ops or []] == [11]   # (what the link did not take, over TCP)

        routes.link_down(0)
        assert isinstance(routes.to(0), TcpRoute)
        routes.to(0).send([Reply(0, Ok(4))])
        assert [op.id for op in _recv(w0).ops or []] == [4] and taken == [[2, 11, 3]]
    finally:
        worker.close(linger_ms=0)
        server.close(linger_ms=0)


def _wait_routed(router: Channel, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if router.recv(routed=True) is not None:
            return True
        time.sleep(0.01)
    raise AssertionError(f"the worker's first message did not arrive in {timeout} s")
