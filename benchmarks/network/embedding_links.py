"""The embedding workload with each safety option on a rate-limited network: every process on a
host of its own, each host's port 1 Gbit/s.

    python benchmarks/network/embedding_links.py                              # 20 M rows, 2 interleaved runs
    python benchmarks/network/embedding_links.py --rows 2e6 --runs 1 --steps 100   # smoke run
    python benchmarks/network/embedding_links.py --cleanup                    # testbeds of a killed run

The testbed (benchmarks/network/netns.py): five hosts on one switch, every port limited to
``--rate`` in both directions; host 0 runs the scheduler, hosts 1 and 2 a server each, hosts 3
and 4 a worker each, so every push, pull and copy between two servers crosses two links.  The
workload is benchmarks/training/embedding_worker.py's (an ``EmbeddingBag(rows, 16)`` computed on
the servers, AdaGrad, batch 256 of 8 Zipf ids per worker); the systems are
benchmarks/training/embedding.py's ``--safety`` ones: plain psnode, ``--replicas 2``,
``--checkpoint-rounds 50`` (a fresh directory on the server's host), both; interleaved, their
order rotating between runs.

Per system: steps/s (median over ranks; median [min-max] over runs), steps/s over plain psnode's
in the same run, and the bytes each server's link carried per step (sent plus received, its
interface's counters over the whole job divided by its steps) beside the distinct rows the two
workers' batches touch per step.  Every wait has a deadline (``--timeout`` per job); the
namespaces and every process in them are removed on every exit.  Needs root and iproute2.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import parse_results  # noqa: E402
from benchmarks.network import netns  # noqa: E402
from benchmarks.network.netbench import JobFailed, Proc, free_port, preflight, tail, wait_job  # noqa: E402
from benchmarks.report import fmt_range, print_table  # noqa: E402
from benchmarks.training.embedding import FULL, ORDER, PSNODE, SAFETY  # noqa: E402
from psnode.config import NodeConfig, Role  # noqa: E402

WORKER = ROOT / "benchmarks" / "training" / "embedding_worker.py"
SYSTEMS = [s for s in ORDER if s == PSNODE or s in SAFETY]
SCHEDULER, SERVERS, WORKERS = 0, (1, 2), (3, 4)


def link_bytes(bed: netns.Testbed, host: int) -> int:
    """Bytes the host's port sent and received so far."""
    h = bed.hosts[host]
    stats = f"/sys/class/net/{h.iface}/statistics"
    out = netns.run("ip", "netns", "exec", h.ns, "cat", f"{stats}/tx_bytes", f"{stats}/rx_bytes")
    return sum(int(x) for x in out.split())


def run_job(bed: netns.Testbed, system: str, cfg: dict[str, Any], logdir: Path, timeout: float) -> dict[str, Any]:
    """One job of ``system``; its workers' results and each server link's bytes."""
    job_id = f"el{uuid.uuid4().hex[:10]}"
    port = free_port()
    safety = dict(SAFETY.get(system, {}))
    sched = bed.hosts[SCHEDULER]
    base = {k: v for k, v in os.environ.items() if not k.startswith("PSNODE_")}
    base["PYTHONPATH"] = str(ROOT) + os.pathsep + base.get("PYTHONPATH", "")
    base.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    scratch = Path(tempfile.mkdtemp(prefix="emb-links-ckpt-"))
    procs: list[Proc] = []

    def spawn(role: Role, rank: int, host_i: int, argv: list[str]) -> None:
        host = bed.hosts[host_i]
        cfg_node = NodeConfig(role=role, scheduler_host=sched.addr, scheduler_port=port, num_workers=len(WORKERS),
                              num_servers=len(SERVERS), job_id=job_id, host=host.addr,
                              rank=None if role is Role.SCHEDULER else rank, register_timeout=120.0,
                              replicas=int(safety.get("PSNODE_REPLICAS", "1")),
                              max_restarts=int(safety.get("PSNODE_MAX_RESTARTS", "0")))
        env = dict(base, **cfg_node.to_env())
        if "PSNODE_CHECKPOINT_ROUNDS" in safety:
            env.update(PSNODE_CHECKPOINT_ROUNDS=safety["PSNODE_CHECKPOINT_ROUNDS"],
                       PSNODE_CHECKPOINT_DIR=str(scratch / f"server-{rank}"))
        log = logdir / f"{job_id}.{role.value}{rank}.log"
        procs.append(Proc(role.value, rank, host_i, bed.spawn(host, argv, env, log, cwd=ROOT), log))

    before = {h: link_bytes(bed, h) for h in SERVERS}
    try:
        spawn(Role.SCHEDULER, 0, SCHEDULER, [sys.executable, "-m", "psnode"])
        for r, h in enumerate(SERVERS):
            spawn(Role.SERVER, r, h, [sys.executable, "-m", "psnode"])
        for r, h in enumerate(WORKERS):
            spawn(Role.WORKER, r, h, [sys.executable, str(WORKER), "psnode", json.dumps(dict(cfg, system=system))])
        wait_job(procs, timeout)
    finally:
        bed.kill_all()
        for p in scratch.rglob("*"):
            if p.is_file():
                p.unlink()
    moved = {h: link_bytes(bed, h) - before[h] for h in SERVERS}
    results = [r for p in procs if p.role == "worker" for r in parse_results(p.log.read_text(errors="replace"))]
    if len(results) != len(WORKERS):
        raise JobFailed(f"{system}: {len(results)} worker results of {len(WORKERS)}; worker 0's log:\n"
                        f"{tail(procs[-len(WORKERS)].log)}")
    return {"system": system, "results": results, "link_bytes": moved}


def rows_per_step(cfg: dict[str, Any]) -> float:
    """The distinct rows the workers' batches touch per step (mean over the timed steps)."""
    import numpy as np

    from benchmarks.training.embedding_worker import batches
    per_rank = [batches(cfg, r) for r in range(len(WORKERS))]
    steps = range(cfg["warmup"], cfg["warmup"] + cfg["steps"])
    return statistics.fmean(len(np.unique(np.concatenate([b[s][0].numpy().ravel() for b in per_rank])))
                            for s in steps)


def summarize(records: list[dict[str, Any]], cfg: dict[str, Any], print_fn=print) -> list[dict[str, Any]]:
    steps = cfg["warmup"] + cfg["steps"] + 1
    rows = rows_per_step(cfg)
    runs = sorted({r["run"] for r in records})
    speed = {(r["run"], r["system"]): statistics.median(x["steps_per_s"] for x in r["results"]) for r in records}
    out = []
    for system in SYSTEMS:
        mine = [r for r in records if r["system"] == system]
        if not mine:
            continue
        rates = [speed[(r["run"], system)] for r in mine]
        ratio = [speed[(run, system)] / speed[(run, PSNODE)] for run in runs
                 if (run, system) in speed and (run, PSNODE) in speed]
        per_step = [b / steps / 1024 for r in mine for b in r["link_bytes"].values()]
        out.append({"system": system, "steps/s": fmt_range(rates, ".1f"),
                    "/ psnode": fmt_range(ratio, ".2f") if system != PSNODE else "",
                    "server link KiB/step": fmt_range(per_step, ".1f"), "rows touched/step": f"{rows:.0f}"})
    hdr = ("system", "steps/s", "/ psnode", "server link KiB/step", "rows touched/step")
    print_table(hdr, [tuple(o[h] for h in hdr) for o in out], print_fn=print_fn)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=float, default=20e6, help="the table's rows (default 20e6)")
    ap.add_argument("--runs", type=int, default=2, help="interleaved runs (default 2)")
    ap.add_argument("--steps", type=int, default=1000, help="timed steps per job (default 1000)")
    ap.add_argument("--warmup", type=int, default=FULL["warmup"], help="untimed steps first")
    ap.add_argument("--rate", default="1gbit", help="every host port's rate, both directions (tc units)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per job")
    ap.add_argument("--json", type=Path, help="write the records and the summary here")
    ap.add_argument("--cleanup", action="store_true", help="only remove testbeds a killed run left")
    args = ap.parse_args(argv)
    code = netns.begin("embedding_links", preflight(), args.cleanup)
    if code is not None:
        return code
    cfg = dict(FULL, rows=int(args.rows), steps=args.steps, warmup=args.warmup)
    logdir = Path(tempfile.mkdtemp(prefix="emb-links-"))
    bed = netns.Testbed(5, args.rate)
    records: list[dict[str, Any]] = []
    try:
        try:
            bed.up()
        except netns.TestbedError as exc:
            print(f"embedding_links: cannot build the testbed: {exc}", file=sys.stderr)
            return 3
        print(f"embedding_links: {bed.tag}: 5 hosts at {args.rate}, {cfg['rows']:,} rows, "
              f"{args.steps} timed steps; logs in {logdir}", flush=True)
        for run in range(args.runs):
            order = SYSTEMS[run % len(SYSTEMS):] + SYSTEMS[:run % len(SYSTEMS)]
            for system in order:
                t0 = time.monotonic()
                rec = run_job(bed, system, cfg, logdir, args.timeout)
                rec["run"] = run
                records.append(rec)
                rate = statistics.median(x["steps_per_s"] for x in rec["results"])
                print(f"run {run + 1}/{args.runs} {system:32} {rate:7.1f} steps/s  ({time.monotonic() - t0:.0f} s)",
                      flush=True)
        summary = summarize(records, cfg)
        if args.json:
            args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                             "records": records, "summary": summary}, indent=1))
        return 0
    except JobFailed as exc:
        print(f"embedding_links: job failed: {exc}", file=sys.stderr)
        return 1
    finally:
        bed.down()


if __name__ == "__main__":
    sys.exit(main())
