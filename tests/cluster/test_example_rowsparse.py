"""The row_sparse example converges, distributed as well as in one process."""
from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.support.cluster import ROOT, run_job

EXAMPLE = ROOT / "examples" / "embedding_rowsparse.py"


def _rmse(text: str) -> float:
    return float(re.search(r"^rmse=([0-9.]+)", text, re.M).group(1))


def test_matrix_factorisation_converges_with_row_sparse_keys() -> None:
    args = ["--epochs", "5"]
    single = subprocess.run([sys.executable, str(EXAMPLE), *args], capture_output=True, text=True,
                            timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert single.returncode == 0, single.stderr
    job = run_job(EXAMPLE.read_text(), 2, 2, args=args, timeout=120,
                  env={"PYTHONPATH": f"{ROOT}:{ROOT / 'examples'}"})
    assert [p.code for p in job.procs] == [0] * 5, job.describe()
    rank0 = next(p for p in job.workers if p.rank == 0)
    one, two = _rmse(single.stdout), _rmse(rank0.out)
    # ratings have std ~1 and noise 0.05: after 5 epochs both runs are far below the std, and
    # the distributed run (sum aggregator: same updates as one process) tracks the single one
    assert one < 0.3 and two < 0.3, (one, two)
    assert abs(one - two) < 0.02, (one, two)
