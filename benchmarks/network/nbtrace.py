"""Per-phase timestamps of netbench's processes (``netbench.py --trace DIR``): a diagnostic.

``install(role, rank)`` wraps a few psnode functions of this process so that each call records
``(time.monotonic(), event, detail)`` (the clock is the machine's, shared by the namespaces);
the records go to ``$NETBENCH_TRACE/<role><rank>.json`` at exit. Worker events: ``push`` /
``pull`` (the API calls; ``kv.pushpull`` records ``push+`` and ``pull-``), ``compress`` (one key
part, with its server), ``submit`` (a request handed to the engine), ``send_tcp`` (the I/O
thread writes requests for a server), ``answer`` (a reply's message read), ``copy`` (its values
copied out). Server events: ``ops`` (one data message handled, with its worker and op kinds),
``contribute`` (a push summed), ``send`` (the replies of one message sent). ``python benchmarks/network/nbtrace.py
JOBDIR...`` prints each job's phase times (median over the timed rounds). It changes no
behaviour; it costs microseconds per call.
"""
from __future__ import annotations

import atexit
import functools
import json
import math
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
        from psnode.worker import datapath, ioloop, kvstore
        from psnode.worker import engine as worker
        _span(kvstore.KVStore, "push", "push")
        _span(kvstore.KVStore, "pull", "pull")
        pushpull = kvstore.KVStore.pushpull

        @functools.wraps(pushpull)
        def traced_pushpull(*a: Any, **kw: Any) -> Any:   # a round: push+ ... pull-, as push then pull
            _note("push+")
            try:
                return pushpull(*a, **kw)
            finally:
                _note("pull-")
        kvstore.KVStore.pushpull = traced_pushpull  # type: ignore[method-assign]
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
        from psnode.server import loop as server
        from psnode.server import rounds
        _span(server.Server, "_on_ops", "ops",
              lambda self, w, ops, *a, **kw: f"{w} {','.join(type(o).__name__ for o in ops)}")
        _span(server.Server, "_send", "send", lambda self, replies, *a, **kw: ",".join(str(r.worker) for r in replies))
        _span(rounds.Rounds, "_contribute", "contribute", lambda self, e, w, *a: w)
    path = Path(where) / f"{role}{rank}.json"
    atexit.register(lambda: path.write_text(json.dumps(_RECORDS)))


# ---------------------------------------------------------------- analysis

def load(where: Path) -> dict[str, list[tuple[float, str, str]]]:
    return {p.stem: [(float(t), str(e), str(d)) for t, e, d in json.loads(p.read_text())]
            for p in sorted(where.glob("*.json"))}


def phases(where: Path, rounds: int = 30) -> dict[str, float]:
    """Median ms over the last ``rounds`` rounds (but the very last) and both workers of one job
    (W2 S2) of the phases on a worker's critical path: its part on the other host's server."""
    recs = load(where)
    out: dict[str, list[float]] = {}
    for w in (0, 1):
        me, rs = recs[f"worker{w}"], str(1 - w)
        srv = recs[f"server{rs}"]
        for t0 in [t for t, e, _ in me if e == "push+"][-rounds - 1:-1]:
            t1 = min(t for t, e, _ in me if e == "pull-" and t > t0)

            def first(rs_: list[tuple[float, str, str]], ev: str, det: str, after: float = t0,
                      end: float = t1) -> float:
                return next((t for t, e, d in rs_ if after <= t <= end and e == ev and d.startswith(det)), math.nan)
            c0, c1 = first(me, "compress+", rs), first(me, "compress-", rs)
            sub = first(me, "submit+", f"{rs} Push")
            st = first(me, "send_tcp+", rs, sub)
            arr = first(srv, "ops+", f"{w} Push")
            k0, k1 = first(srv, "contribute+", str(w), arr), first(srv, "contribute-", str(w), arr)
            sp = first(srv, "ops+", f"{w} Pull", arr)
            snd = first(srv, "send-", str(w), k1 if math.isnan(sp) else sp)
            ans = first(me, "answer+", rs, snd)
            cp0, cp1 = first(me, "copy+", rs, ans), first(me, "copy-", rs, ans)
            row = {"round": t1 - t0, "before compress/submit": (sub if math.isnan(c0) else c0) - t0,
                   "compress remote part": c1 - c0, "submit -> I/O thread sends": st - sub,
                   "push on the wire": arr - st, "server sums it": k1 - k0,
                   "summed -> reply sent": snd - k1, "pull arrives -> reply sent": snd - sp,
                   "reply on the wire": ans - snd, "copy into out": cp1 - cp0, "copy -> call returns": t1 - cp1}
            for k, v in row.items():
                out.setdefault(k, []).append(v * 1e3)
    return {k: statistics.median([x for x in v if not math.isnan(x)] or [math.nan]) for k, v in out.items()}


if __name__ == "__main__":
    import sys
    for d in sys.argv[1:]:
        print(d)
        for name, ms in phases(Path(d)).items():
            print(f"   {name:28} {ms:7.2f}")
