"""Scaling on one host: W = 1, 2, 4, 8 workers with S = 1, 2, 4 servers, psnode and MXNet in the
same interleaved run, round times of 1 MiB and 200 x 16 KiB (the workload's dense round:
push every key, pull every key; benchmarks/README.md).

    python benchmarks/kvstore/scaling.py                     # 3 runs, every W and S (about 7 minutes here)
    python benchmarks/kvstore/scaling.py --quick             # 1 run, W 1,2 x S 1, few rounds
    python benchmarks/kvstore/scaling.py --workers 1,2,4 --servers 1,2 --runs 3 --json /tmp/scaling.json

All W + S + 1 processes share this machine's cores, so the round time grows with W for every
system; what matters is how fast: for each S, growth(W) = round time at W / round time at W=1,
per run, for psnode and for MXNet, and their quotient (psnode's growth / MXNet's: above 1 =
psnode's round time grows faster with W than MXNet's).  Fewer rounds than run.py (the job
count is 2 x 12 per run): 1 MiB 10 warm-up + 60 timed, 200 x 16 KiB 3 + 30.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.cases import ALL, Case  # noqa: E402
from benchmarks.common import harness  # noqa: E402
from benchmarks.kvstore.mxnet_job import DEFAULT_VENV, mxnet_python, run_mxnet  # noqa: E402
from benchmarks.kvstore.psnode_job import Launcher, cli_ready, run_psnode, run_psnode_mxdist  # noqa: E402
from benchmarks.report import Stats, collect, fmt_range, print_table, ratios  # noqa: E402

CASES = [dataclasses.replace(ALL["1x1MiB"], warmup=10, rounds=60, quick_rounds=10),
         dataclasses.replace(ALL["200x16KiB"], warmup=3, rounds=30, quick_rounds=4)]


def growth_table(stats: Stats, case: Case, workers: list[int], servers: list[int], print_fn=print) -> list[dict]:
    hdr = ("W", "S", "psnode ms", "MXNet ms", "MXNet/psnode (time)", "psnode t(W)/t(1)", "MXNet t(W)/t(1)",
           "growth psnode/MXNet")
    rows = []
    for S in servers:
        base_p = stats.get(("psnode", f"{workers[0]},{S}", case.name), {})
        base_m = stats.get(("mxnet", f"{workers[0]},{S}", case.name), {})
        for W in workers:
            p = stats.get(("psnode", f"{W},{S}", case.name), {})
            m = stats.get(("mxnet", f"{W},{S}", case.name), {})
            gp, gm = ratios(p, base_p), ratios(m, base_m)
            rows.append((str(W), str(S), fmt_range([v * 1e3 for v in p.values()], ".2f"),
                         fmt_range([v * 1e3 for v in m.values()], ".2f"), fmt_range(ratios(m, p), ".2f"),
                         fmt_range(gp, ".2f"), fmt_range(gm, ".2f"),
                         fmt_range([a / b for a, b in zip(gp, gm, strict=False)], ".2f") if gp and gm else "-"))
    print_fn(f"\n{case.name}: round time (median over workers; median [min-max] over runs); t(W)/t(1): the round\n"
             f"time at W over W={workers[0]} with the same S, per run; growth psnode/MXNet above 1 = psnode's "
             "grows faster.")
    print_table(hdr, rows, print_fn)
    return [dict(zip(hdr, r, strict=True)) for r in rows]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 run, W 1,2 x S 1, few rounds")
    ap.add_argument("--workers", help="W values (default 1,2,4,8)")
    ap.add_argument("--servers", help="S values (default 1,2,4)")
    ap.add_argument("--runs", type=int, help="interleaved runs (default 3; --quick 1)")
    ap.add_argument("--no-mxnet", action="store_true", help="psnode only")
    ap.add_argument("--mxnet-venv", type=Path, default=DEFAULT_VENV)
    ap.add_argument("--psnode-via", choices=("harness", "mxdist"), default="harness")
    ap.add_argument("--launch-flags", default="", help="extra mxdist launch flags (implies mxdist)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per job")
    ap.add_argument("--json", help="write the records and the summary here")
    a = ap.parse_args(argv)
    workers = [int(x) for x in (a.workers or ("1,2" if a.quick else "1,2,4,8")).split(",")]
    servers = [int(x) for x in (a.servers or ("1" if a.quick else "1,2,4")).split(",")]
    runs = a.runs or (1 if a.quick else 3)
    mx_py = None
    if not a.no_mxnet:
        mx_py, why = mxnet_python(a.mxnet_venv)
        print(f"MXNet: {why}" if mx_py else f"MXNet skipped: {why}", flush=True)
    h = harness()
    launcher = None
    if a.psnode_via == "mxdist" or a.launch_flags:
        ok, exe = cli_ready()
        if not ok:
            raise SystemExit(f"psnode through mxdist: the CLI is not usable: {exe}")
        launcher = Launcher(exe, shlex.split(a.launch_flags))
        refused = launcher.flags_refused()
        if refused:
            raise SystemExit(f"mxdist launch {a.launch_flags}: {refused}")
    print(f"scaling benchmark: {platform.python_version()} on {os.cpu_count()} cpu(s); runs={runs} W={workers} "
          f"S={servers} cases={[c.name for c in CASES]} mxnet={mx_py is not None} "
          f"psnode via {'harness' if launcher is None else 'mxdist launch ' + shlex.join(launcher.flags)}")
    records: list[dict] = []
    t_all = time.monotonic()
    for run in range(runs):
        steps = []
        for W in workers:
            for S in servers:
                steps.append((f"psnode W{W}S{S}", W, S, lambda W=W, S=S: (
                    run_psnode(h, W, S, CASES, a.quick, a.timeout) if launcher is None else
                    run_psnode_mxdist(launcher, W, S, CASES, a.quick, a.timeout))))
                if mx_py:
                    steps.append((f"mxnet W{W}S{S}", W, S,
                                  lambda W=W, S=S: run_mxnet(mx_py, W, S, CASES, a.quick, a.timeout)))
        k = (run * 7) % len(steps)     # rotate the order each run
        for name, W, S, fn in steps[k:] + steps[:k]:
            t0 = time.monotonic()
            got = fn()
            for r in got:
                r.update(run=run, config=f"{W},{S}", system=r.get("system", "psnode"))
            records.extend(got)
            print(f"  run {run + 1}/{runs} {name}: {len(got)} results in {time.monotonic() - t0:.1f} s", flush=True)
    stats = collect(records)
    summary = {c.name: growth_table(stats, c, workers, servers) for c in CASES}
    print(f"\ntotal {time.monotonic() - t_all:.0f} s")
    if a.json:
        Path(a.json).write_text(json.dumps({"argv": sys.argv, "records": records, "summary": summary}, indent=1))
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
