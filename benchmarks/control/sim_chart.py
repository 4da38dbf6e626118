"""The control plane's figures against the node count, as an SVG (no plotting library needed).

    python benchmarks/control/simulate.py --json /tmp/relay.json               # 100, 1000, 10000 workers
    python benchmarks/control/simulate.py --no-relay --json /tmp/direct.json
    python benchmarks/control/sim_chart.py /tmp/relay.json /tmp/direct.json --out docs/control_plane.svg

One panel per figure of :mod:`benchmarks.control.simulate` (the scheduler's CPU at rest, the
barrier, the start, a lost host's detection, the status answer, the scheduler's state), each
against the workers on a log scale, one line per file given (with and without the hosts'
relays), and the issue's goal at 10,000 workers as a dashed red line where it has one.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

#: (result key, title, scale to the unit shown, the goal in that unit or None)
PANELS = (("cpu_idle_share", "scheduler CPU at rest, % of a core", 100.0, 25.0),
          ("barrier_ms", "barrier, last arrival to last answer, ms (median of 5)", 1.0, 100.0),
          ("start_s", "first REGISTER to the job's start, s", 1.0, 30.0),
          ("detect_host_s", "a lost host named, s (timeout 5 s)", 1.0, 10.0),
          ("status_s", "mxdist status answered, s", 1.0, 2.0),
          ("scheduler_state_mb", "scheduler state, MiB", 1.0, None))
COLORS = ("#1f77b4", "#e67e22", "#2ca02c", "#9467bd")
W, PH, PW, L, T = 820, 150, 330, 60, 40   # width, panel height and width, left margin, top


def series(doc: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """A simulate.py --json document: its label (relay or not) and its results by size."""
    results = sorted(doc["results"], key=lambda r: r["workers"])
    if not results:
        raise ValueError("no results in the file")
    return ("relays" if results[0].get("relay") else "no relays"), results


def svg(docs: list[dict[str, Any]]) -> str:
    """The chart of ``docs`` (each a simulate.py --json document)."""
    lines = [series(d) for d in docs]
    sizes = sorted({r["workers"] for _, rs in lines for r in rs})
    xr = (math.log10(sizes[0]), math.log10(sizes[-1])) if len(sizes) > 1 else (0.0, math.log10(sizes[0]) + 1)
    rows = (len(PANELS) + 1) // 2
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{T + rows * (PH + 60) + 10}" '
             'font-family="sans-serif" font-size="11">', '<rect width="100%" height="100%" fill="white"/>',
             f'<text x="{L}" y="18" font-size="13">psnode control plane, real scheduler and simulated nodes '
             '(one server per 10 workers, 8 processes a host)</text>']
    for k, (label, _) in enumerate(lines):
        parts.append(f'<text x="{L + 520 + 110 * k}" y="34" fill="{COLORS[k % len(COLORS)]}">&#9632; {label}</text>')
    for i, (key, title, scale, goal) in enumerate(PANELS):
        x0, y0 = L + (i % 2) * (PW + L + 20), T + (i // 2) * (PH + 60) + 20
        ys = [scale * r[key] for _, rs in lines for r in rs if r.get(key) is not None] + ([goal] if goal else [])
        hi = max(ys or [1.0]) * 1.1 or 1.0
        parts.append(f'<text x="{x0}" y="{y0 - 6}" font-size="12">{title}</text>')
        parts.append(f'<rect x="{x0}" y="{y0}" width="{PW}" height="{PH}" fill="none" stroke="#999"/>')
        for t in (hi * j / 4 for j in range(5)):
            y = y0 + PH - t / hi * PH
            parts.append(f'<line x1="{x0}" x2="{x0 + PW}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
            parts.append(f'<text x="{x0 - 4}" y="{y + 4:.1f}" text-anchor="end">{t:.3g}</text>')
        for n in sizes:
            x = x0 + (math.log10(n) - xr[0]) / (xr[1] - xr[0]) * PW
            parts.append(f'<text x="{x:.1f}" y="{y0 + PH + 14}" text-anchor="middle">{n:,}</text>')
        if goal:
            y = y0 + PH - goal / hi * PH
            parts.append(f'<line x1="{x0}" x2="{x0 + PW}" y1="{y:.1f}" y2="{y:.1f}" stroke="#c00" '
                         'stroke-dasharray="6,3"/>')
            parts.append(f'<text x="{x0 + PW - 4}" y="{y - 4:.1f}" text-anchor="end" fill="#c00">goal</text>')
        for k, (_, rs) in enumerate(lines):
            pts = [(x0 + (math.log10(r["workers"]) - xr[0]) / (xr[1] - xr[0]) * PW,
                    y0 + PH - scale * r[key] / hi * PH) for r in rs if r.get(key) is not None]
            color = COLORS[k % len(COLORS)]
            parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="'
                         + " ".join(f"{x:.1f},{y:.1f}" for x, y in pts) + '"/>')
            parts.extend(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}"/>' for x, y in pts)
        parts.append(f'<text x="{x0 + PW / 2}" y="{y0 + PH + 28}" text-anchor="middle">workers</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="simulate.py --json files (one line each)")
    ap.add_argument("--out", required=True, help="the SVG file to write")
    a = ap.parse_args(argv)
    docs = []
    for name in a.runs:
        try:
            docs.append(json.loads(Path(name).read_text()))
            series(docs[-1])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"sim_chart: {name}: not a simulate.py --json file ({exc})", file=sys.stderr)
            return 2
    Path(a.out).write_text(svg(docs))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
