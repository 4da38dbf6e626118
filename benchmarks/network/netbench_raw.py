"""The testbed's own ceiling: a perfect parameter server's traffic in raw TCP (run by netbench.py).

argv: <my address> <peer address> <port> <plan-json>
plan: [{"case": name, "push": bytes, "pull": bytes, "warmup": n, "rounds": n}, ...]

One process per host, both started at once.  Each has a "server" socket (it accepts the peer's
connection) and a "worker" socket (it connects to the peer's server).  A round is what one
psnode round puts on the links, and nothing else: the push phase (the worker sends ``push``
bytes to the peer's server while this host's server receives as many from the peer's worker),
then the pull phase (this host's server sends ``pull`` bytes back to the peer's worker while this
worker receives as many).  The local halves of a psnode round (a worker and the server on its own
host) cost nothing here.  Reports one BENCHRESULT line per case (median round time).
"""
from __future__ import annotations

import json
import socket
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.cases import fail, report, summarize  # noqa: E402

CONNECT_S = 30.0   # every wait is bounded: the peer must be there within this
IO_S = 60.0        # and every send or receive must progress within this


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if not n:
            fail("peer closed the connection")
        got += n


def connect(me: str, peer: str, port: int) -> tuple[socket.socket, socket.socket]:
    """(server side: the peer's worker, worker side: the peer's server)."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((me, port))
    listener.listen(1)
    listener.settimeout(CONNECT_S)
    accepted: list[socket.socket] = []
    t = threading.Thread(target=lambda: accepted.append(listener.accept()[0]), daemon=True)
    t.start()
    deadline = time.monotonic() + CONNECT_S
    while True:
        try:
            worker = socket.create_connection((peer, port), timeout=IO_S)
            break
        except OSError:
            if time.monotonic() > deadline:
                fail(f"no server at {peer}:{port} within {CONNECT_S:g} s")
            time.sleep(0.05)
    t.join(CONNECT_S)
    if not accepted:
        fail(f"no worker connected to {me}:{port} within {CONNECT_S:g} s")
    listener.close()
    server = accepted[0]
    server.settimeout(IO_S)
    for s in (server, worker):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return server, worker


def phase(send: socket.socket, recv: socket.socket, out: memoryview, into: memoryview) -> None:
    """Send ``out`` on one socket while receiving ``into`` on the other."""
    t = threading.Thread(target=send.sendall, args=(out,))
    t.start()
    recv_exact(recv, into)
    t.join(IO_S)
    if t.is_alive():
        fail(f"send not done within {IO_S:g} s")


def main() -> None:
    me, peer, port, plan = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
    server, worker = connect(me, peer, port)
    size = max(max(c["push"], c["pull"]) for c in plan)
    out, into = memoryview(bytearray(size)), memoryview(bytearray(size))
    for c in plan:
        push, pull = c["push"], c["pull"]
        times = []
        for i in range(c["warmup"] + c["rounds"]):
            t0 = time.perf_counter()
            phase(worker, server, out[:push], into[:push])   # push phase
            phase(server, worker, out[:pull], into[:pull])   # pull phase
            if i >= c["warmup"]:
                times.append(time.perf_counter() - t0)
        report(system="raw", case=c["case"], host=me, push=push, pull=pull, **summarize(times))
    server.close()
    worker.close()


if __name__ == "__main__":
    main()
