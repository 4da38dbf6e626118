"""GPUs under --launcher slurm (see conftest.py): the preflight step reports each node's GPUs
(mxdist.backends.agent.gpus run on the node).  The emulated nodes are this machine, which has no GPU: the
report says so quietly, ``--gpus-per-worker`` fails before any step starts (one row per node),
and a CUDA_VISIBLE_DEVICES given to every process is each node's list.
"""
from __future__ import annotations

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
    for line in ("127.0.0.2: has no GPU, but its 1 worker x --gpus-per-worker 1 need 1 GPU",
                 "127.0.0.3: has no GPU, but its 1 worker x --gpus-per-worker 1 need 1 GPU"):
        assert line in text, text
    assert "(the panel above): nothing was started, no job recorded" in text and not records(home), text

    res = salloc(slurm3, ["-N2", "--ntasks-per-node=2"], home, tmp_path, *MXDIST, "launch", "--launcher", "slurm",
                 "-s", "0", "--gpus-per-worker", "1", "-e", "CUDA_VISIBLE_DEVICES=2,3", show)
    assert res.returncode == 0, res.stdout + res.stderr
    for rank, node, visible in ((0, "127.0.0.2", 2), (1, "127.0.0.2", 3), (2, "127.0.0.3", 2), (3, "127.0.0.3", 3)):
        assert f"SHOW rank {rank} node {node} visible {visible}" in res.stdout, res.stdout
    assert "GPUs on 127.0.0.3: CUDA_VISIBLE_DEVICES=2,3: 2 GPUs" in res.stderr
    assert_nothing_left(slurm3, latest(home)["id"])
