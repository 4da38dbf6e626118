"""A stream of open-ended ids under a memory cap: the same job with ``max_rows`` capping the servers
and without a cap, one after the other in one run: servers' memory, held-out AUC and log loss
against steps, a chart.

    python benchmarks/training/stream.py                          # 50 M+ distinct ids, 1 GiB cap, ~10 minutes
    python benchmarks/training/stream.py --quick                  # smoke run: a few hundred thousand ids
    python benchmarks/training/stream.py --json docs/stream.json --svg docs/stream.svg
    python benchmarks/training/stream.py --from docs/stream.json --svg docs/stream.svg   # chart a run again
    python benchmarks/training/stream.py --speed-runs 3 --json docs/stream.json --svg docs/stream.svg
        # the three goals of a table without a row count in one run: the stream above, and
        # benchmarks/training/embedding.py --with-dynamic (20 M rows, W2 S2) for the speed
        # against the fixed table and the servers' memory against the rows touched

The model, data and step are in benchmarks/training/stream_worker.py: W=2 S=2 ``dist_sync``, a
table without a row count (``EmbeddingBag(None, dim)``), each sample ``head`` ids from a Zipf
head and ``tail`` ids seen once (every tail id of the job distinct), AdaGrad on the servers.
The capped job passes ``max_rows`` per server (least recently used rows evicted); the other
holds every row it made.

Memory: a sampler reads both servers' resident memory (VmRSS) every 0.25 s and their peaks
(VmHWM); the cap holds when the sum of the servers' peaks stays under ``--cap-gib``.  A job is
killed (its processes, by pid) when the machine's available memory falls under ``--floor-gib``.
Held-out AUC and log loss by progressive validation (each batch scored before the model trains
on it), per window of steps, mean over the ranks; the goal compares the mean of the last
``--tail-windows`` windows: capped within 1% of uncapped.  Only processes this driver starts
are killed.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import harness, parse_results, tail  # noqa: E402

WORKER = Path(__file__).resolve().parent / "stream_worker.py"
#: (the uncapped servers stall for seconds when their index and arrays grow past millions of rows:
#: a minute of silence allowed)
ENV = {"OMP_NUM_THREADS": "1", "PSNODE_HEARTBEAT_INTERVAL": "1.0", "PSNODE_HEARTBEAT_LIVENESS": "60",
       "PSNODE_RETRY_TIMEOUT": "60", "PSNODE_REGISTER_TIMEOUT": "120"}
FULL = {"steps": 800, "batch": 8192, "head": 4, "tail": 4, "dim": 4, "lr": 0.05, "window": 20}
QUICK = dict(FULL, steps=60, batch=1024, window=10)
CAPPED, UNCAPPED = "capped", "no cap"
GiB, MiB = 2**30, 2**20


def _kib(pid: int, name: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(name + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def available_gib() -> float:
    with open("/proc/meminfo") as fh:
        return next(int(x.split()[1]) for x in fh if x.startswith("MemAvailable:")) / 2**20


@dataclass
class Sampler:
    """The servers' summed VmRSS every ``every`` seconds, their peaks (VmHWM); kills the job's
    processes (``pids``, by pid) when the machine's available memory falls under ``floor`` GiB."""

    servers: list[int]
    pids: list[int]
    floor: float
    every: float = 0.25
    log: list[tuple[float, int]] = field(default_factory=list)     # (time.time(), servers' RSS KiB)
    hwm: dict[int, int] = field(default_factory=dict)
    killed: str = ""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            rss = [_kib(p, "VmRSS") for p in self.servers]
            for p in self.servers:
                h = _kib(p, "VmHWM")
                if h is not None:
                    self.hwm[p] = max(self.hwm.get(p, 0), h)
            self.log.append((time.time(), sum(r or 0 for r in rss)))
            if available_gib() < self.floor and not self.killed:
                self.killed = f"the machine's available memory fell under {self.floor:g} GiB"
                for pid in self.pids:
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)


def run_job(h, name: str, cfg: dict, timeout: float, floor: float) -> dict:
    """One job; its record: the ranks' results, the servers' memory over time and peaks."""
    job = h.start_job(WORKER.read_text(), 2, 2, env=ENV, args=[json.dumps(dict(cfg, system=name))])
    servers = [p.popen.pid for p in job.procs if p.role == "server"]
    s = Sampler(servers, [p.popen.pid for p in job.procs], floor).start()
    problem = ""
    t0 = time.monotonic()
    try:
        h.wait_job(job, timeout)
    except AssertionError as exc:
        problem = str(exc)
    finally:
        s.stop()
    if any(p.code != 0 for p in job.procs) and not problem:
        problem = f"exit codes {[(p.role, p.rank, p.code) for p in job.procs]}"
    if problem or s.killed:
        print(f"  {name}: {s.killed or problem}\n{tail(job.describe(), 30)}", file=sys.stderr)
    ranks = [r for p in job.workers for r in parse_results(p.out)]
    return {"system": name, "config": cfg, "ranks": ranks, "memory": s.log, "server_hwm_kib": sorted(s.hwm.values()),
            "seconds": time.monotonic() - t0, "problem": s.killed or problem}


# ---------------------------------------------------------------- the curves and the goals (pure)
def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve (ties count half), vectorised."""
    scores, labels = np.asarray(scores), np.asarray(labels)
    _, inv, counts = np.unique(scores, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    ranks = (ends - (counts - 1) / 2)[inv]            # average 1-based rank of each tie group
    pos = labels > 0.5
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if not n_pos or not n_neg:
        return float("nan")
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def curves(rec: dict) -> dict[str, list[float]]:
    """Per window (steps): AUC, log loss and the true probabilities' AUC (mean over ranks), and
    the servers' RSS in MiB at the window's end (the last sample before it)."""
    ranks = rec["ranks"]
    n = min(len(r["windows"]) for r in ranks)
    out: dict[str, list[float]] = {"step": [], "auc": [], "logloss": [], "best_auc": [], "server_mib": []}
    mem = rec["memory"]
    for i in range(n):
        ws = [r["windows"][i] for r in ranks]
        out["step"].append(ws[0]["step"])
        for k in ("auc", "logloss", "best_auc"):
            out[k].append(statistics.mean(w[k] for w in ws))
        t = max(w["time"] for w in ws)
        before = [kib for when, kib in mem if when <= t]
        out["server_mib"].append((before[-1] if before else 0) / 1024)
    return out


def summary(capped: dict, free: dict, cap_gib: float, last: int) -> dict:
    """The three figures the goals name, from a capped and an uncapped record."""
    c, f = curves(capped), curves(free)
    k = min(last, len(c["auc"]), len(f["auc"]))
    out = {"distinct_tail_ids": sum(r["tail_ids"] for r in capped["ranks"])}
    for name, rec, cv in ((CAPPED, capped, c), (UNCAPPED, free, f)):
        out[name] = {"auc": statistics.mean(cv["auc"][-k:]), "logloss": statistics.mean(cv["logloss"][-k:]),
                     "best_auc": statistics.mean(cv["best_auc"][-k:]),
                     "servers_peak_mib": sum(rec["server_hwm_kib"]) / 1024,
                     "servers_rss_max_mib": max((kib for _, kib in rec["memory"]), default=0) / 1024,
                     "steps_per_s": statistics.median(r["steps_per_s"] for r in rec["ranks"])}
    out["auc_ratio"] = out[CAPPED]["auc"] / out[UNCAPPED]["auc"]
    out["logloss_ratio"] = out[CAPPED]["logloss"] / out[UNCAPPED]["logloss"]
    out["cap_mib"] = cap_gib * 1024
    out["goals"] = {"50M distinct ids": out["distinct_tail_ids"] >= 50_000_000,
                    "memory under the cap": out[CAPPED]["servers_peak_mib"] <= out["cap_mib"],
                    "AUC within 1%": abs(out["auc_ratio"] - 1) <= 0.01}
    return out


def speed(runs: int, steps: int, timeout: float) -> dict:
    """The embedding workload (benchmarks/training/embedding.py: 20 M-row fixed table against
    the same items as 64-bit ids on a table without a row count, W2 S2, interleaved ``runs``):
    the 64-bit ids' steps/s over the fixed table's per run, and each one's servers' peak memory."""
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "embedding.json"
        cmd = [sys.executable, str(ROOT / "benchmarks" / "training" / "embedding.py"), "--rows", "20e6",
               "--runs", str(runs), "--steps", str(steps), "--warmup", "30", "--with-dynamic", "--no-ddp",
               "--json", str(out)]
        print("  speed: " + " ".join(cmd[1:]), flush=True)
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0 or not out.exists():
            raise SystemExit(f"embedding.py failed (exit {proc.returncode}):\n{tail(proc.stdout + proc.stderr)}")
        doc = json.loads(out.read_text())
    rate: dict[tuple[int, str], list[float]] = {}
    for r in doc["records"]:
        rate.setdefault((r["run"], r["system"]), []).append(r["steps_per_s"])
    fixed, dyn = "psnode", "psnode, 64-bit ids"
    ratios = [statistics.median(rate[(k, dyn)]) / statistics.median(rate[(k, fixed)])
              for k in sorted({k for k, _ in rate}) if (k, dyn) in rate and (k, fixed) in rate]
    mem = {name: max(m["server_mib"] for m in doc["memory"] if m["system"] == name) for name in (fixed, dyn)}
    touched = {r["system"]: r["rows_touched"] for r in doc["records"]}
    return {"ratios": ratios, "ratio": statistics.median(ratios), "server_peak_mib": mem,
            "rows_touched_per_step": touched.get(dyn, 0.0), "summary": doc["summary"]}


def report_speed(v: dict) -> None:
    print("\nthe embedding workload, 20 M items (W2 S2): 64-bit ids on a table without a row count over the "
          "fixed table")
    for row in v["summary"]:
        print(f"  {row['system']:20} steps/s {row['steps/s']:22} server CPU ms/step {row['per server']:15} "
              f"peak MiB per server {row['peak MiB per server']}")
    print(f"  steps/s ratio per run: {', '.join(f'{r:.2f}' for r in v['ratios'])} (median {v['ratio']:.2f})")


# ---------------------------------------------------------------- the chart (SVG, no dependency)
def _poly(xs, ys, x0, y0, w, h, xr, yr, color: str, dash: str = "") -> str:
    pts = " ".join(f"{x0 + (x - xr[0]) / (xr[1] - xr[0]) * w:.1f},{y0 + h - (y - yr[0]) / (yr[1] - yr[0]) * h:.1f}"
                   for x, y in zip(xs, ys, strict=True))
    d = f' stroke-dasharray="{dash}"' if dash else ""
    return f'<polyline fill="none" stroke="{color}" stroke-width="1.6"{d} points="{pts}"/>'


def _ticks(lo: float, hi: float, n: int = 4) -> list[float]:
    return [lo + (hi - lo) * i / n for i in range(n + 1)]


def svg(capped: dict, free: dict, cap_mib: float) -> str:
    """Three panels against steps: held-out AUC, log loss, the servers' memory (with the cap)."""
    c, f = curves(capped), curves(free)
    steps = c["step"] + f["step"]
    xr = (0.0, float(max(steps)))
    panels = [("held-out AUC (progressive validation)", "auc", "{:.3f}"),
              ("held-out log loss", "logloss", "{:.3f}"),
              ("servers' resident memory, MiB (both)", "server_mib", "{:.0f}")]
    W, PH, L, T = 760, 190, 70, 30
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{T + len(panels) * (PH + 50) + 20}" '
             'font-family="sans-serif" font-size="11">', '<rect width="100%" height="100%" fill="white"/>',
             f'<text x="{L}" y="18" font-size="13">{capped["config"]["batch"] * 2 * capped["config"]["steps"]:,} '
             f'samples, {summary(capped, free, cap_mib / 1024, 10)["distinct_tail_ids"]:,} distinct tail ids, '
             f'W=2 S=2: max_rows cap (blue) vs no cap (orange)</text>']
    for i, (title, key, fmt) in enumerate(panels):
        y0 = T + i * (PH + 50) + 20
        ys = c[key] + f[key] + ([cap_mib] if key == "server_mib" else []) + (c["best_auc"] if key == "auc" else [])
        lo, hi = min(ys), max(ys)
        pad = (hi - lo) * 0.08 or 1.0
        yr = (lo - pad if key != "server_mib" else 0.0, hi + pad)
        w = W - L - 20
        parts.append(f'<text x="{L}" y="{y0 - 6}" font-size="12">{title}</text>')
        parts.append(f'<rect x="{L}" y="{y0}" width="{w}" height="{PH}" fill="none" stroke="#999"/>')
        for t in _ticks(*yr):
            y = y0 + PH - (t - yr[0]) / (yr[1] - yr[0]) * PH
            parts.append(f'<line x1="{L}" x2="{L + w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
            parts.append(f'<text x="{L - 4}" y="{y + 4:.1f}" text-anchor="end">{fmt.format(t)}</text>')
        for t in _ticks(*xr):
            x = L + (t - xr[0]) / (xr[1] - xr[0]) * w
            parts.append(f'<text x="{x:.1f}" y="{y0 + PH + 14}" text-anchor="middle">{t:.0f}</text>')
        if key == "auc":
            parts.append(_poly(c["step"], c["best_auc"], L, y0, w, PH, xr, yr, "#999", "3,3"))
        if key == "server_mib":
            y = y0 + PH - (cap_mib - yr[0]) / (yr[1] - yr[0]) * PH
            parts.append(f'<line x1="{L}" x2="{L + w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#c00" '
                         'stroke-dasharray="6,3"/>')
            parts.append(f'<text x="{L + w - 4}" y="{y - 4:.1f}" text-anchor="end" fill="#c00">cap</text>')
        parts.append(_poly(f["step"], f[key], L, y0, w, PH, xr, yr, "#e67e22"))
        parts.append(_poly(c["step"], c[key], L, y0, w, PH, xr, yr, "#1f77b4"))
    parts.append(f'<text x="{L + (W - L) / 2}" y="{T + len(panels) * (PH + 50) + 8}" text-anchor="middle">'
                 'steps (per worker); grey dashes: the AUC of the true click probabilities</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def report(s: dict) -> None:
    print(f"\ndistinct tail ids: {s['distinct_tail_ids']:,} (plus the Zipf head's)")
    print(f"{'job':8} {'steps/s':>8} {'AUC':>7} {'log loss':>9} {'true-p AUC':>10} {'servers peak MiB':>17} "
          f"{'max RSS MiB':>12}")
    for name in (CAPPED, UNCAPPED):
        v = s[name]
        print(f"{name:8} {v['steps_per_s']:8.2f} {v['auc']:7.4f} {v['logloss']:9.4f} {v['best_auc']:10.4f} "
              f"{v['servers_peak_mib']:17.0f} {v['servers_rss_max_mib']:12.0f}")
    print(f"capped/uncapped: AUC {s['auc_ratio']:.4f}, log loss {s['logloss_ratio']:.4f}; cap {s['cap_mib']:.0f} MiB")
    for goal, met in s["goals"].items():
        print(f"  {goal}: {'met' if met else 'NOT MET'}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a smoke run: 60 steps of 1024 samples")
    ap.add_argument("--steps", type=int, help=f"steps per worker (default {FULL['steps']})")
    ap.add_argument("--batch", type=int, help=f"samples per step per worker (default {FULL['batch']})")
    ap.add_argument("--max-rows", type=int, default=1_000_000, help="the capped job's rows per server")
    ap.add_argument("--cap-gib", type=float, default=1.0, help="the servers' memory cap, in all (GiB)")
    ap.add_argument("--floor-gib", type=float, default=3.0, help="kill a job when the machine has less available")
    ap.add_argument("--tail-windows", type=int, default=10, help="windows the AUC goal averages (the last ones)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per job")
    ap.add_argument("--json", help="write both jobs' records and the summary here")
    ap.add_argument("--svg", help="write the chart here")
    ap.add_argument("--from", dest="src", help="read a --json file instead of running")
    ap.add_argument("--speed-runs", type=int, default=0,
                    help="also run the embedding workload's fixed table against 64-bit ids this many interleaved "
                         "times (goal: at least 0.8x the steps/s, median of the runs)")
    ap.add_argument("--speed-steps", type=int, default=400, help="timed steps per speed run")
    a = ap.parse_args(argv)
    fast = None
    if a.src:
        doc = json.loads(Path(a.src).read_text())
        capped, free, cap_gib = doc["jobs"][CAPPED], doc["jobs"][UNCAPPED], doc["cap_gib"]
        fast = doc.get("speed")
    else:
        cfg = dict(QUICK if a.quick else FULL)
        for k in ("steps", "batch"):
            if getattr(a, k):
                cfg[k] = getattr(a, k)
        print(f"stream benchmark on {os.cpu_count()} cpu(s), {available_gib():.1f} GiB available; config {cfg}, "
              f"max_rows {a.max_rows} per server, cap {a.cap_gib:g} GiB")
        h = harness()
        jobs = {}
        for name, rows in ((CAPPED, a.max_rows), (UNCAPPED, 0)):
            print(f"  {name}: ...", end="", flush=True)
            jobs[name] = run_job(h, name, dict(cfg, max_rows=rows), a.timeout, a.floor_gib)
            rec = jobs[name]
            print(f" {'ok' if not rec['problem'] else 'FAILED'} in {rec['seconds']:.0f} s, servers' peaks "
                  f"{[round(k / 1024) for k in rec['server_hwm_kib']]} MiB", flush=True)
            if rec["problem"] or len(rec["ranks"]) != 2:
                return 1
        capped, free, cap_gib = jobs[CAPPED], jobs[UNCAPPED], a.cap_gib
        if a.speed_runs:
            fast = speed(a.speed_runs, a.speed_steps, 60 * (5 + 2 * a.speed_runs))
        if a.json:
            Path(a.json).write_text(json.dumps({"argv": sys.argv, "cap_gib": a.cap_gib, "max_rows": a.max_rows,
                                                "jobs": jobs, "summary": summary(capped, free, cap_gib,
                                                                                 a.tail_windows),
                                                "speed": fast}))
            print(f"wrote {a.json}")
    s = summary(capped, free, cap_gib, a.tail_windows)
    if fast:
        report_speed(fast)
        s["goals"]["steps/s at least 0.8x the fixed table (median of runs)"] = fast["ratio"] >= 0.8
        mem = fast["server_peak_mib"]
        s["goals"]["server memory follows the rows touched (64-bit ids under 1/4 of the fixed table's)"] = \
            mem["psnode, 64-bit ids"] < mem["psnode"] / 4
    report(s)
    if a.svg:
        Path(a.svg).write_text(svg(capped, free, cap_gib * 1024))
        print(f"wrote {a.svg}")
    return 0 if all(s["goals"].values()) or a.quick else 1


if __name__ == "__main__":
    sys.exit(main())
