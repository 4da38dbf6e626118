"""Wait-for cycles among workers: the scheduler ends a job that can never progress (pure).

Every heartbeat of a worker says what its user's thread waits for, when that is other workers
(psnode.worker.engine ``Engine.waiting``; the report is checked on receipt:
:func:`psnode.protocol.control.wait_report`): a barrier (``what="barrier"``, ``n``), or a pull
(or init) parked on its server (``what="pull"``, ``of``, ``push``, ``on``), ``on`` being the
workers whose pushes its round lacks.  A worker reports such a wait only once every
push it sent is known to have arrived (a lost push is resent, never taken for a cycle), and
reports nothing while it computes.  The workers a barrier waits for are those not in it
(:class:`Watch` is told them), less those that report waiting in it themselves (their entry is
still on the way: a worker sends it again until answered).

:meth:`Watch.check` finds a **deadlock** when every live worker has reported the same wait for
``settle`` seconds (the heartbeat timeout) and each waits only for workers that wait too or
that will never push again (finished); the verdict names a cycle::

    deadlock: worker 0 waits in barrier 1 for worker 1; worker 1 waits in the pull of 'w' (push 2) for worker 0

A slow worker still computing reports no wait, so it never triggers one; nor does a job with a
node being replaced (its replacement will push).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from psnode.protocol.control import WaitKind
from psnode.protocol.control import WaitReport as Wait


def _entered(w: Wait | None, n: int | None) -> bool:
    """Does report ``w`` say its worker entered barrier ``n`` (or a later one)?"""
    return w is not None and w.what is WaitKind.BARRIER and (w.n or 0) >= (n or 0)


def describe(w: Wait) -> str:
    """What ``w`` waits in, in words: ``barrier 1``, ``the init of 'w'``, ``the pull of 'w' (push 2)``."""
    if w.what is WaitKind.BARRIER:
        return f"barrier {w.n}"
    if w.what is WaitKind.INIT:
        return f"the init of {w.of}"
    return f"the pull of {w.of} (push {w.push})"


@dataclass
class Watch:
    """The scheduler's view of the workers' waits (see the module docstring)."""

    settle: float
    _key: object = None
    _since: float = 0.0

    def reset(self) -> None:
        self._key = None

    def check(self, now: float, waits: Mapping[int, Wait | None], in_barrier: Callable[[int], list[int]],
              gone: set[int]) -> str | None:
        """The deadlock verdict, or None.  ``waits``: every live worker's last report (None:
        not waiting); ``in_barrier(n)``: the live workers not in barrier ``n``; ``gone``:
        workers that will never push again."""
        if not waits or any(w is None for w in waits.values()):
            self._key = None
            return None
        key = sorted((r, w.episode, w.on) for r, w in waits.items() if w is not None)
        if key != self._key:
            self._key, self._since = key, now
            return None
        if now - self._since < self.settle:
            return None
        edges: dict[int, list[int]] = {}
        for r, w in waits.items():
            assert w is not None
            # (a worker that reports waiting in the barrier entered it, though its entry may still
            # be on the way to the scheduler: sent again until answered)
            on = [x for x in in_barrier(w.n) if not _entered(waits.get(x), w.n)] if w.what is WaitKind.BARRIER \
                else list(w.on)
            on = [x for x in on if x != r]
            if not on or any(x not in waits and x not in gone for x in on):
                return None   # (it waits for someone who may still push)
            edges[r] = on
        return "deadlock: " + "; ".join(self._path(min(edges), edges, waits, gone))

    @staticmethod
    def _path(start: int, edges: dict[int, list[int]], waits: Mapping[int, Wait | None],
              gone: set[int]) -> list[str]:
        """The cycle reached from ``start`` (or the path to a worker that finished)."""
        order: list[int] = []
        r = start
        while r not in order:
            order.append(r)
            if r in gone:
                break
            on = edges[r]
            r = next((x for x in on if x in order), on[0])   # (close the cycle when it can)
        if r in order and r not in gone:
            order = order[order.index(r):]
        steps: list[str] = []
        for i, x in enumerate(order):
            if x in gone:
                steps[-1] += ", which has finished"
                break
            nxt = order[i + 1] if i + 1 < len(order) else order[0]
            w = waits[x]
            assert w is not None
            steps.append(f"worker {x} waits in {describe(w)} for worker {nxt}")
        return steps


__all__ = ["Watch", "describe"]
