"""A worker's shared-memory buffers for the same-host link (pure bookkeeping over psnode.samehost.segments).

* **Push slots** (arena ``out``, read-only for servers): a push copies the caller's array into
  a slot of its key part instead of a fresh array; the slot is the push's data for the server
  and for the journal.  A slot is reused only when its push is released (applied: a pull
  after it returned, the server is done with it; and durable: the journal forgot it,
  psnode.worker.journal), so a key part keeps at most ``MAX_SLOTS`` slots;
  beyond that (pushes without pulls) :meth:`Staging.slot` gives None and the caller copies
  into plain memory (that push then travels over TCP).
* **Landing areas** (arena ``landing``, writable by servers): a pull names one; the server
  writes the answer there when it cannot be read in place; it returns to the pool when the
  answer was copied out (:meth:`Staging.release`), and is dropped if its request failed.
"""
from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from psnode.samehost.segments import Arena

MAX_SLOTS = 34   # a restartable job's journal holds up to 32 pushes until durable (psnode.worker.journal), + 2
SlotKey = tuple[Any, int, int]   # (key, part, array index: 0 data, 1 row ids)


@dataclass(eq=False)   # (slots are told apart by identity: their arrays have no truth value)
class _Slot:
    block: np.ndarray    # uint8 arena block (its capacity)
    seq: int = 0         # the push it holds (0: free)
    exact: np.ndarray | None = None   # the last shaped view handed out (reused when it fits)


class Staging:
    """Push slots and landing areas of one worker (see the module docstring)."""

    def __init__(self, job: str, rank: int, released: Callable[[tuple[Any, int]], int]) -> None:
        self.out = Arena(f"psnode.{job}.w{rank}.out", first=0)
        self.landing = Arena(f"psnode.{job}.w{rank}.in", first=1 << 20)
        self._released = released
        self._slots: dict[SlotKey, list[_Slot]] = {}
        self._free: dict[int, list[np.ndarray]] = {}       # block size -> free landing blocks
        self._blocks: dict[int, np.ndarray] = {}           # id(area) -> its block
        self._lock = threading.Lock()

    def slot(self, key: SlotKey, shape: tuple[int, ...], dtype: np.dtype, seq: int) -> np.ndarray | None:
        """An array of ``shape`` for push ``seq`` of ``key`` in a free slot (None: every slot
        of the key part holds a push not yet released)."""
        nbytes = math.prod(shape) * dtype.itemsize
        slots = self._slots.setdefault(key, [])
        done = self._released(key[:2])
        for s in slots:
            if s.seq <= done and s.block.nbytes >= nbytes:
                s.seq = seq
                if s.exact is not None and s.exact.shape == shape and s.exact.dtype == dtype:
                    return s.exact
                s.exact = self.out.adopt(s.block[:nbytes].view(dtype).reshape(shape))
                return s.exact
        free = [s for s in slots if s.seq <= done]
        if len(slots) >= MAX_SLOTS and not free:
            return None
        if free:                        # too small: give its block back, take a bigger one
            slots.remove(free[0])
        block = self.out.array((max(nbytes, 64) + nbytes // 4,), np.uint8)
        s = _Slot(block, seq)
        slots.append(s)
        s.exact = self.out.adopt(block[:nbytes].view(dtype).reshape(shape))
        return s.exact

    def land(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A landing area for an answer of ``shape`` and ``dtype`` (a view of a block of the
        next power-of-two size: answers whose size varies, e.g. rows, reuse blocks)."""
        shape = tuple(int(d) for d in shape)
        nbytes = max(64, math.prod(shape) * dtype.itemsize)
        size = 1 << (nbytes - 1).bit_length()
        with self._lock:
            free = self._free.get(size)
            block = free.pop() if free else None
        if block is None:
            block = self.landing.array((size,), np.uint8)
        area = block[:math.prod(shape) * dtype.itemsize].view(dtype).reshape(shape)
        with self._lock:
            self._blocks[id(area)] = block
        return area

    def release(self, area: np.ndarray) -> None:
        """``area``'s answer was copied out: its block may land another one."""
        with self._lock:
            block = self._blocks.pop(id(area), None)
            if block is not None:
                self._free.setdefault(block.nbytes, []).append(block)

    def owns(self, area: np.ndarray) -> bool:
        """``area`` is a landing area handed out (and not yet released)."""
        return id(area) in self._blocks

    def close(self) -> None:
        self.out.close()
        self.landing.close()


__all__ = ["MAX_SLOTS", "Staging"]
