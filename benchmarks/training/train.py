"""End to end, as users train: one PyTorch model, W=2 on this machine, psnode (S=1 and S=2)
against DDP + gloo, steps per second side by side in one interleaved run.

    python benchmarks/training/train.py                  # 3 interleaved runs
    python benchmarks/training/train.py --quick          # smoke run: 1 run, few steps, a small model
    python benchmarks/training/train.py --runs 5 --batch 64 --json /tmp/train.json

The model, data and step are in benchmarks/training/train_worker.py.  psnode jobs start through the
test harness (the env contract: scheduler, S servers, 2 workers); DDP's two ranks are plain
processes with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT.  Every process has
``OMP_NUM_THREADS=1`` (2 cores; as benchmarks/kvstore/run.py's gloo).  A run's value per system is the
median over ranks of each rank's steps/s; the table shows median [min-max] over runs, and
psnode/DDP per run (above 1: psnode faster).  Each system's ranks must end with equal weights
(checksum), or the run says so.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import child_env, free_port, harness, parse_results, tail  # noqa: E402
from benchmarks.report import fmt_range, print_table, ratios  # noqa: E402

WORKER = Path(__file__).resolve().parent / "train_worker.py"
FULL = {"inp": 512, "width": 1024, "depth": 15, "classes": 100, "batch": 32, "batches": 8,
        "lr": 0.002, "momentum": 0.9, "warmup": 3, "steps": 20}
QUICK = dict(FULL, width=256, depth=4, warmup=1, steps=3)
ENV = {"OMP_NUM_THREADS": "1", "PSNODE_HEARTBEAT_INTERVAL": "1.0", "PSNODE_REGISTER_TIMEOUT": "60"}


def run_psnode(h, S: int, cfg: dict, timeout: float, W: int = 2) -> list[dict]:
    system = f"psnode S{S}"
    job = h.start_job(WORKER.read_text(), W, S, env=ENV, args=["psnode", json.dumps(dict(cfg, system=system))])
    try:
        h.wait_job(job, timeout)
    except AssertionError as exc:
        print(f"  {system}: {exc}\n{tail(job.describe(), 30)}", file=sys.stderr)
        return []
    if any(p.code != 0 for p in job.procs):
        print(f"  {system}: exit codes {[(p.role, p.rank, p.code) for p in job.procs]}\n"
              f"{tail(job.describe(), 30)}", file=sys.stderr)
    return [r for p in job.workers for r in parse_results(p.out)]


def run_ddp(cfg: dict, timeout: float, W: int = 2) -> list[dict]:
    port = free_port()
    argv = [sys.executable, "-m", "benchmarks.training.train_worker", "ddp", json.dumps(dict(cfg, system="DDP gloo"))]
    procs = [subprocess.Popen(argv, cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=child_env(**ENV, RANK=str(r), WORLD_SIZE=str(W), LOCAL_RANK=str(r),
                                            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
             for r in range(W)]
    out: list[dict] = []
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            so, se = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            if p.returncode != 0:
                print(f"  DDP rank exited {p.returncode}:\n{tail(se)}", file=sys.stderr)
            out.extend(parse_results(so))
    except subprocess.TimeoutExpired:
        print(f"  DDP timed out after {timeout:.0f} s", file=sys.stderr)
        out = []
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return out


def summarize(records: list[dict], systems: list[str], print_fn=print) -> list[dict]:
    per: dict[str, dict[int, float]] = {}
    for s in systems:
        runs: dict[int, list[float]] = {}
        for r in records:
            if r["system"] == s:
                runs.setdefault(r["run"], []).append(r["steps_per_s"])
        per[s] = {run: statistics.median(v) for run, v in runs.items()}
    ddp = per.get("DDP gloo", {})
    hdr = ("system", "steps/s", "ms/step", "system/DDP (steps/s)", "last loss (rank 0)")
    rows = []
    for s in systems:
        losses = [r["loss"] for r in records if r["system"] == s and r["rank"] == 0]
        rows.append((s, fmt_range(list(per[s].values()), ".2f"),
                     fmt_range([1e3 / v for v in per[s].values()], ".0f"),
                     fmt_range(ratios(per[s], ddp), ".2f") if s != "DDP gloo" else "1",
                     fmt_range(losses, ".3f")))
    print_fn("\nTraining steps per second, W=2 on this machine (median over ranks; median [min-max] over runs;\n"
             "system/DDP per run: above 1 = faster than DDP + gloo).")
    print_table(hdr, rows, print_fn)
    return [dict(zip(hdr, r, strict=True)) for r in rows]


def check_equal_weights(records: list[dict]) -> list[str]:
    """Every system's ranks end a run with the same weights; the problems found."""
    bad = []
    groups: dict[tuple[str, int], list[float]] = {}
    for r in records:
        groups.setdefault((r["system"], r["run"]), []).append(r["checksum"])
    for (system, run), sums in sorted(groups.items()):
        if len(set(sums)) != 1:
            bad.append(f"{system} run {run + 1}: ranks end with different weights {sums}")
    return bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 run, a small model, few steps")
    ap.add_argument("--runs", type=int, help="interleaved runs (default 3; --quick: 1)")
    ap.add_argument("--servers", default="1,2", help="psnode's S values (default 1,2)")
    ap.add_argument("--no-ddp", action="store_true", help="psnode only")
    for k in ("batch", "width", "depth", "steps", "warmup"):
        ap.add_argument(f"--{k}", type=int, help=f"model/run setting (default {FULL[k]})")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per job")
    ap.add_argument("--json", help="write the records and the summary here")
    a = ap.parse_args(argv)
    cfg = dict(QUICK if a.quick else FULL)
    cfg.update({k: getattr(a, k) for k in ("batch", "width", "depth", "steps", "warmup") if getattr(a, k)})
    runs = a.runs or (1 if a.quick else 3)
    servers = [int(s) for s in a.servers.split(",") if s.strip()]
    h = harness()
    steps = [(f"psnode S{S}", lambda S=S: run_psnode(h, S, cfg, a.timeout)) for S in servers]
    if not a.no_ddp:
        steps.append(("DDP gloo", lambda: run_ddp(cfg, a.timeout)))
    print(f"training benchmark: {platform.python_version()} on {os.cpu_count()} cpu(s); runs={runs} "
          f"model={cfg} systems={[s for s, _ in steps]}")
    records: list[dict] = []
    t_all = time.monotonic()
    for run in range(runs):
        k = run % len(steps)
        for name, fn in steps[k:] + steps[:k]:
            t0 = time.monotonic()
            got = fn()
            for r in got:
                r["run"] = run
            records.extend(got)
            print(f"  run {run + 1}/{runs} {name}: {len(got)} results in {time.monotonic() - t0:.1f} s", flush=True)
    if records:
        print(f"model: {records[0]['params'] / 1e6:.1f} M parameters in {records[0]['tensors']} tensors, "
              f"batch {cfg['batch']} per worker")
    summary = summarize(records, [s for s, _ in steps])
    problems = check_equal_weights(records)
    for p in problems:
        print(f"  CHECK FAILED: {p}")
    print(f"\ntotal {time.monotonic() - t_all:.0f} s")
    if a.json:
        Path(a.json).write_text(json.dumps({"argv": sys.argv, "config": cfg, "records": records,
                                            "summary": summary, "problems": problems}, indent=1))
        print(f"wrote {a.json}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
