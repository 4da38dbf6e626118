"""What a worker's link to each server delivers, as seen from its answers (pure: no clocks, no sockets).

The worker's resend deadlines and its verdict on a silent server come from here
(:class:`~psnode.worker.tracker.Tracker` feeds it), under one rule: **a worker never gives a
server up because a big request is slow**.

* **bytes in order**: every operation sent to a server adds its payload to the link's ``sent``
  count; the request remembers that count as its *mark*.  A server's connection delivers in
  order, so an answer to a request proves the server received everything up to its mark
  (``received``).  ``sent - received`` is the link's backlog: bytes on their way.
* **rate**: each time ``received`` advances by ``SAMPLE_BYTES`` or more, the bytes over the time
  since the link last advanced (or since its backlog last started) are one sample of the rate
  the link delivers; the rate is their running mean (``RATE_GUESS`` before the first sample,
  never below ``RATE_FLOOR``).  An answer held back by a round (other workers' pushes) makes a
  sample low: deadlines then grow, never shrink.
* **deadline** (:meth:`LinkMeter.due`): a request is overdue ``timeout`` seconds after its
  bytes, and the bytes ahead of it, should have arrived at the measured rate; while the link
  keeps delivering bytes sent before it, its clock restarts at the latest delivery.
* **liveness** (:meth:`LinkMeter.heard_since`): any answer from a server, to any request, shows
  it alive; a worker gives a server up only after resends that got no answer of any kind
  (heartbeats to the scheduler decide the rest: a dead server ends the job, or is replaced).
"""
from __future__ import annotations

from dataclasses import dataclass

RATE_GUESS = 10.0 * 2**20   # bytes/s a link is assumed to deliver before its first sample
RATE_FLOOR = 1.0 * 2**20    # bytes/s: a measured rate below this counts as this
SAMPLE_BYTES = 256 * 2**10  # an advance of fewer bytes is no rate sample (the server's own delay dominates)


@dataclass(slots=True)
class LinkRate:
    """One server's link, in bytes and seconds (see the module docstring)."""

    sent: int = 0               # payload bytes sent, in order
    received: int = 0           # bytes the server surely received (the highest answered mark)
    moved: float = float("-inf")   # when ``received`` last advanced
    busy: float = float("-inf")    # when the backlog last went from empty to not
    rate: float = RATE_GUESS    # bytes/s delivered
    samples: int = 0
    heard: float = float("-inf")   # when the server last answered anything

    @property
    def backlog(self) -> int:
        return self.sent - self.received


class LinkMeter:
    """The links to ``num_servers`` servers (see the module docstring)."""

    def __init__(self, num_servers: int) -> None:
        self.links = [LinkRate() for _ in range(num_servers)]

    def sent(self, server: int, nbytes: int, now: float) -> tuple[int, int]:
        """``nbytes`` of payload leave for ``server``; (their mark, the backlog with them)."""
        link = self.links[server]
        if link.sent <= link.received:
            link.busy = now
        link.sent += nbytes
        return link.sent, link.sent - link.received

    def heard(self, server: int, now: float) -> None:
        """``server`` answered something (a sign of life, whatever it answered)."""
        link = self.links[server]
        link.heard = max(link.heard, now)

    def answered(self, server: int, mark: int, now: float) -> None:
        """``server`` answered a request whose mark is ``mark``: it received every byte before."""
        link = self.links[server]
        link.heard = max(link.heard, now)
        if mark <= link.received:
            return
        moved = mark - link.received
        start = max(link.moved, link.busy)
        if moved >= SAMPLE_BYTES and now > start:
            sample = moved / (now - start)
            link.rate = sample if not link.samples else (link.rate + sample) / 2
            link.rate = max(link.rate, RATE_FLOOR)
            link.samples += 1
        link.received, link.moved = mark, now

    def due(self, server: int, sent: float, mark: int, ahead: int, back: int, timeout: float) -> float:
        """When a request sent at ``sent`` (mark ``mark``; ``ahead``: the backlog with it, then;
        ``back``: the bytes its answer brings) is overdue."""
        link = self.links[server]
        if link.moved > sent and mark > link.received:   # the link still delivers what was before it
            return link.moved + timeout + (mark - link.received + back) / link.rate
        return sent + timeout + (ahead + back) / link.rate

    def heard_since(self, server: int, when: float) -> bool:
        return self.links[server].heard >= when

    def rate(self, server: int) -> float:
        return self.links[server].rate


__all__ = ["RATE_FLOOR", "RATE_GUESS", "SAMPLE_BYTES", "LinkMeter", "LinkRate"]
