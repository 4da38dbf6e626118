"""A job's timeline: each process appends its own events to its own file (``PSNODE_TIMELINE``).

Off (the default), :data:`current` is None and every call site costs one ``is None`` check.
On, :func:`start` (once per process, when its rank is known) opens
``<dir>/<role>-<rank>-<pid>.jsonl`` and :data:`current` records:

* spans (:meth:`Timeline.span`, Chrome trace-event ``"X"`` events, microseconds of wall-clock
  time): a worker's ``push`` / ``pull`` / ``pushpull`` / ``barrier`` calls, ``compute`` between
  two calls, ``pull-wait`` / ``init-wait`` / ``barrier-wait`` while its thread waits for an
  answer; a server's ``apply`` (a round folded into a value) and ``checkpoint``;
* instants (:meth:`Timeline.instant`, ``"i"``): ``restart`` (a process that is a restart),
  ``membership`` (a change of the workers), ``failover`` (a server's replacement serves again).

Events are buffered and appended as JSON lines every :data:`FLUSH_EVENTS` events, every
:data:`FLUSH_SECONDS` seconds (at the next event) and at exit.  The launcher merges every
process's file into one trace (:func:`merge`): ``pid`` a process, its name and sort order from
``process_name`` / ``process_sort_index`` metadata events; it opens in Perfetto or
chrome://tracing.
"""
from __future__ import annotations

import atexit
import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

FLUSH_EVENTS = 4096
FLUSH_SECONDS = 5.0
SUFFIX = ".jsonl"


class Timeline:
    """One process's event file (see the module docstring)."""

    def __init__(self, directory: str, role: str, rank: int | None) -> None:
        self.name = role if rank is None else f"{role}-{rank}"
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.path = os.path.join(directory, f"{self.name}-{os.getpid()}{SUFFIX}")
        self.pid = os.getpid()
        self._events: list[tuple[Any, ...]] = []
        self._lock = threading.Lock()
        self._flushed = time.monotonic()
        self._last_call_end = 0.0
        self._meta = {"role": role, "rank": rank, "pid": self.pid}

    @staticmethod
    def now() -> float:
        return time.time()

    def span(self, name: str, start: float, end: float | None = None, tid: int = 0, **args: Any) -> None:
        """A span ``name`` from ``start`` to ``end`` (default: now), wall-clock seconds."""
        self._add(("X", name, start, (time.time() if end is None else end) - start, tid, args))

    def instant(self, name: str, **args: Any) -> None:
        self._add(("i", name, time.time(), 0.0, 0, args))

    def call(self, name: str, start: float) -> None:
        """A worker's call ``name`` that began at ``start`` ended now; the time since the end of
        its previous call is ``compute``."""
        end = time.time()
        if self._last_call_end:
            self._add(("X", "compute", self._last_call_end, start - self._last_call_end, 0, {}))
        self._add(("X", name, start, end - start, 0, {}))
        self._last_call_end = end

    def _add(self, event: tuple[Any, ...]) -> None:
        with self._lock:
            self._events.append(event)
            if len(self._events) < FLUSH_EVENTS and time.monotonic() - self._flushed < FLUSH_SECONDS:
                return
            events, self._events = self._events, []
            self._flushed = time.monotonic()
        self._write(events)

    def flush(self) -> None:
        with self._lock:
            events, self._events = self._events, []
            self._flushed = time.monotonic()
        self._write(events)

    def _write(self, events: list[tuple[Any, ...]]) -> None:
        lines = [json.dumps({"ph": ph, "name": name, "ts": round(ts * 1e6, 1), "dur": round(dur * 1e6, 1),
                             "tid": tid, "args": args}) for ph, name, ts, dur, tid, args in events]
        if not os.path.exists(self.path):
            lines.insert(0, json.dumps({"ph": "meta", "args": self._meta}))
        if lines:
            with open(self.path, "a") as f:
                f.write("\n".join(lines) + "\n")


#: this process's timeline (None: off)
current: Timeline | None = None


def traced(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``fn`` recording a span ``name`` per call on :data:`current` (installed only when on)."""
    def run(*args: Any, **kwargs: Any) -> Any:
        tl = current
        if tl is None:
            return fn(*args, **kwargs)
        start = time.time()
        try:
            return fn(*args, **kwargs)
        finally:
            tl.span(name, start)
    return run


def trace_calls(obj: Any, names: Iterable[str]) -> None:
    """Each method ``names`` of ``obj`` (a worker's KVStore) recorded as a call
    (:meth:`Timeline.call`: the span, and ``compute`` since the previous call)."""
    for name in names:
        fn = getattr(obj, name)

        def run(*args: Any, _fn: Callable[..., Any] = fn, _name: str = name, **kwargs: Any) -> Any:
            tl = current
            if tl is None:
                return _fn(*args, **kwargs)
            start = time.time()
            try:
                return _fn(*args, **kwargs)
            finally:
                tl.call(_name, start)
        setattr(obj, name, run)


def start(directory: str | None, role: str, rank: int | None, restarts: int = 0) -> Timeline | None:
    """Turn the timeline on for this process (``directory`` None: stays off)."""
    global current
    if directory is None or current is not None:
        return current
    current = Timeline(directory, role, rank)
    atexit.register(current.flush)
    if restarts:
        current.instant("restart", count=restarts)
    return current


_ORDER = {"scheduler": 0, "server": 1, "worker": 2}


def merge(files: Iterable[str | Path]) -> dict[str, Any]:
    """One Chrome trace-event document of the processes' files: a ``pid`` per file (its
    process), named ``worker 2``, ``server 0``, ..., sorted scheduler, servers, workers; times
    from the earliest event.  Unreadable lines are left out."""
    out: list[dict[str, Any]] = []
    procs: list[tuple[tuple[int, int, int], str, list[dict[str, Any]]]] = []
    for path in files:
        meta: dict[str, Any] = {}
        events = []
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        for line in text.splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if not isinstance(ev, dict):
                continue
            if ev.get("ph") == "meta":
                meta = ev.get("args", {})
            elif ev.get("ph") in ("X", "i") and isinstance(ev.get("ts"), (int, float)):
                events.append(ev)
        role, rank = str(meta.get("role", "process")), meta.get("rank")
        name = role if rank is None else f"{role} {rank}"
        procs.append(((_ORDER.get(role, 3), rank if isinstance(rank, int) else -1, len(procs)), name, events))
    procs.sort(key=lambda p: p[0])
    t0 = min((ev["ts"] for *_, evs in procs for ev in evs), default=0.0)
    for pid, (_, name, events) in enumerate(procs, start=1):
        out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": 0, "args": {"name": name}})
        for ev in events:
            item = {"ph": ev["ph"], "name": str(ev.get("name", "?")), "pid": pid, "tid": int(ev.get("tid", 0)),
                    "ts": round(ev["ts"] - t0, 1), "args": ev.get("args", {})}
            if ev["ph"] == "X":
                item["dur"] = max(0.0, float(ev.get("dur", 0.0)))
            else:
                item["s"] = "p"
            out.append(item)
    return {"traceEvents": out, "displayTimeUnit": "ms"}


__all__ = ["FLUSH_EVENTS", "FLUSH_SECONDS", "SUFFIX", "Timeline", "current", "merge", "start", "trace_calls",
           "traced"]
