"""Exception hierarchy of psnode.

Every error a user can see derives from :class:`PSError`, so a training script (or the
``mxdist`` CLI) can catch one type.  Messages name the offending value, where it came from
and, when there is one, the fix.
"""
from __future__ import annotations


class PSError(RuntimeError):
    """Base class of every psnode error."""


class ConfigError(PSError):
    """Bad configuration: an environment variable, an argument, a spec."""


class ProtocolError(PSError):
    """A malformed, foreign or oversize message (logged and dropped by servers)."""


class PeerLost(PSError):
    """A node of the job died, stopped answering, or the job was stopped."""


class DataLost(PeerLost):
    """A push a restored server needs exists nowhere any more (psnode.journal): the job cannot
    go on exactly, and no restart can bring it back, so it ends."""


class KeyNotInitialized(PSError, KeyError):
    """Push or pull of a key that no worker has initialised."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class ShapeMismatch(PSError, ValueError):
    """A value whose shape or dtype differs from the key's."""


class RemoteError(PSError):
    """A server refused a request; the message carries the server's reason."""


#: Error kinds a server names in a FAILED answer (psnode.protocol), and the class a worker
#: raises for each; an unknown kind raises RemoteError.
KINDS: dict[str, type[PSError]] = {
    "KeyNotInitialized": KeyNotInitialized,
    "ShapeMismatch": ShapeMismatch,
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
