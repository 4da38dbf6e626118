"""How often the scheduler answers a node's heartbeats: every other one where the heartbeat
timeout spans 4 intervals or more (a node calls its scheduler silent only after the whole
timeout without an answer, psnode.net.link), every one otherwise.  The real scheduler on a
loopback port, its clock stepped by the test, what it sends recorded."""
from __future__ import annotations

import types
from typing import Any

import pytest

from psnode.config import NodeConfig, Role
from psnode.protocol import Command, Message
from psnode.protocol.control import Register
from psnode.scheduler import loop
from tests.support.cluster import free_port


def _acked_at(liveness: int, beats: list[float], monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """When the scheduler answered heartbeats sent at ``beats`` (seconds, interval 1 s)."""
    now = [100.0]
    clock = types.SimpleNamespace(monotonic=lambda: now[0], time=lambda: now[0], sleep=lambda s: None)
    monkeypatch.setattr(loop, "time", clock)
    cfg = NodeConfig(role=Role.SCHEDULER, scheduler_host="127.0.0.1", scheduler_port=free_port(),
                     num_workers=2, num_servers=1, job_id="jack", host="127.0.0.1",
                     heartbeat_interval=1.0, heartbeat_liveness=liveness)
    s = loop.Scheduler(cfg)
    acks: list[float] = []
    send = s.chan.send

    def recorded(cmd: Any, body: Any = None, *args: Any, **kw: Any) -> Any:
        if cmd is Command.HEARTBEAT_ACK:
            acks.append(now[0] - 100.0)
        return send(cmd, body, *args, **kw)

    s.chan.send = recorded  # type: ignore[method-assign]
    try:
        s._dispatch(b"n0", Message(Command.REGISTER, "jack", "x", Register("worker", "127.0.0.1", 0, 1, 0).to_body()))
        for t in beats:
            now[0] = 100.0 + t
            s._dispatch(b"n0", Message(Command.HEARTBEAT, "jack", "x", {"stats": {"pushes": int(t)}}))
    finally:
        s.t.close()
    return acks


def test_every_other_heartbeat_is_answered_when_the_timeout_spans_five_intervals(monkeypatch):
    beats = [float(t) for t in range(10)]
    assert _acked_at(5, beats, monkeypatch) == [0.0, 2.0, 4.0, 6.0, 8.0]


def test_a_late_heartbeat_is_answered_at_once(monkeypatch):
    # 0 answered; 1 not; 3.5 (2.5 s after the last answer, a heartbeat lost between) answered
    assert _acked_at(5, [0.0, 1.0, 3.5, 4.5, 5.5], monkeypatch) == [0.0, 3.5, 5.5]


def test_every_heartbeat_is_answered_when_the_timeout_is_short(monkeypatch):
    beats = [float(t) for t in range(6)]
    assert _acked_at(3, beats, monkeypatch) == beats
