"""Key parts whose values the server computes itself (``kv.init`` with ``ps_initializer``), or
copies from a big init's array (:class:`CopyOf`).

Pure: no sockets.  A part of a big table takes seconds to compute, longer than a server may go
without a heartbeat, so :class:`Fills` computes it a bounded number of elements at a time:
the server loop calls :meth:`Fills.step` between polls while :attr:`Fills.pending` is not
empty (a ``'local'`` store runs every fill to the end at once).  A part being filled is not a
key yet (:mod:`psnode.server.store` creates its entry when the fill completes), so no push,
pull or checkpoint ever sees it half computed; its init is answered then.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from psnode.math.initializers import FillSpec

Key = tuple[Any, int]   # (user key, part index)

#: elements computed per step (tens of milliseconds of a normal initializer)
STEP = 1 << 21


class CopyOf:
    """A part's values given whole (a big ``kv.init`` array), copied a step at a time like a
    computed fill, so the copy never holds the server's loop."""

    def __init__(self, source: np.ndarray) -> None:
        self.flat = source.reshape(-1)

    def fill(self, key: Any, out: np.ndarray, start: int) -> None:
        np.copyto(out, self.flat[start:start + len(out)])


@dataclass
class Fill:
    """One part being computed: its value buffer, the spec, how far it got, and the request
    that asked for it (``worker``, ``op``: answered when it is done)."""

    key: Key
    value: np.ndarray
    spec: FillSpec | CopyOf
    worker: int
    op: Any
    done: int = 0

    @property
    def size(self) -> int:
        return int(self.value.size)


class Fills:
    """The parts being computed, oldest first."""

    def __init__(self, step: int = STEP) -> None:
        self.step_elements = step
        self.pending: dict[Key, Fill] = {}

    def start(self, key: Key, value: np.ndarray, spec: FillSpec | CopyOf, worker: int, op: Any) -> None:
        """Compute ``value`` (C-contiguous, the part's shape) from ``spec`` from now on."""
        self.pending[key] = Fill(key, value, spec, worker, op)

    def step(self, budget: int | None = None) -> list[Fill]:
        """Compute ``budget`` elements (default: this store's step; a negative budget: all of
        them), oldest part first; the parts completed."""
        left = self.step_elements if budget is None else budget
        done: list[Fill] = []
        for key, fill in list(self.pending.items()):
            flat = fill.value.reshape(-1)
            while fill.done < fill.size and left != 0:
                n = fill.size - fill.done if left < 0 else min(left, fill.size - fill.done)
                fill.spec.fill(key[0], flat[fill.done:fill.done + n], fill.done)
                fill.done += n
                if left > 0:
                    left -= n
            if fill.done < fill.size:
                break
            del self.pending[key]
            done.append(fill)
        return done


__all__ = ["STEP", "CopyOf", "Fill", "Fills"]
