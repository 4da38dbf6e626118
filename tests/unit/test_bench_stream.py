"""benchmarks/training/stream.py: the curves, the goals and the chart from hand-made records."""
from __future__ import annotations

import xml.etree.ElementTree as ET

from benchmarks.training import stream


def job(name: str, aucs: list[float], rss_mib: list[int], hwm_mib: list[int], tail_ids: int) -> dict:
    windows = [{"step": 10 * (i + 1), "time": 100.0 + i, "auc": a, "logloss": 1 - a, "best_auc": 0.8}
               for i, a in enumerate(aucs)]
    ranks = [{"steps_per_s": 4.0 + r, "windows": windows, "tail_ids": tail_ids} for r in (0, 1)]
    memory = [(100.0 + i - 0.5, m * 1024) for i, m in enumerate(rss_mib)]
    return {"system": name, "config": {"batch": 8, "steps": 10 * len(aucs)}, "ranks": ranks, "memory": memory,
            "server_hwm_kib": [m * 1024 for m in hwm_mib]}


def test_the_goals_compare_the_last_windows_and_the_servers_summed_peaks() -> None:
    capped = job(stream.CAPPED, [0.5, 0.7, 0.79], [100, 300, 400], [450, 500], 25_000_000)
    free = job(stream.UNCAPPED, [0.5, 0.7, 0.8], [100, 600, 2000], [1100, 1200], 25_000_000)
    c = stream.curves(capped)
    assert c["step"] == [10, 20, 30] and c["server_mib"] == [100, 300, 400]   # the sample before each window's end
    s = stream.summary(capped, free, 1.0, last=2)
    assert s["distinct_tail_ids"] == 50_000_000
    assert s[stream.CAPPED]["auc"] == 0.745 and s[stream.UNCAPPED]["auc"] == 0.75
    assert s[stream.CAPPED]["servers_peak_mib"] == 950 and s[stream.CAPPED]["steps_per_s"] == 4.5
    assert s["goals"] == {"50M distinct ids": True, "memory under the cap": True, "AUC within 1%": True}
    worse = stream.summary(job(stream.CAPPED, [0.5, 0.7, 0.7], [100] * 3, [600, 500], 1), free, 1.0, last=2)
    assert worse["goals"] == {"50M distinct ids": False, "memory under the cap": False, "AUC within 1%": False}
    root = ET.fromstring(stream.svg(capped, free, 1024.0))     # well-formed, three panels of two lines
    assert len([e for e in root.iter() if e.tag.endswith("polyline")]) == 7   # + the true probabilities' AUC


def test_auc_counts_ties_half() -> None:
    assert stream.auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == 0.75
    assert stream.auc([0.5, 0.5], [0, 1]) == 0.5
