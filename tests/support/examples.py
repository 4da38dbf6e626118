"""Running the examples (examples/*.py) as real jobs through the cluster harness (tests/cluster
and tests/gpu)."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.support.cluster import ROOT, start_job, wait_job

EXAMPLES = ROOT / "examples"


def require_module(module: str) -> None:
    """Skip the test without ``module`` (CI: the ImportError instead)."""
    try:
        __import__(module)
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"{module} is not installed (pip install -e '.[examples,torch]'); CI fails instead")


def runner(example: str, args: list[str]) -> str:
    """Worker script for the harness: run examples/<example> as __main__ with ``args``."""
    path = str(EXAMPLES / example)
    return (f"import runpy, sys\n"
            f"sys.path.insert(0, {str(EXAMPLES)!r})\n"
            f"sys.argv = [{path!r}] + {args!r}\n"
            f"runpy.run_path({path!r}, run_name='__main__')\n")


def run_example(example: str, workers: int, servers: int, args: list[str], tmp: Path,
                timeout: float = 60, **kw) -> str:
    """Run a job, check every process exited 0, return rank 0's stdout."""
    job = wait_job(start_job(runner(example, args), workers, servers, tmp=tmp, **kw), timeout)
    assert all(p.code == 0 for p in job.procs), job.describe()
    return job.workers[0].out


def metric(out: str, name: str) -> float:
    """The last ``name=<number>`` line of ``out``."""
    found = re.findall(rf"^{name}=([0-9.]+)$", out, re.M)
    assert found, f"no {name}= line in:\n{out}"
    return float(found[-1])
