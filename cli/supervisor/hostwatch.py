"""A host whose psnode nodes went silent is asked at once whether it still answers.

The scheduler calls a node silent after the heartbeat timeout (5 s by default).  A connection
to a host that lost power learns it only when its SSH keepalives go unanswered (interval x count:
15 s by default), and a job whose processes may be restarted waits that long for them.  So,
while such a job runs on more than one host, a :class:`HostWatch` asks the scheduler every
:data:`WATCH_S` seconds which nodes are silent or late (``restarting`` in its table, or no
heartbeat for half the heartbeat timeout: :func:`to_probe`) and probes each one's host (the
backend's reachability check, :data:`PROBE_S` at most), and the scheduler's own host when the
scheduler does not answer.  Probing a late node's host before the timeout lets a lost host's
processes restart elsewhere about when the scheduler calls them silent; the scheduler takes a
replacement for a node it still counts as alive.  A host that does not
answer is lost (:meth:`mxdist.supervisor.membership.JobMembers.answers`: said once, never used
again) and its connection dropped (:meth:`Backend.disconnect`), so the streams of its processes
end at once without an exit status and the usual rules restart them elsewhere.  A host that
answers is left alone (its node may be merely slow; the scheduler's own rules go on).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence

from psnode import launcher as door
from psnode.config import NodeConfig, Role

from ..backends.base import Backend
from ..job.records import JobRecord
from ..planning.hosts import Host
from ..planning.plan import Plan

WATCH_S = 0.5     # seconds between the watch's questions to the scheduler
PROBE_S = 2.0     # seconds a host with a silent node is given to answer
ASK_S = 0.5       # seconds the scheduler is given to answer


class HostWatch(threading.Thread):
    """Probes the hosts of silent nodes (module docstring) until :meth:`stop`.  ``answers(host,
    timeout)`` is the membership's check (False: lost, and recorded so); ``ended`` is the job's."""

    def __init__(self, record: JobRecord, hosts: Mapping[str, Host], backend: Backend,
                 answers: Callable[[Host, float], bool], ended: threading.Event, late_after: float) -> None:
        super().__init__(name="host-watch", daemon=True)
        self.late_after = late_after   # seconds without a heartbeat after which a node's host is probed
        self.record = record
        self.by_address = {h.address: h for h in hosts.values()}
        self.backend = backend
        self.answers = answers
        self.ended = ended
        self._probed: dict[str, float] = {}   # host label -> when it last answered a probe

    def run(self) -> None:
        while not self.ended.wait(WATCH_S):
            try:
                answer = door.status(self.record.scheduler, self.record.id, key_file=self.record.key_file,
                                     timeout=ASK_S)
            except Exception:  # noqa: BLE001 - no answer: the scheduler's host is the one to probe
                self._probe(self.record.scheduler.rpartition(":")[0])
                continue
            for address in to_probe(answer.nodes, self.late_after):
                self._probe(address)

    def _probe(self, address: str) -> None:
        """Probe the host at ``address`` (not again within PROBE_S of an answer); lost: disconnect."""
        host = self.by_address.get(address.strip("[]"))
        if host is None or time.monotonic() - self._probed.get(host.label, -1e9) < PROBE_S:
            return
        if self.answers(host, PROBE_S):
            self._probed[host.label] = time.monotonic()
        else:
            self.backend.disconnect(host)


def late_after(plan: Plan) -> float:
    """Seconds without a heartbeat after which a node's host is probed: half the heartbeat timeout
    after which psnode's scheduler calls a node silent (``NodeConfig.dead_after``, as the job's
    scheduler reads it from its own environment)."""
    scheduler = plan.of_role(Role.SCHEDULER)[0]
    return NodeConfig.from_env(scheduler.env).dead_after / 2


def to_probe(rows: Sequence[door.NodeRow], late_after: float) -> list[str]:
    """The hosts (addresses, each once, in row order) of the nodes the scheduler calls silent
    (``restarting``) or that are alive with no heartbeat for ``late_after`` seconds."""
    out: list[str] = []
    for row in rows:
        late = row.state == door.NodeState.ALIVE.value and (row.heartbeat_age or 0.0) >= late_after
        if (row.state == door.NodeState.RESTARTING.value or late) and row.host not in out:
            out.append(row.host)
    return out


__all__ = ["PROBE_S", "WATCH_S", "HostWatch", "late_after", "to_probe"]
