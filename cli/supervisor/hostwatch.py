"""A host whose psnode nodes went silent is asked at once whether it still answers.

The scheduler calls a node silent after the heartbeat timeout (5 s by default).  A connection
to a host that lost power learns it only when its SSH keepalives go unanswered (interval x count:
15 s by default), and a job whose processes may be restarted waits that long for them.  So,
while such a job runs on more than one host, a :class:`HostWatch` asks the scheduler every
:data:`WATCH_S` seconds which nodes are silent (``restarting`` in its table) and probes each
one's host (the backend's reachability check, :data:`PROBE_S` at most), and the scheduler's
own host when the scheduler does not answer.  A host that does not
answer is lost (:meth:`mxdist.supervisor.membership.Membership.answers`: said once, never used
again) and its connection dropped (:meth:`Backend.disconnect`), so the streams of its processes
end at once without an exit status and the usual rules restart them elsewhere.  A host that
answers is left alone (its node may be merely slow; the scheduler's own rules go on).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from psnode import launcher as door

from ..backends.base import Backend
from ..job.records import JobRecord
from ..planning.hosts import Host

WATCH_S = 1.0     # seconds between the watch's questions to the scheduler
PROBE_S = 2.0     # seconds a host with a silent node is given to answer
ASK_S = 0.5       # seconds the scheduler is given to answer


class HostWatch(threading.Thread):
    """Probes the hosts of silent nodes (module docstring) until :meth:`stop`.  ``answers(host,
    timeout)`` is the membership's check (False: lost, and recorded so); ``ended`` is the job's."""

    def __init__(self, record: JobRecord, hosts: Mapping[str, Host], backend: Backend,
                 answers: Callable[[Host, float], bool], ended: threading.Event) -> None:
        super().__init__(name="host-watch", daemon=True)
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
            for row in answer.nodes:
                if row.state == door.NodeState.RESTARTING.value:
                    self._probe(row.host)

    def _probe(self, address: str) -> None:
        """Probe the host at ``address`` (not again within PROBE_S of an answer); lost: disconnect."""
        host = self.by_address.get(address.strip("[]"))
        if host is None or time.monotonic() - self._probed.get(host.label, -1e9) < PROBE_S:
            return
        if self.answers(host, PROBE_S):
            self._probed[host.label] = time.monotonic()
        else:
            self.backend.disconnect(host)


__all__ = ["PROBE_S", "WATCH_S", "HostWatch"]
