"""Per-phase timestamps of netbench's processes (``netbench.py --trace DIR``): a diagnostic.

``install(role, rank)`` wraps a few psnode functions of this process so that each call records
``(time.monotonic(), event, detail)`` (the clock is the machine's, shared by the namespaces);
the records go to ``$NETBENCH_TRACE/<role><rank>.json`` at exit.  Worker events: ``push`` /
``pull`` (the API calls), ``compress`` (one key part, with its server), ``submit`` (a request
handed to the engine), ``send_tcp`` (the I/O thread writes requests for a server), ``answer``
(a reply's message read), ``copy`` (its values copied out).  Server events: ``ops`` (one data
message handled, with its worker and op kinds), ``contribute`` (a push summed), ``send`` (the
replies of one message sent).  ``summary`` turns the records of one job into per-round phase
times (median over the timed rounds).  It changes no behaviour; it costs microseconds per call.
"""
from __future__ import annotations

import atexit
import functools
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

_RECORDS: list[tuple[float, str, str]] = []


def _note(event: str, detail: str = "") -> None:
    _RECORDS.append((time.monotonic(), event, detail))


def _span(cls: Any, name: str, event: str, detail: Any = None) -> None:
    """Record the start (``event+``) and end (``event-``) of every call of ``cls.name``."""
    fn = getattr(cls, name)

    @functools.wraps(fn)
    def wrapped(*a: Any, **kw: Any) -> Any:
        d = "" if detail is None else str(detail(*a, **kw))
        _note(event + "+", d)
        try:
            return fn(*a, **kw)
        finally:
            _note(event + "-", d)
    setattr(cls, name, wrapped)


def install(role: str, rank: int) -> None:
    where = os.environ.get("NETBENCH_TRACE")
    if not where:
        return
    if role == "worker":
        from psnode import datapath, ioloop, kvstore, worker
        _span(kvstore.KVStore, "push", "push")
        _span(kvstore.KVStore, "pull", "pull")
        _span(datapath.DataPath, "_compressed", "compress", lambda self, k, info, part, *a, **kw: part.server)
        _span(ioloop.IoLoop, "send_tcp", "send_tcp", lambda self, server, *a, **kw: server)
        _span(ioloop.IoLoop, "answered", "answer", lambda self, server, *a, **kw: server)
        _span(worker.Engine, "submit", "submit", lambda self, server, op, *a, **kw: f"{server} {type(op).__name__}")
        copier = datapath.DataPath._copier

        def traced_copier(dest: Any, info: Any, part: Any) -> Any:
            copy = copier(dest, info, part)

            def run(ans: Any) -> None:
                _note("copy+", str(part.server))
                copy(ans)
                _note("copy-", str(part.server))
            return run
        datapath.DataPath._copier = staticmethod(traced_copier)  # type: ignore[method-assign]
    else:
        from psnode import aggregation, server
        _span(server.Server, "_on_ops", "ops",
              lambda self, w, ops, *a, **kw: f"{w} {','.join(type(o).__name__ for o in ops)}")
        _span(server.Server, "_send", "send", lambda self, replies, *a, **kw: ",".join(str(r.worker) for r in replies))
        _span(aggregation.Store, "_contribute", "contribute", lambda self, e, w, *a: w)
    path = Path(where) / f"{role}{rank}.json"
    atexit.register(lambda: path.write_text(json.dumps(_RECORDS)))


# ---------------------------------------------------------------- analysis

def load(where: Path) -> dict[str, list[tuple[float, str, str]]]:
    return {p.stem: [tuple(r) for r in json.loads(p.read_text())] for p in sorted(where.glob("*.json"))}


def summary(where: Path, rounds: int) -> dict[str, float]:
    """Median over the last ``rounds`` rounds of worker 0's view, in ms from its push call:
    when each event first happened in every process."""
    recs = load(where)
    w0 = recs["worker0"]
    starts = [t for t, e, _ in w0 if e == "push+"][-rounds:]
    out: dict[str, list[float]] = {}
    for i, t0 in enumerate(starts):
        t1 = starts[i + 1] if i + 1 < len(starts) else float("inf")
        for proc, rs in recs.items():
            seen: dict[str, int] = {}
            for t, e, d in rs:
                if t0 - 0.02 <= t < t1 - 0.02 or (proc == "worker0" and t0 <= t < t1):
                    name = f"{proc} {e} {d}".strip()
                    seen[name] = seen.get(name, 0) + 1
                    out.setdefault(f"{name} #{seen[name]}", []).append((t - t0) * 1e3)
    return {k: statistics.median(v) for k, v in out.items() if len(v) >= max(1, rounds // 2)}
