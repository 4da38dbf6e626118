"""The embedding workload: psnode (the table on the servers) against DDP + gloo (every rank holds
the table), W=2, in one interleaved run: steps/s, peak memory per worker and per server, loss.

    python benchmarks/training/embedding.py                       # 2 M and 20 M rows, 3 interleaved runs
    python benchmarks/training/embedding.py --quick               # smoke run: 1 run, 200 k rows, few steps
    python benchmarks/training/embedding.py --rows 2e6,20e6 --runs 3 --steps 400 --json /tmp/emb.json
    python benchmarks/training/embedding.py --with-plain          # also psnode without prefetch
    python benchmarks/training/embedding.py --with-dynamic        # also the ids hashed into 64 bits, no row count
    python benchmarks/training/embedding.py --safety --rows 20e6  # also psnode with replicas, checkpoints, both
    python benchmarks/training/embedding.py --largest --cap-gib 12        # the largest table each one trains

The model, data and step are in benchmarks/training/embedding_worker.py.  psnode jobs start through the
test harness (scheduler, S=2 servers, 2 workers; the table is split by rows over both servers);
DDP's two ranks are plain processes.  Every process has ``OMP_NUM_THREADS=1``.

Memory.  Each worker reports its peak resident memory (VmHWM); a sampler thread reads the
servers' VmHWM (and the scheduler's) every 0.2 s, and the job's total proportional set size
(PSS: shared pages counted once).  The same thread is the watchdog: a job whose total PSS passes
``--cap-gib``, or a machine whose available memory falls under ``--floor-gib``, is killed (its
processes, by pid) and recorded as not fitting.  ``--largest`` grows the table step by step under
that cap: DDP from ``--ddp-start`` rows by ``--grow`` until a run does not fit, then psnode from
twice DDP's largest; a system "trains" a size when every step completes inside the cap.

Per size the table shows each system's steps/s (median over ranks; median [min-max] over runs),
psnode/DDP steps/s per run, peak MiB per worker (max over ranks) and per server (max over
servers), the job's peak total PSS, and the mean loss of the first and the last ``--loss-window``
steps (mean over ranks).  Only processes this driver starts are killed.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import child_env, cpu_seconds, free_port, harness, parse_results, tail  # noqa: E402
from benchmarks.report import fmt_range, print_table, ratios  # noqa: E402

WORKER = Path(__file__).resolve().parent / "embedding_worker.py"
FULL = {"warmup": 30, "steps": 400, "lr": 0.1, "loss_window": 50, "prefetch": True}
QUICK = dict(FULL, warmup=5, steps=40, loss_window=10)
SEARCH = dict(FULL, warmup=10, steps=100, loss_window=20)
ENV = {"OMP_NUM_THREADS": "1", "PSNODE_HEARTBEAT_INTERVAL": "1.0", "PSNODE_REGISTER_TIMEOUT": "120"}
PSNODE, DDP, PLAIN, DYNAMIC = "psnode", "DDP gloo", "psnode, no prefetch", "psnode, 64-bit ids"
#: --safety: psnode with each safety option (the servers' env; a checkpoint directory is added)
REPLICAS, CHECKPOINTS, BOTH = "psnode --replicas 2", "psnode --checkpoint-rounds 50", "psnode, both"
SAFETY = {REPLICAS: {"PSNODE_REPLICAS": "2", "PSNODE_MAX_RESTARTS": "1"},
          CHECKPOINTS: {"PSNODE_CHECKPOINT_ROUNDS": "50", "PSNODE_MAX_RESTARTS": "1"},
          BOTH: {"PSNODE_REPLICAS": "2", "PSNODE_CHECKPOINT_ROUNDS": "50", "PSNODE_MAX_RESTARTS": "1"}}
ORDER = (PSNODE, DYNAMIC, REPLICAS, CHECKPOINTS, BOTH, PLAIN, DDP)
GiB = 2**30


# ---------------------------------------------------------------- memory: sampler and watchdog
def _status_kib(pid: int, field: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            return next((int(line.split()[1]) for line in fh if line.startswith("Pss:")), 0)
    except OSError:
        return 0


def available_gib() -> float:
    with open("/proc/meminfo") as fh:
        kib = next(int(line.split()[1]) for line in fh if line.startswith("MemAvailable:"))
    return kib / 2**20


@dataclass
class Watch:
    """Samples the job's processes (``pids``: label -> pid) until stopped: each one's last VmHWM
    and the peak of their summed PSS; kills them all (SIGKILL, by pid) when the sum passes
    ``cap`` bytes or the machine's available memory falls under ``floor`` bytes."""

    pids: dict[str, int]
    cap: float
    floor: float
    peak_kib: dict[str, int] = field(default_factory=dict)
    cpu_s: dict[str, float] = field(default_factory=dict)   # label -> CPU seconds at the last sample
    cpu_log: list[tuple[float, dict[str, float]]] = field(default_factory=list)   # (time.time(), CPU s)
    total_peak_kib: int = 0
    killed: str = ""
    #: the servers' bytes copied and checkpointed so far (psnode: the scheduler's STATUS), None if unknown
    moved: Callable[[], tuple[int, int, int] | None] | None = None
    #: (time.time(), rounds, copied, checkpointed), summed over the servers
    moved_log: list[tuple[float, int, int, int]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Watch:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        tick = 0
        while not self._stop.wait(0.2):
            tick += 1
            if self.moved is not None and tick % 3 == 0:
                got = self.moved()
                if got is not None:
                    self.moved_log.append((time.time(), *got))
            total = 0
            for label, pid in self.pids.items():
                hwm = _status_kib(pid, "VmHWM")
                if hwm is not None:
                    self.peak_kib[label] = max(self.peak_kib.get(label, 0), hwm)
                cpu = cpu_seconds(pid)
                if cpu is not None:
                    self.cpu_s[label] = cpu
                total += _pss_kib(pid)
            self.cpu_log.append((time.time(), dict(self.cpu_s)))
            self.total_peak_kib = max(self.total_peak_kib, total)
            why = ""
            if total * 1024 > self.cap:
                why = f"the job's memory passed the cap ({total / 2**20:.1f} GiB > {self.cap / GiB:.1f} GiB)"
            elif available_gib() * GiB < self.floor:
                why = f"the machine's available memory fell under {self.floor / GiB:.1f} GiB"
            if why and not self.killed:
                self.killed = why
                for pid in self.pids.values():
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)


@dataclass
class Outcome:
    records: list[dict]
    watch: Watch
    problem: str = ""

    @property
    def fits(self) -> bool:
        return not self.problem and not self.watch.killed and len(self.records) == 2

    def peaks(self, prefix: str) -> list[float]:
        return [v / 1024 for k, v in self.watch.peak_kib.items() if k.startswith(prefix)]

    def cpu_ms_per_step(self, prefix: str) -> float | None:
        """CPU milliseconds per timed step of the processes named ``prefix`` (mean over them),
        from the samples nearest the workers' first timed start and last timed end."""
        if not self.records or len(self.watch.cpu_log) < 2:
            return None
        t0 = min(r["timed_from"] for r in self.records)
        t1 = max(r["timed_to"] for r in self.records)
        log = self.watch.cpu_log
        a = min(log, key=lambda x: abs(x[0] - t0))
        b = min(log, key=lambda x: abs(x[0] - t1))
        labels = [k for k in b[1] if k.startswith(prefix) and k in a[1]]
        if b[0] - a[0] < 0.5 * (t1 - t0) or not labels:
            return None
        steps = self.records[0]["steps"] * (b[0] - a[0]) / (t1 - t0)
        return sum(b[1][k] - a[1][k] for k in labels) / len(labels) * 1e3 / steps

    def moved_per_round(self) -> tuple[float, float] | None:
        """The servers' bytes copied and checkpointed per round they completed (a round: every
        worker's push of one key part applied; the table's part on each server completes one
        per step), from the first STATUS sample after a round completed (the whole copies and
        the base checkpoint are made before: kv.init's answer waits for them) to the last one
        before the workers' last timed step ended (not the job's final checkpoint).  The
        servers tell their counters with their heartbeats (1 s here): use enough ``--steps``."""
        end = max((r["timed_to"] for r in self.records), default=0.0)
        log = [x for x in self.watch.moved_log if x[1] > 0 and x[0] <= end]
        if len(log) < 2 or log[-1][1] <= log[0][1]:
            return None
        (_, r0, c0, k0), (_, r1, c1, k1) = log[0], log[-1]
        return (c1 - c0) / (r1 - r0), (k1 - k0) / (r1 - r0)


# ---------------------------------------------------------------- the two systems
def run_psnode(h, rows: int, cfg: dict, timeout: float, cap: float, floor: float, system: str = PSNODE) -> Outcome:
    env = dict(ENV, **SAFETY.get(system, {}))
    scratch = None
    if "PSNODE_CHECKPOINT_ROUNDS" in env:
        scratch = tempfile.TemporaryDirectory(prefix="emb-ckpt-")
        env["PSNODE_CHECKPOINT_DIR"] = scratch.name
    job = h.start_job(WORKER.read_text(), 2, 2, env=env,
                      args=["psnode", json.dumps(dict(cfg, rows=rows, system=system))])
    watch = Watch({f"{p.role} {p.rank}": p.popen.pid for p in job.procs}, cap, floor,
                  moved=lambda: _moved(job.scheduler, job.job_id)).start()
    problem = ""
    try:
        h.wait_job(job, timeout)
    except AssertionError as exc:
        problem = str(exc)
    finally:
        watch.stop()
        if scratch is not None:
            scratch.cleanup()
    if any(p.code != 0 for p in job.procs) and not watch.killed:
        problem = problem or f"exit codes {[(p.role, p.rank, p.code) for p in job.procs]}"
        print(f"  psnode {rows}: {problem}\n{tail(job.describe(), 30)}", file=sys.stderr)
    return Outcome([r for p in job.workers for r in parse_results(p.out)], watch, problem)


def _moved(scheduler: str, job_id: str) -> tuple[int, int, int] | None:
    """The servers' rounds completed, bytes copied to their holders and written to checkpoints
    so far (sums over servers, as their last heartbeats told the scheduler); None while unknown."""
    from psnode.errors import PSError
    from psnode.scheduler.client import status
    try:
        nodes = status(scheduler, job_id, timeout=1.0).nodes
    except (PSError, OSError):
        return None
    servers = [n for n in nodes if n.role == "server"]
    if not servers:
        return None
    return (sum(n.rounds or 0 for n in servers), sum(n.copied or 0 for n in servers),
            sum(n.checkpointed or 0 for n in servers))


def run_ddp(rows: int, cfg: dict, timeout: float, cap: float, floor: float) -> Outcome:
    port = free_port()
    argv = [sys.executable, "-m", "benchmarks.training.embedding_worker", "ddp",
            json.dumps(dict(cfg, rows=rows, system=DDP))]
    procs = [subprocess.Popen(argv, cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              start_new_session=True,
                              env=child_env(**ENV, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r),
                                            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
             for r in range(2)]
    watch = Watch({f"worker {r}": p.pid for r, p in enumerate(procs)}, cap, floor).start()
    out: list[dict] = []
    problem = ""
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            so, se = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            if p.returncode != 0 and not watch.killed:
                problem = f"a rank exited {p.returncode}"
                print(f"  DDP {rows}: {problem}:\n{tail(se)}", file=sys.stderr)
            out.extend(parse_results(so))
    except subprocess.TimeoutExpired:
        problem = f"timed out after {timeout:.0f} s"
        print(f"  DDP {rows}: {problem}", file=sys.stderr)
    finally:
        watch.stop()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return Outcome(out, watch, problem)


# ---------------------------------------------------------------- tables
def _per_run(records: list[dict], system: str, rows: int, key: str, agg=statistics.median) -> dict[int, float]:
    runs: dict[int, list[float]] = {}
    for r in records:
        if r["system"] == system and r["rows"] == rows:
            runs.setdefault(r["run"], []).append(r[key])
    return {run: agg(v) for run, v in runs.items()}


def summarize(records: list[dict], mem: list[dict], sizes: list[int], print_fn=print) -> list[dict]:
    hdr = ("rows", "system", "steps/s", "psnode/DDP steps/s", "/ psnode", "CPU ms/step per worker", "per server",
           "peak MiB per worker", "peak MiB per server", "job total GiB (PSS)", "loss first", "loss last")
    out_rows = []
    for rows in sizes:
        ddp = _per_run(records, DDP, rows, "steps_per_s")
        base = _per_run(records, PSNODE, rows, "steps_per_s")
        for system in ORDER:
            rate = _per_run(records, system, rows, "steps_per_s")
            if not rate:
                continue
            worker = _per_run(records, system, rows, "peak_mib", max)
            cpu = _per_run(records, system, rows, "cpu_ms_per_step")
            m = [x for x in mem if x["system"] == system and x["rows"] == rows]
            servers = [x["server_mib"] for x in m if x["server_mib"]]
            first = _per_run(records, system, rows, "loss_first", statistics.mean)
            last = _per_run(records, system, rows, "loss_last", statistics.mean)
            out_rows.append((f"{rows / 1e6:g} M", system, fmt_range(list(rate.values()), ".1f"),
                             fmt_range(ratios(rate, ddp), ".2f") if system != DDP and ddp else "",
                             fmt_range(ratios(rate, base), ".2f") if system in SAFETY and base else "",
                             fmt_range(list(cpu.values()), ".1f"),
                             fmt_range([x["server_cpu_ms_per_step"] for x in m if x["server_cpu_ms_per_step"]], ".1f")
                             if system != DDP else "-",
                             fmt_range(list(worker.values()), ".0f"), fmt_range(servers, ".0f") if servers else "-",
                             fmt_range([x["total_gib"] for x in m], ".2f"),
                             fmt_range(list(first.values()), ".3f"), fmt_range(list(last.values()), ".3f")))
    print_fn("\nEmbedding workload, W=2 (psnode S=2): steps/s median over ranks, median [min-max] over runs;\n"
             "psnode/DDP per run (above 1: psnode faster); a safety option's steps/s over plain psnode's per run\n"
             "(--safety); peak resident memory (VmHWM); mean loss of the\n"
             "first and last steps (mean over ranks).")
    print_table(hdr, out_rows, print_fn)
    return [dict(zip(hdr, r, strict=True)) for r in out_rows]


def moved_table(records: list[dict], mem: list[dict], sizes: list[int], print_fn=print) -> list[dict]:
    """Bytes on the links beside the rows touched: per psnode system and size, the rows a step
    touches (every rank's ids, each once) and the servers' bytes copied to the holders of their
    replicas and written to checkpoints per round (median over runs)."""
    hdr = ("rows", "system", "rows touched per step", "KiB copied per round", "KiB checkpointed per round")
    out_rows = []
    for rows in sizes:
        for system in ORDER:
            m = [x["moved_per_round"] for x in mem if x["system"] == system and x["rows"] == rows
                 and x.get("moved_per_round")]
            if not m:
                continue
            hit = [r["rows_touched"] for r in records if r["system"] == system and r["rows"] == rows
                   and "rows_touched" in r]
            out_rows.append((f"{rows / 1e6:g} M", system, f"{statistics.median(hit):.0f}" if hit else "-",
                             fmt_range([c / 1024 for c, _ in m], ".0f"), fmt_range([k / 1024 for _, k in m], ".0f")))
    if out_rows:
        print_fn("\nBytes on the links (the servers' STATUS, summed over servers; a round: one key part's pushes\n"
                 "applied, the table's part on each server completing one per step).")
        print_table(hdr, out_rows, print_fn)
    return [dict(zip(hdr, r, strict=True)) for r in out_rows]


def phase_table(records: list[dict], mem: list[dict], sizes: list[int], print_fn=print) -> list[dict]:
    """Where a step's time goes: per system, size and phase, a worker's wall and CPU ms (each
    rank's median over the timed steps; median over ranks and runs), then the servers' CPU ms
    per step (psnode) and the step as 1000 / steps/s."""
    hdr = ("rows", "system", "phase", "wall ms", "worker CPU ms")
    out_rows = []
    for rows in sizes:
        for system in ORDER:
            mine = [r for r in records if r["system"] == system and r["rows"] == rows and r.get("phases")]
            if not mine:
                continue
            names = list(mine[0]["phases"])
            for name in names:
                wall = [r["phases"][name]["wall_ms"] for r in mine if name in r["phases"]]
                cpu = [r["phases"][name]["cpu_ms"] for r in mine if name in r["phases"]]
                out_rows.append((f"{rows / 1e6:g} M", system, name, f"{statistics.median(wall):.2f}",
                                 f"{statistics.median(cpu):.2f}"))
            step = statistics.median(1e3 / r["steps_per_s"] for r in mine)
            cpu_step = statistics.median(r["cpu_ms_per_step"] for r in mine)
            out_rows.append((f"{rows / 1e6:g} M", system, "whole step (process)", f"{step:.2f}", f"{cpu_step:.2f}"))
            servers = [x["server_cpu_ms_per_step"] for x in mem
                       if x["system"] == system and x["rows"] == rows and x["server_cpu_ms_per_step"]]
            if servers:
                out_rows.append((f"{rows / 1e6:g} M", system, "each server (process CPU)", "-",
                                 f"{statistics.median(servers):.2f}"))
    if out_rows:
        print_fn("\nWhere a step goes (a worker's main thread per phase, median over timed steps, ranks and runs;\n"
                 "the process's CPU per step includes its other threads; the servers' CPU per step of one worker).")
        print_table(hdr, out_rows, print_fn)
    return [dict(zip(hdr, r, strict=True)) for r in out_rows]


def _memory_record(system: str, rows: int, run: int, o: Outcome) -> dict:
    servers = o.peaks("server")
    return {"system": system, "rows": rows, "run": run, "fits": o.fits, "killed": o.watch.killed,
            "problem": o.problem, "server_mib": max(servers) if servers else 0.0,
            "total_gib": o.watch.total_peak_kib / 2**20,
            "peaks_mib": {k: v / 1024 for k, v in o.watch.peak_kib.items()},
            "cpu_s": dict(o.watch.cpu_s), "server_cpu_ms_per_step": o.cpu_ms_per_step("server"),
            "moved_per_round": o.moved_per_round()}


# ---------------------------------------------------------------- main
def _sizes(text: str) -> list[int]:
    return [int(float(x)) for x in text.split(",") if x.strip()]


def compare(a, cfg: dict, sizes: list[int], runs: int, h, cap: float, floor: float) -> tuple[list[dict], list[dict]]:
    records: list[dict] = []
    mem: list[dict] = []
    systems = [(PSNODE, lambda n: run_psnode(h, n, cfg, a.timeout, cap, floor)),
               (DDP, lambda n: run_ddp(n, cfg, a.timeout, cap, floor))]
    if a.with_plain:
        plain = dict(cfg, prefetch=False)
        systems.insert(1, (PLAIN, lambda n: run_psnode(h, n, plain, a.timeout, cap, floor, PLAIN)))
    if a.with_dynamic:
        dyn = dict(cfg, dynamic=True)
        systems.insert(1, (DYNAMIC, lambda n: run_psnode(h, n, dyn, a.timeout, cap, floor, DYNAMIC)))
    if a.no_ddp:
        systems = [s for s in systems if s[0] != DDP]
    if a.safety:
        for i, name in enumerate(SAFETY, start=1):
            systems.insert(i, (name, lambda n, name=name: run_psnode(h, n, cfg, a.timeout, cap, floor, name)))
    if a.only:
        wanted = {w.strip() for w in a.only.split(",")}
        systems = [s for s in systems if s[0] in wanted or (s[0] != PSNODE and s[0].removeprefix("psnode ") in wanted)]
    for run in range(runs):
        for rows in sizes:
            k = (run + sizes.index(rows)) % len(systems)
            for name, fn in systems[k:] + systems[:k]:
                t0 = time.monotonic()
                print(f"  run {run + 1}/{runs} {name} rows={rows}: available {available_gib():.1f} GiB ...", end="",
                      flush=True)
                o = fn(rows)
                for r in o.records:
                    r["run"] = run
                records.extend(o.records)
                mem.append(_memory_record(name, rows, run, o))
                state = "ok" if o.fits else f"DID NOT FIT ({o.watch.killed or o.problem})"
                cpu = ", ".join(f"{k} {v:.1f}" for k, v in sorted(o.watch.cpu_s.items()))
                print(f" {state} in {time.monotonic() - t0:.0f} s, job peak {o.watch.total_peak_kib / 2**20:.2f} GiB; "
                      f"CPU s: {cpu}", flush=True)
    return records, mem


def largest(a, h, cap: float, floor: float) -> dict:
    """Grow the table for DDP, then psnode from twice DDP's largest; one run per size."""
    cfg = dict(SEARCH)
    found: dict[str, dict] = {}
    tried: list[dict] = []
    for name, start in ((DDP, a.ddp_start), (PSNODE, 0)):
        rows = start if name == DDP else 2 * found[DDP]["rows"]
        best = None
        while rows <= a.max_rows:
            print(f"  largest {name} rows={rows / 1e6:g} M: available {available_gib():.1f} GiB ...", end="",
                  flush=True)
            t0 = time.monotonic()
            o = run_ddp(rows, cfg, a.timeout, cap, floor) if name == DDP else run_psnode(h, rows, cfg, a.timeout,
                                                                                         cap, floor)
            rec = _memory_record(name, rows, 0, o)
            rec["records"] = o.records
            tried.append(rec)
            print(f" {'trains' if o.fits else 'does not fit: ' + (o.watch.killed or o.problem)} "
                  f"({time.monotonic() - t0:.0f} s, job peak {o.watch.total_peak_kib / 2**20:.2f} GiB)", flush=True)
            if not o.fits:
                break
            best = rec
            rows = int(rows * a.grow)
        if best is None:
            print(f"  {name}: no size fits under the cap")
            return {"tried": tried}
        found[name] = best
    return {"tried": tried, "largest": {k: v["rows"] for k, v in found.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 run, 200 k rows, few steps")
    ap.add_argument("--runs", type=int, help="interleaved runs (default 3; --quick: 1)")
    ap.add_argument("--rows", help="comma list of table sizes (default 2e6,20e6; --quick: 2e5)")
    ap.add_argument("--steps", type=int, help=f"timed steps (default {FULL['steps']})")
    ap.add_argument("--warmup", type=int, help=f"untimed steps first (default {FULL['warmup']})")
    ap.add_argument("--no-prefetch", action="store_true", help="psnode pulls each batch's rows in its forward")
    ap.add_argument("--with-plain", action="store_true",
                    help=f"also run {PLAIN!r}: psnode pulling each batch's rows in its forward")
    ap.add_argument("--with-dynamic", action="store_true",
                    help=f"also run {DYNAMIC!r}: the same items as 64-bit ids, a table without a row count")
    ap.add_argument("--safety", action="store_true",
                    help="also psnode with --replicas 2, with checkpoints every 50 rounds, and with both")
    ap.add_argument("--no-ddp", action="store_true",
                    help="leave DDP out (e.g. with --safety: the options' ratios only)")
    ap.add_argument("--only", help="comma list of the systems to run, by name or option "
                    "(e.g. psnode,--checkpoint-rounds 50)")
    ap.add_argument("--largest", action="store_true", help="only the largest-table search (see above)")
    ap.add_argument("--cap-gib", type=float, default=12.0, help="a job's memory cap (total PSS), GiB")
    ap.add_argument("--floor-gib", type=float, default=3.0, help="kill a job when the machine has less available")
    ap.add_argument("--ddp-start", type=float, default=30e6, help="--largest: DDP's first size")
    ap.add_argument("--grow", type=float, default=1.25, help="--largest: size factor per step")
    ap.add_argument("--max-rows", type=float, default=1e9, help="--largest: stop growing here")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per job")
    ap.add_argument("--json", help="write the records and the summary here")
    a = ap.parse_args(argv)
    a.ddp_start, a.max_rows = int(a.ddp_start), int(a.max_rows)
    cap, floor = a.cap_gib * GiB, a.floor_gib * GiB
    h = harness()
    print(f"embedding benchmark: {platform.python_version()} on {os.cpu_count()} cpu(s), "
          f"{available_gib():.1f} GiB available; cap {a.cap_gib:g} GiB per job, floor {a.floor_gib:g} GiB")
    t_all = time.monotonic()
    if a.largest:
        result = largest(a, h, cap, floor)
        print(f"\nlargest table trained under a {a.cap_gib:g} GiB cap: {result.get('largest')}")
        if a.json:
            Path(a.json).write_text(json.dumps({"argv": sys.argv, "cap_gib": a.cap_gib, **result}, indent=1))
        print(f"total {time.monotonic() - t_all:.0f} s")
        return 0 if "largest" in result else 1
    cfg = dict(QUICK if a.quick else FULL)
    for k in ("steps", "warmup"):
        if getattr(a, k):
            cfg[k] = getattr(a, k)
    cfg["prefetch"] = not a.no_prefetch
    sizes = _sizes(a.rows) if a.rows else ([200_000] if a.quick else [2_000_000, 20_000_000])
    runs = a.runs or (1 if a.quick else 3)
    print(f"config {cfg}, sizes {sizes}, runs {runs}")
    records, mem = compare(a, cfg, sizes, runs, h, cap, floor)
    summary = summarize(records, mem, sizes)
    phases = phase_table(records, mem, sizes)
    moved = moved_table(records, mem, sizes)
    problems = [f"{m['system']} rows={m['rows']} run {m['run'] + 1}: {m['killed'] or m['problem']}"
                for m in mem if not m["fits"]]
    for p in problems:
        print(f"  DID NOT COMPLETE: {p}")
    print(f"\ntotal {time.monotonic() - t_all:.0f} s")
    if a.json:
        Path(a.json).write_text(json.dumps({"argv": sys.argv, "config": cfg, "records": records, "memory": mem,
                                            "summary": summary, "phases": phases, "moved": moved,
                                            "problems": problems}, indent=1))
        print(f"wrote {a.json}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
