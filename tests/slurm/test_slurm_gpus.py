"""GPUs under --launcher slurm (see conftest.py): the preflight step reports each node's GPUs
(mxdist.backends.agent.gpus run on the node).  The emulated nodes are this machine, which has no GPU: the
report says so quietly, ``--gpus-per-worker`` fails before any step starts (one row per node),
and a CUDA_VISIBLE_DEVICES given to every process is each node's list.
"""
from __future__ import annotations

import re

import shutil
import textwrap

import pytest

from tests.support.cli import latest, records
from tests.support.slurm_launch import MXDIST, assert_nothing_left, salloc, write

SHOW = textwrap.dedent("""
    import os
    print("SHOW rank", os.environ["RANK"], "node", os.environ["SLURMD_NODENAME"],
          "visible", os.environ.get("CUDA_VISIBLE_DEVICES"), flush=True)
""")

pytestmark = pytest.mark.skipif(shutil.which("nvidia-smi") is not None,
                                reason="this machine has nvidia-smi: its emulated nodes are not CPU nodes")


def test_slurm_nodes_report_no_gpu_and_gpus_per_worker_is_refused(slurm3, home, tmp_path):
    show = write(tmp_path, "show.py", SHOW)
    res = salloc(slurm3, ["-N2", "--ntasks-per-node=1"], home, tmp_path, *MXDIST, "launch", "--launcher", "slurm",
                 "-s", "0", "--gpus-per-worker", "1", show)
    assert res.returncode == 3, res.stdout + res.stderr
    text = " ".join(res.stderr.replace("│", " ").split())
    assert "preflight failed: nothing was started" in text
    refused = re.findall(r"(127\.0\.0\.\d): has no GPU, but its 1 worker x --gpus-per-worker 1 need 1 GPU", text)
    assert len(set(refused)) == 2, text    # (each node of the allocation, whichever two Slurm gave)
    assert "(the panel above): nothing was started, no job recorded" in text and not records(home), text

    res = salloc(slurm3, ["-N2", "--ntasks-per-node=2"], home, tmp_path, *MXDIST, "launch", "--launcher", "slurm",
                 "-s", "0", "--gpus-per-worker", "1", "-e", "CUDA_VISIBLE_DEVICES=2,3", show)
    assert res.returncode == 0, res.stdout + res.stderr
    shown = {int(r): (n, int(v)) for r, n, v in re.findall(r"SHOW rank (\d) node (\S+) visible (\d)", res.stdout)}
    first, second = shown[0][0], shown[2][0]     # (the two nodes Slurm gave, in rank order)
    assert first != second and shown == {0: (first, 2), 1: (first, 3), 2: (second, 2), 3: (second, 3)}, res.stdout
    assert f"GPUs on {second}: CUDA_VISIBLE_DEVICES=2,3: 2 GPUs" in res.stderr
    assert_nothing_left(slurm3, latest(home)["id"])
