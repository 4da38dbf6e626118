"""A server's per-key-part state and its answers (the data of psnode.server.store, and the
small rules about it that psnode.server.buckets shares)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from psnode.math.compression import spec_of_tag
from psnode.protocol import Answer

Key = tuple[Any, int]  # (user key, part index)


@dataclass
class Reply:
    """An answer to one operation, for ``worker``.  With ``entry``, ``answer.arrays[0]`` is that
    entry's value: the sender must call :func:`sent` once the send was issued (with its
    tracker, if any).  ``dest``: the pull's landing area (same-host link), where the sender
    copies the value unless ``shared``: the value may be read in place until the worker's next
    push of the key (sync rounds: it changes only when a round completes)."""

    worker: int
    answer: Answer
    entry: Entry | None = None
    dest: np.ndarray | None = None
    shared: bool = False
    fixed: bool = False   # the array is written in place by later rounds: TCP must send a copy
    holder: Any = None    # the Entry or bucket whose durable watermark the Ok's seq reports

    def __post_init__(self) -> None:
        if self.entry is not None:
            self.entry.value_sends.append(UNSENT)


def sent(entry: Entry, tracker: Any | None) -> None:
    """A reply carrying ``entry.value`` went out; ``tracker`` tells when zmq is done with it."""
    if UNSENT in entry.value_sends:
        entry.value_sends.remove(UNSENT)
    if tracker is not None:
        entry.value_sends.append(tracker)


@dataclass
class Entry:
    value: np.ndarray
    sparse: bool
    sync: bool
    average: bool
    round: int = 0
    first: np.ndarray | None = None   # the round's first dense push, by reference
    spare: np.ndarray | None = None   # buffer the next aggregate is summed into
    spare_sends: list[Any] = field(default_factory=list)
    contributors: set[int] = field(default_factory=set)
    sparse_parts: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    # pushes for later rounds: (seq, data: an array or a psnode.server.arith.Packed, rows)
    early: dict[int, list[tuple[int, Any, np.ndarray | None]]] = field(default_factory=dict)
    pushed: dict[int, int] = field(default_factory=dict)
    ahead: dict[int, set[int]] = field(default_factory=dict)  # async: applied beyond a gap
    pulls: list[tuple[int, int, int, np.ndarray | None, np.ndarray | None]] = field(default_factory=list)
    state: Any = None
    value_sends: list[Any] = field(default_factory=list)  # zero-copy sends reading ``value``
    nonfinite: set[int] = field(default_factory=set)   # workers whose push this round was bad
    skipped: int = 0
    bucket: Any = None     # the psnode.server.buckets bucket it belongs to (its value is a view of it)
    fixed: bool = False    # value stays where it is (written in place, never swapped)
    scaled: bool = False   # spare already holds the round's average (summed and scaled at once)
    row_sum: np.ndarray | None = None   # flat scratch a sync row_sparse round is summed into
    durable: dict[int, int] = field(default_factory=dict)   # worker -> pushes its last checkpoint holds


class _Unsent:
    """Marks a value referenced by a reply not sent yet: it must not be written."""

    done = False


UNSENT = _Unsent()


class OpError(Exception):
    """A request refused; ``kind`` names the exception the worker raises."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def fmt(key: Any, part: int) -> str:
    return f"key {key!r}" + (f" part {part}" if part else "")


def fits(dest: np.ndarray | None, shape: tuple[int, ...], dtype: np.dtype) -> bool:
    """``dest`` is a writable landing area for an answer of ``shape`` and ``dtype``."""
    return dest is not None and dest.shape == shape and dest.dtype == dtype and dest.flags.writeable


def received(entry: Entry, worker: int, seq: int) -> bool:
    return (seq <= entry.pushed.get(worker, 0) or seq in entry.ahead.get(worker, ())
            or any(s == seq for s, *_ in entry.early.get(worker, [])))


def first_gap(entry: Entry, worker: int) -> int:
    """The first push sequence number of ``worker`` this key part has not received."""
    have = {s for s, *_ in entry.early.get(worker, [])} | entry.ahead.get(worker, set())
    seq = entry.pushed.get(worker, 0) + 1
    while seq in have:
        seq += 1
    return seq


def contiguous(entry: Entry, worker: int) -> int:
    """How many pushes of ``worker`` this key part holds, counted without a gap (1..n all
    received: applied, in the round being summed, or waiting for a later round)."""
    if not entry.early and not entry.ahead:
        return entry.pushed.get(worker, 0)
    return first_gap(entry, worker) - 1


def mark_async(entry: Entry, worker: int, seq: int) -> None:
    """Record async push ``seq`` of ``worker`` as applied; ``pushed`` stays contiguous."""
    done = entry.pushed.get(worker, 0)
    if seq != done + 1:
        entry.ahead.setdefault(worker, set()).add(seq)
        return
    done = seq
    ahead = entry.ahead.get(worker)
    while ahead and done + 1 in ahead:
        ahead.discard(done + 1)
        done += 1
    entry.pushed[worker] = done


def agree(settings: dict[int, str], worker: int, tag: str) -> None:
    """Record ``tag`` (its compression tag, "" for none) as the gradient compression of
    ``worker``'s pushes, unless another worker pushes with other settings: then OpError
    (ConfigError) naming this worker and both settings (nothing is recorded)."""
    for other, theirs in settings.items():
        if other != worker and theirs != tag:
            raise OpError("ConfigError",
                          f"worker {worker} pushes with gradient compression {describe_tag(tag)}, but worker "
                          f"{other} pushes with {describe_tag(theirs)}: every worker must call "
                          "kv.set_gradient_compression with the same settings before its first push")
    settings[worker] = tag


def describe_tag(tag: str) -> str:
    """A compression tag as the user wrote it: ``{'type': '2bit', 'threshold': 0.5}``, or none."""
    return str(spec_of_tag(tag).to_params()) if tag else "none (uncompressed float32)"


def fresh(buf: np.ndarray | None, sends: list[Any], like: np.ndarray,
           new: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """``buf`` if it is writable and no send still reads it; else ``new(like)``."""
    if buf is not None and buf.flags.writeable and buf.shape == like.shape and all(t.done for t in sends):
        return buf
    return new(like)


__all__ = ["UNSENT", "Entry", "Key", "OpError", "Reply", "agree", "contiguous", "describe_tag", "first_gap", "fits",
           "fmt", "fresh", "mark_async", "received", "sent"]
