"""Control client: what ``mxdist status`` and the launcher's supervisor (``mxdist scale``, an
elastic job's lost workers) ask a job's scheduler, through :mod:`psnode.launcher`, and what a
standby scheduler tells the scheduler it stands by for (:func:`announce_standby`).

Each call opens a short-lived DEALER to the scheduler on the control plane, with the job's secret
file when the job has one (``key_file``: its ``PSNODE_KEY_FILE``; the link is then CURVE, the
scheduler refuses anyone without the job's key before reading a message), sends one request
and waits at most ``timeout`` seconds for the answer; no answer raises :class:`PeerLost` (a
malformed one is logged and dropped).  An unreadable or world-readable secret file raises
:class:`ConfigError` naming the file.
"""
from __future__ import annotations

import logging
import os
import secrets
import time

from psnode.config import parse_address
from psnode.errors import PeerLost, ProtocolError
from psnode.net.security import Plane, Security
from psnode.net.transport import Poller, Transport
from psnode.protocol import Command
from psnode.protocol.control import Body, Empty, Lost, ScaleDown, Standby, StatusAnswer, decode_body

log = logging.getLogger("psnode.control")


def _ask(scheduler: str, job_id: str, cmd: Command, reply: Command, key_file: str | None,
         timeout: float, body: Body) -> Body:
    host, port = parse_address(scheduler, "scheduler address")
    t = Transport(job_id, "control", 2**24, Security.load(key_file))
    try:
        chan = t.dealer(host, port, f"control-{os.getpid()}-{secrets.token_hex(4)}", Plane.CONTROL)
        chan.send(cmd, body.to_body())
        poller = Poller()
        poller.add(chan)
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if poller.poll(left):
                got = chan.recv()
                if got is not None and got[1].cmd is reply:
                    try:
                        return decode_body(reply, got[1].body)
                    except ProtocolError as exc:
                        log.warning("dropped %s from the scheduler: %s", reply.value, exc)
        raise PeerLost(f"the scheduler of job {job_id} at {scheduler} did not answer within {timeout:g} s")
    finally:
        t.close()


def status(scheduler: str, job_id: str, key_file: str | None = None, timeout: float = 2.0) -> StatusAnswer:
    """The live node table (``refused``: connections the scheduler refused; each row has its
    node's count)."""
    answer = _ask(scheduler, job_id, Command.STATUS, Command.STATUS_REPLY, key_file, timeout, Empty())
    assert isinstance(answer, StatusAnswer)
    return answer


def request_leave(scheduler: str, job_id: str, ranks: list[int] | tuple[int, ...], key_file: str | None = None,
                  timeout: float = 2.0) -> bool:
    """Ask workers ``ranks`` to leave gracefully: each leaves at its next ``kv.push`` (it flushes
    what it pushed, leaves the membership and raises :class:`psnode.errors.Leave`, code 0).
    True once the scheduler acknowledged (ranks it does not know as members are ignored)."""
    try:
        _ask(scheduler, job_id, Command.LEAVE, Command.LEAVE_ACK, key_file, timeout,
             ScaleDown(tuple(sorted({int(r) for r in ranks}))))
        return True
    except PeerLost:
        return False


def report_lost(scheduler: str, job_id: str, rank: int, key_file: str | None = None,
                timeout: float = 2.0, reason: str = "its process died", restarts: int | None = None) -> bool:
    """Worker ``rank``'s process died and will not be restarted: the scheduler removes it from
    the membership at once (the servers' open rounds complete over the rest) instead of waiting
    for its heartbeats to stop.  With ``restarts`` (the process that died was the rank's
    ``restarts``-th replacement, and its launcher starts another), the scheduler awaits the
    replacement at once instead.  True once the scheduler acknowledged."""
    body = Lost(int(rank), reason[:500]) if restarts is None else \
        Lost(int(rank), reason[:500], restart=True, restarts=int(restarts))
    try:
        _ask(scheduler, job_id, Command.LOST, Command.LOST_ACK, key_file, timeout, body)
        return True
    except PeerLost:
        return False


def announce_standby(scheduler: str, job_id: str, address: str, key_file: str | None = None,
                     timeout: float = 1.0) -> bool:
    """Tell the scheduler at ``scheduler`` that a standby scheduler waits at ``address``: it
    tells each of its nodes (and each node it welcomes later).  True once acknowledged."""
    try:
        _ask(scheduler, job_id, Command.STANDBY, Command.STANDBY_ACK, key_file, timeout, Standby(address))
        return True
    except PeerLost:
        return False
