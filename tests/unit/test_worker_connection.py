"""A worker's connection per server (psnode.worker.connection): chosen once, re-pointed in one
place.  Real ZeroMQ sockets on 127.0.0.1 in this process: a server is a ROUTER, the worker's
connection a DEALER; a thread other than the "I/O thread" (the test's main thread) queues sends."""
from __future__ import annotations

import threading

import numpy as np

from psnode.config import NodeConfig, Role
from psnode.net.security import Security
from psnode.net.transport import Channel, Transport
from psnode.protocol import Message, Op, Push
from psnode.worker.connection import Connections, TcpConnection
from psnode.worker.futures import Future
from psnode.worker.samehost import SameHostLinks
from tests.support import wait_for


def _received(router: Channel, n: int) -> list[Op]:
    """The first ``n`` operations ``router`` receives (within 5 s)."""
    ops: list[Op] = []

    def more() -> bool:
        while (got := router.recv(routed=True)) is not None:
            msg: Message = got[1]
            ops.extend(msg.ops or [])
        return len(ops) >= n
    wait_for(more, 5.0, f"{n} operations on {router.address}", interval=0.005)
    return ops


def _push(seq: int) -> Push:
    return Push("w", 0, seq, np.full(4, seq, np.float32), id=seq)


def _conns(t: Transport, host: str = "127.0.0.1") -> tuple[Connections, list[int]]:
    cfg = NodeConfig(role=Role.WORKER, scheduler_host="127.0.0.1", scheduler_port=1, num_workers=1,
                     num_servers=1, job_id="jc", host=host)
    woken: list[int] = []
    links = SameHostLinks(cfg, lambda server, msg, io: None, lambda: 0, lambda: False)
    return Connections(cfg, links, lambda: woken.append(1)), woken


def test_a_tcp_connection_is_chosen_once_and_sends_from_any_thread() -> None:
    """No staging (no shared memory): every server is reached over TCP, ``near`` is False and
    says so for the whole connection; a send from another thread waits in the connection's own
    outbox (the I/O thread is woken) and leaves on the I/O thread's flush, in order."""
    srv = Transport("jc", "server", 2**20, Security.insecure())
    wrk = Transport("jc", "worker", 2**20, Security.insecure())
    try:
        router, port = srv.router("127.0.0.1", 0)
        conns, woken = _conns(wrk)
        conn = conns.connect(0, "127.0.0.1", port, wrk.dealer("127.0.0.1", port, "w0"), wrk.security)
        assert isinstance(conn, TcpConnection) and conns[0] is conn and len(conns) == 1
        assert not conn.near and conns.near() == frozenset() and not conns.is_near(0) and not conns.is_near(7)
        assert conns.address(0) == f"127.0.0.1:{port}" and conns.address(3) == "server 3"
        other = threading.Thread(target=conns.send, args=({0: [_push(1), _push(2)]}, False))
        other.start()
        other.join()
        assert woken == [1] and conn.pending
        conns.send({0: [_push(3)]}, io_thread=True)         # the I/O thread's own send leaves at once
        assert [op.seq for op in _received(router, 1)] == [3]
        conns.flush()
        assert not conn.pending
        assert [op.seq for op in _received(router, 2)] == [1, 2]
        assert conns.tcp_bytes()[1] > 0
        fut = Future(None, 0)
        conns.wait(fut, 0.01)                                # (a TCP wait: the future's own)
        assert not fut.done
    finally:
        wrk.close()
        srv.close()


def test_re_pointing_a_server_carries_its_queue_and_counts_to_the_new_address() -> None:
    """A server that moved is re-pointed in one call: what other threads queued for the old
    connection, and what a thread still holding the old connection sends, goes to the new
    address; the byte counts carry over."""
    srv = Transport("jc", "server", 2**20, Security.insecure())
    wrk = Transport("jc", "worker", 2**20, Security.insecure())
    try:
        old_router, old_port = srv.router("127.0.0.1", 0)
        new_router, new_port = srv.router("127.0.0.1", 0)
        conns, _ = _conns(wrk)
        old = conns.connect(0, "127.0.0.1", old_port, wrk.dealer("127.0.0.1", old_port, "w0"), wrk.security)
        old.send([_push(1)], io_thread=True)
        assert [op.seq for op in _received(old_router, 1)] == [1]
        sent = old.tcp.chan.bytes_out
        old.send([_push(2)], io_thread=False)               # queued, not flushed yet
        old.tcp.chan.close()
        assert not conns.link_down(0)                        # (no same-host link to take down)
        new = conns.connect(0, "127.0.0.1", new_port, wrk.dealer("127.0.0.1", new_port, "w0"), wrk.security)
        assert conns[0] is new and new is not old and new.address == f"127.0.0.1:{new_port}"
        assert new.tcp.chan.bytes_out == sent
        old.send([_push(3)], io_thread=False)               # a thread that still held the old one
        conns.flush()
        assert [op.seq for op in _received(new_router, 2)] == [2, 3]
        assert new.tcp.chan.bytes_out > sent
    finally:
        wrk.close()
        srv.close()
