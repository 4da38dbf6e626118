"""A node's link to the scheduler: registration, heartbeats, scheduler liveness.

Used by servers and by the worker's I/O thread (inside the thread that owns the sockets).
The node registers (again with each heartbeat until WELCOME arrives), then heartbeats every
``heartbeat_interval`` seconds with its counters;
the scheduler acknowledges each heartbeat.  No acknowledgement for ``dead_after`` seconds
means the scheduler is gone: :meth:`SchedulerLink.check` raises :class:`PeerLost`.
"""
from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from typing import Any

from psnode.config import NodeConfig
from psnode.errors import PeerLost
from psnode.net.security import Plane
from psnode.net.transport import Channel, Transport
from psnode.protocol import Command, Message


class SchedulerLink:
    def __init__(self, t: Transport, cfg: NodeConfig, role: str, port: int,
                 stats: Callable[[], dict[str, Any]]) -> None:
        self.cfg = cfg
        self.chan: Channel = t.dealer(cfg.scheduler_host, cfg.scheduler_port,
                                      f"{role}-{os.getpid()}-{secrets.token_hex(4)}", Plane.CONTROL)
        self._stats = stats
        self._next_beat = 0.0
        self.scheduler_pid: int | None = None
        self.last_ack = time.monotonic()
        self.welcomed = False
        self._register = {"role": role, "host": cfg.host, "port": port, "pid": os.getpid(), "rank": cfg.rank}
        self.chan.send(Command.REGISTER, self._register)

    def tick(self, now: float) -> None:
        """Heartbeat when due (and register again until welcomed: a REGISTER or its WELCOME can
        be lost with a connection); raise PeerLost when the scheduler has been silent too long."""
        if now >= self._next_beat:
            if not self.welcomed:
                self.chan.send(Command.REGISTER, self._register)
            self.chan.send(Command.HEARTBEAT, {"stats": self._stats()})
            self._next_beat = now + self.cfg.heartbeat_interval
        silent = now - self.last_ack
        if silent > self.cfg.dead_after:
            pid = f" (pid {self.scheduler_pid})" if self.scheduler_pid else ""
            raise PeerLost(f"the scheduler{pid} at {self.cfg.scheduler_address} stopped responding "
                           f"({silent:.1f} s without a heartbeat reply)")

    def timeout(self, now: float) -> float:
        """Seconds until the next heartbeat is due."""
        return max(0.0, min(self._next_beat - now, self.cfg.heartbeat_interval))

    def recv(self) -> Message | None:
        got = self.chan.recv()
        if got is None:
            return None
        self.last_ack = time.monotonic()
        msg = got[1]
        if msg.cmd is Command.WELCOME:
            self.welcomed = True
            if isinstance(msg.body.get("pid"), int):
                self.scheduler_pid = msg.body["pid"]
        return msg

    def fail(self, reason: str, restart: bool = False) -> None:
        """Tell the scheduler this node failed: the job then ends, naming it, or with
        ``restart`` waits for the launcher's replacement."""
        self.chan.send(Command.BYE, {"restart": reason} if restart else {"error": reason})


def lost_message(msg: Message) -> str:
    """The user-facing text of a PEER_LOST or failed SHUTDOWN."""
    return str(msg.body.get("reason", "the job ended"))
