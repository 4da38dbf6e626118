"""Draw one chart from a ``benchmarks/kvstore/run.py --json FILE`` run: psnode against a peer, per case;
or, from a ``benchmarks/training/embedding.py --json FILE`` run, psnode's tables on the servers against
DDP + gloo per table size (:func:`embedding_series`, :func:`draw_embedding`); or, from a
``benchmarks/network/clusterbench.py --json FILE`` run, the four-host cluster's designs per case
(:func:`cluster_series`, :func:`draw_cluster`).

    python benchmarks/chart.py RUN.json --out docs/performance.png
    python benchmarks/chart.py RUN.json --out chart.png --config 2,1 --peer zmq,gloo
    python benchmarks/chart.py EMBEDDING.json --out docs/embedding.png
    python benchmarks/chart.py CLUSTER.json --out docs/cluster.png

Left panel: the round time of every case the run measured at one W,S configuration (default
2,2), psnode beside each peer, median over the run's interleaved runs with the [min-max] range.
Right panel: each peer's round time over psnode's, computed per run (above 1: psnode faster),
median [min-max], with the run's target for MXNet (2x) drawn when MXNet is charted.

Peers: ``mxnet`` when the run has it (same W,S), else those of ``zmq``, ``gloo`` and ``bare``
it has (raw zmq is one client and one echo server, gloo two ranks: the same on every W,S row of
the run's tables).  Statistics come from :mod:`benchmarks.report` (the numbers the run printed).

Needs matplotlib (``pip install -e '.[bench]'``); :func:`series` is pure and needs nothing.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import report  # noqa: E402
from benchmarks.cases import ALL  # noqa: E402

PEER_ORDER = ("mxnet", "zmq", "gloo", "bare")
PEER_LABEL = {"mxnet": "MXNet 1.9.1 dist_sync", "zmq": "raw pyzmq (transport only)",
              "gloo": "torch gloo all_reduce", "bare": "bare PS (pyzmq + numpy)"}
PEER_CONFIG = {"zmq": "1,1", "gloo": "2"}     # config-independent peers: the key their records carry
MXNET_GOAL = 2.0                              # the run's target: MXNet time / psnode time >= 2


@dataclass(frozen=True)
class Spread:
    """Median and range of per-run values."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        return cls(statistics.median(values), min(values), max(values))


@dataclass(frozen=True)
class Series:
    """What the chart shows: per case, psnode's round time, each peer's, and peer/psnode."""

    config: str
    runs: int
    system: str
    peers: tuple[str, ...]
    cases: tuple[str, ...]
    seconds: dict[str, dict[str, Spread]]     # system -> case -> round time (s)
    ratio: dict[str, dict[str, Spread]]       # peer -> case -> peer time / psnode time (per run)


def series(doc: dict, config: str = "2,2", peers: list[str] | None = None, system: str = "psnode") -> Series:
    """The chart's data from a run.py JSON document (pure).  Raises ValueError when the run has
    no psnode figures at ``config`` or none of the peers asked for."""
    stats = report.collect(doc["records"])
    cases = [c for c in ALL if (system, config, c) in stats]
    if not cases:
        have = sorted({k[1] for k in stats if k[0] == system})
        raise ValueError(f"no {system} figures at W,S={config} in this run (it has: {', '.join(have) or 'none'})")

    def key(peer: str, case: str) -> tuple[str, str, str]:
        return (peer, PEER_CONFIG.get(peer, config), case)

    present = [p for p in PEER_ORDER if any(key(p, c) in stats for c in cases)]
    default = ["mxnet"] if "mxnet" in present else present
    chosen = default if peers is None else [p for p in peers if p in present]
    if not chosen:
        raise ValueError(f"none of the peers {peers or list(PEER_ORDER)} ran at W,S={config} in this run")
    seconds: dict[str, dict[str, Spread]] = {system: {c: Spread.of(list(stats[(system, config, c)].values()))
                                                      for c in cases}}
    ratio: dict[str, dict[str, Spread]] = {}
    for p in chosen:
        seconds[p], ratio[p] = {}, {}
        for c in cases:
            if key(p, c) in stats:
                seconds[p][c] = Spread.of(list(stats[key(p, c)].values()))
                per_run = report.ratios(stats[key(p, c)], stats[(system, config, c)])
                if per_run:
                    ratio[p][c] = Spread.of(per_run)
    runs = len({r["run"] for r in doc["records"]})
    return Series(config, runs, system, tuple(chosen), tuple(cases), seconds, ratio)


def describe(doc: dict) -> str:
    """One line about where the run ran (from the JSON's own fields)."""
    argv = " ".join(doc.get("argv", [])[1:])
    return (f"python {doc.get('python', '?')} on {doc.get('cpus', '?')} CPUs, data path {doc.get('path', '?')}, "
            f"cpu policy {doc.get('cpu_policy', '?')}; run.py {argv}".strip())


def draw(s: Series, out: Path, note: str = "") -> None:
    """Write the PNG (matplotlib, Agg backend)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = (s.system, *s.peers)
    colours = {s.system: "#1f77b4", "mxnet": "#d62728", "zmq": "#7f7f7f", "gloo": "#ff7f0e", "bare": "#2ca02c"}
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.2), gridspec_kw={"width_ratios": [3, 2]})
    n, width = len(s.cases), 0.8 / len(systems)
    for i, name in enumerate(systems):
        xs, ms, lo, hi = [], [], [], []
        for j, case in enumerate(s.cases):
            sp = s.seconds[name].get(case)
            if sp is None:
                continue
            xs.append(j + (i - (len(systems) - 1) / 2) * width)
            ms.append(sp.median * 1e3)
            lo.append((sp.median - sp.low) * 1e3)
            hi.append((sp.high - sp.median) * 1e3)
        label = "psnode" if name == s.system else PEER_LABEL[name]
        left.bar(xs, ms, width, yerr=[lo, hi], capsize=3, label=label, color=colours.get(name, "#9467bd"))
    left.set_yscale("log")
    left.set_xticks(range(n), s.cases)
    left.set_ylabel("round time, ms (log scale; lower is better)")
    left.set_title(f"push + pull round per worker, W{s.config.replace(',', 'S')}")
    left.legend(loc="upper left", fontsize=9)
    left.grid(axis="y", which="both", alpha=0.3)

    rwidth = 0.8 / len(s.peers)
    for i, peer in enumerate(s.peers):
        cases = [c for c in s.cases if c in s.ratio[peer]]
        xs = [s.cases.index(c) + (i - (len(s.peers) - 1) / 2) * rwidth for c in cases]
        sp = [s.ratio[peer][c] for c in cases]
        bars = right.bar(xs, [x.median for x in sp], rwidth, color=colours.get(peer, "#9467bd"),
                         yerr=[[x.median - x.low for x in sp], [x.high - x.median for x in sp]], capsize=3,
                         label=f"{PEER_LABEL[peer]} time / psnode time")
        right.bar_label(bars, labels=[f"{x.median:.1f}x" for x in sp], label_type="center", fontsize=8,
                        color="white", fontweight="bold")
    right.axhline(1.0, color="black", linewidth=0.8)
    if "mxnet" in s.peers:
        right.axhline(MXNET_GOAL, color="#d62728", linestyle="--", linewidth=1, label="target vs MXNet: 2x")
    right.set_xticks(range(n), s.cases, rotation=30, ha="right")
    right.set_ylabel("peer's time / psnode's (above 1: psnode faster)")
    right.set_title("speed-up, per run: median [min-max]")
    right.legend(loc="upper left", fontsize=8)
    right.grid(axis="y", alpha=0.3)
    left.tick_params(axis="x", labelrotation=30)
    fig.suptitle(f"psnode vs {', '.join(PEER_LABEL[p] for p in s.peers)}: {s.runs} interleaved runs, "
                 f"median [min-max]", fontsize=12)
    if note:
        fig.text(0.5, 0.01, note, ha="center", fontsize=8, color="#444444")
    fig.tight_layout(rect=(0, 0.04, 1, 0.95))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


@dataclass
class EmbeddingSeries:
    """Per table size (``rows``, ascending): psnode's steps/s over DDP's, computed per run, and
    the peak MiB per worker of each system (max over ranks), median [min-max] over runs."""

    rows: list[int]
    speed: dict[int, Spread]
    peak: dict[str, dict[int, Spread]]


def embedding_series(doc: dict) -> EmbeddingSeries:
    """The figures of one ``embedding.py --json`` run (pure; the statistics are embedding.py's)."""
    from benchmarks.training import embedding as emb
    records = doc.get("records") or []
    rows = sorted({r["rows"] for r in records if r["system"] == emb.PSNODE} &
                  {r["rows"] for r in records if r["system"] == emb.DDP})
    if not rows:
        raise ValueError("no table size measured on both psnode and DDP (not an embedding.py --json file?)")
    speed, peak = {}, {emb.PSNODE: {}, emb.DDP: {}}
    for n in rows:
        ddp = emb._per_run(records, emb.DDP, n, "steps_per_s")
        ps = emb._per_run(records, emb.PSNODE, n, "steps_per_s")
        speed[n] = Spread.of([ps[r] / ddp[r] for r in sorted(ps) if r in ddp])
        for system in peak:
            peak[system][n] = Spread.of(list(emb._per_run(records, system, n, "peak_mib", max).values()))
    return EmbeddingSeries(rows, speed, peak)


def draw_embedding(s: EmbeddingSeries, out: Path, note: str = "") -> None:
    """Left: psnode's steps/s over DDP's per table size (the 1x line); right: peak MiB per worker."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from benchmarks.training import embedding as emb
    labels = [f"{n / 1e6:g} M rows" for n in s.rows]
    x = list(range(len(s.rows)))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    med = [s.speed[n].median for n in s.rows]
    err = [[m - s.speed[n].low for m, n in zip(med, s.rows, strict=True)],
           [s.speed[n].high - m for m, n in zip(med, s.rows, strict=True)]]
    left.bar(x, med, 0.5, yerr=err, capsize=4, color="tab:blue")
    left.axhline(1.0, color="black", lw=1)
    for i, m in enumerate(med):
        left.text(i, m / 2, f"{m:.2f}x", ha="center", color="white", weight="bold")
    left.set(xticks=x, xticklabels=labels, ylabel="psnode steps/s / DDP's (above 1: psnode faster)",
             title="training speed, per run: median [min-max]")
    for k, (system, color) in enumerate(((emb.PSNODE, "tab:blue"), (emb.DDP, "tab:red"))):
        vals = [s.peak[system][n].median for n in s.rows]
        pos = [i + (k - 0.5) * 0.38 for i in x]
        right.bar(pos, vals, 0.38, color=color, label=f"{system} (table on the servers)" if k == 0 else
                  f"{system} (table on every rank)")
        for p_, v in zip(pos, vals, strict=True):
            right.text(p_, v, f"{v:.0f}", ha="center", va="bottom", fontsize=8)
    right.set(xticks=x, xticklabels=labels, ylabel="peak MiB per worker (max over ranks)",
              title="worker memory")
    right.legend(loc="upper left", fontsize=8)
    fig.suptitle("embedding tables (EmbeddingBag, 16 dims, AdaGrad), W=2 S=2: psnode vs DDP + gloo")
    if note:
        fig.text(0.5, 0.01, note, ha="center", fontsize=8, color="dimgray")
    fig.tight_layout(rect=(0, 0.04, 1, 0.95))
    fig.savefig(out, dpi=110)
    plt.close(fig)


CLUSTER_LABEL = {"psnode-dedicated": "psnode, servers on hosts of their own",
                 "psnode-colocated": "psnode, servers on the workers' hosts",
                 "gloo": "torch gloo all_reduce (ring)", "tcp-mesh": "raw TCP, a PS's traffic"}
CLUSTER_COLOR = {"psnode-dedicated": "#1f77b4", "psnode-colocated": "#9ecae1", "gloo": "#d62728",
                 "tcp-mesh": "#bbbbbb"}


@dataclass(frozen=True)
class ClusterSeries:
    """Per case and design: the round time, the links' bound, and gloo's time over the design's."""

    cases: list[str]
    designs: list[str]
    round_s: dict[str, dict[str, Spread]]
    bound_s: dict[str, dict[str, float]]
    over_gloo: dict[str, dict[str, Spread]]
    rate: str
    goal: float


def cluster_series(doc: dict) -> ClusterSeries:
    """The figures of one ``clusterbench.py --json`` run (pure); ratios per run, then median."""
    from benchmarks.network import clusterbench as cb
    summ = doc["summary"]
    cases = list(summ["cases"])
    if not cases:
        raise ValueError("no case measured (not a clusterbench.py --json file?)")
    designs = [d for d in cb.DESIGNS if any(d in summ["cases"][c] for c in cases)]
    rounds = {c: {d: Spread.of(v["round_s"]) for d, v in summ["cases"][c].items()} for c in cases}
    bounds = {c: {d: v["bound_s"] for d, v in summ["cases"][c].items()} for c in cases}
    over: dict[str, dict[str, Spread]] = {}
    for c in cases:
        g = summ["cases"][c].get("gloo")
        if g:
            over[c] = {d: Spread.of([a / b for a, b in zip(g["round_s"], v["round_s"], strict=False)])
                       for d, v in summ["cases"][c].items()}
    return ClusterSeries(cases, designs, rounds, bounds, over, summ["rate"], cb.SPEEDUP_GOAL)


def draw_cluster(s: ClusterSeries, out: Path, note: str = "") -> None:
    """Left: round time per case and design ([min-max] bars) with each design's bound (black
    tick); right: gloo's round time over each design's (above 1: faster than the ring)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    width = 0.8 / len(s.designs)
    for i, d in enumerate(s.designs):
        xs = [k + (i - (len(s.designs) - 1) / 2) * width for k in range(len(s.cases))]
        sp = [s.round_s[c].get(d) for c in s.cases]
        ys = [x.median if x else 0 for x in sp]
        err = [[(x.median - x.low) if x else 0 for x in sp], [(x.high - x.median) if x else 0 for x in sp]]
        left.bar(xs, ys, width * 0.95, yerr=err, capsize=3, color=CLUSTER_COLOR[d], label=CLUSTER_LABEL[d])
        for x, c in zip(xs, s.cases, strict=True):
            if d in s.bound_s[c]:
                left.plot([x - width / 2, x + width / 2], [s.bound_s[c][d]] * 2, color="black", lw=1.5)
        if d != "gloo" and s.over_gloo:
            rs = [s.over_gloo.get(c, {}).get(d) for c in s.cases]
            lo = [(r.median - r.low) if r else 0 for r in rs]
            hi = [(r.high - r.median) if r else 0 for r in rs]
            right.bar(xs, [r.median if r else 0 for r in rs], width * 0.95, color=CLUSTER_COLOR[d],
                      yerr=[lo, hi], capsize=3, label=CLUSTER_LABEL[d])
    left.set_xticks(range(len(s.cases)), s.cases)
    left.set_ylabel("round time, s (black: what the links allow)")
    left.legend(fontsize=8)
    right.set_xticks(range(len(s.cases)), s.cases)
    right.axhline(1.0, color="#d62728", lw=1, label="gloo's ring")
    right.axhline(s.goal, color="black", ls="--", lw=1, label=f"goal {s.goal}x")
    right.axhline(1.5, color="grey", ls=":", lw=1, label="ideal at 4 workers, 1.5x")
    right.set_ylabel("gloo's round time / this design's (above 1: faster)")
    right.set_ylim(0, 1.9)
    right.legend(fontsize=8, loc="upper left", ncol=2)
    fig.suptitle(f"4 workers on 4 hosts, one switch, every port {s.rate} both ways: parameter server vs ring")
    if note:
        fig.text(0.01, 0.01, note, fontsize=7, color="grey")
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", type=Path, help="the JSON file of benchmarks/kvstore/run.py --json")
    ap.add_argument("--out", type=Path, required=True, help="the PNG to write")
    ap.add_argument("--config", default="2,2", help="the W,S configuration to chart (default 2,2)")
    ap.add_argument("--peer", help="comma list of peers (default: mxnet if the run has it, else every peer it has)")
    ap.add_argument("--system", default="psnode", help="psnode's system name in the run (default psnode)")
    a = ap.parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SystemExit("benchmarks/chart.py needs matplotlib: pip install -e '.[bench]'") from None
    doc = json.loads(a.run.read_text())
    if isinstance(doc.get("summary"), dict) and "workers" in doc["summary"]:   # clusterbench.py
        try:
            cs = cluster_series(doc)
        except (ValueError, KeyError) as exc:
            raise SystemExit(f"{a.run}: {exc}") from None
        draw_cluster(cs, a.out, f"benchmarks/network/clusterbench.py, {doc['summary']['runs']} run(s)")
        for c in cs.cases:
            for d in cs.designs:
                if d in cs.round_s[c]:
                    r, g = cs.round_s[c][d], cs.over_gloo.get(c, {}).get(d)
                    print(f"{c:8s} {d:17s} round {r.median * 1e3:7.0f} ms  bound {cs.bound_s[c][d] * 1e3:6.0f} ms"
                          + (f"  gloo/this {g.median:.2f} [{g.low:.2f}-{g.high:.2f}]" if g else ""))
        print(f"wrote {a.out}")
        return 0
    if str((doc.get("argv") or [""])[0]).endswith("embedding.py"):
        try:
            e = embedding_series(doc)
        except ValueError as exc:
            raise SystemExit(f"{a.run}: {exc}") from None
        draw_embedding(e, a.out, "embedding.py " + " ".join(doc.get("argv", [])[1:]))
        for n in e.rows:
            sp = e.speed[n]
            print(f"{n:>10d} rows psnode/DDP steps/s {sp.median:.2f} [{sp.low:.2f}-{sp.high:.2f}]")
        print(f"wrote {a.out}")
        return 0
    try:
        s = series(doc, a.config, a.peer.split(",") if a.peer else None, a.system)
    except ValueError as exc:
        raise SystemExit(f"{a.run}: {exc}") from None
    draw(s, a.out, describe(doc))
    for peer in s.peers:
        for case, sp in s.ratio[peer].items():
            print(f"{case:12s} {peer}/psnode time {sp.median:.2f} [{sp.low:.2f}-{sp.high:.2f}]")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
