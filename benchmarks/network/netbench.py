"""psnode on a rate-limited network: three namespaces, 1 Gbit/s per host, W=2 S=2.

    python benchmarks/network/netbench.py                                # uncompressed, 3 interleaved runs
    python benchmarks/network/netbench.py --compression none,fp16,2bit,1bit   # side by side
    python benchmarks/network/netbench.py --quick --no-mlp               # smoke run (~10 s)
    python benchmarks/network/netbench.py --cleanup                      # remove testbeds of a killed run
    python benchmarks/network/netbench.py --no-mlp --replicas 2          # each server's state copied to the other
    python benchmarks/network/netbench.py --loopback --compression none,fp16,2bit   # all on this host, no limit

Needs root and iproute2 (``ip``, ``tc`` with the tbf qdisc).  The testbed (benchmarks/network/netns.py)
is three hosts on one switch, every port limited to ``--rate`` in both directions; host 0 runs
server 0 and worker 0, host 1 server 1 and worker 1, host 2 the scheduler: mxdist's own placement
on a two-machine cluster (one server per host, workers in the hosts' slots).  A worker's push and
pull to its own host's server stay on that host; those to the other host's server cross both
links.  The processes are started directly (``python -m psnode`` and the worker script) with the
``PSNODE_*`` environment of ``NodeConfig.to_env``, inside the namespaces (``ip netns exec``).

Per compression setting and run: one job runs the workload's dense cases (default ``1x16MiB`` and
``16x1MiB`` of benchmarks/cases.py), then the raw TCP reference (netbench_raw.py: the bytes those
rounds put on the links, in the same two phases, with no parameter server at all), then one job
runs examples/mlp_numpy.py (epoch times).  Settings are interleaved and their order rotates
between runs.  ``bound`` is what the links allow: the
time of a round's push phase plus its pull phase, each at the bytes of its busiest link direction
(compressed pushes that cross, then float32 pull replies that cross, from psnode's placement), at
the rate less TCP/IP/Ethernet headers (1448 payload bytes per 1514-byte frame).

``--loopback`` runs the same jobs with every process on this host (127.0.0.1, no namespace, no
root needed): workers and servers then talk over the same-host data plane, no raw reference and
no bound.  It answers whether compression pays without a slow network (it does not: see README).

Every wait has a deadline (``--timeout`` per job).  The namespaces and every process in them are
removed on every exit: normal end, failure, timeout, Ctrl-C, SIGTERM, SIGHUP; after a SIGKILL, the
next run (or ``--cleanup``) removes them.  Exit codes: 0 done, 1 a job failed or a check failed,
2 bad usage, 3 the machine cannot build the testbed, 130 / 143 / 129 interrupted.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.cases import DENSE, MARK, Case, encode_cases  # noqa: E402
from benchmarks.network import netns  # noqa: E402
from psnode.config import NodeConfig, Role  # noqa: E402
from psnode.errors import ConfigError  # noqa: E402
from psnode.math.compression import CompressionSpec  # noqa: E402
from psnode.worker.placement import Placer  # noqa: E402

WORKER = Path(__file__).resolve().parent / "netbench_worker.py"
RAW = Path(__file__).resolve().parent / "netbench_raw.py"
DEFAULT_CASES = "1x16MiB,16x1MiB"
TARGET_CASES = ("1x16MiB", "16x1MiB")   # the targets are checked on these
FRAME_EFFICIENCY = 1448 / 1514     # TCP payload per Ethernet frame at MTU 1500 (timestamps on)
BASE_PORT = 9100
MARK_RE = re.compile(re.escape(MARK) + r"(\{.*\})")
W = S = 2


class JobFailed(RuntimeError):
    pass


# ---------------------------------------------------------------- options

def parse_rate(text: str) -> float:
    """tc's rate units (SI: 1gbit = 1e9 bit/s) -> bytes per second."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit)", text.strip().lower())
    if not m:
        raise argparse.ArgumentTypeError(f"rate {text!r}: use tc units, e.g. 1gbit, 100mbit, 10gbit")
    scale = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}[m.group(2)]
    return float(m.group(1)) * scale / 8


def parse_compression(text: str) -> list[CompressionSpec]:
    """``none,fp16,2bit,2bit:0.25,1bit`` -> validated specs."""
    specs = []
    for item in text.split(","):
        kind, _, threshold = item.strip().partition(":")
        params: dict[str, Any] = {"type": kind}
        if threshold:
            params["threshold"] = threshold
        try:
            specs.append(CompressionSpec.from_params(params))
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return specs


def label(spec: CompressionSpec) -> str:
    if spec.thresholded and spec.threshold != 0.5:
        return f"{spec.type.value}:{spec.threshold:g}"
    return spec.type.value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--compression", type=parse_compression, default=parse_compression("none"),
                   help="comma list of none, fp16, 2bit, 1bit (TYPE:THRESHOLD for a threshold)")
    p.add_argument("--cases", default=DEFAULT_CASES, help=f"dense cases of benchmarks/cases.py ({DEFAULT_CASES})")
    p.add_argument("--runs", type=int, default=3, help="interleaved runs (3)")
    p.add_argument("--rate", default="1gbit", help="every host port's rate, both directions (1gbit)")
    p.add_argument("--unlimited", action="store_true", help="no tbf: the namespaces' raw veth speed")
    p.add_argument("--mlp-epochs", type=int, default=10, help="epochs of the MLP example (10)")
    p.add_argument("--loopback", action="store_true",
                   help="every process on this host (no namespaces, no limit, no raw reference)")
    p.add_argument("--no-mlp", action="store_true", help="skip the MLP example")
    p.add_argument("--no-raw", action="store_true", help="skip the raw TCP reference (netbench_raw.py)")
    p.add_argument("--quick", action="store_true", help="few rounds, 1 run, 3 MLP epochs")
    p.add_argument("--timeout", type=float, default=300, help="seconds per job (300)")
    p.add_argument("--json", type=Path, default=None, help="write every record and the summary here")
    p.add_argument("--keep-logs", action="store_true", help="keep the processes' logs after a good run")
    p.add_argument("--pushpull", action="store_true",
                   help="timed rounds call kv.pushpull (one request per key part) instead of push then pull")
    p.add_argument("--trace", type=Path, default=None,
                   help="per-phase timestamps of every worker and server (benchmarks/network/nbtrace.py) "
                        "under this folder")
    p.add_argument("--cleanup", action="store_true", help="only remove testbeds left by killed runs")
    p.add_argument("--replicas", type=int, default=1, choices=(1, 2),
                   help="copies of each server's state, as mxdist launch --replicas K --max-restarts 1 (1)")
    args = p.parse_args(argv)
    try:
        args.rate_bytes = parse_rate(args.rate)
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    known = {c.name: c for c in DENSE}
    names = [n.strip() for n in args.cases.split(",") if n.strip()]
    bad = [n for n in names if n not in known]
    if bad or not names:
        p.error(f"unknown case(s) {bad}; dense cases: {', '.join(known)}")
    args.case_list = [known[n] for n in names]
    if args.loopback:
        args.unlimited = args.no_raw = True
    if args.quick:
        args.runs, args.mlp_epochs = 1, min(args.mlp_epochs, 3)
    if args.runs < 1 or args.mlp_epochs < 1 or args.timeout <= 0:
        p.error("--runs, --mlp-epochs and --timeout must be positive")
    return args


# ---------------------------------------------------------------- what the links allow

def link_bound(cases: list[Case], spec: CompressionSpec, rate_bytes: float) -> dict[str, dict[str, Any]]:
    """Per case: the least time a round can take on these links.

    A sync round is a push phase then a pull phase (a key's new value exists only after every
    worker's push of it arrived); each phase takes at least the bytes of its busiest link direction
    at the payload rate.  Replays psnode's placement (the job's init order); worker w and server w
    share host w, so only the parts on the other host's server cross.
    """
    placer = Placer(S)
    out = {}
    for c in cases:
        push = {(h, d): 0 for h in range(S) for d in ("up", "down")}
        pull = dict(push)
        for i in range(c.keys):
            for part in placer.place(f"{c.name}/{i}", (c.elems,), 4).parts:
                n, s = part.hi - part.lo, part.server
                for w in range(W):
                    if w != s:   # w's push goes up w's link and down s's; the reply comes back
                        push[w, "up"] += spec.nbytes(n)
                        push[s, "down"] += spec.nbytes(n)
                        pull[s, "up"] += 4 * n
                        pull[w, "down"] += 4 * n
        busiest = max(push.values()) + max(pull.values())
        out[c.name] = {"push_bytes": max(push.values()), "pull_bytes": max(pull.values()),
                       "link_bytes": busiest, "bound_s": busiest / (rate_bytes * FRAME_EFFICIENCY)}
    return out


# ---------------------------------------------------------------- jobs

@dataclass
class Proc:
    role: str
    rank: int
    host: int
    popen: Any
    log: Path


TRACE: Path | None = None   # --trace: each job's timestamps go to a folder under it
REPLICAS = 1                # --replicas: copies of each server's state (with restarts allowed)


def child_env(spec: CompressionSpec, iface: str = "eth0") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PSNODE_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               NETBENCH_COMPRESSION=json.dumps(spec.to_params()), NETBENCH_IFACE=iface)
    return env


def server_argv(rank: int) -> list[str]:
    """``python -m psnode``, or (--trace) the same with benchmarks/network/nbtrace.py's timestamps."""
    if TRACE is None:
        return [sys.executable, "-m", "psnode"]
    return [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
            "from benchmarks.network import nbtrace; "
            f"nbtrace.install('server', {rank}); from psnode.__main__ import main; sys.exit(main())"]


def start_job(bed: netns.Testbed | netns.LocalBed, port: int, worker_argv: list[str], spec: CompressionSpec,
              logdir: Path) -> list[Proc]:
    """Scheduler on host 2; server r and worker r on host r."""
    job_id = f"nb{uuid.uuid4().hex[:10]}"
    sched = bed.hosts[2]
    base = child_env(spec, sched.iface)
    if TRACE is not None:
        (TRACE / job_id).mkdir(parents=True)
        base["NETBENCH_TRACE"] = str(TRACE / job_id)
    procs = []

    def spawn(role: Role, rank: int, host_i: int, argv: list[str]) -> None:
        host = bed.hosts[host_i]
        cfg = NodeConfig(role=role, scheduler_host=sched.addr, scheduler_port=port, num_workers=W,
                         num_servers=S, job_id=job_id, host=host.addr,
                         rank=None if role is Role.SCHEDULER else rank, register_timeout=30.0,
                         replicas=REPLICAS, max_restarts=1 if REPLICAS > 1 else 0)
        env = dict(base)
        env.update(cfg.to_env())
        log = logdir / f"{job_id}.{role.value}{rank}.log"
        procs.append(Proc(role.value, rank, host_i, bed.spawn(host, argv, env, log, cwd=ROOT), log))

    spawn(Role.SCHEDULER, 0, 2, [sys.executable, "-m", "psnode"])
    for r in range(S):
        spawn(Role.SERVER, r, r, server_argv(r))
    for r in range(W):
        spawn(Role.WORKER, r, r, [sys.executable, str(WORKER), *worker_argv])
    return procs


def tail(path: Path, n: int = 12) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").strip().splitlines()[-n:])
    except FileNotFoundError:
        return "(no log)"


def wait_job(procs: list[Proc], timeout: float) -> None:
    """Until every process exited 0; JobFailed at the first failure or at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        codes = [p.popen.poll() for p in procs]
        failed = [p for p, c in zip(procs, codes, strict=True) if c not in (None, 0)]
        if failed:
            p = failed[0]
            raise JobFailed(f"{p.role} {p.rank} on host {p.host} exited {p.popen.returncode}:\n"
                            f"{tail(p.log)}\n(log: {p.log})")
        if all(c == 0 for c in codes):
            return
        if time.monotonic() > deadline:
            running = ", ".join(f"{p.role} {p.rank}" for p, c in zip(procs, codes, strict=True) if c is None)
            raise JobFailed(f"job not done within {timeout:g} s (still running: {running}); "
                            f"worker 0's log:\n{tail(procs[-W].log)}")
        time.sleep(0.05)


def results(procs: list[Proc]) -> list[dict[str, Any]]:
    out = []
    for p in procs:
        if p.role == "worker":
            out += [json.loads(m.group(1)) for m in MARK_RE.finditer(p.log.read_text(errors="replace"))]
    return out


def run_job(bed: netns.Testbed | netns.LocalBed, procs: list[Proc], timeout: float) -> list[dict[str, Any]]:
    try:
        wait_job(procs, timeout)
    finally:
        bed.kill_all()   # nothing of this job outlives it, whatever happened
    return results(procs)


def start_raw(bed: netns.Testbed, port: int, args: argparse.Namespace, spec: CompressionSpec,
              logdir: Path) -> list[Proc]:
    """The raw TCP reference (netbench_raw.py) on hosts 0 and 1, same bytes as psnode's rounds."""
    bounds = link_bound(args.case_list, spec, args.rate_bytes)
    plan = json.dumps([{"case": c.name, "push": bounds[c.name]["push_bytes"], "pull": bounds[c.name]["pull_bytes"],
                        "warmup": c.warm(args.quick), "rounds": c.timed(args.quick)} for c in args.case_list])
    env = child_env(spec)
    procs = []
    for me, peer in ((0, 1), (1, 0)):
        a, b = bed.hosts[me], bed.hosts[peer]
        log = logdir / f"raw{port}.{me}.log"
        argv = [sys.executable, str(RAW), a.addr, b.addr, str(port), plan]
        procs.append(Proc("worker", me, me, bed.spawn(a, argv, env, log, cwd=ROOT), log))
    return procs


# ---------------------------------------------------------------- the report

def med(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1e3:.1f} [{min(xs) * 1e3:.1f}-{max(xs) * 1e3:.1f}]"


def summarize(args: argparse.Namespace, records: list[dict[str, Any]]) -> tuple[dict[str, Any], bool]:
    """Print the tables; return the summary and whether every check passed."""
    ok = True
    summary: dict[str, Any] = {"cases": {}, "mlp": {}}
    MiB = 2**20
    labels = [label(s) for s in args.compression]
    where = ("one host (loopback)" if args.loopback else
             f"3 hosts, every port {args.rate if not args.unlimited else 'unlimited'} both ways")
    print(f"\nW={W} S={S}, {where}, --replicas {args.replicas}; "
          f"median [min-max] over {args.runs} run(s)")
    print(f"{'case':9} {'compression':11} {'psnode round ms':>22} {'raw TCP ms':>22} {'psnode/raw':>10} "
          f"{'bound ms':>8} {'psnode/bound':>12} {'link MiB/round':>14} {'vs none':>7}")

    def per_run(system: str, case: str, name: str) -> list[float]:
        recs = [r for r in records if r.get("system") == system and r.get("case") == case and r["label"] == name]
        return [statistics.median([r["median"] for r in recs if r["run"] == k])
                for k in sorted({r["run"] for r in recs})]

    for c in args.case_list:
        base = None
        for spec, name in zip(args.compression, labels, strict=True):
            ps, raw = per_run("psnode", c.name, name), per_run("raw", c.name, name)
            if not ps:
                continue
            link = statistics.median([max(r["link_tx"], r["link_rx"]) for r in records
                                      if r.get("system") == "psnode" and r.get("case") == c.name
                                      and r["label"] == name])
            t = statistics.median(ps)
            t_raw = statistics.median(raw) if raw else float("nan")
            bound = link_bound(args.case_list, spec, args.rate_bytes)[c.name]
            bound_s = bound["bound_s"] if not args.unlimited else float("nan")
            base = t if name == "none" else base
            speed = f"{base / t:7.2f}" if base else f"{'-':>7}"
            print(f"{c.name:9} {name:11} {med(ps):>22} {med(raw) if raw else '-':>22} {t / t_raw:10.2f} "
                  f"{bound_s * 1e3:8.1f} {t / bound_s:12.2f} {link / MiB:14.2f} {speed}")
            summary["cases"].setdefault(c.name, {})[name] = {
                "round_s": ps, "median_s": t, "raw_round_s": raw, "raw_median_s": t_raw,
                "link_bytes_per_round": link, "bound_s": bound_s, "bound_bytes": bound["link_bytes"],
                "round_over_bound": t / bound_s, "round_over_raw": t / t_raw,
                "speedup_vs_none": base / t if base else None}
    mlps = [r for r in records if r.get("system") == "mlp"]
    if mlps:
        print(f"\nexamples/mlp_numpy.py, {args.mlp_epochs} epochs: epoch time (median over epochs 2.., then runs)")
        for name in labels:
            recs = [r for r in mlps if r["label"] == name]
            if not recs:
                continue
            ep = [statistics.median(r["epochs"][1:] or r["epochs"]) for r in recs]
            acc = [r["accuracy"] for r in recs]
            print(f"  {name:11} epoch {med(ep)} ms   accuracy {', '.join(f'{a:.4f}' for a in acc)}")
            summary["mlp"][name] = {"epoch_s": ep, "accuracy": acc}
    if not args.unlimited and set(summary["cases"]) & set(TARGET_CASES):
        print("\nchecks (within 15% of what the links allow; 2bit >= 1.6x, fp16 >= 1.15x vs none):")
        for cname, by in summary["cases"].items():
            if cname not in TARGET_CASES:
                continue
            for name, s in by.items():
                good = s["round_over_bound"] <= 1.15
                ok &= good
                print(f"  {'PASS' if good else 'MISS'} {cname} {name}: round {s['median_s'] * 1e3:.1f} ms "
                      f"<= 1.15 x bound {s['bound_s'] * 1e3:.1f} ms")
                need = {"2bit": 1.6, "fp16": 1.15}.get(name)
                if need and s["speedup_vs_none"] is not None:
                    good = s["speedup_vs_none"] >= need
                    ok &= good
                    print(f"  {'PASS' if good else 'MISS'} {cname} {name}: {s['speedup_vs_none']:.2f}x "
                          f"faster than none (>= {need})")
    return summary, ok


# ---------------------------------------------------------------- main

def _interrupted(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def free_port() -> int:
    """A port free on 127.0.0.1 now (--loopback: other jobs share this host's ports)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def preflight() -> str | None:
    if os.geteuid() != 0:
        return "netbench needs root (network namespaces and tc)"
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    if missing:
        return f"netbench needs iproute2: {', '.join(missing)} not found (apt-get install iproute2)"
    return None


def main(argv: list[str] | None = None) -> int:
    global TRACE, REPLICAS
    args = parse_args(argv)
    TRACE, REPLICAS = args.trace, args.replicas
    if args.pushpull:
        os.environ["NETBENCH_PUSHPULL"] = "1"   # (child_env passes it on)
    why = None if args.loopback and not args.cleanup else preflight()
    if why:
        print(f"netbench: {why}", file=sys.stderr)
        return 3
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupted)
    stale = [] if args.loopback else netns.remove_stale()
    if stale:
        print(f"netbench: removed namespaces left by a killed run: {' '.join(stale)}", flush=True)
    if args.cleanup:
        return 0
    if any(s.active for s in args.compression):
        import psnode.worker.kvstore
        if not hasattr(psnode.worker.kvstore.KVStore, "set_gradient_compression"):
            print("netbench: this psnode has no kv.set_gradient_compression; "
                  "use --compression none", file=sys.stderr)
            return 2
    logdir = Path(tempfile.mkdtemp(prefix="netbench-"))
    bed: netns.Testbed | netns.LocalBed = (netns.LocalBed(3) if args.loopback else
                                           netns.Testbed(3, None if args.unlimited else args.rate))
    records: list[dict[str, Any]] = []
    code = 1
    try:
        try:
            bed.up()
        except netns.TestbedError as exc:
            print(f"netbench: cannot build the testbed: {exc}", file=sys.stderr)
            return 3
        print(f"netbench: testbed {bed.tag}: hosts {', '.join(h.addr for h in bed.hosts)}"
              f"{'' if args.loopback else ' on one switch'}; "
              f"logs in {logdir}", flush=True)
        for h in bed.hosts:
            print(f"  host {h.index} ({h.ns}): {bed.qdisc(h)}", flush=True)
        port = BASE_PORT
        for run in range(args.runs):
            order = args.compression[run % len(args.compression):] + args.compression[:run % len(args.compression)]
            for spec in order:
                kinds = ["cases", *([] if args.no_raw else ["raw"]), *([] if args.no_mlp else ["mlp"])]
                for what in kinds:
                    t0 = time.monotonic()
                    if what == "raw":
                        assert isinstance(bed, netns.Testbed)   # (--loopback has no raw reference)
                        procs = start_raw(bed, port, args, spec, logdir)
                    else:
                        worker_argv = (["cases", encode_cases(args.case_list), "1" if args.quick else "0"]
                                       if what == "cases" else ["mlp", "--epochs", str(args.mlp_epochs)])
                        procs = start_job(bed, free_port() if args.loopback else port, worker_argv, spec, logdir)
                    got = run_job(bed, procs, args.timeout)
                    port += 1
                    for r in got:
                        r.update(run=run, label=label(spec))
                    records += got
                    print(f"run {run + 1}/{args.runs} {label(spec):8} {what:5}: {time.monotonic() - t0:5.1f} s",
                          flush=True)
        summary, ok = summarize(args, records)
        if args.json:
            args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                             "records": records, "summary": summary}, indent=1))
        code = 0 if ok else 1
    except JobFailed as exc:
        print(f"netbench: job failed: {exc}", file=sys.stderr)
    except netns.TestbedError as exc:
        print(f"netbench: {exc}", file=sys.stderr)
    except KeyboardInterrupt:
        print("netbench: interrupted", file=sys.stderr)
        code = 130
    finally:
        if not netns.end("netbench", bed, check=not args.loopback):
            code = 1
        if code == 0 and not args.keep_logs:
            shutil.rmtree(logdir, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
