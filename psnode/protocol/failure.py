"""Failure records: what a process writes when it fails, so the launcher can name the root cause.

torch elastic's way: each process writes its own record, with a timestamp, when it fails, and
the supervisor picks the earliest one, so a crash is never blamed on the processes it took
down.  The file is ``PSNODE_ERROR_FILE`` (the launcher sets it to :func:`path_in` of the run
directory and the process name; ``~`` is expanded); without it nothing is written.  One
:class:`FailureRecord` as a JSON object (:meth:`FailureRecord.to_dict`), written atomically
(tmp + rename, mode 0600)::

    {"version": 1, "time": 1767000000.123,      wall-clock seconds (time.time()) of the failure
     "role": "worker", "rank": 1, "host": "10.0.0.2", "pid": 4242,
     "kind": "exception" | "job_ended" | "verdict",
     "type": "ValueError", "message": "...",     the exception (kind exception, job_ended)
     "traceback": "...",                          its last lines (kind exception)
     "culprit": {"role", "rank", "host", "pid"},  kind verdict: whom the scheduler blames
     "reason": "..."}                             kind verdict: why (failed / stopped responding)

Kinds (:class:`FailureKind`):

* ``exception``: this process failed for its own reason (an uncaught exception in a worker);
* ``job_ended``: this process ended because the job failed elsewhere (a consequence);
* ``verdict``: the scheduler's decision about another node (a worker that reported a failure,
  or a node silent for longer than the heartbeat timeout); ``time`` is when the culprit failed
  or was last heard from.

:func:`read` and :meth:`FailureRecord.from_dict` never raise: a missing, partial or foreign file
reads as None; a record's missing or mistyped fields other than ``kind`` and ``time`` read as
their defaults.

torch elastic's error files: a script decorated with
``torch.distributed.elastic.multiprocessing.errors.record`` writes the exception that ends it to
``TORCHELASTIC_ERROR_FILE`` (the launcher sets it to :func:`torch_path_in`) as
``{"message": {"message": "Type: text", "extraInfo": {"py_callstack": "...", "timestamp":
"<whole seconds>"}}}``.  :func:`from_torch` reads such a file as an ``exception`` record whose
``source`` is that file; its ``time`` is the file's modification time when that agrees with the
timestamp (a finer clock, so two failures within one second are still told apart), else the
timestamp.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from psnode.files import write_atomic

FILE_SUFFIX = ".failure.json"
TORCH_SUFFIX = ".torch-error.json"
_MAX_TEXT = 2000


class FailureKind(str, Enum):
    EXCEPTION = "exception"
    JOB_ENDED = "job_ended"
    VERDICT = "verdict"


KINDS = tuple(k.value for k in FailureKind)


def file_name(name: str) -> str:
    """The failure record's file name of the process ``name`` (``worker-1.failure.json``)."""
    return f"{name}{FILE_SUFFIX}"


def path_in(run_dir: str, name: str) -> str:
    """The failure record of the process ``name`` in its host's ``run_dir`` (a POSIX path,
    ``~`` left for the host to expand)."""
    return f"{run_dir.rstrip('/')}/{file_name(name)}"


def torch_path_in(run_dir: str, name: str) -> str:
    """The torch elastic error file (``TORCHELASTIC_ERROR_FILE``) of the process ``name`` in its
    host's ``run_dir`` (a POSIX path, ``~`` left for the host to expand)."""
    return f"{run_dir.rstrip('/')}/{name}{TORCH_SUFFIX}"


def _opt(data: Mapping[str, Any], name: str, kind: type) -> Any:
    v = data.get(name)
    return v if type(v) is kind else None


@dataclass(frozen=True)
class Culprit:
    """The node a verdict blames."""

    role: str
    rank: int | None
    host: str
    pid: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role, "rank": self.rank, "host": self.host, "pid": self.pid}

    @classmethod
    def from_dict(cls, data: Any) -> Culprit | None:
        if not isinstance(data, dict):
            return None
        return cls(_opt(data, "role", str) or "", _opt(data, "rank", int), _opt(data, "host", str) or "",
                   _opt(data, "pid", int))


@dataclass(frozen=True)
class FailureRecord:
    """One failure record (the fields: see the module docstring)."""

    kind: FailureKind
    time: float
    role: str = ""
    rank: int | None = None
    host: str = ""
    pid: int | None = None
    type: str | None = None
    message: str | None = None
    traceback: str | None = None
    culprit: Culprit | None = None
    reason: str | None = None
    version: int = 1
    source: str | None = None     # torch elastic's error file it was read from (None: psnode's own)

    @property
    def exception(self) -> str:
        """``ValueError: bad batch`` (what is known of the exception; "" when none)."""
        if self.type and self.message:
            return f"{self.type}: {self.message}"
        return self.type or self.message or ""

    @property
    def summary(self) -> str:
        """``ValueError: bad batch``, or the reason of a verdict."""
        if self.kind is FailureKind.VERDICT:
            return self.reason or ""
        return self.exception or "failed"

    def to_dict(self) -> dict[str, Any]:
        record: dict[str, Any] = {"version": self.version, "time": self.time, "role": self.role,
                                  "rank": self.rank, "host": self.host, "pid": self.pid, "kind": self.kind.value}
        for name in ("type", "message", "traceback"):
            if getattr(self, name) is not None:
                record[name] = getattr(self, name)
        if self.culprit is not None:
            record["culprit"] = self.culprit.to_dict()
        if self.reason is not None:
            record["reason"] = self.reason
        if self.source is not None:
            record["source"] = self.source
        return record

    @classmethod
    def from_dict(cls, data: Any) -> FailureRecord | None:
        """The record of a JSON object; None when it is not one (no known kind or no time)."""
        if not isinstance(data, dict) or data.get("kind") not in KINDS:
            return None
        when = data.get("time")
        if not isinstance(when, (int, float)) or isinstance(when, bool):
            return None
        return cls(FailureKind(data["kind"]), float(when), _opt(data, "role", str) or "", _opt(data, "rank", int),
                   _opt(data, "host", str) or "", _opt(data, "pid", int), _opt(data, "type", str),
                   _opt(data, "message", str), _opt(data, "traceback", str), Culprit.from_dict(data.get("culprit")),
                   _opt(data, "reason", str), _opt(data, "version", int) or 1, _opt(data, "source", str))

    def save(self, path: str) -> None:
        """Write this record to ``path`` atomically (mode 0600); never raises."""
        with contextlib.suppress(OSError):
            write_atomic(os.path.expanduser(path), json.dumps(self.to_dict()))


def record_of(value: FailureRecord | Mapping[str, Any] | None) -> FailureRecord | None:
    """A record, or the record of its JSON object (as read from a host); None stays None."""
    if value is None or isinstance(value, FailureRecord):
        return value
    return FailureRecord.from_dict(value)


_TYPE_RE = re.compile(r"([A-Za-z_][\w.]*): (.*)", re.S)


def from_torch(data: Any, path: str, written: float | None = None) -> FailureRecord | None:
    """The ``exception`` record of torch elastic's error file ``data`` (its JSON object, read
    from ``path``, modified at ``written``); None when it is not one.  Never raises."""
    if not isinstance(data, dict):
        return None
    message, extra = data.get("message"), None
    if isinstance(message, dict):
        extra = message.get("extraInfo")
        message = message.get("message")
    if not isinstance(extra, dict):
        extra = {}
    if not isinstance(message, str):
        return None
    try:
        stamp: float | None = float(int(str(extra.get("timestamp"))))
    except ValueError:
        stamp = None
    ok = written is not None and math.isfinite(written) and (stamp is None or stamp - 1 < written < stamp + 2)
    when = written if ok else stamp
    if when is None:
        return None
    match = _TYPE_RE.fullmatch(message)
    kind_of, text = (match.group(1), match.group(2)) if match else (None, message)
    trace = extra.get("py_callstack")
    return FailureRecord(FailureKind.EXCEPTION, when, type=kind_of, message=text[:_MAX_TEXT],
                         traceback=trace[-_MAX_TEXT:] if isinstance(trace, str) else None, source=path)


def write(path: str | None, kind: str, role: str, rank: int | None, host: str, *,
          exc: BaseException | None = None, culprit: Culprit | None = None,
          reason: str | None = None, when: float | None = None) -> None:
    """Write a failure record to ``path`` (nothing if ``path`` is None); never raises."""
    if not path or kind not in KINDS:
        return
    what = FailureKind(kind)
    kind_of = message = trace = None
    if exc is not None:
        kind_of, message = type(exc).__name__, str(exc)[:_MAX_TEXT]
        if what is FailureKind.EXCEPTION:
            trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-_MAX_TEXT:]
    FailureRecord(what, time.time() if when is None else when, role, rank, host, os.getpid(), kind_of, message,
                  trace, culprit, None if reason is None else reason[:_MAX_TEXT]).save(path)


def read(path: str) -> FailureRecord | None:
    """The failure record at ``path``, or None (missing, unreadable, not a record)."""
    try:
        with open(os.path.expanduser(path)) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return FailureRecord.from_dict(data)


__all__ = ["FILE_SUFFIX", "KINDS", "TORCH_SUFFIX", "Culprit", "FailureKind", "FailureRecord", "file_name", "from_torch",
           "path_in", "read", "record_of", "torch_path_in", "write"]
