"""benchmarks/control/sim_chart.py: the control plane's figures against the node count."""
from __future__ import annotations

import json
import re
from pathlib import Path

from benchmarks.control.sim_chart import PANELS, main, svg


def _doc(relay: bool, cpu: float) -> dict:
    return {"results": [{"workers": n, "relay": relay, "cpu_idle_share": cpu * n / 10_000, "barrier_ms": 5.0 + n / 100,
                         "start_s": 2.0, "detect_host_s": 5.5, "status_s": n / 20_000, "scheduler_state_mb": n / 1000}
                        for n in (10_000, 100, 1000)]}


def test_one_line_per_run_three_points_each_and_a_goal_per_panel_that_has_one() -> None:
    out = svg([_doc(True, 0.2), _doc(False, 0.3)])
    assert out.count("<polyline") == 2 * len(PANELS)
    assert out.count("<circle") == 2 * 3 * len(PANELS)
    assert out.count(">goal</text>") == sum(1 for *_, goal in PANELS if goal)
    assert "relays</text>" in out and "no relays</text>" in out
    # the CPU panel: 30% at 10,000 workers (no relays) is the panel's top point, 25% the goal below it
    first = re.search(r'<polyline fill="none" stroke="#e67e22" stroke-width="2" points="([^"]+)"', out)
    assert first is not None
    ys = [float(p.split(",")[1]) for p in first.group(1).split()]
    assert ys == sorted(ys, reverse=True)   # grows with the workers (SVG's y grows downward)


def test_the_command_line_names_a_file_that_is_not_a_run(tmp_path: Path, capsys) -> None:
    good, bad = tmp_path / "a.json", tmp_path / "b.json"
    good.write_text(json.dumps(_doc(True, 0.2)))
    bad.write_text("{}")
    assert main([str(good), str(bad), "--out", str(tmp_path / "c.svg")]) == 2
    assert "b.json: not a simulate.py --json file" in capsys.readouterr().err
    assert main([str(good), "--out", str(tmp_path / "c.svg")]) == 0
    assert (tmp_path / "c.svg").read_text().startswith("<svg")
