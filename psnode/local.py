"""The in-process engine behind ``kv.create('local')``: one worker, one server, no sockets.

It runs the servers' own logic (:class:`psnode.aggregation.Store`) on the caller's thread, so a
single process gives the values a distributed job gives.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from psnode.aggregation import Store, sent
from psnode.errors import from_kind
from psnode.protocol import Command, Failed, Ok, Op
from psnode.worker import Future

Copier = Callable[[Ok], None]


class LocalEngine:
    """The in-process stand-in for :class:`psnode.worker.Engine`: one server, one worker."""

    def __init__(self) -> None:
        self.store = Store(1)
        self.rank = 0
        self.num_servers = 1
        self.restarts = 0

    def submit(self, server: int, op: Op, nbytes: int = 0, priority: int = 0,
               on_reply: Copier | None = None, reply: bool = True) -> Future | None:
        fut = Future(on_reply)
        for r in self.store.handle(0, op):
            if isinstance(r.answer, Failed):
                fut.fail(from_kind(r.answer.kind, r.answer.message))
            elif isinstance(r.answer, Ok):
                fut.set(r.answer)
            if r.entry is not None:
                sent(r.entry, None)  # the reply's value was copied out already
        if not reply:
            if fut.error is not None:
                raise fut.error
            return None
        return fut

    def wait(self, fut: Future) -> Ok:
        return fut.wait(0)

    def control(self, cmd: Command, body: dict[str, Any] | None = None) -> Future:
        fut = Future()
        fut.set(Ok(0))
        return fut

    def check(self) -> None:
        pass

    def resume(self) -> None:
        pass

    def close(self, timeout: float = 30.0) -> None:
        pass
