"""benchmarks/training/gluon.py runs (its smoke run: one run, few steps): MXNet's dist_sync and psnode
both train the example's model to the end, each with its ranks ending equal."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytest.importorskip("mxnet")

from tests.support.cli import ROOT


def test_gluon_benchmark_quick() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "training" / "gluon.py"), "--quick"], cwd=ROOT,
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    for system in ("mxnet", "psnode"):
        assert re.search(rf"run 1 {system}: [0-9.]+ steps/s, accuracy 0\.\d+", r.stdout), r.stdout + r.stderr
    assert "differ" not in r.stdout and "failed" not in r.stdout, r.stdout
    assert re.search(r"psnode / MXNet steps/s per run: [0-9.]+", r.stdout), r.stdout
