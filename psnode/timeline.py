"""A job's timeline: each process appends its own events to its own file (``PSNODE_TIMELINE``).

Off (the default), :data:`current` is None and every call site costs one ``is None`` check.
On, :func:`start` (once per process, when its rank is known) opens
``<dir>/<role>-<rank>-<pid>.jsonl`` and :data:`current` records:

* spans (:meth:`Timeline.span`, Chrome trace-event ``"X"`` events, written in microseconds of
  wall-clock time): a worker's calls (:data:`CALLS`), ``pull-wait`` / ``init-wait`` /
  ``barrier-wait`` while its thread waits for an answer; a server's ``apply`` (a round folded
  into a value) and ``checkpoint``;
* instants (:meth:`Timeline.instant`, ``"i"``): ``restart`` (a process that is a restart),
  ``membership`` (a change of the workers), ``failover`` (a server's replacement serves again).

Events are buffered and appended as JSON lines every :data:`FLUSH_EVENTS` events, every
:data:`FLUSH_SECONDS` seconds (at the next event) and at exit.  The launcher merges every
process's file into one trace (:func:`merge`): ``pid`` a process, its name and sort order from
``process_name`` / ``process_sort_index`` metadata events, and a worker's ``compute`` spans (the
time between two of its calls) added there; it opens in Perfetto or chrome://tracing.
"""
from __future__ import annotations

import atexit
import itertools
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
#: a worker's KVStore calls recorded by :func:`trace_calls`; the time between two is ``compute``
CALLS = ("push", "pull", "pushpull", "row_sparse_pull", "barrier")

_ns = time.time_ns
Args = dict[str, Any] | tuple[int, ...] | None   # an event's args (a tuple: a wait's workers)
Event = tuple[str, str, int, int, int, Args]     # ph, name, ts ns, dur ns, tid, args


class Timeline:
    """One process's event file (see the module docstring).  Times are wall-clock nanoseconds
    (:func:`time.time_ns`, comparable across processes and hosts); recording an event appends
    one tuple, and the JSON is written at a flush."""

    def __init__(self, directory: str, role: str, rank: int | None) -> None:
        self.name = role if rank is None else f"{role}-{rank}"
        Path(directory).mkdir(parents=True, exist_ok=True)
        self.path = os.path.join(directory, f"{self.name}-{os.getpid()}{SUFFIX}")
        self.pid = os.getpid()
        self._events: list[Event] = []
        self._lock = threading.Lock()
        self._flush_at = time.monotonic() + FLUSH_SECONDS
        self._meta = {"role": role, "rank": rank, "pid": self.pid}
        self._started = False

    now = staticmethod(_ns)

    def span(self, name: str, start: int, end: int | None = None, tid: int = 0, **args: Any) -> None:
        """A span ``name`` from ``start`` to ``end`` (default: now), nanoseconds (:meth:`now`)."""
        self._add(("X", name, start, (_ns() if end is None else end) - start, tid, args or None))

    def wait(self, name: str, start: int, on: tuple[int, ...]) -> None:
        """A wait ``name`` from ``start`` (ns) to now for the workers ``on`` (``args.on``)."""
        self._add(("X", name, start, _ns() - start, 0, on))

    def instant(self, name: str, **args: Any) -> None:
        self._add(("i", name, _ns(), 0, 0, args or None))

    def call(self, name: str, start: int) -> None:
        """A worker's call ``name`` (one of :data:`CALLS`) that began at ``start`` (ns) ended now
        (``compute``, the time between two calls, is added by :func:`merge`)."""
        self._add(("X", name, start, _ns() - start, 0, None))

    def _add(self, event: Event) -> None:
        with self._lock:
            self._events.append(event)
            if len(self._events) < FLUSH_EVENTS and time.monotonic() < self._flush_at:
                return
        self.flush()

    def flush(self) -> None:
        with self._lock:
            events, self._events = self._events, []
            self._flush_at = time.monotonic() + FLUSH_SECONDS
        self._write(events)

    def _write(self, events: list[Event]) -> None:
        # names are the module's own words (no quoting needed); args go through json
        lines = [f'{{"ph":"{ph}","name":"{name}","ts":{ts // 1000},"dur":{dur // 1000},"tid":{tid},'
                 f'"args":{_args(args)}}}' for ph, name, ts, dur, tid, args in events]
        if not self._started:
            lines.insert(0, json.dumps({"ph": "meta", "args": self._meta}))
        if lines:
            with open(self.path, "a") as f:
                f.write("\n".join(lines) + "\n")
            self._started = True


def _args(args: Args) -> str:
    """An event's ``args`` as JSON: none, a wait's workers (a tuple: ``{"on": [...]}``), or a
    dict, its ints and lists of ints (the common case) written directly, the rest through
    :func:`json.dumps`."""
    if args is None:
        return "{}"
    if isinstance(args, tuple):
        return '{"on":[' + ",".join(map(str, args)) + "]}"
    parts = []
    for k, v in args.items():
        if type(v) is int:
            parts.append(f'"{k}":{v}')
        elif type(v) is list and all(type(x) is int for x in v):
            parts.append(f'"{k}":[{",".join(map(str, v))}]')
        else:
            return json.dumps(args)
    return "{" + ",".join(parts) + "}"


#: this process's timeline (None: off)
current: Timeline | None = None


def traced(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``fn`` recording a span ``name`` per call on :data:`current` (installed only when on)."""
    def run(*args: Any, **kwargs: Any) -> Any:
        tl = current
        if tl is None:
            return fn(*args, **kwargs)
        start = _ns()
        try:
            return fn(*args, **kwargs)
        finally:
            tl.span(name, start)
    return run


def trace_calls(obj: Any, names: Iterable[str]) -> None:
    """Each method ``names`` of ``obj`` (a worker's KVStore) recorded as a call
    (:meth:`Timeline.call`)."""
    for name in names:
        fn = getattr(obj, name)

        def run(*args: Any, _fn: Callable[..., Any] = fn, _name: str = name, **kwargs: Any) -> Any:
            tl = current
            if tl is None:
                return _fn(*args, **kwargs)
            start = _ns()
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


def _with_compute(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A worker's events and a ``compute`` span for each gap between two of its calls."""
    calls = sorted((ev for ev in events if ev.get("ph") == "X" and ev.get("name") in CALLS
                    and isinstance(ev.get("dur"), (int, float))), key=lambda ev: ev["ts"])
    out = list(events)
    for prev, nxt in itertools.pairwise(calls):
        end = prev["ts"] + prev["dur"]
        if nxt["ts"] > end:
            out.append({"ph": "X", "name": "compute", "ts": end, "dur": nxt["ts"] - end, "tid": 0, "args": {}})
    return out


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
        for ev in _with_compute(events) if name.startswith("worker") else events:
            item = {"ph": ev["ph"], "name": str(ev.get("name", "?")), "pid": pid, "tid": int(ev.get("tid", 0)),
                    "ts": round(ev["ts"] - t0, 1), "args": ev.get("args", {})}
            if ev["ph"] == "X":
                item["dur"] = max(0.0, float(ev.get("dur", 0.0)))
            else:
                item["s"] = "p"
            out.append(item)
    return {"traceEvents": out, "displayTimeUnit": "ms"}


__all__ = ["CALLS", "FLUSH_EVENTS", "FLUSH_SECONDS", "SUFFIX", "Timeline", "current", "merge", "start", "trace_calls",
           "traced"]
