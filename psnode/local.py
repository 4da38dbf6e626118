"""The in-process engine behind ``kv.create('local')``: one worker, one server, no sockets.

:class:`LocalEngine` is what a KVStore holds in place of a job's engine (it implements
:class:`psnode.worker.kvstore.KVBackend`): it runs the servers' own logic
(:class:`psnode.server.store.Store`) on the caller's thread, so a single process gives the values
a distributed job gives.  Every request is answered before ``send`` returns; no server is near
(no shared memory); a Python updater (``kv.set_updater``) runs in the store.  It sits above both
sides, the only module importing :mod:`psnode.worker` and :mod:`psnode.server` together.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from psnode.errors import PSError, from_kind
from psnode.protocol import Failed, Ok
from psnode.samehost.staging import NOWHERE, Places
from psnode.server.replies import sent
from psnode.server.store import Store
from psnode.worker.futures import Future, Notice, Placed


class LocalEngine:
    """The in-process stand-in for :class:`psnode.worker.engine.Engine`: one server, one worker."""

    def __init__(self) -> None:
        self.store = Store(1)
        self.rank = 0
        self.num_servers = 1
        self.restarts = 0
        self.fatal: PSError | None = None

    def send(self, placed: Sequence[Placed]) -> None:
        """Handle each operation at once (no server is near: nothing is placed)."""
        for p in placed:
            fut = p.future if p.future is not None else Future()
            replies = self.store.handle(0, p.op)
            if self.store.filling.pending:   # (values computed here: all at once)
                replies += self.store.fill_some(-1)
            while self.store.evict_due() and self.store.evict_some():   # (tables without a row count)
                pass
            for r in replies:
                if isinstance(r.answer, Failed):
                    fut.fail(from_kind(r.answer.kind, r.answer.message))
                elif isinstance(r.answer, Ok):
                    fut.set(r.answer)
                if r.entry is not None:
                    sent(r.entry, None)  # the reply's value was copied out already
            if p.future is None and fut.error is not None:
                raise fut.error

    def set_updater(self, updater: Callable[[Any, Any, np.ndarray], None] | None) -> None:
        self.store.updater = updater

    def protect(self, guards: list[Any], on: bool) -> None:
        pass

    def count_pulls(self, n: int) -> None:
        pass

    def batch(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def wait(self, fut: Future) -> Ok:
        return fut.wait(0)

    def barrier(self) -> None:
        pass

    joiner = False
    leaving = False
    notice = Notice()   # (never raised: one process has no job to hear from)
    places: Places = NOWHERE

    def membership(self) -> tuple[int, tuple[int, ...]]:
        return 0, (0,)

    def membership_changes(self) -> list[tuple[int, tuple[int, ...]]]:
        return []

    def agreed_members(self) -> tuple[int, tuple[int, ...]]:
        return 0, (0,)

    def check(self) -> None:
        pass

    def resume(self) -> None:
        pass

    def close(self, timeout: float = 30.0) -> None:
        pass
