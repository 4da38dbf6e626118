"""psnode.server.replicas over real sockets on 127.0.0.1: a keeper thread, the primaries' copies
to it, and a replacement's fetch."""
from __future__ import annotations

import time

import numpy as np
import pytest

from psnode.config import NodeConfig, Role
from psnode.net.security import Mode
from psnode.net.transport import Transport, new_security
from psnode.protocol.control import ServerAddress
from psnode.server.replicas import Keeper, Replicator, fetch

JOB = "job-replicas"


def _copy(primary: Replicator, value: float) -> None:
    """Copy ``value`` as the primary's state; AssertionError if it is not acknowledged in 10 s."""
    deadline = time.monotonic() + 10.0

    def pump() -> None:
        assert time.monotonic() < deadline, f"the copy of {value} was not acknowledged in 10 s"
    primary.copy({"value": value}, {"w": np.full(4, value, np.float32)}, pump, resend_after=1.0)


def test_a_replacements_copies_supersede_its_predecessors_at_the_holder() -> None:
    """Server 1 copies its state to server 0's keeper three times and dies; its replacement (one
    restart later) restores, changes its state and copies it: the keeper must hold the
    replacement's copy, so a second replacement fetches that one, not the predecessor's (which
    lacks what the replacement reported durable)."""
    security = new_security(Mode.AUTHENTICATED)
    cfg = NodeConfig(role=Role.SERVER, scheduler_host="127.0.0.1", scheduler_port=1, num_workers=1,
                     num_servers=2, job_id=JOB)
    keeper = Keeper(cfg, security)
    keeper.start()
    book = [ServerAddress(0, "127.0.0.1", 1, keeper.port), ServerAddress(1, "127.0.0.1", 2)]
    transports = []
    try:
        for restart, values in ((0, [1.0, 2.0, 3.0]), (1, [4.0])):
            t = Transport(JOB, f"server:1/{restart}", cfg.max_message_bytes, security)
            transports.append(t)
            primary = Replicator(t, 1, 2, 2, restart_count=restart)
            primary.repoint(book)
            for v in values:
                _copy(primary, v)
            primary.close()
        t = Transport(JOB, "server:1/2", cfg.max_message_bytes, security)
        transports.append(t)
        meta, arrays, holder = fetch(t, 1, book, 2, 2, lambda: None, timeout=5.0)
        assert (meta, holder) == ({"value": 4.0}, 0)
        np.testing.assert_array_equal(arrays["w"], np.full(4, 4.0, np.float32))
    finally:
        for t in transports:
            t.close()
        keeper.close()


class _Abandoned(Exception):
    pass


def test_a_replaced_primarys_late_copy_is_never_acknowledged() -> None:
    """A primary replaced while it still runs (cut off, then back) copies again: the keeper keeps
    the replacement's copy and never acknowledges the older one, so that primary's copy never
    completes (it waits, pumping its scheduler link, until the job tells it to end)."""
    security = new_security(Mode.AUTHENTICATED)
    cfg = NodeConfig(role=Role.SERVER, scheduler_host="127.0.0.1", scheduler_port=1, num_workers=1,
                     num_servers=2, job_id=JOB)
    keeper = Keeper(cfg, security)
    keeper.start()
    book = [ServerAddress(0, "127.0.0.1", 1, keeper.port), ServerAddress(1, "127.0.0.1", 2)]
    old_t = Transport(JOB, "server:1/0", cfg.max_message_bytes, security)
    new_t = Transport(JOB, "server:1/1", cfg.max_message_bytes, security)
    try:
        old, new = Replicator(old_t, 1, 2, 2), Replicator(new_t, 1, 2, 2, restart_count=1)
        new.repoint(book)    # (both connected to the keeper at once: each gets its own acks)
        old.repoint(book)
        _copy(old, 1.0)
        _copy(new, 2.0)
        deadline = time.monotonic() + 1.5

        def pump() -> None:
            if time.monotonic() > deadline:
                raise _Abandoned
        with pytest.raises(_Abandoned):
            old.copy({"value": 3.0}, {"w": np.full(4, 3.0, np.float32)}, pump, resend_after=0.5)
        meta, _, _ = fetch(new_t, 1, book, 2, 2, lambda: None, timeout=5.0)
        assert meta == {"value": 2.0}
    finally:
        old_t.close()
        new_t.close()
        keeper.close()
