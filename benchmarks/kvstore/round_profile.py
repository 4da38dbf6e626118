"""Where a dense round's time goes, in CPU milliseconds per round, by what the CPU does.

    python benchmarks/kvstore/round_profile.py                         # 1x16MiB at W2S2
    python benchmarks/kvstore/round_profile.py --case 1x64MiB --rounds 400 --json /tmp/round.json

Needs ``perf`` (Debian: ``apt install linux-perf``) and root (or ``kernel.perf_event_paranoid``
at most 1).  Starts a harness job running the case (same-host data path, as
benchmarks/kvstore/run.py), lets it settle, then, over one window on every worker and server at
once, samples each process with ``perf record`` and reads its CPU time from /proc.  After the
job ends, the workers' own median round time turns shares into milliseconds per round:

    role ms per round in a category = the process's cores busy x its samples' share x round ms

Categories, by the sampled function: ``copy`` (libc memmove/memcpy: a worker's gradient in and
the result out), ``sum`` and ``scale`` (numpy's float add and multiply: a server's average),
``python`` (the interpreter: psnode's own code), ``kernel`` (system calls, wake-ups, scheduling)
and ``other``.  Then the machine's view: its cores x the round is the CPU time a round has;
what no process of the job used is ``idle`` (waiting: a role for another, or a core for work).
With ``--bound``, the memory bound of the case (benchmarks/kvstore/peers.py ``membw``) is
measured after the job, as ``copy`` at full speed with no waiting, for comparison, and the
round's time over the bound is split into what fills it (:func:`gap`): the cores' idle time,
the workers' and the servers' Python, the kernel and the rest, and the copies, sum and scaling
pass beyond the bound's own copies -- each in CPU ms per round and as ms of the round (CPU ms /
cores), largest first.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.cases import ALL, encode_cases  # noqa: E402
from benchmarks.common import cpu_seconds, harness, parse_results  # noqa: E402
from benchmarks.kvstore.peers_run import run_membw  # noqa: E402
from benchmarks.kvstore.psnode_job import PSNODE_ENV, WORKER  # noqa: E402
from benchmarks.kvstore.run import parse_configs  # noqa: E402
from benchmarks.report import print_table  # noqa: E402

CATEGORIES = ("copy", "sum", "scale", "python", "kernel", "other")
LINE = re.compile(r"^\s*([\d.]+)%\s+(\S+)\s+\[[.k]\]\s+(\S+)")


def category(dso: str, symbol: str) -> str:
    """The category of one sampled function (its library ``dso`` and name ``symbol``)."""
    if "memmove" in symbol or "memcpy" in symbol:
        return "copy"
    if symbol.startswith(("FLOAT_add", "DOUBLE_add")):
        return "sum"
    if symbol.startswith(("FLOAT_multiply", "DOUBLE_multiply")):
        return "scale"
    if dso.startswith(("libpython", "python")):
        return "python"
    if dso.startswith("[kernel"):
        return "kernel"
    return "other"


def shares(report_text: str) -> dict[str, float]:
    """Per category, the share of a process's samples (0..1), from ``perf report --sort
    dso,symbol`` text."""
    out = dict.fromkeys(CATEGORIES, 0.0)
    for line in report_text.splitlines():
        m = LINE.match(line)
        if m:
            out[category(m.group(2), m.group(3))] += float(m.group(1)) / 100
    total = sum(out.values())
    return {k: v / total for k, v in out.items()} if total else out


def gap(per_proc: dict[str, dict], idle: float, round_ms: float, bound_ms: float,
        cores: int) -> list[tuple[str, float]]:
    """What stands between the round and the memory bound: ``cores x (round - bound)`` CPU ms
    split into [(what, CPU ms per round)], largest first.  ``per_proc``: "role rank" ->
    {"ms_per_round": {category: CPU ms}}.  The parts add up to the whole: the round's CPU is the
    processes' (copies, sum, scale, Python, kernel, other) plus the idle time, and the bound's
    is the copies alone on every core; "copies, sum and scale beyond the bound's" is negative
    when they ran faster than the bound measured."""
    def total(role: str, cats: tuple[str, ...]) -> float:
        return sum(v["ms_per_round"][k] for name, v in per_proc.items() if name.startswith(role) for k in cats)
    parts = [("idle: no process of the job on a core (waiting, or work not the job's)", idle),
             ("the workers' Python", total("worker", ("python",))),
             ("the servers' Python", total("server", ("python",))),
             ("kernel and other", total("", ("kernel", "other"))),
             ("copies, sum and scale beyond the bound's", total("", ("copy", "sum", "scale")) - cores * bound_ms)]
    return sorted(parts, key=lambda p: -p[1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", default="1x16MiB", choices=[c for c, v in ALL.items() if v.kind == "dense"])
    ap.add_argument("--config", default="2,2", help="W,S")
    ap.add_argument("--rounds", type=int, default=1500, help="timed rounds of the job (long enough for the window)")
    ap.add_argument("--settle", type=float, default=2.0, help="seconds before the window")
    ap.add_argument("--seconds", type=float, default=3.0, help="the window")
    ap.add_argument("--bound", action="store_true", help="also measure the case's memory bound")
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args(argv)
    perf = shutil.which("perf")
    if perf is None:
        raise SystemExit("perf not found (Debian: apt install linux-perf)")
    (W, S), = parse_configs([a.config])
    c = dataclasses.replace(ALL[a.case], rounds=a.rounds)
    h = harness()
    out = Path(tempfile.mkdtemp(prefix="round-profile-"))
    job = h.start_job(WORKER.read_text(), W, S, env=PSNODE_ENV, args=["bench", encode_cases([c]), "0"])
    procs = [p for p in job.procs if p.role in ("worker", "server")]
    try:
        time.sleep(a.settle)
        cpu0 = {p.popen.pid: cpu_seconds(p.popen.pid) or 0.0 for p in procs}
        t0 = time.monotonic()
        spies = [subprocess.Popen([perf, "record", "-q", "-o", str(out / f"{p.role}{p.rank}.data"),
                                   "-p", str(p.popen.pid), "--", "sleep", str(a.seconds)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for p in procs]
        for sp in spies:
            sp.wait(a.seconds + 60)
        busy = {p.popen.pid: ((cpu_seconds(p.popen.pid) or 0.0) - cpu0[p.popen.pid]) / (time.monotonic() - t0)
                for p in procs}
        h.wait_job(job, 600)
    finally:
        h.kill_job(job)
    if any(p.code != 0 for p in job.procs):
        raise SystemExit(f"the job failed: {[(p.role, p.rank, p.code) for p in job.procs]}\n{job.describe()[-3000:]}")
    rounds = [r["median"] for p in job.workers for r in parse_results(p.out)]
    round_ms = statistics.median(rounds) * 1e3
    rows, per_proc = [], {}
    used = 0.0
    for p in procs:
        text = subprocess.run([perf, "report", "-q", "-i", str(out / f"{p.role}{p.rank}.data"), "--no-children",
                               "--sort", "dso,symbol", "--stdio"], capture_output=True, text=True).stdout
        sh = shares(text)
        ms = {k: busy[p.popen.pid] * v * round_ms for k, v in sh.items()}
        per_proc[f"{p.role} {p.rank}"] = {"cores_busy": busy[p.popen.pid], "ms_per_round": ms}
        used += busy[p.popen.pid] * round_ms
        rows.append((f"{p.role} {p.rank}", f"{busy[p.popen.pid]:.2f}", *(f"{ms[k]:.2f}" for k in CATEGORIES),
                     f"{busy[p.popen.pid] * round_ms:.2f}"))
    cores = len(os.sched_getaffinity(0))
    idle = cores * round_ms - used
    totals = {k: sum(v["ms_per_round"][k] for v in per_proc.values()) for k in CATEGORIES}
    rows.append(("all", f"{used / round_ms:.2f}", *(f"{totals[k]:.2f}" for k in CATEGORIES), f"{used:.2f}"))
    print(f"{a.case} at W{W}S{S}: round {round_ms:.2f} ms (the workers' median); {cores} cores = "
          f"{cores * round_ms:.2f} CPU ms per round; window {a.seconds:g} s")
    print_table(("process", "cores busy", *(f"{k} ms" for k in CATEGORIES), "CPU ms/round"), rows)
    print(f"idle (no process of the job on a core): {idle:.2f} CPU ms per round; load average "
          f"{os.getloadavg()[0]:.2f} (work that is not the job's counts as idle here: profile a quiet machine)")
    bound_ms = None
    between: list[tuple[str, float]] | None = None
    if a.bound:
        got = run_membw(W, S, [c], False, 300)
        if got:
            bound_ms = max(r["median"] for r in got) * 1e3
            print(f"memory bound: {bound_ms:.2f} ms per round ({cores * bound_ms:.2f} CPU ms of copying at full "
                  f"speed); the round is {round_ms / bound_ms:.2f}x it")
            between = gap(per_proc, idle, round_ms, bound_ms, cores)
            print(f"between the round and the bound: {cores * (round_ms - bound_ms):.2f} CPU ms per round "
                  f"({round_ms - bound_ms:.2f} ms of the round):")
            print_table(("what", "CPU ms per round", "ms of the round"),
                        [(what, f"{ms:.2f}", f"{ms / cores:.2f}") for what, ms in between])
    if a.json:
        Path(a.json).write_text(json.dumps({"case": a.case, "config": a.config, "round_ms": round_ms, "cores": cores,
                                            "processes": per_proc, "totals": totals, "idle_ms": idle,
                                            "bound_ms": bound_ms, "gap": between}, indent=1))
    shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
