"""A node's link to the scheduler: registration, heartbeats, scheduler liveness.

Used by servers and by the worker's I/O thread (inside the thread that owns the sockets).
The node registers (again with each heartbeat until WELCOME arrives), then heartbeats every
``heartbeat_interval`` seconds with its counters;
the scheduler acknowledges each heartbeat.  No acknowledgement for ``dead_after`` seconds
means the scheduler is gone: :meth:`SchedulerLink.tick` raises :class:`PeerLost`.  Only time
the node listened counts: a node never takes the scheduler for dead because of its own work, so
when its loop comes back from a turn longer than ``heartbeat_interval`` (held by its own work;
the scheduler's replies wait in the socket meanwhile), that turn counts as one interval.
:meth:`SchedulerLink.recv` decodes what the scheduler sends (:mod:`psnode.protocol.control`);
a malformed message is logged and dropped.

A scheduler restarted at its address (:mod:`psnode.scheduler.rebuild`) does not know the node
and answers it REJOIN: a welcomed node then registers again, with its rank and the
:class:`~psnode.protocol.control.Rejoin` report its role gives (:attr:`SchedulerLink.report`),
with each heartbeat until the new WELCOME.  The link hands that WELCOME to the role like any
other.  REJOIN counts as an answer; the heartbeat timeout bounds how long a node waits for any
scheduler to answer.

With a standby scheduler (``PSNODE_SCHEDULER_STANDBY``: the launcher runs one on a second host),
a node whose scheduler stays silent for the heartbeat timeout goes over to the standby once, at
once, with the same socket (:meth:`Channel.repoint`): it registers there again as after a
restart (the standby rebuilds the job from the live nodes: :mod:`psnode.scheduler.rebuild`), and
the heartbeat timeout starts again.  Silent there too, the node fails as without a standby.
The scheduler names its standby (one that announced itself to it: a standby the launcher
started after a failover, for the scheduler that took the job over) in STANDBY and in each
WELCOME: the node goes over there next, so a job survives one host loss after another.

With ``cfg.relay`` (``PSNODE_HEARTBEAT_RELAY``), heartbeats go through the host's relay
(:mod:`psnode.net.relay`; the first node of the job on the host runs it,
:mod:`psnode.net.relayhost`), which answers them once the scheduler took their batch; an answer
through the relay counts as the scheduler's.  A worker's BARRIER goes the way its heartbeats
go (:meth:`SchedulerLink.send_barrier`: the relay forwards its host's entries together), and
the relay hears of its FINISH (:meth:`SchedulerLink.send_finish`: not waited for any more).
Everything else goes to the scheduler directly.
The relay silent for :data:`~psnode.net.relay.FALLBACK_INTERVALS` intervals: the node
heartbeats directly, and tries the relay again now and then (becoming the host's relay itself
when no process holds it); gone over to a standby: directly, for good.
"""
from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from psnode.config import NodeConfig, parse_address
from psnode.errors import ConfigError, PeerLost, ProtocolError
from psnode.net import relayhost
from psnode.net.relay import RelayUse, endpoint
from psnode.net.security import Plane
from psnode.net.transport import Channel, Transport
from psnode.protocol import Command
from psnode.protocol.control import Bye, Control, Counters, Heartbeat, Register, Rejoin, Standby, Welcome, decode

log = logging.getLogger("psnode.link")


class SchedulerLink:
    def __init__(self, t: Transport, cfg: NodeConfig, role: str, port: int,
                 stats: Callable[[], Counters], replica: int = 0) -> None:
        self.cfg = cfg
        ident = f"{role}-{os.getpid()}-{secrets.token_hex(4)}"
        self.chan: Channel = t.dealer(cfg.scheduler_host, cfg.scheduler_port, ident, Plane.CONTROL)
        #: this host's relay when this process runs it; the node's channel to the relay (same identity)
        self.relay_host = relayhost.start(cfg) if cfg.relay else None
        self.relay_chan: Channel | None = t.local_dealer(endpoint(cfg.job_id), ident) if cfg.relay else None
        self.relay_use = RelayUse(cfg.heartbeat_interval, on=cfg.relay)
        self._stats = stats
        self._next_beat = 0.0
        self.scheduler_pid: int | None = None
        self.last_ack = time.monotonic()
        self._ticked = self.last_ack          # the previous tick (the loop's previous turn)
        self.welcomed = False
        self._register = Register(role, cfg.host, port, os.getpid(), cfg.rank, replica=replica)
        self.rank: int | None = None
        #: what this node reports to a restarted scheduler (None: it does not rejoin)
        self.report: Callable[[], Rejoin] | None = None
        self.rejoining = False
        #: where to go once when the scheduler is silent (None: nowhere, or gone there already)
        self.standby: str | None = cfg.scheduler_standby
        self.chan.send(Command.REGISTER, self._register.to_body())

    def _registration(self) -> dict[str, Any]:
        if self.rejoining and self.report is not None:
            r = self._register
            return replace(r, rank=self.rank, rejoin=self.report()).to_body()
        return self._register.to_body()

    def tick(self, now: float) -> None:
        """Heartbeat when due (and register again until welcomed: a REGISTER or its WELCOME can
        be lost with a connection); raise PeerLost when the scheduler has been silent too long
        while this node listened (see the module docstring)."""
        held = now - self._ticked - self.cfg.heartbeat_interval
        self._ticked = now
        if held > 0:   # (this node's own loop was held: not the scheduler's silence)
            self.last_ack = min(now, self.last_ack + held)
            self.relay_use.held(held)
        if self.relay_chan is not None and self.relay_use.retry:
            self._relay_answers(now)
        if now >= self._next_beat:
            if not self.welcomed:
                self.chan.send(Command.REGISTER, self._registration())
            self._beat(now)
            self._next_beat = now + self.cfg.heartbeat_interval
        silent = now - self.last_ack
        if silent > self.cfg.dead_after and self.standby is not None:
            self._go_to_standby(now, silent)
        elif silent > self.cfg.dead_after:
            pid = f" (pid {self.scheduler_pid})" if self.scheduler_pid else ""
            raise PeerLost(f"the scheduler{pid} at {self.chan.address} stopped responding "
                           f"({silent:.1f} s without a heartbeat reply)")

    def _beat(self, now: float) -> None:
        """Send a heartbeat: through the host's relay while it answers, else directly."""
        body = Heartbeat(self._stats()).to_body()
        if self.relay_use.on and self.relay_chan is not None:
            self.relay_chan.send(Command.HEARTBEAT, body)
            self.relay_use.sent(now)
            return
        self.chan.send(Command.HEARTBEAT, body)
        if self.relay_chan is not None and self.relay_use.probe(now):   # (try the relay again)
            if self.relay_host is None:
                self.relay_host = relayhost.start(self.cfg)   # (the host's relay, if no process is)
            self.relay_chan.send(Command.HEARTBEAT, body)

    def send_barrier(self, body: dict[str, Any]) -> None:
        """Send a BARRIER (or send it again): through the host's relay while heartbeats go
        through it, else directly.  Its answer, BARRIER_DONE, comes from the scheduler."""
        if self.relay_use.on and self.relay_chan is not None:
            self.relay_chan.send(Command.BARRIER, body)
        else:
            self.chan.send(Command.BARRIER, body)

    def send_finish(self, body: dict[str, Any]) -> None:
        """Send FINISH (this worker is done) to the scheduler, and tell the host's relay so: it
        waits for this worker's barrier entries no more."""
        self.chan.send(Command.FINISH, body)
        if self.relay_use.on and self.relay_chan is not None:
            self.relay_chan.send(Command.FINISH, body)

    def _relay_answers(self, now: float) -> None:
        """Take the relay's answers; fall back to direct heartbeats when it left one unanswered
        too long (psnode.net.relay)."""
        assert self.relay_chan is not None
        while (got := self.relay_chan.recv()) is not None:
            if got[1].cmd is Command.HEARTBEAT_ACK:
                self.last_ack = time.monotonic()
                if self.relay_use.answered():
                    log.warning("the heartbeat relay of this host (%s) answers again; heartbeating through it",
                                self.relay_chan.address)
        if self.relay_use.fall_back(now):
            log.warning("the heartbeat relay of this host (%s) does not answer; heartbeating the scheduler "
                        "at %s directly", self.relay_chan.address, self.chan.address)
            self._next_beat = now   # (at once)

    def close(self) -> None:
        """Stop this host's relay if this process runs it (the other nodes fall back)."""
        if self.relay_host is not None:
            self.relay_host.stop()
            self.relay_host = None

    def _go_to_standby(self, now: float, silent: float) -> None:
        """The scheduler is silent: repoint at the standby and register there again."""
        assert self.standby is not None
        gone, (host, port), there = self.chan.address, parse_address(self.standby, "the standby"), self.standby
        self.standby = None
        log.warning("the scheduler at %s stopped responding (%.1f s without a heartbeat reply); "
                    "going over to the standby scheduler at %s", gone, silent, there)
        self.chan.repoint(host, port)
        self.scheduler_pid = None
        self.last_ack = now
        self.relay_use.stop()   # (the relay serves the scheduler that went silent)
        if self.welcomed and self.report is not None:
            self.welcomed, self.rejoining = False, True
        self.chan.send(Command.REGISTER, self._registration())
        self.chan.send(Command.HEARTBEAT, Heartbeat(self._stats()).to_body())
        self._next_beat = now + self.cfg.heartbeat_interval

    def _stand_by(self, address: str) -> None:
        """The scheduler names its standby: go there when it is silent (never to itself)."""
        try:
            host, port = parse_address(address, "the standby")
        except ConfigError as exc:
            log.warning("dropped the scheduler's standby: %s", exc)
            return
        if f"{host}:{port}" != self.chan.address and address != self.standby:
            log.info("the standby scheduler is at %s", address)
            self.standby = address

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
                                self.chan.address, self._register.role, self.rank)
                    self.welcomed, self.rejoining = False, True
                    self.chan.send(Command.REGISTER, self._registration())
                elif self.rejoining:
                    self.chan.send(Command.REGISTER, self._registration())
                continue
            if isinstance(msg.body, Standby):
                self._stand_by(msg.body.address)
                continue
            if isinstance(msg.body, Welcome):
                if self.rejoining and msg.body.rank != self.rank:
                    continue   # a WELCOME for an earlier registration
                self.welcomed, self.rejoining = True, False
                self.scheduler_pid = msg.body.pid
                self.rank = msg.body.rank
                if msg.body.standby:
                    self._stand_by(msg.body.standby)
            return msg
        return None

    def fail(self, reason: str, restart: bool = False) -> None:
        """Tell the scheduler this node failed: the job then ends, naming it, or with
        ``restart`` waits for the launcher's replacement."""
        self.chan.send(Command.BYE, (Bye(restart=reason) if restart else Bye(error=reason)).to_body())
