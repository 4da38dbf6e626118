"""The benchmark driver runs end to end: psnode, the raw zmq peer and the bare PS each pass their
check round (the exact average) and report every timed round.  No speed is asserted here
(speed is measured by benchmarks/run.py itself, never in tests)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_benchmark_runs_every_system(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    r = subprocess.run([sys.executable, "benchmarks/run.py", "--quick", "--peers", "zmq,bare", "--no-launch",
                        "--cases", "1x4KiB,1x1MiB,rowsparse1%", "--configs", "2,2", "--timeout", "120",
                        "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "benchmark check failed" not in r.stderr, r.stderr[-3000:]
    data = json.loads(out.read_text())
    got = {(x["system"], x["case"]): [] for x in data["records"]}
    for x in data["records"]:
        got[(x["system"], x["case"])].append(x)
    from benchmarks.cases import ALL
    for system, cases, ranks in (("psnode", ("1x4KiB", "1x1MiB", "rowsparse1%"), 2),
                                 ("bare", ("1x4KiB", "1x1MiB", "rowsparse1%"), 2),
                                 ("zmq", ("1x4KiB", "1x1MiB"), 1)):
        for case in cases:
            recs = got.get((system, case), [])
            assert len(recs) == ranks, (system, case, recs)
            assert all(x["n"] == ALL[case].timed(True) and x["median"] > 0 for x in recs), recs
    # the table names the bare PS and its verdict on each target it can be compared with
    assert "bare PS MiB/s" in r.stdout and "bare PS at W2S2: 4 KiB round" in r.stdout
    assert "bare PS at W2S2: row_sparse 1%" in r.stdout
