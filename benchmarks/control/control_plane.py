"""The control plane at scale: jobs of 16, 32 and 64 processes (tiny keys) on this machine.

    python benchmarks/control/control_plane.py                  # 16, 32, 64 processes, S=4, 3 runs (~2 minutes)
    python benchmarks/control/control_plane.py --procs 64 --runs 3 --json /tmp/cp.json

A job of P processes is the scheduler, S servers and W = P - 1 - S workers (benchmarks/
control_worker.py), started by the test harness with a 1 s heartbeat.  Measured:

- **registration**: from starting the processes to the last worker's WELCOME (includes
  interpreter start and imports of P processes on 2 cores); from the last worker ready to
  register (imports done) to the last WELCOME; and the spread of the WELCOMEs (first to last).
- **barrier**: each worker times ``barriers`` barriers (W BARRIER messages in, W BARRIER_DONE
  out per barrier); median over a worker's barriers, then median (and max) over workers.
- **tiny rounds**: push+pull of ``keys`` keys of 16 float32, median round time.
- **finish**: after a last barrier every worker calls ``kv.close()`` (FINISH until acknowledged;
  the FINISHes one scheduler turn handles make it send one MEMBERSHIP to every server): the
  median close time, and from the first close called to the last one returned.
- **scheduler CPU to welcome**: its CPU time when worker 0 has its WELCOME (interpreter start,
  imports and the registration of W + S nodes).
- **scheduler CPU per message**: the scheduler's CPU time (all its threads, schedstat ns),
  sampled by worker 0 around the barrier loop and around an idle window (only heartbeats: each
  of the W + S nodes sends HEARTBEAT and gets HEARTBEAT_ACK every second).  Per heartbeat
  message = idle CPU / (2 (W + S) x idle seconds); per barrier message = (barrier-window CPU -
  the heartbeat CPU rate x its duration) / (2 W x barriers).  Message counts are those the
  protocol prescribes (psnode/scheduler.py), not counted on the wire.

If a step costs O(1) per message, the CPU per message stays flat as P grows and the barrier time
grows linearly with W; CPU per message that grows with P means per-message work linear in the
job size (O(N^2) per event).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import harness, parse_results, tail  # noqa: E402
from benchmarks.report import fmt_range, print_table  # noqa: E402

WORKER = Path(__file__).resolve().parent / "control_worker.py"
HEARTBEAT = 1.0


def run_job(h, procs: int, S: int, cfg: dict, timeout: float) -> dict | None:
    W = procs - 1 - S
    env = {"PSNODE_HEARTBEAT_INTERVAL": str(HEARTBEAT), "PSNODE_REGISTER_TIMEOUT": str(timeout),
           "OMP_NUM_THREADS": "1"}
    t_spawn = time.time()
    job = h.start_job(WORKER.read_text(), W, S, env=env, args=[json.dumps(cfg)])
    try:
        h.wait_job(job, timeout)
    except AssertionError as exc:
        print(f"  P={procs}: {exc}\n{tail(job.describe(), 20)}", file=sys.stderr)
        return None
    recs = [r for p in job.workers for r in parse_results(p.out)]
    if any(p.code != 0 for p in job.procs) or len(recs) != W:
        bad = [(p.role, p.rank, p.code) for p in job.procs if p.code != 0]
        print(f"  P={procs}: {len(recs)} of {W} results, failed {bad}\n{tail(job.describe(), 20)}",
              file=sys.stderr)
        return None
    return analyse(recs, procs, W, S, cfg, t_spawn)


def analyse(recs: list[dict], procs: int, W: int, S: int, cfg: dict, t_spawn: float) -> dict:
    welcome = [r["t_welcome"] for r in recs]
    ready = [r["t_ready"] for r in recs]
    per_worker = [statistics.median(r["barrier"]) for r in recs]
    out = {"procs": procs, "W": W, "S": S,
           "spawn_to_welcome_s": max(welcome) - t_spawn,
           "ready_to_welcome_ms": (max(welcome) - max(ready)) * 1e3,
           "welcome_spread_ms": (max(welcome) - min(welcome)) * 1e3,
           "barrier_ms": statistics.median(per_worker) * 1e3, "barrier_max_ms": max(per_worker) * 1e3,
           "round_ms": statistics.median(statistics.median(r["rounds"]) for r in recs) * 1e3,
           "close_ms": statistics.median(r["t_closed"] - r["t_close"] for r in recs) * 1e3,
           "finish_ms": (max(r["t_closed"] for r in recs) - min(r["t_close"] for r in recs)) * 1e3}
    cpu = next((r["cpu"] for r in recs if r.get("cpu")), None)
    if cpu and cpu.get("welcomed") is not None:
        out["sched_cpu_to_start_ms"] = cpu["welcomed"] / 1e6
    if cpu and None not in (cpu["barrier_start"], cpu["barrier_end"], cpu["idle_end"]):
        d_bar = (cpu["barrier_end"] - cpu["barrier_start"]) / 1e9
        t_bar = cpu["t_barrier_end"] - cpu["t_barrier_start"]
        d_idle = (cpu["idle_end"] - cpu["barrier_end"]) / 1e9
        t_idle = cpu["t_idle_end"] - cpu["t_barrier_end"]
        hb_rate = d_idle / t_idle                       # scheduler CPU s per s from heartbeats
        hb_msgs = 2 * (W + S) / HEARTBEAT * t_idle
        bar_msgs = 2 * W * cfg["barriers"]
        out.update(sched_cpu_idle_pct=hb_rate * 100, us_per_heartbeat_msg=d_idle / hb_msgs * 1e6,
                   us_per_barrier_msg=max(0.0, d_bar - hb_rate * t_bar) / bar_msgs * 1e6,
                   sched_ms_per_barrier=max(0.0, d_bar - hb_rate * t_bar) / cfg["barriers"] * 1e3)
    return out


def table(results: list[dict], print_fn=print) -> list[dict]:
    hdr = ("procs", "W,S", "start to all welcomed s", "last ready to all welcomed ms", "welcome spread ms",
           "sched CPU to welcome ms", "barrier ms", "barrier ms (slowest worker)", "tiny push+pull ms",
           "close ms", "first close to last closed ms", "sched CPU idle %", "sched CPU us/heartbeat msg",
           "sched CPU us/barrier msg", "sched CPU ms/barrier")
    keys = ("spawn_to_welcome_s", "ready_to_welcome_ms", "welcome_spread_ms", "sched_cpu_to_start_ms", "barrier_ms",
            "barrier_max_ms", "round_ms", "close_ms", "finish_ms", "sched_cpu_idle_pct", "us_per_heartbeat_msg",
            "us_per_barrier_msg", "sched_ms_per_barrier")
    specs = (".2f", ".0f", ".0f", ".0f", ".2f", ".2f", ".2f", ".1f", ".0f", ".1f", ".0f", ".0f", ".2f")
    rows = []
    for procs in sorted({r["procs"] for r in results}):
        mine = [r for r in results if r["procs"] == procs]
        rows.append((str(procs), f"{mine[0]['W']},{mine[0]['S']}",
                     *(fmt_range([r[k] for r in mine if k in r], s) for k, s in zip(keys, specs, strict=True))))
    print_fn("\nControl plane (median [min-max] over runs; message counts as the protocol prescribes):")
    print_table(hdr, rows, print_fn)
    return [dict(zip(hdr, r, strict=True)) for r in rows]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--procs", default="16,32,64", help="job sizes in processes (default 16,32,64)")
    ap.add_argument("--servers", type=int, default=4, help="servers per job (default 4)")
    ap.add_argument("--runs", type=int, default=3, help="runs (sizes interleaved)")
    ap.add_argument("--barriers", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--idle", type=float, default=5.0, help="seconds of the heartbeat-only window")
    ap.add_argument("--keys", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args(argv)
    sizes = [int(x) for x in a.procs.split(",")]
    if min(sizes) < a.servers + 2:
        raise SystemExit(f"--procs must be at least --servers + 2 ({a.servers + 2})")
    cfg = {"barriers": a.barriers, "rounds": a.rounds, "idle": a.idle, "keys": a.keys}
    print(f"control plane benchmark: {platform.python_version()} on {os.cpu_count()} cpu(s); sizes={sizes} "
          f"S={a.servers} runs={a.runs} {cfg}")
    h = harness()
    results = []
    t_all = time.monotonic()
    for run in range(a.runs):
        order = sizes[run % len(sizes):] + sizes[:run % len(sizes)]
        for procs in order:
            t0 = time.monotonic()
            got = run_job(h, procs, a.servers, cfg, a.timeout)
            if got:
                got["run"] = run
                results.append(got)
            print(f"  run {run + 1}/{a.runs} P={procs}: {'ok' if got else 'failed'} in {time.monotonic() - t0:.1f} s",
                  flush=True)
    summary = table(results)
    print(f"\ntotal {time.monotonic() - t_all:.0f} s")
    if a.json:
        Path(a.json).write_text(json.dumps({"argv": sys.argv, "results": results, "summary": summary}, indent=1))
        print(f"wrote {a.json}")
    return 0 if len(results) == len(sizes) * a.runs else 1


if __name__ == "__main__":
    sys.exit(main())
