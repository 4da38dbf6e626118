"""benchmarks/training/embedding.py runs end to end: both systems report every rank from the same start
(the same weights and batches give the same first losses), the memory records name every
process, and the watchdog kills a job that passes its memory cap (recorded, not hung).  No speed
is asserted (benchmarks measure speed, tests do not)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict]:
    try:
        import torch  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("torch is not installed (pip install torch); CI fails here instead")
    out = tmp_path / "emb.json"
    r = subprocess.run([sys.executable, "benchmarks/training/embedding.py", "--quick", "--timeout", "120",
                        "--json", str(out), *args], cwd=ROOT, capture_output=True, text=True, timeout=400)
    return r, json.loads(out.read_text())


def test_quick_embedding_benchmark_reports_both_systems(tmp_path: Path) -> None:
    r, data = _run(tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    by = {(x["system"], x["rank"]): x for x in data["records"]}
    assert set(by) == {("psnode", 0), ("psnode", 1), ("DDP gloo", 0), ("DDP gloo", 1)}
    for x in by.values():
        assert x["rows"] == 200_000 and x["steps"] == 40 and x["steps_per_s"] > 0 and x["peak_mib"] > 0
    for rank in (0, 1):   # the same table, head and batches: the first losses agree
        assert abs(by[("psnode", rank)]["loss_first"] - by[("DDP gloo", rank)]["loss_first"]) < 0.01
    mem = {m["system"]: m for m in data["memory"]}
    assert mem["psnode"]["fits"] and mem["DDP gloo"]["fits"]
    assert set(mem["psnode"]["peaks_mib"]) == {"scheduler 0", "server 0", "server 1", "worker 0", "worker 1"}
    assert mem["psnode"]["server_mib"] > 0 and mem["psnode"]["total_gib"] > 0
    assert "psnode/DDP steps/s" in r.stdout and "| 0.2 M | psnode" in r.stdout
    # where a step goes: every phase of each system's step, on every rank
    assert set(by[("psnode", 0)]["phases"]) == {"zero_grad", "forward", "backward", "prefetch", "step", "loss"}
    assert set(by[("DDP gloo", 1)]["phases"]) == {"zero_grad", "forward", "backward", "step", "loss"}
    assert all(p["wall_ms"] >= 0 and p["cpu_ms"] >= 0 for x in by.values() for p in x["phases"].values())
    phases = {(row["system"], row["phase"]) for row in data["phases"]}
    assert {("psnode", "step"), ("psnode", "whole step (process)"), ("DDP gloo", "backward")} <= phases


def test_a_job_past_the_cap_is_killed_and_recorded(tmp_path: Path) -> None:
    r, data = _run(tmp_path, "--cap-gib", "0.25")
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    assert {m["system"]: m["fits"] for m in data["memory"]} == {"psnode": False, "DDP gloo": False}
    assert all("passed the cap" in m["killed"] for m in data["memory"])
    assert r.stdout.count("DID NOT COMPLETE") == 2
