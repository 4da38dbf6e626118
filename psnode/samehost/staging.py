"""A worker's shared-memory buffers for the same-host link (pure bookkeeping over psnode.samehost.segments).

* **Push slots** (arena ``out``, read-only for servers): a push copies the caller's array into
  a slot of its key part instead of a fresh array; the slot is the push's data for the server
  and for the journal.  A slot is reused only when its push is released (applied: a pull
  after it returned, the server is done with it; and durable: the journal forgot it), as
  the journal's published ``releases`` say (psnode.worker.journal), so a key part keeps at
  most ``MAX_SLOTS`` slots; beyond that (pushes without pulls) :meth:`Staging.slot` gives None and the caller copies
  into plain memory (that push then travels over TCP).
* **Landing areas** (arena ``landing``, writable by servers): a pull names one; the server
  writes the answer there when it cannot be read in place; it returns to the pool when the
  answer was copied out (:meth:`Staging.release`), and is dropped if its request failed.

Each slot and landing area comes with its place, ``(segment, offset)`` in this worker's
segments, known when its block was made: the data path writes it on the operation
(``at``, psnode.protocol.ops.Where) and the link sends it as it is, never looking the array up.
:class:`Places` is what one call of the data path gets: which servers are near, and their
memory.
"""
from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from psnode.samehost.segments import Arena

Loc = tuple[int, int]    # (segment, offset) in this worker's segments
MAX_SLOTS = 66   # a restartable job's journal holds up to 64 pushes until durable (psnode.worker.journal), + 2
SlotKey = tuple[Any, int, int]   # (key, part, array index: 0 data, 1 row ids)


@dataclass(eq=False)   # (slots are told apart by identity: their arrays have no truth value)
class _Slot:
    block: np.ndarray    # uint8 arena block (its capacity)
    at: Loc              # where the block lies
    seq: int = 0         # the push it holds (0: free)
    exact: np.ndarray | None = None   # the last shaped view handed out (reused when it fits)


class Staging:
    """Push slots and landing areas of one worker (see the module docstring)."""

    def __init__(self, job: str, rank: int, releases: Mapping[tuple[Any, int], int]) -> None:
        """``releases``: key part -> its pushes up to this are released (the journal publishes
        it, psnode.worker.journal.PushJournal.releases; read here, never written)."""
        self.out = Arena(f"psnode.{job}.w{rank}.out", first=0)
        self.landing = Arena(f"psnode.{job}.w{rank}.in", first=1 << 20)
        self._releases = releases
        self._slots: dict[SlotKey, list[_Slot]] = {}
        self._free: dict[int, list[tuple[np.ndarray, Loc]]] = {}   # block size -> free landing blocks
        self._blocks: dict[int, tuple[np.ndarray, Loc]] = {}       # id(area) -> its block
        self._lock = threading.Lock()

    def slot(self, key: SlotKey, shape: tuple[int, ...], dtype: np.dtype, seq: int
             ) -> tuple[np.ndarray, Loc] | None:
        """An array of ``shape`` for push ``seq`` of ``key`` in a free slot, and its place (None:
        every slot of the key part holds a push not yet released)."""
        nbytes = math.prod(shape) * dtype.itemsize
        slots = self._slots.setdefault(key, [])
        done = self._releases.get(key[:2], 0)
        for s in slots:
            if s.seq <= done and s.block.nbytes >= nbytes:
                s.seq = seq
                exact = s.exact
                if exact is None or exact.shape != shape or exact.dtype != dtype:
                    exact = s.exact = s.block[:nbytes].view(dtype).reshape(shape)
                return exact, s.at
        free = [s for s in slots if s.seq <= done]
        if len(slots) >= MAX_SLOTS and not free:
            return None
        if free:                        # too small: give its block back, take a bigger one
            slots.remove(free[0])
        block = self.out.array((max(nbytes, 64) + nbytes // 4,), np.uint8)
        at = self.out.locate(block)
        assert at is not None
        s = _Slot(block, at, seq)
        slots.append(s)
        s.exact = block[:nbytes].view(dtype).reshape(shape)
        return s.exact, at

    def land(self, shape: tuple[int, ...], dtype: np.dtype) -> tuple[np.ndarray, Loc]:
        """A landing area for an answer of ``shape`` and ``dtype`` (a view of a block of the
        next power-of-two size: answers whose size varies, e.g. rows, reuse blocks), and its place."""
        shape = tuple(int(d) for d in shape)
        nbytes = max(64, math.prod(shape) * dtype.itemsize)
        size = 1 << (nbytes - 1).bit_length()
        with self._lock:
            free = self._free.get(size)
            got = free.pop() if free else None
        if got is None:
            block = self.landing.array((size,), np.uint8)
            at = self.landing.locate(block)
            assert at is not None
            got = (block, at)
        area = got[0][:math.prod(shape) * dtype.itemsize].view(dtype).reshape(shape)
        with self._lock:
            self._blocks[id(area)] = got
        return area, got[1]

    def release(self, area: np.ndarray) -> None:
        """``area``'s answer was copied out: its block may land another one."""
        with self._lock:
            got = self._blocks.pop(id(area), None)
            if got is not None:
                self._free.setdefault(got[0].nbytes, []).append(got)

    def close(self) -> None:
        self.out.close()
        self.landing.close()


class Places:
    """Where the arrays of one call's requests go (what the data path gets once per call):
    ``near`` names the servers reached over this host's link; for those, arrays go to push
    slots and landing areas of ``staging``, each with its place; for the others, plain memory
    (its place None: its bytes are sent)."""

    __slots__ = ("_staging", "near")

    def __init__(self, near: frozenset[int], staging: Staging | None) -> None:
        self.near = near
        self._staging = staging if near else None

    def slot(self, server: int, key: Any, part: int, index: int, shape: tuple[int, ...], dtype: np.dtype,
             seq: int) -> tuple[np.ndarray, Loc | None]:
        """Where to copy array ``index`` of push ``seq`` of a key part for ``server``."""
        staging = self._staging
        if staging is not None and server in self.near:
            got = staging.slot((key, part, index), shape, dtype, seq)
            if got is not None:
                return got
        return np.empty(shape, dtype), None

    def land(self, server: int, shape: tuple[int, ...], dtype: np.dtype) -> tuple[np.ndarray | None, Loc | None]:
        """A landing area for an answer (or a request's scratch, e.g. row ids) from ``server``
        (None off the link: the answer brings its own memory); it goes back to the pool once
        its request's answer was handled."""
        staging = self._staging
        if staging is not None and server in self.near:
            return staging.land(shape, np.dtype(dtype))
        return None, None


NOWHERE = Places(frozenset(), None)


__all__ = ["MAX_SLOTS", "NOWHERE", "Loc", "Places", "Staging"]
