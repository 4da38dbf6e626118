"""A node's link to the scheduler: registration, heartbeats, scheduler liveness.

Used by servers and by the worker's I/O thread (inside the thread that owns the sockets).
The node registers (again with each heartbeat until WELCOME arrives), then heartbeats every
``heartbeat_interval`` seconds with its counters;
the scheduler acknowledges each heartbeat.  No acknowledgement for ``dead_after`` seconds
means the scheduler is gone: :meth:`SchedulerLink.check` raises :class:`PeerLost`.
:meth:`SchedulerLink.recv` decodes what the scheduler sends (:mod:`psnode.protocol.control`);
a malformed message is logged and dropped.

A scheduler restarted at its address (:mod:`psnode.scheduler.rebuild`) does not know the node
and answers it REJOIN: a welcomed node then registers again, with its rank and the
:class:`~psnode.protocol.control.Rejoin` report its role gives (:attr:`SchedulerLink.report`),
with each heartbeat until the new WELCOME.  The link hands that WELCOME to the role like any
other.  REJOIN counts as an answer; the heartbeat timeout bounds how long a node waits for any
scheduler to answer.
"""
from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Callable
from typing import Any

from psnode.config import NodeConfig
from psnode.errors import PeerLost, ProtocolError
from psnode.net.security import Plane
from psnode.net.transport import Channel, Transport
from psnode.protocol import Command
from psnode.protocol.control import Bye, Control, Counters, Heartbeat, Register, Rejoin, Welcome, decode

log = logging.getLogger("psnode.link")


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
        self._register = Register(role, cfg.host, port, os.getpid(), cfg.rank)
        self.rank: int | None = None
        #: what this node reports to a restarted scheduler (None: it does not rejoin)
        self.report: Callable[[], Rejoin] | None = None
        self.rejoining = False
        self.chan.send(Command.REGISTER, self._register.to_body())

    def _registration(self) -> dict[str, Any]:
        if self.rejoining and self.report is not None:
            r = self._register
            return Register(r.role, r.host, r.port, r.pid, self.rank, self.report()).to_body()
        return self._register.to_body()

    def tick(self, now: float) -> None:
        """Heartbeat when due (and register again until welcomed: a REGISTER or its WELCOME can
        be lost with a connection); raise PeerLost when the scheduler has been silent too long."""
        if now >= self._next_beat:
            if not self.welcomed:
                self.chan.send(Command.REGISTER, self._registration())
            self.chan.send(Command.HEARTBEAT, Heartbeat(Counters.of(self._stats())).to_body())
            self._next_beat = now + self.cfg.heartbeat_interval
        silent = now - self.last_ack
        if silent > self.cfg.dead_after:
            pid = f" (pid {self.scheduler_pid})" if self.scheduler_pid else ""
            raise PeerLost(f"the scheduler{pid} at {self.cfg.scheduler_address} stopped responding "
                           f"({silent:.1f} s without a heartbeat reply)")

    def timeout(self, now: float) -> float:
        """Seconds until the next heartbeat is due."""
        return max(0.0, min(self._next_beat - now, self.cfg.heartbeat_interval))

    def recv(self) -> Control | None:
        """The next message from the scheduler, decoded (None: none waits)."""
        while (got := self.chan.recv()) is not None:
            self.last_ack = time.monotonic()
            try:
                msg = decode(got[1])
            except ProtocolError as exc:
                log.warning("dropped %s from the scheduler: %s", got[1].cmd.value, exc)
                continue
            if msg.cmd is Command.REJOIN:
                if self.welcomed and self.report is not None:   # a restarted scheduler
                    log.warning("the scheduler at %s restarted; registering again as %s %s",
                                self.cfg.scheduler_address, self._register.role, self.rank)
                    self.welcomed, self.rejoining = False, True
                    self.chan.send(Command.REGISTER, self._registration())
                elif self.rejoining:
                    self.chan.send(Command.REGISTER, self._registration())
                continue
            if isinstance(msg.body, Welcome):
                if self.rejoining and msg.body.rank != self.rank:
                    continue   # a WELCOME for an earlier registration
                self.welcomed, self.rejoining = True, False
                self.scheduler_pid = msg.body.pid
                self.rank = msg.body.rank
            return msg
        return None

    def fail(self, reason: str, restart: bool = False) -> None:
        """Tell the scheduler this node failed: the job then ends, naming it, or with
        ``restart`` waits for the launcher's replacement."""
        self.chan.send(Command.BYE, (Bye(restart=reason) if restart else Bye(error=reason)).to_body())
