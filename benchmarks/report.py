"""Statistics, tables and targets of benchmarks/kvstore/run.py (pure: no processes, no I/O but print_fn).

Records are dicts with ``system``, ``config`` ("W,S"; "1,1" for raw zmq, "2" for gloo and DDP),
``case``, ``run`` and ``median`` (seconds per round, or per step for the ``embedding`` case; ``wall``
for launch).  :func:`collect` turns them into ``(system, config, case) -> {run: value}``: per run
the median over workers (launch: the max; embedding: the seconds per step of the median steps/s).
Ratios are computed per run (same interleaved run), then summarized as median [min-max].
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable

from benchmarks.cases import SPARSE_COLS, SPARSE_FRACTION, SPARSE_ROWS, Case, MiB

Stats = dict[tuple[str, str, str], dict[int, float]]
PrintFn = Callable[[str], None]
SPARSE_BYTES = 2 * int(SPARSE_ROWS * SPARSE_FRACTION) * SPARSE_COLS * 4
TARGET_CONFIGS = ("1,1", "2,1", "2,2")   # the goals hold at 2,2; shown for the others
GOAL_CONFIG = "2,2"
MXNET_CASES = ("1x4KiB", "1x1MiB", "1x16MiB", "1x64MiB", "16x1MiB", "200x16KiB", "rowsparse1%")
EMBEDDING = "embedding"   # the embedding workload's case: psnode (W2 S2) against DDP + gloo (system "ddp", W2)
DDP, DDP_CONFIG = "ddp", "2"


def fmt_range(vals: list[float], spec: str = ".0f") -> str:
    if not vals:
        return "-"
    med = statistics.median(vals)
    if len(vals) == 1:
        return format(med, spec)
    return f"{med:{spec}} [{min(vals):{spec}}-{max(vals):{spec}}]"


def collect(records: list[dict]) -> Stats:
    """(system, config, case) -> per-run value: median over workers of each worker's median."""
    per_run: dict[tuple[str, str, str], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        v = r["wall"] if r["case"] == "launch" else r["median"]
        per_run[(r["system"], r["config"], r["case"])][r["run"]].append(v)
    out: Stats = {}
    for key, runs in per_run.items():
        if key[2] == "launch" or key[0] == "membw":   # the job is up when every worker has pulled,
            # the bound's copies are done when every core's are: max over processes
            out[key] = {run: max(v) for run, v in runs.items()}
        elif key[2] == EMBEDDING:   # the median of the ranks' steps/s, as seconds per step
            out[key] = {run: 1 / statistics.median(1 / t for t in v) for run, v in runs.items()}
        else:
            out[key] = {run: statistics.median(v) for run, v in runs.items()}
    return out


def mibs(seconds: float, nbytes: int) -> float:
    return nbytes / seconds / MiB


def ratios(a: dict[int, float], b: dict[int, float], f: Callable[[float], float] = lambda t: t) -> list[float]:
    """f(a[run]) / f(b[run]) for every run both have."""
    return [f(a[r]) / f(b[r]) for r in sorted(a) if r in b]


def print_table(hdr: tuple[str, ...], rows: list[tuple[str, ...]], print_fn: PrintFn = print) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(hdr, *rows, strict=False)]

    def line(r: tuple[str, ...]) -> str:
        return "| " + " | ".join(str(x).ljust(w) for x, w in zip(r, widths, strict=False)) + " |"
    print_fn(line(hdr))
    print_fn("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print_fn(line(r))


def dense_table(stats: Stats, cases: list[Case], configs: list[tuple[int, int]], print_fn: PrintFn = print,
                psnode: str = "psnode") -> list[dict]:
    dense = [c for c in cases if c.kind == "dense" and c.name != "densetable"]
    if not dense:
        return []
    hdr = ("case", "W,S", "psnode MiB/s", "MXNet MiB/s", "raw zmq MiB/s", "gloo MiB/s", "bare PS MiB/s",
           "MXNet/psnode (time)", "psnode/zmq", "psnode/gloo", "psnode/bare")
    rows = []
    for c in dense:
        nb = 2 * c.keys * c.nbytes
        z = stats.get(("zmq", "1,1", c.name), {})
        g = stats.get(("gloo", "2", c.name), {})
        sub = [("", lambda t, nb=nb: mibs(t, nb), ".0f", lambda t: 1 / t)]
        if c.name == "1x4KiB":
            sub.append((" round us", lambda t: t * 1e6, ".0f", lambda t: t))
        for suffix, conv, spec, rf in sub:
            for W, S in configs:
                cfg = f"{W},{S}"
                p = stats.get((psnode, cfg, c.name), {})
                m = stats.get(("mxnet", cfg, c.name), {})
                b = stats.get(("bare", cfg, c.name), {})
                rows.append((c.name + suffix, cfg, *(fmt_range([conv(v) for v in x.values()], spec)
                                                     for x in (p, m, z, g, b)),
                             fmt_range(ratios(m, p), ".2f"),
                             *(fmt_range(ratios(p, x, rf), ".2f") for x in (z, g, b))))
    print_fn("\nDense push+pull, per-worker MiB/s (4 KiB also as round time in us).  median [min-max] over\n"
             "runs; ratios are per run.  MXNet/psnode (time): MXNet's round time / psnode's, above 1 =\n"
             "psnode faster.  psnode/X: throughput ratios (for the us rows time ratios: > 1 = psnode slower).\n"
             "bare PS: pyzmq + numpy parameter server, same W,S and placement (ceiling for big keys).")
    print_table(hdr, rows, print_fn)
    return [dict(zip(hdr, r, strict=False)) for r in rows]


def sparse_table(stats: Stats, configs: list[tuple[int, int]], print_fn: PrintFn = print,
                 psnode: str = "psnode") -> list[dict]:
    if not any(k[2] in ("rowsparse1%", "densetable") for k in stats):
        return []
    hdr = ("W,S", "row_sparse 1% ms/round", "dense table ms/round", "dense/sparse", "sparse MiB/s",
           "MXNet row_sparse ms", "MXNet dense table ms", "MXNet/psnode (time)",
           "bare PS row_sparse ms", "bare PS dense table ms", "psnode/bare (time)")
    rows = []
    for W, S in configs:
        cfg = f"{W},{S}"

        def get(system: str, case: str, cfg: str = cfg) -> dict[int, float]:
            return stats.get((system, cfg, case), {})
        s, d = get(psnode, "rowsparse1%"), get(psnode, "densetable")
        ms, md = get("mxnet", "rowsparse1%"), get("mxnet", "densetable")
        bs, bd = get("bare", "rowsparse1%"), get("bare", "densetable")

        def msec(x: dict[int, float], spec: str = ".2f") -> str:
            return fmt_range([v * 1e3 for v in x.values()], spec)
        rows.append((cfg, msec(s), msec(d, ".1f"), fmt_range(ratios(d, s), ".1f"),
                     fmt_range([mibs(v, SPARSE_BYTES) for v in s.values()]),
                     msec(ms), msec(md, ".1f"), fmt_range(ratios(ms, s), ".2f"),
                     msec(bs), msec(bd, ".1f"), fmt_range(ratios(s, bs), ".2f")))
    print_fn("\nRow-sparse: table 200,000 x 64 float32, every worker pushes 1% random rows (fresh each\n"
             "round) and row_sparse-pulls them; vs dense push+pull of the whole table; the same for MXNet\n"
             "(server SGD lr -1, lazy_update) and the bare PS (its dense table is a flat key of the same size).")
    print_table(hdr, rows, print_fn)
    return [dict(zip(hdr, r, strict=False)) for r in rows]


def launch_table(stats: Stats, print_fn: PrintFn = print) -> list[dict]:
    launch = sorted(k for k in stats if k[2] == "launch")
    if not launch:
        return []
    hdr = ("launch to first pull", "W,S", "seconds")
    rows = [(k[0], k[1], fmt_range(list(stats[k].values()), ".2f")) for k in launch]
    summary = [dict(zip(hdr, r, strict=False)) for r in rows]
    g = stats.get(("gloo", "2", "launch"))
    for k in launch:
        if k[0] != "gloo" and g:
            rows.append((f"{k[0]}/gloo", k[1], fmt_range(ratios(stats[k], g), ".2f")))
    print_fn("\nLaunch to first completed pull (max over workers; gloo: first all_reduce).")
    print_table(hdr, rows, print_fn)
    return summary


# ---------------------------------------------------------------- memory bound
BOUND_GOAL = 1.3   # the 16 MiB W2S2 round within this multiple of the memory bound
EMBEDDING_GOAL = 1.3   # psnode's embedding workload at least this multiple of DDP's steps/s


def bound_table(stats: Stats, cases: list[Case], configs: list[tuple[int, int]], print_fn: PrintFn = print,
                psnode: str = "psnode") -> list[dict]:
    """psnode's round against the memory bound (system ``membw``), per dense case and config."""
    if not any(k[0] == "membw" for k in stats):
        return []
    hdr = ("case", "W,S", "psnode round ms", "memory bound ms", "psnode/bound (time)")
    rows = []
    for c in cases:
        if c.kind != "dense" or c.name == "densetable":
            continue
        for W, S in configs:
            p, b = stats.get((psnode, f"{W},{S}", c.name), {}), stats.get(("membw", f"{W},{S}", c.name), {})
            rows.append((c.name, f"{W},{S}", fmt_range([v * 1e3 for v in p.values()], ".2f"),
                         fmt_range([v * 1e3 for v in b.values()], ".2f"), fmt_range(ratios(p, b), ".2f")))
    print_fn("\nMemory bound: a same-host round copies the model at least 3W times (each worker's gradient\n"
             "in, the servers' sum reading it, the result out); the bound is those copies, each between\n"
             "arrays of its own, shared out over every core at once with no waiting (max over cores).\n"
             "psnode/bound: per run, 1 = the bound.")
    print_table(hdr, rows, print_fn)
    return [dict(zip(hdr, r, strict=False)) for r in rows]


# ---------------------------------------------------------------- targets
def target_values(stats: Stats, system: str, cfg: str) -> list[tuple[str, float, list[float] | None]]:
    """[(target, goal, per-run values or None when not measured)] for ``system`` at ``cfg``.
    Each value is "higher is better" and meets the target when >= goal."""
    def get(sys_: str, case: str, config: str = cfg) -> dict[int, float]:
        return stats.get((sys_, config, case), {})
    out: list[tuple[str, float, list[float] | None]] = []
    for case in MXNET_CASES:
        mine, mx = get(system, case), get("mxnet", case)
        out.append((f"{case}: MXNet time / {system} time >= 2", 2.0, ratios(mx, mine) if mine and mx else None))
    mine, g = get(system, "1x16MiB"), get("gloo", "1x16MiB", "2")
    out.append((f"1x16MiB: gloo all_reduce time / {system} time >= 1", 1.0,
                ratios(g, mine) if mine and g else None))
    bound = get("membw", "1x16MiB")
    out.append((f"1x16MiB: memory bound / {system} time >= {1 / BOUND_GOAL:.2f} (within {BOUND_GOAL}x)",
                1 / BOUND_GOAL, ratios(bound, mine) if mine and bound else None))
    mine, ddp = get(system, EMBEDDING), get(DDP, EMBEDDING, DDP_CONFIG)
    out.append((f"embedding: {system} steps/s / DDP steps/s >= {EMBEDDING_GOAL}", EMBEDDING_GOAL,
                ratios(ddp, mine) if mine and ddp else None))
    small, big = get(system, "200x16KiB"), get(system, "16x1MiB")
    # throughput ratio: (bytes_small / t_small) / (bytes_big / t_big)
    rel = 200 * 16384 / (16 * MiB)
    out.append(("200x16KiB MiB/s / 16x1MiB MiB/s >= 0.8", 0.8,
                [x * rel for x in ratios(big, small)] if small and big else None))
    return out


def targets(stats: Stats, print_fn: PrintFn = print, psnode: str = "psnode") -> list[dict]:
    """The issue's targets: the goal at W2S2, the same figures shown for W1S1 and W2S1."""
    configs = [c for c in TARGET_CONFIGS if any(k[0] == psnode and k[1] == c for k in stats)]
    if not configs:
        return []
    table = {cfg: target_values(stats, psnode, cfg) for cfg in configs}
    names = [t for t, _, _ in table[configs[0]]]
    hdr = ("W2S2", "target (the goal at W2S2)", *(f"W{c.replace(',', 'S')}" for c in configs))
    rows, out, unmeasured = [], [], []
    for i, name in enumerate(names):
        goal = table[configs[0]][i][1]
        per_cfg = {cfg: table[cfg][i][2] for cfg in configs}
        if not any(per_cfg.values()):
            unmeasured.append(name.rsplit(" >=", 1)[0])
            continue
        at_goal = per_cfg.get(GOAL_CONFIG)
        verdict = "-" if not at_goal else "PASS" if statistics.median(at_goal) >= goal else "MISS"
        rows.append((verdict, name, *(fmt_range(v, ".2f") if v else "-" for v in per_cfg.values())))
        out.append({"target": name, "goal": goal, "pass": verdict == "PASS",
                    **{cfg: (statistics.median(v) if v else None) for cfg, v in per_cfg.items()}})
    print_fn("\nTargets (per worker, same run; a ratio at or above the goal meets it; PASS/MISS at W2S2):")
    if rows:
        print_table(hdr, rows, print_fn)
    if unmeasured:
        print_fn(f"  not measured in this run (a system or case was not run): {'; '.join(unmeasured)}")
    return out


def bare_ceilings(stats: Stats, print_fn: PrintFn = print) -> list[dict]:
    """Does the bare PS itself reach each target at W=2, S=2?  A target the bare PS misses by far
    is above what a Python PS over ZeroMQ TCP reaches on this machine."""
    out = []
    for name, goal, vals in target_values(stats, "bare", GOAL_CONFIG):
        if not vals:
            continue
        med = statistics.median(vals)
        ok = med >= goal
        print_fn(f"  bare PS at W2S2: {name}: {med:.2f} "
                 f"({'the bare PS reaches it' if ok else 'the bare PS misses it'})")
        out.append({"target": name, "measured": med, "bare_reaches": ok})
    return out


# ---------------------------------------------------------------- the speed goals
def embedding_table(stats: Stats, print_fn: PrintFn = print, psnode: str = "psnode") -> list[dict]:
    """The embedding workload: psnode's and DDP's steps/s and their ratio, each per run."""
    mine, ddp = stats.get((psnode, GOAL_CONFIG, EMBEDDING), {}), stats.get((DDP, DDP_CONFIG, EMBEDDING), {})
    if not mine and not ddp:
        return []
    hdr = ("embedding, W=2", "psnode steps/s", "DDP steps/s", "psnode/DDP steps/s")
    row = ("steps/s, median [min-max]", *(fmt_range([1 / t for t in x.values()], ".1f") for x in (mine, ddp)),
           fmt_range(ratios(ddp, mine), ".2f"))
    rows = [row] + [(f"run {run + 1}", f"{1 / mine[run]:.1f}" if run in mine else "-",
                     f"{1 / ddp[run]:.1f}" if run in ddp else "-",
                     f"{ddp[run] / mine[run]:.2f}" if run in mine and run in ddp else "-")
                    for run in sorted(set(mine) | set(ddp))]
    print_fn("\nEmbedding workload (W=2; psnode S=2, the table on the servers; DDP + gloo, the table on every\n"
             "rank): steps/s, the median over ranks; psnode/DDP per run (above 1: psnode faster).")
    print_table(hdr, rows, print_fn)
    return [dict(zip(hdr, r, strict=True)) for r in rows]


def speed_goals(stats: Stats, print_fn: PrintFn = print, psnode: str = "psnode") -> list[dict]:
    """The two speed goals, each from per-run ratios: the 1x16MiB W2S2 round over the memory bound
    (time; at most BOUND_GOAL) and psnode's embedding steps/s over DDP's (at least EMBEDDING_GOAL).
    Per goal: every run's value, their median, min and max, and whether the median meets it;
    a goal whose systems did not both run is left out."""
    p, b = stats.get((psnode, GOAL_CONFIG, "1x16MiB"), {}), stats.get(("membw", GOAL_CONFIG, "1x16MiB"), {})
    e, d = stats.get((psnode, GOAL_CONFIG, EMBEDDING), {}), stats.get((DDP, DDP_CONFIG, EMBEDDING), {})
    goals = [("1x16MiB W2S2: psnode round / memory bound", f"<= {BOUND_GOAL}", ratios(p, b),
              lambda m: m <= BOUND_GOAL),
             ("embedding W2S2: psnode steps/s / DDP steps/s", f">= {EMBEDDING_GOAL}", ratios(d, e),
              lambda m: m >= EMBEDDING_GOAL)]
    out, rows = [], []
    for name, goal, vals, meets in goals:
        if not vals:
            continue
        med = statistics.median(vals)
        out.append({"goal": name, "wanted": goal, "per_run": vals, "median": med, "min": min(vals),
                    "max": max(vals), "runs": len(vals), "met": meets(med)})
        rows.append(("MET" if meets(med) else "MISSED", name, goal, fmt_range(vals, ".2f"),
                     ", ".join(f"{v:.2f}" for v in vals)))
    if rows:
        print_fn("\nThe speed goals (per-run ratios; met when the median over runs is on the goal's side):")
        print_table(("", "goal", "wanted", "median [min-max]", "per run"), rows, print_fn)
    return out


# ---------------------------------------------------------------- modes (launch flags, SSH testbed)
def modes_table(stats: Stats, modes: list[str], cases: list[Case], configs: list[tuple[int, int]],
                print_fn: PrintFn = print) -> list[dict]:
    """One row per case and config, one column per mode (system ``psnode:<mode>``): round time
    and per-worker MiB/s; then each mode's round time over the first mode's (per run)."""
    first = modes[0]
    hdr = ("case", "W,S", *(f"{m} ms" for m in modes), *(f"{m} MiB/s" for m in modes),
           *(f"{m}/{first} (time)" for m in modes[1:]))
    rows = []
    for c in cases:
        if c.kind != "dense":
            continue
        nb = 2 * c.keys * c.nbytes
        for W, S in configs:
            cfg = f"{W},{S}"
            per = [stats.get((f"psnode:{m}", cfg, c.name), {}) for m in modes]
            rows.append((c.name, cfg, *(fmt_range([v * 1e3 for v in x.values()], ".2f") for x in per),
                         *(fmt_range([mibs(v, nb) for v in x.values()]) for x in per),
                         *(fmt_range(ratios(x, per[0]), ".2f") for x in per[1:])))
    print_fn(f"\npsnode by launch mode (mxdist launch flags; ratios per run, above 1 = slower than {first}):")
    print_table(hdr, rows, print_fn)
    return [dict(zip(hdr, r, strict=False)) for r in rows]
