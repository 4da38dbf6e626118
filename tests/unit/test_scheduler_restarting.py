"""The launcher tells the scheduler a worker died and is restarted (LOST with ``restart``): the
scheduler awaits its replacement at once, and the others' waits for it count from then as the
failover's; a report about an earlier process of the rank changes nothing.  The real scheduler
on a loopback port, its clock stepped by the test."""
from __future__ import annotations

import types

import pytest

from psnode.config import NodeConfig, Role
from psnode.protocol import Command, Message
from psnode.protocol.control import Lost, Register
from psnode.protocol.status import NodeState
from psnode.scheduler import loop
from tests.support.cluster import free_port


def test_a_worker_restarted_by_its_launcher_is_awaited_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    clock = types.SimpleNamespace(monotonic=lambda: now[0], time=lambda: now[0], sleep=lambda s: None)
    monkeypatch.setattr(loop, "time", clock)
    cfg = NodeConfig(role=Role.SCHEDULER, scheduler_host="127.0.0.1", scheduler_port=free_port(),
                     num_workers=2, num_servers=1, job_id="jrst", host="127.0.0.1", heartbeat_interval=1.0,
                     max_restarts=2)
    s = loop.Scheduler(cfg)
    try:
        def send(ident: bytes, cmd: Command, body: dict) -> None:
            s._dispatch(ident, Message(cmd, "jrst", "x", body))

        send(b"s0", Command.REGISTER, Register("server", "127.0.0.1", free_port(), 10, 0).to_body())
        for rank in (0, 1):
            send(b"w%d" % rank, Command.REGISTER, Register("worker", "127.0.0.1", 0, 11 + rank, rank).to_body())
        assert s.started
        worker1 = next(n for n in s.nodes.values() if n.role == Role.WORKER and n.rank == 1)
        # the server waits for worker 1 alone since 101.0
        now[0] = 102.0
        s.slowness.server(0, [(1, 1.0)], now[0], [(1, 1.0)])
        now[0] = 103.0
        send(b"ctl", Command.LOST, Lost(1, "killed by SIGKILL", restart=True, restarts=1).to_body())
        assert worker1.state == NodeState.ALIVE              # (about its first replacement: not this one)
        send(b"ctl", Command.LOST, Lost(1, "killed by SIGKILL", restart=True, restarts=0).to_body())
        assert worker1.state == NodeState.RESTARTING and (Role.WORKER, 1) in s.waiting_replacement
        now[0] = 106.0                                          # the server waits on, for the replacement
        s.slowness.server(0, [(1, 5.0)], now[0], [(1, 5.0)])
        assert s.slowness.totals() == {1: pytest.approx(2.0)}   # 101..103: the rest is the failover's
    finally:
        s.t.close()
