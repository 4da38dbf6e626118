"""The examples on a GPU: the digits MLP on cuda (2 workers sharing the GPU, 2 servers) against
the same job on the CPU, and the seed's NCCL snippet as one rank.  Marked ``cuda``."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cluster import ROOT, free_port
from tests.support.examples import metric, require_module, run_example

pytestmark = pytest.mark.cuda


def test_mlp_on_cuda_reaches_the_cpu_accuracy(tmp_path: Path) -> None:
    require_module("torch")
    require_module("sklearn")
    args = ["--epochs", "10"]
    cpu = run_example("mlp_torch.py", 2, 2, args, tmp_path, timeout=180)
    gpu = run_example("mlp_torch.py", 2, 2, [*args, "--device", "cuda"], tmp_path, timeout=180)
    assert "device=cuda:0" in gpu
    print(f"mlp_torch W2 S2: cpu accuracy={metric(cpu, 'accuracy'):.4f} cuda accuracy={metric(gpu, 'accuracy'):.4f}")
    assert abs(metric(gpu, "accuracy") - metric(cpu, "accuracy")) <= 0.01


@pytest.mark.parametrize("mode", ["param", "hybrid"])
def test_seed_nccl_snippet_one_rank(mode: str) -> None:
    require_module("torch")
    require_module("sklearn")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PSNODE_")}
    env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "ddp_nccl.py"), "--epochs", "3",
                           "--mode", mode], env=env, capture_output=True, text=True, timeout=180,
                          cwd=ROOT / "examples")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ddp_nccl: backend=nccl world_size=1" in proc.stdout
    assert metric(proc.stdout, "accuracy") > 0.9
