"""What the key store answers, and the rule that keeps zero-copy sends safe (no I/O).

A :class:`Reply` is one answer for one worker, as :meth:`psnode.server.store.Store.handle`
returns it; the server loop (or the same-host link, or ``'local'``) sends it.  A request the
store refuses raises :class:`OpError` inside the store and becomes a ``Failed`` answer.

Zero-copy rule: a reply may carry a key part's value itself (``entry``).  Until the sender
calls :func:`sent` (and, for a zero-copy TCP send, until zmq's tracker is done) the value is
read by a send: the rounds never write it in place then (psnode.server.rounds swaps in a spare
buffer or copies it first).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from psnode.protocol import Answer


class Sends(Protocol):
    """What holds a value replies carry: the sends still reading it (psnode.server.keypart.Entry)."""

    value_sends: list[Any]


class Watermarks(Protocol):
    """What an Ok's ``seq`` reports the durable watermark of: a key part or a bucket."""

    durable: dict[int, int]


@dataclass
class Reply:
    """An answer to one operation, for ``worker``.  With ``entry``, ``answer.arrays[0]`` is that
    entry's value: the sender must call :func:`sent` once the send was issued (with its
    tracker, if any).  ``dest``: the pull's landing area (same-host link), where the sender
    copies the value unless ``shared``: the value may be read in place until the worker's next
    push of the key (sync rounds: it changes only when a round completes)."""

    worker: int
    answer: Answer
    entry: Sends | None = None
    dest: np.ndarray | None = None
    shared: bool = False
    fixed: bool = False   # the array is written in place by later rounds: TCP must send a copy
    holder: Watermarks | None = None   # whose durable watermark the Ok's seq reports (restartable)

    def __post_init__(self) -> None:
        if self.entry is not None:
            self.entry.value_sends.append(UNSENT)


def sent(entry: Sends, tracker: Any | None) -> None:
    """A reply carrying ``entry.value`` went out; ``tracker`` tells when zmq is done with it."""
    if UNSENT in entry.value_sends:
        entry.value_sends.remove(UNSENT)
    if tracker is not None:
        entry.value_sends.append(tracker)


class _Unsent:
    """Marks a value referenced by a reply not sent yet: it must not be written."""

    done = False


UNSENT = _Unsent()


class OpError(Exception):
    """A request refused; ``kind`` names the exception the worker raises."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def fits(dest: np.ndarray | None, shape: tuple[int, ...], dtype: np.dtype) -> bool:
    """``dest`` is a writable landing area for an answer of ``shape`` and ``dtype``."""
    return dest is not None and dest.shape == shape and dest.dtype == dtype and dest.flags.writeable


__all__ = ["UNSENT", "OpError", "Reply", "Sends", "Watermarks", "fits", "sent"]
