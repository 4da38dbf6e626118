"""Chunks: a whole state sent as a train of bounded messages, received into arrays allocated once.

A packed state (a list of contiguous arrays: psnode.server.replicas.pack_state) is cut into
chunks of at most ``size`` bytes (:func:`plan`).  A chunk is a run of **pieces**, each a byte
range of one array: small arrays travel whole beside their neighbours, a big one is cut.  So no
message is bigger than ``size`` (whatever the state's size, and under the transport's
``max_message_bytes``), and each chunk's arrival is progress a receiver can acknowledge.

Chunk 0 is preceded by the **layout** (:func:`layout`: each array's dtype and shape, and
``size``).  The receiver (:class:`Assembly`) checks it, allocates the arrays once, computes the
same plan from it (nothing on the wire says where bytes go), checks each chunk's frames against
that plan, and copies them in.  Chunks are taken in order only; how many were taken is the
acknowledgement, and a sender (:class:`Sender`) that hears nothing for a while sends again
from there (go-back-N), never more than ``window`` chunks ahead of it.
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from psnode.protocol.frames import BY_NAME, MAX_NDIM, NAMES

CHUNK_BYTES = 8 << 20   # the most bytes of state one message carries
WINDOW = 4              # chunks a sender has on their way ahead of the last acknowledged
MAX_ARRAYS = 1 << 20    # a layout naming more arrays is refused


@dataclass(frozen=True)
class Piece:
    """Bytes ``start:stop`` of array ``array``."""

    array: int
    start: int
    stop: int


def chunk_bytes(max_message_bytes: int) -> int:
    """The chunk size for a transport that takes messages of up to ``max_message_bytes``: at
    most CHUNK_BYTES and half the limit (the layout and the envelope fit beside it)."""
    return max(1, min(CHUNK_BYTES, max_message_bytes // 2))


def plan(sizes: Sequence[int], size: int) -> list[tuple[Piece, ...]]:
    """The chunks of arrays of ``sizes`` bytes, in order, each at most ``size`` bytes; at least
    one (an empty one when there is no byte to send)."""
    if size < 1:
        raise ValueError(f"a chunk size must be at least 1 byte, not {size}")
    chunks: list[tuple[Piece, ...]] = []
    run: list[Piece] = []
    used = 0
    for i, n in enumerate(sizes):
        start = 0
        while start < n:
            take = min(n - start, size - used)
            run.append(Piece(i, start, start + take))
            used += take
            start += take
            if used == size:
                chunks.append(tuple(run))
                run, used = [], 0
    if run or not chunks:
        chunks.append(tuple(run))
    return chunks


def _bytes(arr: np.ndarray) -> np.ndarray:
    """A contiguous array's bytes, as a flat uint8 view."""
    return arr.reshape(-1).view(np.uint8)


def layout(arrays: Sequence[np.ndarray], size: int) -> np.ndarray:
    """What a receiver needs to allocate ``arrays`` and plan their chunks of ``size`` bytes, as
    one frame (JSON)."""
    spec = {"size": size, "arrays": [[NAMES[a.dtype], list(a.shape)] for a in arrays]}
    return np.frombuffer(json.dumps(spec, separators=(",", ":")).encode(), dtype=np.uint8)


def frames(arrays: Sequence[np.ndarray], pieces: tuple[Piece, ...]) -> list[np.ndarray]:
    """A chunk's frames: views of its pieces' bytes (contiguous ``arrays``; nothing copied)."""
    return [_bytes(arrays[p.array])[p.start:p.stop] for p in pieces]


@dataclass
class Assembly:
    """A state arriving in chunks: its arrays (allocated from the layout) and how many chunks
    were taken (in order)."""

    arrays: list[np.ndarray]
    chunks: list[tuple[Piece, ...]]
    taken: int = 0

    @classmethod
    def of(cls, spec: np.ndarray, chunks: int, max_bytes: int) -> Assembly:
        """From a layout frame for ``chunks`` chunks (what the sender says it sends), arrays of at
        most ``max_bytes`` in all; ValueError when the layout is not one or does not match."""
        try:
            doc = json.loads(bytes(np.asarray(spec, dtype=np.uint8)).decode())
            size, described = doc["size"], doc["arrays"]
        except (TypeError, ValueError, KeyError, UnicodeDecodeError) as exc:
            raise ValueError(f"a chunked state's layout is not one: {exc}") from None
        if type(size) is not int or size < 1 or not isinstance(described, list) or len(described) > MAX_ARRAYS:
            raise ValueError("a chunked state's layout has no valid chunk size or array list")
        shapes: list[tuple[np.dtype, tuple[int, ...]]] = []
        total = 0
        for item in described:
            if (not isinstance(item, list) or len(item) != 2 or item[0] not in BY_NAME
                    or not isinstance(item[1], list) or len(item[1]) > MAX_NDIM
                    or not all(type(d) is int and d >= 0 for d in item[1])):
                raise ValueError(f"a chunked state's layout names an array it cannot hold: {str(item)[:80]}")
            dtype, shape = BY_NAME[item[0]], tuple(item[1])
            total += math.prod(shape) * dtype.itemsize
            if total > max_bytes:
                raise ValueError(f"a chunked state's layout comes to more than {max_bytes} bytes")
            shapes.append((dtype, shape))
        arrays = [np.empty(shape, dtype) for dtype, shape in shapes]
        cut = plan([a.nbytes for a in arrays], size)
        if len(cut) != chunks:
            raise ValueError(f"a chunked state's layout makes {len(cut)} chunks, not the {chunks} it came with")
        return cls(arrays, cut)

    @property
    def done(self) -> bool:
        return self.taken == len(self.chunks)

    def take(self, index: int, got: Sequence[np.ndarray]) -> bool:
        """Copy in chunk ``index`` if it is the next one (True), else leave it (False: taken
        already, or one before it is missing); ValueError when its frames are not the plan's."""
        if index != self.taken or self.done:
            return False
        pieces = self.chunks[index]
        if len(got) != len(pieces):
            raise ValueError(f"chunk {index} has {len(got)} frames, not {len(pieces)}")
        for frame, p in zip(got, pieces, strict=True):
            if frame.dtype != np.uint8 or frame.ndim != 1 or frame.nbytes != p.stop - p.start:
                raise ValueError(f"chunk {index}: a frame of {frame.nbytes} bytes where {p.stop - p.start} belong")
        for frame, p in zip(got, pieces, strict=True):
            _bytes(self.arrays[p.array])[p.start:p.stop] = frame
        self.taken += 1
        return True


@dataclass
class Sender:
    """One state on its way to one receiver in chunks, go-back-N: up to ``window`` chunks ahead
    of the last acknowledged; after ``silence`` s without progress, from there again."""

    arrays: list[np.ndarray]
    size: int
    window: int = WINDOW
    chunks: list[tuple[Piece, ...]] = field(init=False)
    total: int = field(init=False)
    acked: int = 0
    sent: int = 0
    progress_at: float = 0.0

    def __post_init__(self) -> None:
        self.chunks = plan([a.nbytes for a in self.arrays], self.size)
        self.total = sum(a.nbytes for a in self.arrays)

    @property
    def acked_bytes(self) -> int:
        """Bytes of the state the receiver acknowledged (its chunks taken)."""
        return min(self.total, self.acked * self.size)

    @property
    def done(self) -> bool:
        return self.acked == len(self.chunks)

    def due(self, now: float, silence: float) -> range:
        """The chunks to send at ``now`` (they count as sent): those the window allows, from the
        last acknowledged again when nothing was acknowledged for ``silence`` s.  Until the first
        acknowledgement the window is one chunk: a receiver that refuses the state (busy) costs
        its link one chunk, not a window."""
        if not self.sent:
            self.progress_at = now
        elif self.sent > self.acked and now - self.progress_at > silence:
            self.sent, self.progress_at = self.acked, now
        upto = min(self.acked + (self.window if self.acked else 1), len(self.chunks))
        due = range(self.sent, upto) if upto > self.sent else range(0)
        self.sent = max(self.sent, upto)
        return due

    def ack(self, taken: int, now: float) -> None:
        """The receiver has ``taken`` chunks: progress; fewer than acknowledged before means it
        lost them (a new receiver), so they go again."""
        if taken > self.acked:
            self.acked, self.progress_at = min(taken, len(self.chunks)), now
            self.sent = max(self.sent, self.acked)
        elif taken < self.acked:
            self.acked = self.sent = max(0, taken)
            self.progress_at = now

    def message(self, index: int) -> list[np.ndarray]:
        """Chunk ``index``'s frames, the layout first for chunk 0."""
        got = frames(self.arrays, self.chunks[index])
        return [layout(self.arrays, self.size), *got] if index == 0 else got

    def nbytes(self, index: int) -> int:
        return sum(p.stop - p.start for p in self.chunks[index])


__all__ = ["CHUNK_BYTES", "WINDOW", "Assembly", "Piece", "Sender", "chunk_bytes", "frames", "layout", "plan"]
