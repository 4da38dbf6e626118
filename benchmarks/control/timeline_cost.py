"""What ``mxdist launch --timeline`` costs, in round time of W2S2 jobs (4 KiB and 1 MiB keys).

    python benchmarks/control/timeline_cost.py                        # 7 runs, the A/B method
    python benchmarks/control/timeline_cost.py --method jobs --runs 9 --json /tmp/timeline_cost.json

Two methods, both through ``mxdist launch -n 2 -s 2``; per case one key (4 KiB, 1 MiB), a
warm-up, a barrier, then ``--rounds`` timed rounds (a push and a pull each):

* ``ab`` (default): one ``--timeline`` job per run whose workers record in alternate blocks of
  50 rounds (ABBA order, both workers alike); per run the median ratio of adjacent blocks.
  Adjacent blocks see the same load, so this holds on a busy machine.  The servers record
  throughout (one ``apply`` span per round and key), so that part of the cost is in both
  blocks: the per-event cost printed at the end (measured in this process) bounds it.
* ``jobs``: a pair of jobs per run, with and without ``--timeline``, in alternating order;
  per job worker 0's median block of 100 rounds.  Other jobs' load moves these figures.

Printed per case: the median and range over the runs.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

CASES = {"4KiB": 1024, "1MiB": 256 * 1024}   # float32 elements
MARK = "TIMELINE_COST "

JOB = textwrap.dedent("""
    import json, sys, time
    import numpy as np, psnode
    rounds, warmup, cases = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
    BLOCK = 100
    kv = psnode.kv.create('dist_sync')
    out = {}
    for name, n in cases.items():
        g = np.ones(n, np.float32); v = np.empty(n, np.float32)
        kv.init(name, np.zeros(n, np.float32))
        for _ in range(warmup):
            kv.push(name, g); kv.pull(name, out=v)
        kv.barrier()
        blocks = []
        for _ in range(max(1, rounds // BLOCK)):
            t0 = time.perf_counter()
            for _ in range(BLOCK):
                kv.push(name, g); kv.pull(name, out=v)
            blocks.append((time.perf_counter() - t0) / BLOCK * 1e3)
        out[name] = sorted(blocks)[len(blocks) // 2]
        kv.barrier()
    if kv.rank == 0:
        print("%s%s" % (sys.argv[4], json.dumps(out)), flush=True)
    kv.close()
""")


AB_JOB = textwrap.dedent("""
    import json, sys, time
    import numpy as np, psnode, psnode.timeline as tl
    rounds, warmup, cases = int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
    BLOCK = 50
    kv = psnode.kv.create('dist_sync')
    rec = tl.current   # (started by kv.create)
    assert rec is not None, "launch it with --timeline"
    out = {}
    for name, n in cases.items():
        g = np.ones(n, np.float32); v = np.empty(n, np.float32)
        kv.init(name, np.zeros(n, np.float32))
        for _ in range(warmup):
            kv.push(name, g); kv.pull(name, out=v)
        kv.barrier()
        ratios = []
        on_t, off_t = [], []
        for pair in range(max(1, rounds // (2 * BLOCK))):
            took = {}
            # ABBA: on first in even pairs, off first in odd ones (both workers alike: same pair)
            for on in ((True, False) if pair % 2 == 0 else (False, True)):
                tl.current = rec if on else None
                t0 = time.perf_counter()
                for _ in range(BLOCK):
                    kv.push(name, g); kv.pull(name, out=v)
                took[on] = (time.perf_counter() - t0) / BLOCK * 1e3
            tl.current = rec
            ratios.append(took[True] / took[False]); on_t.append(took[True]); off_t.append(took[False])
        med = lambda xs: sorted(xs)[len(xs) // 2]
        out[name] = {"ratio": med(ratios), "on": med(on_t), "off": med(off_t)}
        kv.barrier()
    if kv.rank == 0:
        print("%s%s" % (sys.argv[4], json.dumps(out)), flush=True)
    kv.close()
""")


def one_ab(job: Path, home: Path, rounds: int, warmup: int, timeout: float) -> dict[str, dict[str, float]]:
    """One ``--timeline`` job whose workers record in alternate blocks: per case the median
    ratio of adjacent blocks (recording over not) and the median block times, ms per round."""
    env = {**os.environ, "MXDIST_HOME": str(home)}
    cmd = [sys.executable, "-m", "mxdist", "launch", "-n", "2", "-s", "2", "--timeline",
           str(job), str(rounds), str(warmup), json.dumps(CASES), MARK]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    for line in proc.stdout.splitlines():
        if MARK in line:
            return dict(json.loads(line.split(MARK, 1)[1]))
    raise SystemExit(f"job failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")


def one(job: Path, home: Path, timeline: bool, rounds: int, warmup: int, timeout: float) -> dict[str, float]:
    """One job's mean round time per case, ms."""
    env = {**os.environ, "MXDIST_HOME": str(home)}
    cmd = [sys.executable, "-m", "mxdist", "launch", "-n", "2", "-s", "2",
           *(["--timeline"] if timeline else []),
           str(job), str(rounds), str(warmup), json.dumps(CASES), MARK]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    for line in proc.stdout.splitlines():
        if MARK in line:
            return {k: float(v) for k, v in json.loads(line.split(MARK, 1)[1]).items()}
    raise SystemExit(f"job failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")


def per_event(n: int = 100_000) -> dict[str, float]:
    """The best of 5 tries, microseconds to record a worker's call,
    a span, and a wait (a span naming the workers waited for), in this process."""
    from psnode import timeline

    with tempfile.TemporaryDirectory(prefix="timeline-event-") as tmp:
        rec = timeline.Timeline(tmp, "worker", 0)
        out = {}
        for what, fn in (("call", lambda: rec.call("push", rec.now())),
                         ("span", lambda: rec.span("apply", rec.now())),
                         ("wait", lambda: rec.wait("pull-wait", rec.now(), (1,)))):
            best = float("inf")
            for _ in range(5):   # (the best of 5: the least disturbed by other load)
                t0 = time.perf_counter()
                for _ in range(n // 5):
                    fn()
                best = min(best, (time.perf_counter() - t0) / (n // 5) * 1e6)
            out[what] = best
        rec.flush()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", choices=("ab", "jobs"), default="ab",
                    help="ab (default): one --timeline job per run, its workers recording in alternate "
                         "blocks of rounds; jobs: a pair of jobs per run, with and without --timeline")
    ap.add_argument("--runs", type=int, default=7, help="runs (default 7)")
    ap.add_argument("--rounds", type=int, default=2000, help="timed rounds per case and job (default 2000)")
    ap.add_argument("--warmup", type=int, default=200, help="untimed rounds first (default 200)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per job")
    ap.add_argument("--json", help="write every run's figures here")
    a = ap.parse_args(argv)
    fmt = lambda xs, d: f"{statistics.median(xs):.{d}f} [{min(xs):.{d}f}-{max(xs):.{d}f}]"  # noqa: E731
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="timeline-cost-") as tmp:
        job = Path(tmp) / "job.py"
        job.write_text(AB_JOB if a.method == "ab" else JOB)
        for r in range(a.runs):
            if a.method == "ab":
                got = one_ab(job, Path(tmp) / "home", a.rounds, a.warmup, a.timeout)
                runs.append(got)
                print(f"  run {r + 1}/{a.runs}: " + "  ".join(
                    f"{c} off {got[c]['off']:.3f} ms, recording {got[c]['on']:.3f} ms, ratio {got[c]['ratio']:.3f}"
                    for c in CASES), flush=True)
                continue
            order = (False, True) if r % 2 == 0 else (True, False)
            pair = {("timeline" if on else "off"): one(job, Path(tmp) / "home", on, a.rounds, a.warmup, a.timeout)
                    for on in order}
            runs.append(pair)
            print(f"  run {r + 1}/{a.runs}: " + "  ".join(
                f"{c} off {pair['off'][c]:.3f} ms, timeline {pair['timeline'][c]:.3f} ms" for c in CASES), flush=True)
    if a.method == "ab":
        print("\n| case | not recording ms | recording ms | recording / not (adjacent blocks) |\n|---|---|---|---|")
        for c in CASES:
            print(f"| {c} | {fmt([r[c]['off'] for r in runs], 3)} | {fmt([r[c]['on'] for r in runs], 3)} | "
                  f"{fmt([r[c]['ratio'] for r in runs], 3)} |")
    else:
        print("\n| case | off ms | --timeline ms | --timeline / off |\n|---|---|---|---|")
        for c in CASES:
            off = [r["off"][c] for r in runs]
            on = [r["timeline"][c] for r in runs]
            print(f"| {c} | {fmt(off, 3)} | {fmt(on, 3)} | {fmt([x / y for x, y in zip(on, off, strict=True)], 3)} |")
    micro = per_event()
    print("\nper event, this process: " + ", ".join(f"{k} {v:.2f} us" for k, v in micro.items()))
    if a.json:
        Path(a.json).write_text(json.dumps({"method": a.method, "runs": runs, "rounds": a.rounds,
                                            "warmup": a.warmup, "per_event_us": micro}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
