"""Stragglers: dist_sync, dist_ssp (s = 1, 3), dist_async and dist_sync with a backup worker on one
real model, W = 3, same run.

    python benchmarks/training/stragglers.py                       # every kind, every mode, 1 run
    python benchmarks/training/stragglers.py --runs 3 --json /tmp/stragglers.json --chart docs/stragglers.png
    python benchmarks/training/stragglers.py --kinds transient --modes sync,ssp3 --quick
    python benchmarks/training/stragglers.py --kinds persistent --modes sync,ssp1,async,backup1 --json /tmp/p.json
    python benchmarks/training/stragglers.py --from /tmp/n.json /tmp/t.json /tmp/p.json --chart docs/stragglers.png

The model is examples/mlp_numpy.py's digits MLP (benchmarks/training/stragglers_worker.py): each worker
trains on a fixed shard of the training set, with plain SGD on the servers at one learning rate
for every mode.  Equal work per clock: a dist_ssp or dist_async server applies each worker's
push on its own, so dist_sync runs with the ``sum`` aggregator (one step with the sum of the
three gradients).  ``backup1`` is dist_sync with backup_workers=1: a round completes without
its last push, which is dropped; it takes the same step per round as dist_sync, W x lr times
the mean of the gradients the round holds (the ``average`` aggregator, the learning rate scaled
by W, as synchronous SGD with backup workers is run: Chen et al. 2016).  A step's compute is a
sleep (``--step-ms``, 40 ms by default) so that the load of a shared machine matters little;
the gradients and the loss are computed for real.

Kinds of stragglers:

* ``none``: every step takes the base time;
* ``transient``: each step each worker, independently with probability 0.1 (seeded per rank,
  the same draws in every mode), takes 10x the base time, the way a shared machine stalls;
* ``persistent``: worker 2 always takes 3x the base time.

Per mode: wall time to a target training loss (the first time any worker's pulled weights have
a full-training-set loss at or under ``--target``), the final training loss and test accuracy
(rank 0's, after a barrier and a pull: every push applied), the time of the whole run, and
ratios to dist_sync of the same kind and run.  ``persistent`` also runs the straggler dropped
(dist_sync over the two fast workers and their shards): what a user does when one machine is
slow for good (``mxdist launch --min-workers``, or rebalancing its shard).  ``--chart`` draws
the loss over wall time, one line per mode, a panel per kind (matplotlib: the ``bench``
extra); ``--from`` reads the results of earlier ``--json`` runs instead of running (short runs
of one kind each, charted together).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from benchmarks.common import harness, parse_results, tail  # noqa: E402
from benchmarks.report import print_table  # noqa: E402

WORKER = Path(__file__).resolve().parent / "stragglers_worker.py"
#: mode name -> (store, staleness, workers left out, backup workers)
MODES = {"sync": ("dist_sync", None, 0, 0), "ssp1": ("dist_ssp", 1, 0, 0), "ssp3": ("dist_ssp", 3, 0, 0),
         "async": ("dist_async", None, 0, 0), "backup1": ("dist_sync", None, 0, 1),
         "drop": ("dist_sync", None, 1, 0)}
LABELS = {"sync": "dist_sync", "ssp1": "dist_ssp s=1", "ssp3": "dist_ssp s=3", "async": "dist_async",
          "backup1": "dist_sync, backup_workers=1", "drop": "dist_sync, straggler dropped"}
KINDS = ("none", "transient", "persistent")
ENV = {"OMP_NUM_THREADS": "1", "PSNODE_HEARTBEAT_INTERVAL": "1.0", "PSNODE_REGISTER_TIMEOUT": "60"}


def ideal_seconds(kind: str, mode: str, args: argparse.Namespace, run: int) -> float:
    """The run's wall time if only the sleeps counted (no messages, no compute): the same
    seeded straggling steps as the workers draw, each pull released as the mode's rule says."""
    store, staleness, out, backup = MODES[mode]
    workers = args.workers - out
    s = 0 if store == "dist_sync" else (10**9 if staleness is None else staleness)
    rngs = [np.random.default_rng(1000 * run + 7 + 101 * r) for r in range(workers)]
    step = args.step_ms / 1000
    start = [0.0] * workers
    pushed: list[list[float]] = [[] for _ in range(workers)]
    for k in range(1, args.steps + 1):
        for r in range(workers):
            slow = rngs[r].random() < 0.1 if kind == "transient" else kind == "persistent" and r == 2
            pushed[r].append(start[r] + step * ((10.0 if kind == "transient" else 3.0) if slow else 1.0))
        if backup:   # round k completes with the (W - b)-th push k; a late worker goes on at once
            done = sorted(p[k - 1] for p in pushed)[workers - backup - 1]
            for r in range(workers):
                start[r] = max(pushed[r][k - 1], done)
            continue
        for r in range(workers):
            j = k - s
            start[r] = max([pushed[r][k - 1]] + ([max(p[j - 1] for p in pushed)] if j >= 1 else []))
    return max(start)


def run_one(h, kind: str, mode: str, args: argparse.Namespace, run: int) -> dict | None:
    store, staleness, out, backup = MODES[mode]
    workers = args.workers - out
    cfg = {"mode": store, "staleness": staleness, "backup": backup, "kind": kind, "steps": args.steps,
           "step_s": args.step_ms / 1000,
           "p": 0.1, "slow": 10.0 if kind == "transient" else 3.0, "slow_rank": 2, "lr": args.lr,
           "batch": args.batch, "hidden": 64, "seed": 0, "straggle_seed": 1000 * run + 7}
    if backup:   # (dist_sync's step per round: W x lr times the mean of the round's gradients)
        cfg.update(aggregator="average", lr=args.lr * args.workers)
    job = h.start_job(WORKER.read_text(), workers, 1, env=ENV, args=[json.dumps(cfg)])
    try:
        h.wait_job(job, args.timeout)
    except AssertionError as exc:
        print(f"  {kind} {mode}: {exc}\n{tail(job.describe(), 30)}", file=sys.stderr)
        return None
    recs = [rec for p in job.workers for rec in parse_results(p.out)]
    if any(p.code != 0 for p in job.procs) or len(recs) != workers:
        print(f"  {kind} {mode}: exit codes {[(p.role, p.rank, p.code) for p in job.procs]}\n"
              f"{tail(job.describe(), 30)}", file=sys.stderr)
        return None
    points = sorted((t, loss) for rec in recs for t, loss in rec["curve"])
    hit = next((t for t, loss in points if loss <= args.target), None)
    rank0 = next(rec for rec in recs if rec["rank"] == 0)
    return {"kind": kind, "mode": mode, "run": run, "to_target_s": hit, "accuracy": rank0["accuracy"],
            "ideal_s": ideal_seconds(kind, mode, args, run),
            "final_loss": rank0["final_loss"], "seconds": max(rec["seconds"] for rec in recs),
            "slow_steps": {rec["rank"]: rec["slow_steps"] for rec in recs}, "curve": points}


def summary(results: list[dict], kinds: list[str], modes: list[str]) -> list[dict]:
    """Per kind and mode: medians over runs, and each run's ratio to dist_sync's."""
    rows = []
    for kind in kinds:
        base = {r["run"]: r for r in results if r["kind"] == kind and r["mode"] == "sync"}
        for mode in modes:
            rs = [r for r in results if r["kind"] == kind and r["mode"] == mode]
            if not rs:
                continue
            hits = [r["to_target_s"] for r in rs if r["to_target_s"] is not None]
            ratio = [r["to_target_s"] / base[r["run"]]["to_target_s"] for r in rs
                     if r["to_target_s"] is not None and r["run"] in base and base[r["run"]]["to_target_s"]]
            dacc = [100 * (r["accuracy"] - base[r["run"]]["accuracy"]) for r in rs if r["run"] in base]
            loss = [r["final_loss"] / base[r["run"]]["final_loss"] for r in rs if r["run"] in base]
            rows.append({"kind": kind, "mode": mode, "runs": len(rs), "reached": len(hits),
                         "final_loss": statistics.median(r["final_loss"] for r in rs),
                         "loss_ratio": statistics.median(loss) if loss else None,
                         "to_target_s": statistics.median(hits) if hits else None,
                         "ratio": statistics.median(ratio) if ratio else None,
                         "ratios": ratio,
                         "accuracy": statistics.median(r["accuracy"] for r in rs),
                         "accuracy_delta_pts": statistics.median(dacc) if dacc else None,
                         "seconds": statistics.median(r["seconds"] for r in rs),
                         "ideal_ratio": statistics.median(r["ideal_s"] / base[r["run"]]["ideal_s"]
                                                          for r in rs if r["run"] in base)
                         if any(r["run"] in base for r in rs) else None})
    return rows


def goals(rows: list[dict]) -> list[tuple[str, bool | None, str]]:
    """The issue's goals, checked on the summary: (goal, met, figures)."""
    def row(kind: str, mode: str) -> dict | None:
        return next((r for r in rows if r["kind"] == kind and r["mode"] == mode), None)
    out: list[tuple[str, bool | None, str]] = []
    t = row("transient", "ssp3")
    if t is not None:
        ok = t["ratio"] is not None and t["ratio"] <= 0.7 and t["accuracy_delta_pts"] is not None \
            and abs(t["accuracy_delta_pts"]) <= 0.5
        out.append(("transient: ssp s=3 to target <= 0.7x dist_sync, accuracy within 0.5 points", ok,
                    f"{t['ratio']}x, {t['accuracy_delta_pts']} points"))
    b = row("persistent", "backup1")
    if b is not None:
        ok = b["ratio"] is not None and b["ratio"] <= 0.5 and b["loss_ratio"] is not None and b["loss_ratio"] <= 2.0
        out.append(("persistent: backup_workers=1 to target <= 0.5x dist_sync, final loss within 2x", ok,
                    f"{b['ratio']}x, final loss {b['loss_ratio']}x"))
    n = row("none", "ssp3")
    if n is not None:
        ok = n["ratio"] is not None and n["ratio"] <= 1.05
        out.append(("no stragglers: ssp s=3 to target <= 1.05x dist_sync", ok, f"{n['ratio']}x"))
    return out


def chart(results: list[dict], kinds: list[str], modes: list[str], target: float, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(kinds), figsize=(5 * len(kinds), 3.8), squeeze=False, sharey=True)
    for ax, kind in zip(axes[0], kinds, strict=True):
        for mode in modes:
            rs = [r for r in results if r["kind"] == kind and r["mode"] == mode]
            if not rs:
                continue
            r = min(rs, key=lambda r: r["run"])   # (the first run)
            best, xs, ys = float("inf"), [], []
            for t, loss in r["curve"]:        # the best loss any worker's weights had so far
                best = min(best, loss)
                xs.append(t)
                ys.append(best)
            ax.plot(xs, ys, label=LABELS[mode], linestyle="--" if mode == "drop" else "-",
                    linewidth=2.0 if mode == "backup1" else 1.2)
        ax.axhline(target, color="grey", linewidth=0.8, linestyle=":")
        ax.set_title(f"stragglers: {kind}")
        ax.set_xlabel("wall time (s)")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("training loss")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"chart: {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--modes", default="sync,ssp1,ssp3,async,backup1",
                   help=f"of {','.join(MODES)} (persistent adds drop)")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--workers", type=int, default=3, help="W (the persistent straggler is rank 2)")
    p.add_argument("--steps", type=int, default=150, help="steps per worker")
    p.add_argument("--step-ms", type=float, default=40.0, help="a step's base compute time (a sleep)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--target", type=float, default=0.15, help="training loss to reach")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per job")
    p.add_argument("--quick", action="store_true", help="60 steps, a loose target")
    p.add_argument("--json", default=None)
    p.add_argument("--chart", default=None, metavar="PNG")
    p.add_argument("--from", dest="inputs", nargs="+", default=None, metavar="JSON",
                   help="summarise and chart the results of earlier --json runs instead of running")
    args = p.parse_args()
    if args.quick:
        args.steps, args.target = 60, 0.4
    kinds = [k for k in args.kinds.split(",") if k]
    modes = [m for m in args.modes.split(",") if m]
    for name in kinds + modes:
        if name not in KINDS and name not in MODES:
            p.error(f"unknown kind or mode {name!r}: kinds {', '.join(KINDS)}; modes {', '.join(MODES)}")
    results: list[dict] = []
    started = time.time()
    if args.inputs:
        for i, f in enumerate(args.inputs):   # (each file's runs numbered apart: 1000 per file)
            got = json.loads(Path(f).read_text())
            results += [{**r, "run": 1000 * i + r["run"]} for r in got["results"]]
            kinds += [k for k in got["args"]["kinds"].split(",") if k and k not in kinds]
            modes += [m for m in got["args"]["modes"].split(",") if m and m not in modes]
            args.target = got["args"]["target"]
        kinds = [k for k in KINDS if k in {r["kind"] for r in results}]
        modes = [m for m in MODES if m != "drop" and any(r["mode"] == m for r in results)]
        args.runs = len({r["run"] for r in results})
    h = None if args.inputs else harness()
    for run in range(0 if args.inputs else args.runs):
        for kind in kinds:
            for mode in modes + (["drop"] if kind == "persistent" and "drop" not in modes else []):
                r = run_one(h, kind, mode, args, run)
                if r is not None:
                    results.append(r)
                    print(f"  run {run} {kind:10} {LABELS[mode]:34} to target "
                          f"{'-' if r['to_target_s'] is None else format(r['to_target_s'], '.2f')} s, "
                          f"accuracy {100 * r['accuracy']:.2f} %, {r['seconds']:.1f} s", flush=True)
    all_modes = modes + (["drop"] if "persistent" in kinds and "drop" not in modes else [])
    rows = summary(results, kinds, all_modes)
    print(f"\nW={args.workers}, S=1, {args.steps} steps per worker, base step {args.step_ms:.0f} ms, lr {args.lr}, "
          f"batch {args.batch}, target loss {args.target}; {args.runs} run(s), {time.time() - started:.0f} s")
    print_table(("stragglers", "mode", "to target s", "x dist_sync", "final loss", "x dist_sync", "test acc %",
                 "d acc pts", "run s", "sleeps only: x dist_sync"), [
        (r["kind"], LABELS[r["mode"]],
         "-" if r["to_target_s"] is None else f"{r['to_target_s']:.2f}",
         "-" if r["ratio"] is None else f"{r['ratio']:.2f}",
         f"{r['final_loss']:.4f}",
         "-" if r["loss_ratio"] is None else f"{r['loss_ratio']:.2f}",
         f"{100 * r['accuracy']:.2f}",
         "-" if r["accuracy_delta_pts"] is None else f"{r['accuracy_delta_pts']:+.2f}",
         f"{r['seconds']:.1f}",
         "-" if r["ideal_ratio"] is None else f"{r['ideal_ratio']:.2f}") for r in rows])
    checked = goals(rows)
    for goal, met, figures in checked:
        print(f"goal {'MET' if met else 'NOT MET'}: {goal} ({figures})")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results, "summary": rows,
                                               "goals": checked}, indent=1))
    if args.chart:
        try:
            chart(results, kinds, all_modes, args.target, args.chart)
        except ImportError:
            print("no chart: matplotlib is missing (pip install 'mxdist[bench]')", file=sys.stderr)


if __name__ == "__main__":
    main()
