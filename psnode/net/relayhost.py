"""A host's heartbeat relay, running: a thread of one of the job's processes on the host.

:func:`start` tries to become the host's relay: a thread binds the job's relay address on this
host (:func:`psnode.net.relay.endpoint`) with its own transport and sockets; the first process
of the job to bind it is the relay, the others' :func:`start` return None.  The thread collects
the heartbeats of the host's nodes on that address and sends their batches to the scheduler on
its own connection, and their barrier entries together (:class:`psnode.net.relay.Relay` says
what goes where and when).  Both sockets use the job's security like every other socket of the
control plane.
"""
from __future__ import annotations

import logging
import os
import secrets
import threading
import time

from psnode.config import NodeConfig
from psnode.errors import ProtocolError
from psnode.net.relay import Relay, endpoint
from psnode.net.security import Plane, Security
from psnode.net.transport import Poller, Transport
from psnode.protocol import Command, Message
from psnode.protocol.control import Barrier, BeatsAck, Heartbeat

log = logging.getLogger("psnode.relay")

_TURN = 0.25   # the longest wait of the relay's loop (how soon it sees it must stop)


class RelayHost(threading.Thread):
    """The relay's thread (its sockets are created, used and closed by it)."""

    def __init__(self, cfg: NodeConfig) -> None:
        super().__init__(name="psnode-relay", daemon=True)
        self.cfg = cfg
        self.bound = False
        self.ready = threading.Event()
        self.stopping = threading.Event()

    def run(self) -> None:
        cfg = self.cfg
        t = Transport(cfg.job_id, "relay", 2**20, Security.load(cfg.key_file))
        try:
            down = t.local_router(endpoint(cfg.job_id))
            if down is None:   # another process of the job is this host's relay
                return
            up = t.dealer(cfg.scheduler_host, cfg.scheduler_port, f"relay-{os.getpid()}-{secrets.token_hex(4)}",
                          Plane.CONTROL)
            self.bound = True
            self.ready.set()
            log.info("relaying the heartbeats of this host's nodes of job %s to %s", cfg.job_id, up.address)
            relay = Relay(cfg.heartbeat_interval)
            poller = Poller()
            poller.add(down)
            poller.add(up)
            while not self.stopping.is_set():
                poller.poll(min(_TURN, relay.timeout(time.monotonic())))
                now = time.monotonic()
                while (got := down.recv(routed=True)) is not None:
                    take(relay, *got, now)
                while (answer := up.recv()) is not None:
                    if answer[1].cmd is not Command.HEARTBEATS_ACK:
                        continue
                    try:
                        ack = BeatsAck.from_body(answer[1].body)
                        acked = relay.acked(ack.n, ack.unknown)
                    except ProtocolError as exc:
                        log.warning("relay: dropped the scheduler's answer: %s", exc)
                        continue
                    if acked:
                        down.send_all(Command.HEARTBEAT_ACK, None, list(acked))
                now = time.monotonic()
                batch = relay.batch(now)
                if batch is not None:
                    up.send(Command.HEARTBEATS, batch.to_body())
                entries = relay.barrier_entries(now)
                if entries is not None:
                    up.send(Command.BARRIERS, entries.to_body())
        except Exception as exc:  # noqa: BLE001 - the nodes fall back to direct heartbeats
            log.warning("the heartbeat relay stopped: %r", exc)
        finally:
            self.ready.set()
            t.close()

    def stop(self) -> None:
        """Stop relaying (the nodes fall back to direct heartbeats); waits for the thread."""
        self.stopping.set()
        self.join(2)


def take(relay: Relay, ident: bytes | None, msg: Message, now: float) -> None:
    """A node's message to the relay: its heartbeat, its entry into a numbered barrier, or its
    FINISH (it enters no more barriers); any other (or a malformed one) is logged and dropped."""
    try:
        if ident is not None and msg.cmd is Command.HEARTBEAT:
            relay.beat(ident, Heartbeat.from_body(msg.body).stats, now)
            return
        if ident is not None and msg.cmd is Command.FINISH:
            relay.leaves(ident)
            return
        if ident is not None and msg.cmd is Command.BARRIER:
            n = Barrier.from_body(msg.body).n
            if n is not None:
                relay.enter(ident, n, now)
                return
    except ProtocolError as exc:
        log.warning("relay: dropped %s from %r: %s", msg.cmd.value, ident, exc)
        return
    log.warning("relay: dropped %s from %r: only heartbeats, numbered barriers and FINISH are taken",
                msg.cmd.value, ident)


def start(cfg: NodeConfig) -> RelayHost | None:
    """Become this host's relay for ``cfg``'s job, if no other process of it is: the running
    relay, or None."""
    host = RelayHost(cfg)
    host.start()
    host.ready.wait(5)
    if not host.bound:
        host.join(2)
        return None
    return host


__all__ = ["RelayHost", "start", "take"]
