"""psnode.server.replicas over real sockets on 127.0.0.1: a keeper thread, the primaries' copies
to it, and a replacement's fetch."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pytest

from psnode.config import NodeConfig, Role
from psnode.net.security import Mode, Security
from psnode.net.transport import Transport, new_security
from psnode.protocol.control import ServerAddress
from psnode.server.replicas import Keeper, Replicator, fetch

JOB = "job-replicas"


@dataclass
class Holder:
    """Server 0's keeper (it holds server 1's copies), the address book naming it, and the
    transports the test opened (closed at the end)."""

    security: Security
    cfg: NodeConfig
    book: list[ServerAddress]
    transports: list[Transport] = field(default_factory=list)

    def transport(self, name: str) -> Transport:
        t = Transport(JOB, name, self.cfg.max_message_bytes, self.security)
        self.transports.append(t)
        return t

    def primary(self, restart_count: int) -> Replicator:
        """Server 1 (its ``restart_count``-th process), connected to the keeper."""
        primary = Replicator(self.transport(f"server:1/{restart_count}"), 1, 2, 2, restart_count=restart_count)
        primary.repoint(self.book)
        return primary

    def fetch(self) -> tuple[dict, dict, int]:
        return fetch(self.transport("server:1/fetch"), 1, self.book, 2, 2, lambda: None, timeout=5.0)


@pytest.fixture
def holder() -> Iterator[Holder]:
    security = new_security(Mode.AUTHENTICATED)
    cfg = NodeConfig(role=Role.SERVER, scheduler_host="127.0.0.1", scheduler_port=1, num_workers=1,
                     num_servers=2, job_id=JOB)
    keeper = Keeper(cfg, security)
    keeper.start()
    h = Holder(security, cfg, [ServerAddress(0, "127.0.0.1", 1, keeper.port), ServerAddress(1, "127.0.0.1", 2)])
    try:
        yield h
    finally:
        for t in h.transports:
            t.close()
        keeper.close()


def _within(seconds: float, what: str) -> Callable[[], None]:
    """A copy's pump that fails the wait after ``seconds``."""
    deadline = time.monotonic() + seconds

    def pump() -> None:
        if time.monotonic() > deadline:
            raise _Abandoned(what)
    return pump


class _Abandoned(Exception):
    pass


def _copy(primary: Replicator, value: float, within: float = 10.0) -> None:
    """Copy ``value`` as the primary's state; _Abandoned if it is not acknowledged in time."""
    primary.copy({"value": value}, {"w": np.full(4, value, np.float32)},
                 _within(within, f"the copy of {value} was not acknowledged in {within:g} s"), resend_after=0.5)


def test_a_replacements_copies_supersede_its_predecessors_at_the_holder(holder: Holder) -> None:
    """Server 1 copies its state to server 0's keeper three times and dies; its replacement (one
    restart later) restores, changes its state and copies it: the keeper must hold the
    replacement's copy, so a second replacement fetches that one, not the predecessor's (which
    lacks what the replacement reported durable)."""
    for restart, values in ((0, [1.0, 2.0, 3.0]), (1, [4.0])):
        primary = holder.primary(restart)
        for v in values:
            _copy(primary, v)
        primary.close()
    meta, arrays, source = holder.fetch()
    assert (meta, source) == ({"value": 4.0}, 0)
    np.testing.assert_array_equal(arrays["w"], np.full(4, 4.0, np.float32))


def test_a_replaced_primarys_late_copy_is_never_acknowledged(holder: Holder) -> None:
    """A primary replaced while it still runs (cut off, then back) copies again: the keeper keeps
    the replacement's copy and never acknowledges the older one, so that primary's copy never
    completes (it waits, pumping its scheduler link, until the job tells it to end)."""
    new = holder.primary(1)    # (both connected to the keeper at once: each gets its own acks)
    old = holder.primary(0)
    _copy(old, 1.0)
    _copy(new, 2.0)
    with pytest.raises(_Abandoned):
        _copy(old, 3.0, within=1.5)
    assert holder.fetch()[0] == {"value": 2.0}
