"""benchmarks/chart.py: the chart's data from a run.py JSON document (hand-made records)."""
from __future__ import annotations

import pytest

from benchmarks import chart


def rec(system: str, config: str, case: str, run: int, median: float, rank: int = 0) -> dict:
    return {"system": system, "config": config, "case": case, "run": run, "median": median, "rank": rank}


def doc(records: list[dict]) -> dict:
    return {"argv": ["benchmarks/run.py", "--configs", "2,2"], "python": "3.11", "cpus": 2, "path": "same-host",
            "cpu_policy": "batch", "records": records}


RUNS = [rec("psnode", "2,2", "1x1MiB", 0, 0.25), rec("psnode", "2,2", "1x1MiB", 0, 0.75, 1),   # median 0.5
        rec("psnode", "2,2", "1x1MiB", 1, 1.0), rec("mxnet", "2,2", "1x1MiB", 0, 1.5),
        rec("mxnet", "2,2", "1x1MiB", 1, 1.5), rec("psnode", "2,2", "1x4KiB", 0, 0.125),
        rec("psnode", "2,1", "1x4KiB", 0, 0.125), rec("mxnet", "2,1", "1x4KiB", 0, 0.5),
        rec("zmq", "1,1", "1x1MiB", 0, 0.25), rec("gloo", "2", "1x1MiB", 0, 1.0)]


def test_mxnet_is_charted_when_the_run_has_it_with_per_run_ratios() -> None:
    s = chart.series(doc(RUNS))
    assert s.peers == ("mxnet",) and s.cases == ("1x4KiB", "1x1MiB") and s.runs == 2
    assert s.seconds["psnode"]["1x1MiB"] == chart.Spread(0.75, 0.5, 1.0)
    assert s.ratio["mxnet"]["1x1MiB"] == chart.Spread(2.25, 1.5, 3.0)      # 1.5/0.5 and 1.5/1.0
    assert "1x4KiB" not in s.ratio["mxnet"]                                 # MXNet's 4 KiB ran at 2,1 only


def test_config_independent_peers_when_asked_or_without_mxnet() -> None:
    s = chart.series(doc(RUNS), peers=["gloo", "zmq"])
    assert s.peers == ("gloo", "zmq")
    assert s.ratio["zmq"]["1x1MiB"] == chart.Spread(0.5, 0.5, 0.5)         # run 0 only: 0.25/0.5
    assert s.ratio["gloo"]["1x1MiB"] == chart.Spread(2.0, 2.0, 2.0)
    without = chart.series(doc([r for r in RUNS if r["system"] != "mxnet"]))
    assert without.peers == ("zmq", "gloo")


def test_a_run_without_the_config_or_the_peers_is_refused() -> None:
    with pytest.raises(ValueError, match=r"no psnode figures at W,S=1,1 .*2,1, 2,2"):
        chart.series(doc(RUNS), config="1,1")
    with pytest.raises(ValueError, match="none of the peers"):
        chart.series(doc(RUNS), peers=["bare"])


def test_draw_writes_a_png(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "chart.png"
    chart.draw(chart.series(doc(RUNS)), out, chart.describe(doc(RUNS)))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
