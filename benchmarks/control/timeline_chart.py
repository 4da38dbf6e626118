"""A picture of a job's ``--timeline`` trace: one row per process, spans coloured by kind.

    python benchmarks/control/timeline_chart.py --out docs/timeline.png          # runs the straggler job
    python benchmarks/control/timeline_chart.py --trace TRACE.json --out timeline.png   # any merged trace

Without ``--trace`` it launches the straggler job below through ``mxdist launch -n 3 -s 1
--timeline-path ...`` (``dist_sync``; worker 2's step takes 3x the others') and draws its trace.
matplotlib is the ``bench`` extra.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

JOB = textwrap.dedent("""
    import sys, time, numpy as np, psnode
    steps, base = int(sys.argv[1]), float(sys.argv[2])
    kv = psnode.kv.create('dist_sync')
    kv.init('w', np.zeros(1 << 16, np.float32))
    for step in range(steps):
        time.sleep(base * (3 if kv.rank == 2 else 1))   # compute; worker 2 is the straggler
        kv.push('w', np.ones(1 << 16, np.float32)); kv.pull('w')
    kv.barrier()
    kv.close()
""")

COLOURS = {"compute": "#9ecae1", "push": "#31a354", "pull": "#74c476", "pushpull": "#31a354",
           "row_sparse_pull": "#74c476", "barrier": "#fdae6b", "pull-wait": "#de2d26",
           "init-wait": "#fc9272", "barrier-wait": "#e6550d", "apply": "#756bb1", "checkpoint": "#54278f"}
LAYER = {"compute": 0, "push": 1, "pull": 1, "pushpull": 1, "row_sparse_pull": 1, "barrier": 1}   # waits on top


def run_job(trace: Path, steps: int, base: float) -> None:
    """Launch the straggler job with ``--timeline-path trace``."""
    with tempfile.TemporaryDirectory(prefix="timeline-chart-") as tmp:
        job = Path(tmp) / "job.py"
        job.write_text(JOB)
        env = {**os.environ, "MXDIST_HOME": str(Path(tmp) / "home")}
        proc = subprocess.run([sys.executable, "-m", "mxdist", "launch", "-n", "3", "-s", "1",
                               "--timeline-path", str(trace), str(job), str(steps), str(base)],
                              env=env, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0 or not trace.exists():
            raise SystemExit(f"the job failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")


def draw(trace: dict[str, Any], out: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    order = sorted(names)                       # the merge's sort order: scheduler, servers, workers
    row = {pid: len(order) - 1 - i for i, pid in enumerate(order)}
    fig, ax = plt.subplots(figsize=(12, 0.55 * len(order) + 1.6))
    seen: set[str] = set()
    spans = sorted((e for e in events if e["ph"] == "X"), key=lambda e: LAYER.get(e["name"], 2))
    end = max((e["ts"] + e["dur"] for e in spans), default=1.0) / 1e3
    thinnest = end / 400   # (ms: a short span, e.g. an apply, stays visible)
    for e in spans:
        y = row[e["pid"]]
        colour = COLOURS.get(e["name"], "#bdbdbd")
        ax.broken_barh([(e["ts"] / 1e3, max(e["dur"] / 1e3, thinnest))], (y - 0.35, 0.7), facecolors=colour,
                       linewidth=0)
        seen.add(e["name"])
    for e in events:
        if e["ph"] == "i":
            ax.plot([e["ts"] / 1e3], [row[e["pid"]]], marker="v", color="black")
            seen.add("event: " + e["name"])
    ax.set_yticks([row[p] for p in order], [names[p] for p in order])
    ax.set_xlabel("ms since the first event")
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
    handles = [Patch(color=COLOURS[k], label=k) for k in COLOURS if k in seen]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=min(8, len(handles)),
              frameon=False)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, help="a merged trace (mxdist launch --timeline); default: run the job")
    ap.add_argument("--out", type=Path, required=True, help="the PNG to write")
    ap.add_argument("--steps", type=int, default=6, help="the job's steps (default 6)")
    ap.add_argument("--step-ms", type=float, default=100, help="a fast worker's step, ms (default 100)")
    ap.add_argument("--keep-trace", type=Path, help="also keep the job's trace here")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="timeline-trace-") as tmp:
        trace = a.trace
        title = f"timeline: {trace}" if trace else \
            f"dist_sync, 3 workers, 1 server: worker 2 takes 3x the others' step ({a.step_ms:.0f} ms)"
        if trace is None:
            trace = Path(tmp) / "timeline.json"
            run_job(trace, a.steps, a.step_ms / 1e3)
        doc = json.loads(trace.read_text())
        if a.keep_trace:
            a.keep_trace.write_text(json.dumps(doc))
        draw(doc, a.out, title)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
