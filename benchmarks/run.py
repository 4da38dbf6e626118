"""Run the performance.md workload on psnode, raw pyzmq, torch gloo and a bare PS, interleaved; print a table.

    python benchmarks/run.py                 # full: 3 interleaved runs, every case and config
    python benchmarks/run.py --quick         # smoke run (~20 s): 1 run, W2S2 only, few rounds
    python benchmarks/run.py --cases 1x4KiB,1x1MiB --configs 2,2 --runs 3 --json out.json
    python benchmarks/run.py --quick --peers bare --no-launch   # psnode vs the bare pyzmq+numpy PS only

See benchmarks/README.md for what is measured and how.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.cases import ALL, MARK, MiB, encode_cases, select  # noqa: E402

HERE = Path(__file__).resolve().parent
WORKER = HERE / "psnode_worker.py"
MARK_RE = re.compile(re.escape(MARK) + r"(\{.*\})")


def _harness():
    spec = importlib.util.spec_from_file_location("_psnode_harness", ROOT / "tests" / "cluster" / "harness.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod   # dataclasses look their module up here
    spec.loader.exec_module(mod)
    return mod


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_results(text: str) -> list[dict]:
    return [json.loads(m.group(1)) for m in MARK_RE.finditer(text)]


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def tail(text: str, n: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


# ---------------------------------------------------------------- the systems
PSNODE_ENV = {"PSNODE_HEARTBEAT_INTERVAL": "1.0", "PSNODE_REGISTER_TIMEOUT": "30"}


def run_psnode(h, W: int, S: int, cases, quick: bool, timeout: float) -> list[dict]:
    job = h.start_job(WORKER.read_text(), W, S, env=PSNODE_ENV,
                      args=["bench", encode_cases(cases), "1" if quick else "0"])
    try:
        h.wait_job(job, timeout)
    except AssertionError as exc:
        print(f"  psnode W{W}S{S}: {exc}\n{tail(job.describe(), 40)}", file=sys.stderr)
        return []
    bad = [p for p in job.procs if p.code != 0]
    if bad:
        print(f"  psnode W{W}S{S}: exit codes {[(p.role, p.rank, p.code) for p in job.procs]}\n"
              f"{tail(job.describe(), 40)}", file=sys.stderr)
    return [r for p in job.workers for r in parse_results(p.out)]


def run_psnode_launch(h, W: int, S: int, timeout: float) -> list[dict]:
    t0 = time.time()
    job = h.start_job(WORKER.read_text(), W, S, env=PSNODE_ENV, args=["launch", repr(t0)])
    try:
        h.wait_job(job, timeout)
    except AssertionError as exc:
        print(f"  psnode launch: {exc}\n{tail(job.describe(), 30)}", file=sys.stderr)
        return []
    return [dict(r, system="psnode-harness") for p in job.workers for r in parse_results(p.out)]


def cli_ready() -> tuple[bool, str]:
    """``mxdist`` usable: ``import cli.main`` works and ``mxdist --help`` runs."""
    exe = shutil.which("mxdist")
    r = subprocess.run([sys.executable, "-c", "import cli.main"], cwd=ROOT, env=child_env(),
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        return False, f"import cli.main failed: {tail(r.stderr, 1)}"
    if exe is None:
        return False, "no mxdist on PATH"
    r = subprocess.run([exe, "--help"], cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        return False, f"mxdist --help exited {r.returncode}: {tail(r.stderr, 1)}"
    return True, exe


def run_mxdist_launch(exe: str, W: int, S: int, timeout: float) -> list[dict]:
    t0 = time.time()
    argv = [exe, "launch", "-n", str(W), "-s", str(S), str(WORKER), "launch", repr(t0)]
    try:
        r = subprocess.run(argv, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"  mxdist launch timed out after {timeout} s", file=sys.stderr)
        return []
    res = [dict(x, system="psnode-mxdist") for x in parse_results(r.stdout + r.stderr)]
    if r.returncode != 0 or len(res) != W:
        print(f"  mxdist launch exited {r.returncode} with {len(res)} results:\n"
              f"{tail(r.stdout + r.stderr, 20)}", file=sys.stderr)
    return res


def run_zmq(cases, quick: bool, timeout: float) -> list[dict]:
    port = free_port()
    py = [sys.executable, "-m", "benchmarks.peers"]
    srv = subprocess.Popen(py + ["zmq-server", str(port)], cwd=ROOT, env=child_env(),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        r = subprocess.run(py + ["zmq-client", str(port), encode_cases(cases), "1" if quick else "0"],
                           cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            print(f"  zmq client exited {r.returncode}:\n{tail(r.stderr)}", file=sys.stderr)
        return parse_results(r.stdout)
    except subprocess.TimeoutExpired:
        print("  zmq client timed out", file=sys.stderr)
        return []
    finally:
        try:
            srv.wait(5)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()


def run_bare(W: int, S: int, cases, quick: bool, timeout: float) -> list[dict]:
    """The bare PS (benchmarks/peers.py) with S servers and W workers on free ports; its records.

    Waits for every process within ``timeout`` seconds in all; on timeout, or when a worker
    fails, kills the processes it started (and only those)."""
    ports: list[int] = []
    while len(ports) < S:
        port = free_port()
        if port not in ports:
            ports.append(port)
    py = [sys.executable, "-m", "benchmarks.peers"]

    def spawn(argv: list[str]) -> subprocess.Popen:
        return subprocess.Popen(py + argv, cwd=ROOT, env=child_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    servers = [spawn(["bare-server", str(port), str(W)]) for port in ports]
    workers = [spawn(["bare-worker", str(r), str(W), ",".join(map(str, ports)), encode_cases(cases),
                      "1" if quick else "0"]) for r in range(W)]
    deadline = time.monotonic() + timeout
    out: list[dict] = []
    try:
        for name, procs in (("worker", workers), ("server", servers)):
            for i, p in enumerate(procs):
                so, se = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
                if p.returncode != 0:
                    print(f"  bare W{W}S{S} {name} {i} exited {p.returncode}:\n{tail(se)}", file=sys.stderr)
                out.extend(parse_results(so))
            if any(p.returncode != 0 for p in workers):
                break            # the servers would wait for QUITs that do not come
    except subprocess.TimeoutExpired:
        print(f"  bare W{W}S{S} timed out after {timeout} s", file=sys.stderr)
        out = []
    finally:
        for p in servers + workers:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return out


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def run_gloo(cases, quick: bool, timeout: float, world: int = 2) -> list[dict]:
    port = free_port()
    t0 = time.time()
    procs = [subprocess.Popen([sys.executable, "-m", "benchmarks.peers", "gloo", str(r), str(world), str(port),
                               encode_cases(cases), "1" if quick else "0", repr(t0)],
                              cwd=ROOT, env=child_env(OMP_NUM_THREADS="1"), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(world)]
    out = []
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            so, se = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print("  gloo timed out", file=sys.stderr)
            for q in procs:
                if q.poll() is None:
                    q.kill()
                    q.communicate()
            return []
        if p.returncode != 0:
            print(f"  gloo rank exited {p.returncode}:\n{tail(se)}", file=sys.stderr)
        out.extend(parse_results(so))
    return out


# ---------------------------------------------------------------- statistics and table
def fmt_range(vals: list[float], spec: str = ".0f") -> str:
    if not vals:
        return "-"
    med = statistics.median(vals)
    if len(vals) == 1:
        return format(med, spec)
    return f"{med:{spec}} [{min(vals):{spec}}-{max(vals):{spec}}]"


def collect(records: list[dict]) -> dict:
    """(system, config, case) -> per-run value: median over workers of each worker's median."""
    per_run: dict[tuple, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        v = r["wall"] if r["case"] == "launch" else r["median"]
        per_run[(r["system"], r["config"], r["case"])][r["run"]].append(v)
    out = {}
    for key, runs in per_run.items():
        if key[2] == "launch":   # the job is up when every worker has pulled: max over workers
            out[key] = {run: max(v) for run, v in runs.items()}
        else:
            out[key] = {run: statistics.median(v) for run, v in runs.items()}
    return out


def mibs(seconds: float, nbytes: int) -> float:
    return nbytes / seconds / MiB


def ratios(a: dict[int, float], b: dict[int, float], f) -> list[float]:
    return [f(a[r]) / f(b[r]) for r in sorted(a) if r in b]


def table(stats: dict, cases, configs, print_fn=print) -> dict:
    summary: dict = {"dense": [], "sparse": [], "launch": []}
    dense = [c for c in cases if c.kind == "dense" and c.name != "densetable"]
    if dense:
        hdr = ("case", "W,S", "psnode MiB/s", "raw zmq MiB/s", "gloo MiB/s", "bare PS MiB/s",
               "psnode/zmq", "psnode/gloo", "psnode/bare")
        rows = []
        for c in dense:
            nb = 2 * c.keys * c.nbytes
            z = stats.get(("zmq", "1,1", c.name), {})
            g = stats.get(("gloo", "2", c.name), {})
            for W, S in configs:
                p = stats.get(("psnode", f"{W},{S}", c.name), {})
                b = stats.get(("bare", f"{W},{S}", c.name), {})
                thr = lambda t, nb=nb: mibs(t, nb)  # noqa: E731
                row = (c.name, f"{W},{S}", fmt_range([thr(v) for v in p.values()]),
                       fmt_range([thr(v) for v in z.values()]), fmt_range([thr(v) for v in g.values()]),
                       fmt_range([thr(v) for v in b.values()]),
                       fmt_range(ratios(p, z, lambda t: 1 / t), ".2f"),
                       fmt_range(ratios(p, g, lambda t: 1 / t), ".2f"),
                       fmt_range(ratios(p, b, lambda t: 1 / t), ".2f"))
                rows.append(row)
                summary["dense"].append(dict(zip(hdr, row)))
            if c.name == "1x4KiB":
                for W, S in configs:
                    p = stats.get(("psnode", f"{W},{S}", c.name), {})
                    b = stats.get(("bare", f"{W},{S}", c.name), {})
                    us = lambda t: t * 1e6  # noqa: E731
                    row = ("1x4KiB round us", f"{W},{S}", fmt_range([us(v) for v in p.values()]),
                           fmt_range([us(v) for v in z.values()]), fmt_range([us(v) for v in g.values()]),
                           fmt_range([us(v) for v in b.values()]),
                           fmt_range(ratios(p, z, us), ".2f"), fmt_range(ratios(p, g, us), ".2f"),
                           fmt_range(ratios(p, b, us), ".2f"))
                    rows.append(row)
                    summary["dense"].append(dict(zip(hdr, row)))
        print_fn("\nDense push+pull, per-worker MiB/s (4 KiB also as round time in us; for the us rows a\n"
                 "ratio > 1 means psnode is slower).  median [min-max] over runs; ratios are per run.\n"
                 "bare PS: pyzmq + numpy parameter server, same W,S and placement (ceiling for big keys).")
        _print_table(hdr, rows, print_fn)
    sp = [c.name for c in cases if c.name in ("rowsparse1%", "densetable")]
    if sp:
        hdr = ("W,S", "row_sparse 1% ms/round", "dense table ms/round", "dense/sparse", "sparse MiB/s",
               "bare PS row_sparse ms", "bare PS dense table ms", "bare dense/sparse", "psnode/bare (time)")
        rows = []
        for W, S in configs:
            s = stats.get(("psnode", f"{W},{S}", "rowsparse1%"), {})
            d = stats.get(("psnode", f"{W},{S}", "densetable"), {})
            bs = stats.get(("bare", f"{W},{S}", "rowsparse1%"), {})
            b = stats.get(("bare", f"{W},{S}", "densetable"), {})
            nb = 2 * 2000 * 64 * 4
            row = (f"{W},{S}", fmt_range([v * 1e3 for v in s.values()], ".2f"),
                   fmt_range([v * 1e3 for v in d.values()], ".1f"),
                   fmt_range(ratios(d, s, lambda t: t), ".1f"), fmt_range([mibs(v, nb) for v in s.values()]),
                   fmt_range([v * 1e3 for v in bs.values()], ".2f"),
                   fmt_range([v * 1e3 for v in b.values()], ".1f"),
                   fmt_range(ratios(b, bs, lambda t: t), ".1f"),
                   fmt_range(ratios(s, bs, lambda t: t), ".2f"))
            rows.append(row)
            summary["sparse"].append(dict(zip(hdr, row)))
        print_fn("\nRow-sparse: table 200,000 x 64 float32, every worker pushes 1% random rows (fresh each\n"
                 "round) and row_sparse-pulls them; vs dense push+pull of the whole table; the same for\n"
                 "the bare PS (its dense table is a flat key of the same size).")
        _print_table(hdr, rows, print_fn)
    launch = [k for k in stats if k[2] == "launch"]
    if launch:
        hdr = ("launch to first pull", "W,S", "seconds")
        rows = []
        for key in sorted(launch):
            row = (key[0], key[1], fmt_range(list(stats[key].values()), ".2f"))
            rows.append(row)
            summary["launch"].append(dict(zip(hdr, row)))
        g = stats.get(("gloo", "2", "launch"))
        for key in sorted(launch):
            if key[0].startswith("psnode") and g:
                rows.append((f"{key[0]}/gloo", key[1], fmt_range(ratios(stats[key], g, lambda t: t), ".2f")))
        print_fn("\nLaunch to first completed pull (max over workers; gloo: first all_reduce).")
        _print_table(hdr, rows, print_fn)
    return summary


def _print_table(hdr, rows, print_fn) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(hdr, *rows)]
    line = lambda r: "| " + " | ".join(str(x).ljust(w) for x, w in zip(r, widths)) + " |"  # noqa: E731
    print_fn(line(hdr))
    print_fn("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print_fn(line(r))


MIBS_TARGETS = (("1x1MiB", 2 * MiB, 2000), ("1x16MiB", 32 * MiB, 2000), ("200x16KiB", 400 * 16384, 1000))
"""(case, bytes per round, target per-worker MiB/s at W=2, S=2)."""


def _median_at(stats: dict, system: str, config: str, case: str) -> float | None:
    v = stats.get((system, config, case), {})
    return statistics.median(v.values()) if v else None


def _checks(stats: dict, system: str) -> list[tuple[str, str, str, bool]]:
    """The issue's targets at W=2, S=2 (per worker) for ``system``: (case, target, measured, met)."""
    def med(case):
        return _median_at(stats, system, "2,2", case)
    checks = []
    for case, nb, goal in MIBS_TARGETS:
        t = med(case)
        if t is not None:
            checks.append((case, f"{case} >= {goal} MiB/s", f"{mibs(t, nb):.0f} MiB/s", mibs(t, nb) >= goal))
    t = med("1x4KiB")
    if t is not None:
        checks.append(("1x4KiB", "4 KiB round (push+pull) < 250 us", f"{t * 1e6:.0f} us", t * 1e6 < 250))
    s, d = med("rowsparse1%"), med("densetable")
    if s is not None:
        checks.append(("rowsparse1%", "row_sparse 1% <= 7.3/3 = 2.43 ms", f"{s * 1e3:.2f} ms", s * 1e3 <= 7.3 / 3))
    if s is not None and d is not None:
        checks.append(("dense/sparse", "dense table / row_sparse >= 30x", f"{d / s:.1f}x", d / s >= 30))
    return checks


def targets(stats: dict, print_fn=print) -> list[dict]:
    """psnode against the issue's targets at W=2, S=2 (per worker)."""
    checks = _checks(stats, "psnode")
    if checks:
        print_fn("\nTargets (W=2, S=2, per worker):")
        for _, what, got, ok in checks:
            print_fn(f"  {'PASS' if ok else 'MISS'}  {what:36s} measured {got}")
    return [{"target": w, "measured": g, "pass": ok} for _, w, g, ok in checks]


def bare_ceilings(stats: dict, print_fn=print) -> list[dict]:
    """Does the bare PS itself reach each target at W=2, S=2?  A target the bare PS misses by far
    is above what a Python PS over ZeroMQ TCP reaches on this machine."""
    checks = _checks(stats, "bare")
    for _, what, got, ok in checks:
        print_fn(f"  bare PS at W2S2: {what}: measured {got} "
                 f"({'the bare PS reaches it' if ok else 'above the bare PS'})")
    return [{"case": c, "target": w, "measured": g, "bare_reaches": ok} for c, w, g, ok in checks]


# ---------------------------------------------------------------- main
def parse_configs(values: list[str]) -> list[tuple[int, int]]:
    out = []
    for v in values:
        for item in v.split():
            m = re.fullmatch(r"[Ww]?(\d+)[,xX:Ss](\d+)", item.strip())
            if not m:
                raise SystemExit(f"bad config {item!r}: use W,S (e.g. 2,2)")
            out.append((int(m.group(1)), int(m.group(2))))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 run, W2S2 only, few rounds")
    ap.add_argument("--cases", help=f"comma list of cases (default all): {','.join(ALL)}".replace('%', '%%'))
    ap.add_argument("--configs", nargs="+", help="W,S configurations (default: 1,1 2,1 2,2; --quick: 2,2)")
    ap.add_argument("--runs", type=int, help="interleaved runs (default 3; --quick: 1)")
    ap.add_argument("--peers", default="zmq,gloo,bare",
                    help="peers to run: zmq,gloo,bare (gloo only if torch imports; bare = pyzmq+numpy PS "
                         "on each W,S config)")
    ap.add_argument("--no-launch", action="store_true", help="skip the launch-to-first-pull measurement")
    ap.add_argument("--launch-via", choices=("auto", "harness", "mxdist"),
                    help="auto (default): mxdist launch when the CLI works, else the test harness; "
                         "--quick defaults to harness")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per job before it is killed")
    ap.add_argument("--json", help="write the raw records and the summary here")
    a = ap.parse_args(argv)

    cases = select(a.cases.split(",") if a.cases else None)
    configs = parse_configs(a.configs) if a.configs else ([(2, 2)] if a.quick else [(1, 1), (2, 1), (2, 2)])
    runs = a.runs or (1 if a.quick else 3)
    peers = {p.strip() for p in a.peers.split(",") if p.strip()}
    gloo = "gloo" in peers and torch_available()
    if "gloo" in peers and not gloo:
        print("torch is not importable: gloo skipped (pip install torch, CPU build)")
    h = _harness()

    a.launch_via = a.launch_via or ("harness" if a.quick else "auto")
    launch_mode = "harness"
    launch_note = "harness (tests/cluster/harness.py)"
    exe = None
    if not a.no_launch and a.launch_via != "harness":
        ok, why = cli_ready()
        if ok:
            launch_mode, exe, launch_note = "mxdist", why, f"mxdist launch ({why})"
        elif a.launch_via == "mxdist":
            raise SystemExit(f"--launch-via mxdist: the CLI is not usable: {why}")
        else:
            launch_note = f"harness (tests/cluster/harness.py); mxdist not usable: {why}"
    lw, ls = (2, 2) if (2, 2) in configs or not configs else configs[-1]

    print(f"psnode benchmark: {platform.python_version()} on {os.cpu_count()} cpu(s); runs={runs} "
          f"quick={a.quick} configs={configs} cases={[c.name for c in cases]} gloo={gloo} "
          f"bare={'bare' in peers}")
    if not a.no_launch:
        print(f"launch to first pull via {launch_note}")
    records: list[dict] = []
    t_all = time.monotonic()
    for run in range(runs):
        steps = []
        for W, S in configs:               # the bare PS right after psnode on the same config
            steps.append((f"psnode W{W}S{S}", lambda W=W, S=S: [
                dict(r, config=f"{W},{S}") for r in run_psnode(h, W, S, cases, a.quick, a.timeout)]))
            if "bare" in peers:
                steps.append((f"bare W{W}S{S}", lambda W=W, S=S: [
                    dict(r, config=f"{W},{S}") for r in run_bare(W, S, cases, a.quick, a.timeout)]))
        if "zmq" in peers:
            steps.append(("raw zmq", lambda: [dict(r, config="1,1") for r in run_zmq(cases, a.quick, a.timeout)]))
        if gloo:
            steps.append(("gloo", lambda: [dict(r, config="2") for r in run_gloo(cases, a.quick, a.timeout)]))
        if not a.no_launch:
            def launch():
                out = run_psnode_launch(h, lw, ls, 120)
                if launch_mode == "mxdist":
                    out += run_mxdist_launch(exe, lw, ls, 120)
                return [dict(r, config=f"{lw},{ls}") for r in out]
            steps.append(("launch", launch))
        k = run % len(steps)               # rotate the order each run (interleaving)
        for name, fn in steps[k:] + steps[:k]:
            t0 = time.monotonic()
            got = fn()
            for r in got:
                r["run"] = run
            records.extend(got)
            print(f"  run {run + 1}/{runs} {name}: {len(got)} results in {time.monotonic() - t0:.1f} s", flush=True)
    stats = collect(records)
    summary = table(stats, cases, configs)
    checks = targets(stats)
    ceilings = bare_ceilings(stats)
    print(f"\ntotal {time.monotonic() - t_all:.0f} s")
    if a.json:
        Path(a.json).write_text(json.dumps({
            "argv": sys.argv, "python": platform.python_version(), "cpus": os.cpu_count(),
            "launch_via": launch_note, "records": records, "summary": summary, "targets": checks,
            "bare_ceilings": ceilings,
        }, indent=1))
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
