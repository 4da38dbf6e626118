"""A cluster on one switch: four workers on four hosts, psnode's placements against gloo's ring.

    python benchmarks/network/clusterbench.py                       # 3 interleaved runs, 200 Mbit/s ports
    python benchmarks/network/clusterbench.py --rate 100mbit --runs 5 --json /tmp/cluster.json
    python benchmarks/network/clusterbench.py --quick               # smoke run (tiny cases, 1 run)
    python benchmarks/network/clusterbench.py --cleanup             # remove testbeds of a killed run

Needs root, iproute2 (``ip``, ``tc`` with tbf) and torch (gloo).  The testbed (benchmarks/network/netns.py)
is nine hosts on one switch, every port limited to ``--rate`` in both directions (a tbf on the
host's veth end for what it sends and on the switch's end for what it receives): hosts 0-3 run
the workers, hosts 4-7 the servers of the dedicated placement, host 8 psnode's scheduler.

Designs, interleaved per run (their order rotates between runs), each one job per run that runs
every case:

* ``psnode-dedicated``: psnode, W=4 S=4, servers on hosts 4-7 of their own (``mxdist launch
  --server-hosts``).  Each worker sends its gradient once and receives the sum once: B up and B
  down on a worker's link, and as much on a server's; the bound is B at the link's payload rate
  (push and pull overlap: they use the two directions of a full-duplex link).
* ``psnode-colocated``: psnode, W=4 S=4, server i on worker i's host (mxdist's default
  placement).  A worker's traffic to its own host's server stays on the host; per link direction
  (S-1)/S of the worker's gradient plus the server's (W-1)/W of its slice: 2(n-1)/n B, a ring's.
* ``gloo``: ``torch.distributed.all_reduce`` (gloo, DDP's communication on CPUs) among the four
  worker hosts: a ring sends and receives 2(n-1)/n B per worker.

psnode runs in plain mode (no ``PSNODE_KEY_FILE``: no CURVE encryption, ``mxdist launch
--insecure``), like gloo.  Per case and design: the round time (median over timed rounds, median
over workers), the bytes every host's link carried per timed round (its ``eth0`` counters, read by
a meter process on each host at the start and end of the timed rounds), the bound, and how much
CPU the job used (its processes' CPU seconds over its wall time, out of the machine's cores;
and the machine's idle share over the job, the other users' load included).

Goals checked on the 16 and 64 MiB cases: psnode-dedicated at least 1.35x faster than gloo, and
within 1.15x of its bound.  Every wait is bounded (``--timeout`` per job); the namespaces and
every process in them are removed on every exit, as in netbench.py.  Exit codes: 0 done and the
goals met, 1 a job or a goal failed, 2 bad usage, 3 no testbed possible, 128+N on signal N.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.cases import MARK, Case, MiB, encode_cases  # noqa: E402
from benchmarks.network import netbench, netns  # noqa: E402
from benchmarks.network.netbench import FRAME_EFFICIENCY, JobFailed, Proc, parse_rate, preflight, wait_job  # noqa: E402
from psnode.config import NodeConfig, Role, default  # noqa: E402

WORKER = Path(__file__).resolve().parent / "clusterbench_worker.py"
N = 4                      # workers (and servers)
HOSTS = 2 * N + 1          # workers, dedicated servers, the scheduler
SCHED_HOST = 2 * N
DESIGNS = ("psnode-dedicated", "psnode-colocated", "gloo", "tcp-mesh")
CASES = {c.name: c for c in (Case("1x16MiB", 1, 16 * MiB, 2, 10, 2), Case("1x64MiB", 1, 64 * MiB, 1, 5, 1),
                             Case("16x1MiB", 16, 1 * MiB, 2, 10, 2), Case("1x1MiB", 1, 1 * MiB, 2, 10, 2))}
DEFAULT_CASES = "1x16MiB,1x64MiB,16x1MiB"
GOAL_CASES = ("1x16MiB", "1x64MiB")
SPEEDUP_GOAL, BOUND_GOAL = 1.35, 1.15
BASE_PORT = 9400


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", default="200mbit", help="every host port's rate, both directions (200mbit)")
    p.add_argument("--cases", default=DEFAULT_CASES, help=f"comma list of {', '.join(CASES)} ({DEFAULT_CASES})")
    p.add_argument("--designs", default=",".join(DESIGNS), help=f"comma list of {', '.join(DESIGNS)} (all)")
    p.add_argument("--runs", type=int, default=3, help="interleaved runs (3)")
    p.add_argument("--rounds", type=int, default=0, help="timed rounds per case (0: 10, 5 at 64 MiB)")
    p.add_argument("--slice-bytes", type=int, default=256 * 1024,
                   help="psnode's PSNODE_SLICE_BYTES: big arrays in parts of at most this many bytes (256 KiB; 0: "
                        "one part per server)")
    p.add_argument("--retry-timeout", type=float, default=default("retry_timeout"),
                   help="psnode's PSNODE_RETRY_TIMEOUT, seconds (psnode's default; with --push-then-pull or "
                        "--slice-bytes 0 a 64 MiB round's answers take longer than 2 s on these links, and a "
                        "pull resent meanwhile brings its answer twice: give 10)")
    p.add_argument("--push-then-pull", action="store_true",
                   help="psnode's rounds call kv.push then kv.pull (default: kv.pushpull)")
    p.add_argument("--trace", type=Path, default=None,
                   help="psnode's per-phase timestamps (benchmarks/network/nbtrace.py) of every job under this folder")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 run, 1x1MiB, 2 timed rounds")
    p.add_argument("--timeout", type=float, default=300, help="seconds per job (300)")
    p.add_argument("--json", type=Path, default=None, help="write every record and the summary here")
    p.add_argument("--keep-logs", action="store_true", help="keep the processes' logs after a good run")
    p.add_argument("--cleanup", action="store_true", help="only remove testbeds left by killed runs")
    args = p.parse_args(argv)
    try:
        args.rate_bytes = parse_rate(args.rate)
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    if args.quick:
        args.runs = 1
        if args.cases == DEFAULT_CASES:
            args.cases = "1x1MiB"
    names = [n.strip() for n in args.cases.split(",") if n.strip()]
    bad = [n for n in names if n not in CASES]
    if bad or not names:
        p.error(f"--cases: unknown case(s) {bad}; known: {', '.join(CASES)}")
    args.case_list = [CASES[n] if args.rounds <= 0 else replace(CASES[n], rounds=args.rounds, quick_rounds=args.rounds)
                      for n in names]
    args.design_list = [d.strip() for d in args.designs.split(",") if d.strip()]
    bad = [d for d in args.design_list if d not in DESIGNS]
    if bad or not args.design_list:
        p.error(f"--designs: unknown design(s) {bad}; known: {', '.join(DESIGNS)}")
    if args.runs < 1 or args.timeout <= 0:
        p.error("--runs and --timeout must be positive")
    return args


# ---------------------------------------------------------------- what the links allow

def bound_bytes(design: str, c: Case) -> float:
    """The bytes of a round on the busiest link direction (see the module docstring)."""
    b = c.keys * c.nbytes
    return float(b) if design in ("psnode-dedicated", "tcp-mesh") else 2 * (N - 1) / N * b


def bound_s(design: str, c: Case, rate_bytes: float) -> float:
    return bound_bytes(design, c) / (rate_bytes * FRAME_EFFICIENCY)


# ---------------------------------------------------------------- jobs

def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PSNODE_", "MXDIST_"))}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               GLOO_SOCKET_IFNAME="eth0")
    return env


@dataclass
class Job:
    design: str
    procs: list[Proc]
    markdir: Path
    meters: list[Proc]


def start_job(bed: netns.Testbed, design: str, port: int, args: argparse.Namespace, logdir: Path) -> Job:
    """Meters on every host, then the design's processes (see the module docstring)."""
    job_id = f"cb{uuid.uuid4().hex[:10]}"
    markdir = logdir / job_id
    markdir.mkdir()
    env = base_env()
    env["CLUSTERBENCH_PUSHPULL"] = "0" if args.push_then_pull else "1"
    if args.trace is not None and design != "gloo":
        (args.trace / job_id).mkdir(parents=True)
        env["NETBENCH_TRACE"] = str(args.trace / job_id)
        netbench.TRACE = args.trace
    cases = encode_cases(args.case_list)
    quick = "1" if args.quick else "0"
    meters = []
    for h in bed.hosts:
        log = logdir / f"{job_id}.meter{h.index}.log"
        meters.append(Proc("meter", h.index, h.index,
                           bed.spawn(h, [sys.executable, str(WORKER), "meter", str(markdir), str(h.index)],
                                     env, log, cwd=ROOT), log))
    procs: list[Proc] = []
    if design == "tcp-mesh":
        servers = [bed.hosts[N + r] for r in range(N)]
        for r, h in enumerate(servers):
            log = logdir / f"{job_id}.mesh-server{r}.log"
            procs.append(Proc("server", r, h.index, bed.spawn(h, [sys.executable, str(WORKER), "meshserver", h.addr,
                                                                 str(port), str(N)], env, log, cwd=ROOT), log))
        for r in range(N):
            log = logdir / f"{job_id}.mesh-worker{r}.log"
            argv = [sys.executable, str(WORKER), "meshworker", cases, quick, str(markdir),
                    ",".join(h.addr for h in servers), str(port), str(r)]
            procs.append(Proc("worker", r, r, bed.spawn(bed.hosts[r], argv, env, log, cwd=ROOT), log))
        return Job(design, procs, markdir, meters)
    if design == "gloo":
        master = bed.hosts[0].addr
        for r in range(N):
            log = logdir / f"{job_id}.gloo{r}.log"
            argv = [sys.executable, str(WORKER), "gloo", cases, quick, str(markdir), master, str(port), str(r), str(N)]
            procs.append(Proc("worker", r, r, bed.spawn(bed.hosts[r], argv, env, log, cwd=ROOT), log))
        return Job(design, procs, markdir, meters)
    sched = bed.hosts[SCHED_HOST]

    def spawn(role: Role, rank: int, host_i: int, argv: list[str]) -> None:
        host = bed.hosts[host_i]
        cfg = NodeConfig(role=role, scheduler_host=sched.addr, scheduler_port=port, num_workers=N,
                         num_servers=N, job_id=job_id, host=host.addr,
                         rank=None if role is Role.SCHEDULER else rank, register_timeout=60.0,
                         slice_bytes=args.slice_bytes, retry_timeout=args.retry_timeout)
        e = dict(env)
        e.update(cfg.to_env())
        log = logdir / f"{job_id}.{role.value}{rank}.log"
        procs.append(Proc(role.value, rank, host_i, bed.spawn(host, argv, e, log, cwd=ROOT), log))

    spawn(Role.SCHEDULER, 0, SCHED_HOST, [sys.executable, "-m", "psnode"])
    for r in range(N):
        spawn(Role.SERVER, r, N + r if design == "psnode-dedicated" else r, netbench.server_argv(r))
    for r in range(N):
        spawn(Role.WORKER, r, r, [sys.executable, str(WORKER), "psnode", cases, quick, str(markdir)])
    return Job(design, procs, markdir, meters)


def cpu_children() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def machine_times() -> tuple[float, float]:
    """(idle, total) jiffies of the whole machine (/proc/stat)."""
    fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return fields[3] + fields[4], sum(fields)


def run_job(bed: netns.Testbed, job: Job, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Wait for the job, collect its workers' results and every host's link bytes."""
    cpu0, (idle0, total0), t0 = cpu_children(), machine_times(), time.monotonic()
    try:
        wait_job(job.procs, args.timeout)
        wall = time.monotonic() - t0
        # the meters write their last file within milliseconds of the last mark
        want = [job.markdir / f"{c.name}.h{h.index}.json" for c in args.case_list for h in bed.hosts]
        deadline = time.monotonic() + 10
        while not all(f.exists() for f in want) and time.monotonic() < deadline:
            time.sleep(0.02)
        missing = [f.name for f in want if not f.exists()]
        if missing:
            raise JobFailed(f"{job.design}: no link counters for {missing[:3]}... (meter logs in {job.markdir.parent})")
    finally:
        bed.kill_all()
    idle1, total1 = machine_times()
    cpu = cpu_children() - cpu0
    out = []
    for p in job.procs:
        if p.role == "worker":
            for line in p.log.read_text(errors="replace").splitlines():
                if line.startswith(MARK):
                    out.append(json.loads(line[len(MARK):]))
    for c in args.case_list:
        links = [json.loads((job.markdir / f"{c.name}.h{h.index}.json").read_text()) for h in bed.hosts]
        timed = c.timed(args.quick)
        out.append({"system": "links", "case": c.name,
                    "per_round": [{"host": x["host"], "tx": x["tx"] / timed, "rx": x["rx"] / timed} for x in links]})
    out.append({"system": "cpu", "job_cpu_s": cpu, "wall_s": wall,
                "machine_idle": (idle1 - idle0) / max(1.0, total1 - total0)})
    for r in out:
        r["design"] = job.design
    return out


# ---------------------------------------------------------------- the report

def med(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1e3:.0f} [{min(xs) * 1e3:.0f}-{max(xs) * 1e3:.0f}]"


def summarize(args: argparse.Namespace, records: list[dict[str, Any]]) -> tuple[dict[str, Any], bool]:
    """Print the tables; the summary and whether the goals were met."""
    summary: dict[str, Any] = {"rate": args.rate, "rate_bytes": args.rate_bytes, "runs": args.runs,
                               "workers": N, "servers": N, "cases": {}, "cpu": {}}
    print(f"\nlink MiB per round: the busiest worker host's (server host's) link, sent,received\n"
          f"W={N} S={N}, {HOSTS} hosts on one switch, every port {args.rate} both ways; psnode plain mode "
          f"(no CURVE); median [min-max] over {args.runs} run(s)")
    print(f"{'case':8} {'design':17} {'round ms':>18} {'bound ms':>8} {'/bound':>6} {'gloo/this':>9} "
          f"{'worker link MiB up,down':>30} {'server link MiB':>16}")

    def per_run(design: str, case: str) -> list[float]:
        recs = [r for r in records if r["design"] == design and r.get("case") == case and "median" in r]
        runs = sorted({r["run"] for r in recs})
        return [statistics.median([r["median"] for r in recs if r["run"] == k]) for k in runs]

    for c in args.case_list:
        gloo = per_run("gloo", c.name)
        for d in args.design_list:
            rounds = per_run(d, c.name)
            if not rounds:
                continue
            t = statistics.median(rounds)
            bnd = bound_s(d, c, args.rate_bytes)
            links = [r["per_round"] for r in records if r["design"] == d and r.get("system") == "links"
                     and r["case"] == c.name]
            per_host = {h: {k: statistics.median([lk[h][k] for lk in links]) for k in ("tx", "rx")}
                        for h in range(HOSTS)}
            wk = [per_host[h] for h in range(N)]
            sv = [per_host[h] for h in range(N, 2 * N)]
            speed = statistics.median(gloo) / t if gloo else float("nan")
            up = max(x["tx"] for x in wk) / MiB
            down = max(x["rx"] for x in wk) / MiB
            srv = (f"{max(x['rx'] for x in sv) / MiB:.1f},{max(x['tx'] for x in sv) / MiB:.1f}"
                   if d in ("psnode-dedicated", "tcp-mesh") else "-")
            print(f"{c.name:8} {d:17} {med(rounds):>18} {bnd * 1e3:8.0f} {t / bnd:6.2f} {speed:9.2f} "
                  f"{up:>14.1f},{down:<15.1f} {srv:>16}")
            summary["cases"].setdefault(c.name, {})[d] = {
                "round_s": rounds, "median_s": t, "bound_s": bnd, "bound_bytes": bound_bytes(d, c),
                "round_over_bound": t / bnd, "gloo_over_this": speed, "link_bytes_per_round": per_host}
    print("\nCPU per job (its processes' CPU seconds / wall seconds, of 2 cores) and the machine's idle share:")
    for d in args.design_list:
        cpus = [r for r in records if r["design"] == d and r.get("system") == "cpu"]
        if cpus:
            used = [r["job_cpu_s"] / r["wall_s"] for r in cpus]
            idle = [r["machine_idle"] for r in cpus]
            print(f"  {d:17} cores used {statistics.median(used):.2f} [{min(used):.2f}-{max(used):.2f}]   "
                  f"machine idle {statistics.median(idle):.0%} [{min(idle):.0%}-{max(idle):.0%}]")
            summary["cpu"][d] = {"cores_used": used, "machine_idle": idle}
    ok = True
    goal = [n for n in GOAL_CASES if n in summary["cases"] and {"gloo", "psnode-dedicated"} <= set(summary["cases"][n])]
    if goal:
        print(f"\ngoals (psnode-dedicated >= {SPEEDUP_GOAL}x gloo's speed, <= {BOUND_GOAL}x its bound):")
    for n in goal:
        s = summary["cases"][n]["psnode-dedicated"]
        for good, text in ((s["gloo_over_this"] >= SPEEDUP_GOAL, f"{s['gloo_over_this']:.2f}x gloo's speed"),
                           (s["round_over_bound"] <= BOUND_GOAL, f"{s['round_over_bound']:.2f}x its bound "
                            f"({s['median_s'] * 1e3:.0f} vs {s['bound_s'] * 1e3:.0f} ms)")):
            ok &= good
            print(f"  {'PASS' if good else 'MISS'} {n} psnode-dedicated: {text}")
    return summary, ok


# ---------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    code = netns.begin("clusterbench", preflight(), args.cleanup)
    if code is not None:
        return code
    logdir = Path(tempfile.mkdtemp(prefix="clusterbench-"))
    bed = netns.Testbed(HOSTS, args.rate)
    records: list[dict[str, Any]] = []
    code = 1
    try:
        try:
            bed.up()
        except netns.TestbedError as exc:
            print(f"clusterbench: cannot build the testbed: {exc}", file=sys.stderr)
            return 3
        cc = netns.run("ip", "netns", "exec", bed.hosts[0].ns, "sysctl", "-n",
                       "net.ipv4.tcp_congestion_control").strip()
        print(f"clusterbench: testbed {bed.tag}: {HOSTS} hosts {bed.hosts[0].addr}-{bed.hosts[-1].addr} on one "
              f"switch; TCP congestion control {cc}; logs in {logdir}\n  host 0: {bed.qdisc(bed.hosts[0])}", flush=True)
        port = BASE_PORT
        for run in range(args.runs):
            k = run % len(args.design_list)
            for design in args.design_list[k:] + args.design_list[:k]:
                t0 = time.monotonic()
                job = start_job(bed, design, port, args, logdir)
                got = run_job(bed, job, args)
                port += 1
                for r in got:
                    r["run"] = run
                records += got
                print(f"run {run + 1}/{args.runs} {design:17}: {time.monotonic() - t0:5.1f} s", flush=True)
        summary, ok = summarize(args, records)
        if args.json:
            args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                             "records": records, "summary": summary}, indent=1))
        code = 0 if ok else 1
    except JobFailed as exc:
        print(f"clusterbench: job failed: {exc}", file=sys.stderr)
    except netns.TestbedError as exc:
        print(f"clusterbench: {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        print("clusterbench: interrupted", file=sys.stderr)
        code = 130
    finally:
        if not netns.end("clusterbench", bed):
            code = 1
        if code == 0 and not args.keep_logs:
            shutil.rmtree(logdir, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
