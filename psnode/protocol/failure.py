"""Failure records: what a process writes when it fails, so the launcher can name the root cause.

torch elastic's way: each process writes its own record, with a timestamp, when it fails, and
the supervisor picks the earliest one, so a crash is never blamed on the processes it took
down.  The file is ``PSNODE_ERROR_FILE`` (set by the launcher; ``~`` is expanded); without it
nothing is written.  One JSON object, written atomically (tmp + rename, mode 0600)::

    {"version": 1, "time": 1767000000.123,      wall-clock seconds (time.time()) of the failure
     "role": "worker", "rank": 1, "host": "10.0.0.2", "pid": 4242,
     "kind": "exception" | "job_ended" | "verdict",
     "type": "ValueError", "message": "...",     the exception (kind exception, job_ended)
     "traceback": "...",                          its last lines (kind exception)
     "culprit": {"role", "rank", "host", "pid"},  kind verdict: whom the scheduler blames
     "reason": "..."}                             kind verdict: why (failed / stopped responding)

Kinds:

* ``exception``: this process failed for its own reason (an uncaught exception in a worker);
* ``job_ended``: this process ended because the job failed elsewhere (a consequence);
* ``verdict``: the scheduler's decision about another node (a worker that reported a failure,
  or a node silent for longer than the heartbeat timeout); ``time`` is when the culprit failed
  or was last heard from.

:func:`read` never raises: a missing, partial or foreign file reads as None.
"""
from __future__ import annotations

import contextlib
import json
import os
import time
import traceback
from typing import Any

KINDS = ("exception", "job_ended", "verdict")
_MAX_TEXT = 2000


def write(path: str | None, kind: str, role: str, rank: int | None, host: str, *,
          exc: BaseException | None = None, culprit: dict[str, Any] | None = None,
          reason: str | None = None, when: float | None = None) -> None:
    """Write a failure record to ``path`` (nothing if ``path`` is None); never raises."""
    if not path or kind not in KINDS:
        return
    record: dict[str, Any] = {"version": 1, "time": time.time() if when is None else when, "role": role,
                              "rank": rank, "host": host, "pid": os.getpid(), "kind": kind}
    if exc is not None:
        record["type"] = type(exc).__name__
        record["message"] = str(exc)[:_MAX_TEXT]
        if kind == "exception":
            lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
            record["traceback"] = "".join(lines)[-_MAX_TEXT:]
    if culprit is not None:
        record["culprit"] = culprit
    if reason is not None:
        record["reason"] = reason[:_MAX_TEXT]
    target = os.path.expanduser(path)
    tmp = f"{target}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        os.replace(tmp, target)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def read(path: str) -> dict[str, Any] | None:
    """The failure record at ``path``, or None (missing, unreadable, not a record)."""
    try:
        with open(os.path.expanduser(path)) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("kind") not in KINDS or not isinstance(data.get("time"), (int, float)):
        return None
    return data


def summary(record: dict[str, Any]) -> str:
    """``ValueError: bad batch`` (or the reason of a verdict)."""
    if record.get("kind") == "verdict":
        return str(record.get("reason", ""))
    kind, message = record.get("type"), record.get("message")
    if kind and message:
        return f"{kind}: {message}"
    return str(kind or message or "failed")
