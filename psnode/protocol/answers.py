"""Typed answers of data operations (server -> worker); see psnode.protocol.ops for the
operations and psnode.protocol for the wire."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from psnode.errors import ProtocolError
from psnode.protocol.ops import GAP, NA, Key, OpCode, _arrays, _int, _list, _triples


@dataclass(slots=True)
class Ok:
    """Success: ``arrays`` (a value, rows, states), ``seq`` (init: pushes taken), ``names``
    (get_states)."""

    id: int
    arrays: list[np.ndarray] = field(default_factory=list)
    seq: int = 0
    names: list[tuple[Key, int, str]] | None = None
    code: ClassVar[OpCode] = OpCode.OK

    def wire(self) -> tuple[int, int, int, Key, list[np.ndarray], dict[str, Any] | None]:
        extra = None if self.names is None else {"names": [list(n) for n in self.names]}
        return 0, 0, self.seq, 0, list(self.arrays), extra

    @classmethod
    def unwire(cls, flags: int, part: int, id: int, seq: int, key: Key, arrays: list[np.ndarray],
               extra: dict[str, Any]) -> Ok:
        names = _triples(extra["names"], "states names", "str") if "names" in extra else None
        return cls(id, list(arrays), _int(seq, "ok number"), names)


@dataclass(slots=True)
class Wait:
    """The server holds the request (a pull parked until its round completes): nothing was
    lost.  ``gap``: a push of this worker the pull waits for that the server never received;
    ``blockers``: the workers whose pushes the round still waits for."""

    id: int
    gap: int = 0
    blockers: list[int] = field(default_factory=list)
    code: ClassVar[OpCode] = OpCode.WAIT

    def wire(self) -> tuple[int, int, int, Key, list[np.ndarray], dict[str, Any] | None]:
        flags = GAP if self.gap else 0
        return int(flags), 0, self.gap, 0, [], {"blockers": self.blockers} if self.blockers else None

    @classmethod
    def unwire(cls, flags: int, part: int, id: int, seq: int, key: Key, arrays: list[np.ndarray],
               extra: dict[str, Any]) -> Wait:
        _arrays(arrays, 0, "wait")
        blockers = [_int(w, "wait blocker") for w in _list(extra.get("blockers", []), "blockers")]
        return cls(id, _int(seq, "wait gap", 1) if flags & GAP else 0, blockers)


@dataclass(slots=True)
class Missing:
    """Answer to a flush: pushes ``(key, part, [seq, ...])`` the server never received."""

    id: int
    missing: list[tuple[Key, int, list[int]]]
    code: ClassVar[OpCode] = OpCode.MISSING

    def wire(self) -> tuple[int, int, int, Key, list[np.ndarray], dict[str, Any] | None]:
        return 0, 0, 0, 0, [], {"missing": [list(m) for m in self.missing]}

    @classmethod
    def unwire(cls, flags: int, part: int, id: int, seq: int, key: Key, arrays: list[np.ndarray],
               extra: dict[str, Any]) -> Missing:
        _arrays(arrays, 0, "missing")
        return cls(id, _triples(extra.get("missing", []), "missing", "ints"))


@dataclass(slots=True)
class Failed:
    """The request was refused: ``kind`` names the error class (psnode.errors.KINDS) the worker
    raises with ``message``; ``na``: it answers a request sent without wanting an answer."""

    id: int
    kind: str
    message: str
    na: bool = False
    code: ClassVar[OpCode] = OpCode.FAILED

    def wire(self) -> tuple[int, int, int, Key, list[np.ndarray], dict[str, Any] | None]:
        return int(NA * self.na), 0, 0, 0, [], {"kind": self.kind, "err": self.message}

    @classmethod
    def unwire(cls, flags: int, part: int, id: int, seq: int, key: Key, arrays: list[np.ndarray],
               extra: dict[str, Any]) -> Failed:
        _arrays(arrays, 0, "failed")
        kind, message = extra.get("kind"), extra.get("err")
        if type(kind) is not str or type(message) is not str:
            raise ProtocolError("failed: kind and message must be strings")
        return cls(id, kind[:64], message[:4000], bool(flags & NA))


Answer = Ok | Wait | Missing | Failed
ANSWERS: dict[int, Any] = {c.code: c for c in (Ok, Wait, Missing, Failed)}

__all__ = ["ANSWERS", "Answer", "Failed", "Missing", "Ok", "Wait"]
