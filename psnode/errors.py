"""Exception hierarchy of psnode.

Every error a user can see derives from :class:`PSError`, so a training script (or the
``mxdist`` CLI) can catch one type.  Messages name the offending value, where it came from
and, when there is one, the fix.

A psnode error is about the caller's code, so when one goes uncaught the traceback shows the
caller's frames, not psnode's (:func:`user_traceback`).
"""
from __future__ import annotations

import os
import traceback
from types import TracebackType

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


class PSError(RuntimeError):
    """Base class of every psnode error."""


class ConfigError(PSError):
    """Bad configuration: an environment variable, an argument, a spec."""


class ProtocolError(PSError):
    """A malformed, foreign or oversize message (logged and dropped by servers)."""


class PeerLost(PSError):
    """A node of the job died, stopped answering, or the job was stopped."""


class DataLost(PeerLost):
    """A push a restored server needs exists nowhere any more (psnode.worker.journal): the job cannot
    go on exactly, and no restart can bring it back, so it ends."""


class Leave(SystemExit):
    """This worker was asked to leave the job (``mxdist scale`` down): raised by the ``kv.push``
    after the request, once everything it pushed was applied and it left the membership.  A
    SystemExit with code 0: uncaught, the script ends well (check ``kv.leaving`` to end on
    your own terms instead)."""

    def __init__(self, message: str = "this worker left the job (asked to leave)") -> None:
        super().__init__(0)
        self.message = message

    def __str__(self) -> str:
        return self.message


class KeyNotInitialized(PSError, KeyError):
    """Push or pull of a key that no worker has initialised."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class ShapeMismatch(PSError, ValueError):
    """A value whose shape or dtype differs from the key's."""


class DTypeMismatch(ShapeMismatch, TypeError):
    """A value of the key's shape but another dtype (the message names the ``.astype`` to use)."""


class RemoteError(PSError):
    """A server refused a request; the message carries the server's reason."""


#: Error kinds a server names in a FAILED answer (psnode.protocol), and the class a worker
#: raises for each; an unknown kind raises RemoteError.
KINDS: dict[str, type[PSError]] = {
    "KeyNotInitialized": KeyNotInitialized,
    "ShapeMismatch": ShapeMismatch,
    "DTypeMismatch": DTypeMismatch,
    "ConfigError": ConfigError,
    "ProtocolError": ProtocolError,
}


def from_kind(kind: str, message: str) -> PSError:
    """The exception a worker raises for a server's FAILED answer of ``kind``."""
    return KINDS.get(kind, RemoteError)(message)


def kind_of(exc: BaseException) -> str:
    """The kind to report ``exc`` as (its class name when known, else ProtocolError)."""
    name = type(exc).__name__
    return name if name in KINDS else "ProtocolError"


def user_traceback(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> str:
    """The traceback of an uncaught ``exc`` as Python prints it, less the frames inside psnode
    (counted in one line instead), for every exception of the chain."""
    te = traceback.TracebackException(kind, exc, tb)
    hidden = 0
    seen: set[int] = set()
    todo = [te]
    while todo:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        frames = [f for f in item.stack if not os.path.abspath(f.filename).startswith(_PACKAGE)]
        hidden += len(item.stack) - len(frames)
        item.stack = traceback.StackSummary.from_list(frames)
        todo.extend(x for x in (item.__cause__, item.__context__) if x is not None)
    lines = list(te.format())
    if hidden:
        lines.insert(len(lines) - 1, f"  ({hidden} frame{'s' if hidden != 1 else ''} inside psnode not shown)\n")
    return "".join(lines)
