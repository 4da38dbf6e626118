"""benchmarks/report.py: per-run statistics and the issue's targets, from hand-made records."""
from __future__ import annotations

import pytest

from benchmarks import report
from benchmarks.cases import ALL, MiB


def rec(system: str, config: str, case: str, run: int, median: float, rank: int = 0) -> dict:
    return {"system": system, "config": config, "case": case, "run": run, "median": median, "rank": rank}


def test_collect_takes_the_median_over_workers_and_the_max_for_launch() -> None:
    stats = report.collect([rec("psnode", "2,2", "1x1MiB", 0, 1.0), rec("psnode", "2,2", "1x1MiB", 0, 3.0, 1),
                            rec("psnode", "2,2", "1x1MiB", 0, 2.0, 2),
                            {"system": "mxnet", "config": "2,2", "case": "launch", "run": 0, "wall": 2.5},
                            {"system": "mxnet", "config": "2,2", "case": "launch", "run": 0, "wall": 1.5}])
    assert stats[("psnode", "2,2", "1x1MiB")] == {0: 2.0}
    assert stats[("mxnet", "2,2", "launch")] == {0: 2.5}


def test_targets_are_per_run_ratios() -> None:
    records = []
    for run, (p, m) in enumerate(((0.002, 0.005), (0.004, 0.006))):
        records += [rec("psnode", "2,2", "1x1MiB", run, p), rec("mxnet", "2,2", "1x1MiB", run, m)]
    records += [rec("psnode", "2,2", "1x16MiB", 0, 0.020), rec("gloo", "2", "1x16MiB", 0, 0.010)]
    # 200 x 16 KiB moves 3.125 MiB, 16 x 1 MiB 16 MiB: equal round times -> ratio 3.125 / 16
    records += [rec("psnode", "2,2", "200x16KiB", 0, 0.010), rec("psnode", "2,2", "16x1MiB", 0, 0.010)]
    values = {name: (goal, vals) for name, goal, vals in report.target_values(report.collect(records), "psnode", "2,2")}
    assert values["1x1MiB: MXNet time / psnode time >= 2"] == (2.0, [2.5, 1.5])
    assert values["1x16MiB: gloo all_reduce time / psnode time >= 1"] == (1.0, [0.5])
    goal, small = values["200x16KiB MiB/s / 16x1MiB MiB/s >= 0.8"]
    assert goal == 0.8 and small == [pytest.approx(200 * 16384 / (16 * MiB))]
    assert values["1x4KiB: MXNet time / psnode time >= 2"] == (2.0, None)
    lines: list[str] = []
    out = report.targets(report.collect(records), lines.append)
    verdict = {o["target"]: o["pass"] for o in out}
    assert verdict["1x1MiB: MXNet time / psnode time >= 2"] is True      # median of 2.5 and 1.5 is 2.0
    assert verdict["1x16MiB: gloo all_reduce time / psnode time >= 1"] is False
    assert any("not measured in this run" in line and "1x4KiB" in line for line in lines)


def test_fmt_range() -> None:
    assert report.fmt_range([]) == "-"
    assert report.fmt_range([2.0]) == "2"
    assert report.fmt_range([1.0, 3.0, 2.0], ".1f") == "2.0 [1.0-3.0]"


def test_the_memory_bound_is_the_slowest_core_and_its_target_is_a_per_run_ratio() -> None:
    # each core's share of the copies: the bound is done when the slowest core is (max over cores)
    records = [rec("membw", "2,2", "1x16MiB", 0, 0.0030), rec("membw", "2,2", "1x16MiB", 0, 0.0040, 1),
               rec("membw", "2,2", "1x16MiB", 1, 0.0050), rec("membw", "2,2", "1x16MiB", 1, 0.0020, 1),
               rec("psnode", "2,2", "1x16MiB", 0, 0.0050), rec("psnode", "2,2", "1x16MiB", 1, 0.0100)]
    stats = report.collect(records)
    assert stats[("membw", "2,2", "1x16MiB")] == {0: 0.004, 1: 0.005}
    values = {name: (goal, vals) for name, goal, vals in report.target_values(stats, "psnode", "2,2")}
    goal, vals = values["1x16MiB: memory bound / psnode time >= 0.77 (within 1.3x)"]
    assert goal == pytest.approx(1 / 1.3) and vals == [pytest.approx(0.8), pytest.approx(0.5)]
    lines: list[str] = []
    rows = report.bound_table(stats, [ALL["1x16MiB"]], [(2, 2)], lines.append)
    assert rows == [{"case": "1x16MiB", "W,S": "2,2", "psnode round ms": "7.50 [5.00-10.00]",
                     "memory bound ms": "4.50 [4.00-5.00]", "psnode/bound (time)": "1.62 [1.25-2.00]"}]
    out = report.targets(stats, lines.append)
    assert {o["target"]: o["pass"] for o in out}["1x16MiB: memory bound / psnode time >= 0.77 (within 1.3x)"] \
        is False      # median of 0.8 and 0.5
