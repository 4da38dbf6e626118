"""benchmarks/chart.py: the chart's data from a run.py JSON document (hand-made records)."""
from __future__ import annotations

import pytest

from benchmarks import chart


def rec(system: str, config: str, case: str, run: int, median: float, rank: int = 0) -> dict:
    return {"system": system, "config": config, "case": case, "run": run, "median": median, "rank": rank}


def doc(records: list[dict]) -> dict:
    return {"argv": ["benchmarks/kvstore/run.py", "--configs", "2,2"], "python": "3.11", "cpus": 2, "path": "same-host",
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


def emb(system: str, rows: int, run: int, rank: int, rate: float, peak: float) -> dict:
    return {"system": system, "rows": rows, "run": run, "rank": rank, "steps_per_s": rate, "peak_mib": peak}


EMB = {"argv": ["benchmarks/training/embedding.py", "--runs", "2"], "records": [
    emb("psnode", 20, 0, 0, 120.0, 250.0), emb("psnode", 20, 0, 1, 130.0, 260.0),      # median 125
    emb("DDP gloo", 20, 0, 0, 100.0, 2700.0), emb("DDP gloo", 20, 0, 1, 100.0, 2760.0),
    emb("psnode", 20, 1, 0, 90.0, 255.0), emb("DDP gloo", 20, 1, 0, 100.0, 2750.0),
    emb("psnode, no prefetch", 20, 0, 0, 80.0, 250.0), emb("psnode", 40, 0, 0, 1.0, 1.0)]}


def test_embedding_runs_give_speed_ratios_per_run_and_peak_memory_per_worker() -> None:
    s = chart.embedding_series(EMB)
    assert s.rows == [20]                                   # 40 rows: psnode only, not charted
    assert s.speed[20] == chart.Spread(1.075, 0.9, 1.25)    # 125/100 and 90/100
    assert s.peak["psnode"][20] == chart.Spread(257.5, 255.0, 260.0)       # max over ranks per run
    assert s.peak["DDP gloo"][20] == chart.Spread(2755.0, 2750.0, 2760.0)
    with pytest.raises(ValueError, match="both psnode and DDP"):
        chart.embedding_series({"records": [r for r in EMB["records"] if r["system"] != "DDP gloo"]})


def test_draw_embedding_writes_a_png(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "embedding.png"
    chart.draw_embedding(chart.embedding_series(EMB), out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
