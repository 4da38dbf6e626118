"""mxdist launch on GPU hosts, end to end on this (CPU) machine with real processes.

* preflight's GPU report (mxdist.backends.agent.gpus: nvidia-smi --query-gpu, CUDA_VISIBLE_DEVICES): a CPU
  host is quiet; ``--gpus-per-worker`` on it fails before anything starts, naming the host, what
  it has and what was asked;
* ``--gpus-per-worker`` with a stand-in ``nvidia-smi`` (a script on PATH printing what the real
  one prints for four H200s): each worker's CUDA_VISIBLE_DEVICES as its process sees it;
* ``--pass-local-rank``: a script written for ``torch.distributed.launch`` (``--local_rank`` a
  required argument) runs unchanged under ``-s 0`` with gloo, and so does examples/ddp_gloo.py.

Every launch ends by checking that no process of the job is left.
"""
from __future__ import annotations

import importlib.util
import json
import textwrap
from pathlib import Path

import pytest

from mxdist.backends import agent
from tests.support.cli import assert_nothing_left, cli_env, latest, records, run_cli

SHOW = textwrap.dedent("""
    import json, os, sys
    keys = ["RANK", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"]
    print("SHOW " + json.dumps({"argv": sys.argv[1:], **{k: os.environ.get(k) for k in keys}}), flush=True)
""")

# A script written for torch.distributed.launch: --local_rank is a required argument (no
# $LOCAL_RANK fallback), then the seed's "by instance" snippet on the CPU (gloo; DDP takes no
# device_ids for a CPU module).  Rank r's samples are all r+1, so DDP's averaged gradient of
# sum(w * x) over a batch of 4 is (4*1 + 4*2) / 2 = 6 on every rank.
SEED = textwrap.dedent("""
    import argparse, os
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, required=True)
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--num_workers", type=int, default=0)
    args = parser.parse_args()
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.set_num_threads(1)
    model = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    train_dataset = torch.utils.data.TensorDataset(torch.tensor([[1.0], [2.0]] * 4))

    dist.init_process_group("gloo")
    ddp_model = DDP(model, find_unused_parameters=True)
    train_sampler = torch.utils.data.distributed.DistributedSampler(train_dataset, shuffle=False)
    train_loader = torch.utils.data.DataLoader(train_dataset,
                                               batch_size=args.batch_size,
                                               sampler=train_sampler,
                                               num_workers=args.num_workers,
                                               pin_memory=torch.cuda.is_available())

    (x,) = next(iter(train_loader))
    ddp_model(x).sum().backward()
    print("SEED rank", dist.get_rank(), "local_rank", args.local_rank, "LOCAL_RANK", os.environ["LOCAL_RANK"],
          "grad", model.weight.grad.item(), flush=True)
    dist.barrier()
    os._exit(0)   # (printed with flush=True; no gloo teardown: torch 2.13 can abort in it, see examples/ddp_gloo.py)
""")


def script(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def fake_nvidia_smi(directory: Path, body: str) -> Path:
    """``directory`` with an executable ``nvidia-smi`` running the shell ``body``."""
    directory.mkdir(exist_ok=True)
    (directory / "nvidia-smi").write_text("#!/bin/sh\n" + body)
    (directory / "nvidia-smi").chmod(0o755)
    return directory


FOUR_H200 = "".join(f'echo "{i}, GPU-5e1d0000-{i:04d}, NVIDIA H200, 143771"\n' for i in range(4))
NO_DRIVER = ('echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver. Make sure '
             'that the latest NVIDIA driver is installed and running."\nexit 9\n')


def shows(out: str) -> dict[int, dict]:
    """Rank -> what SHOW printed."""
    items = [json.loads(line.split("SHOW ", 1)[1]) for line in out.splitlines() if "SHOW {" in line]
    return {int(i["RANK"]): i for i in items}


def flat(text: str) -> str:
    """Panel text as one line: borders and wrapping removed."""
    return " ".join(text.replace("│", " ").split())


# -- the host agent's GPU report --------------------------------------------------------------------

def test_agent_reports_nvidia_smis_list_the_environments_list_or_nothing(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert agent.gpus({"PATH": str(empty)}) == agent.GpusReport(None, [], None)
    assert agent.gpus({"PATH": str(empty), "CUDA_VISIBLE_DEVICES": "1,0"}).visible == "1,0"
    four = fake_nvidia_smi(tmp_path / "four", FOUR_H200)
    report = agent.gpus({"PATH": str(four)})
    assert report.error is None and [g.index for g in report.gpus] == [0, 1, 2, 3]
    assert report.gpus[2] == agent.GpuEntry(2, "GPU-5e1d0000-0002", "NVIDIA H200", 143771)
    broken = agent.gpus({"PATH": str(fake_nvidia_smi(tmp_path / "broken", NO_DRIVER))})
    assert broken.gpus == [] and broken.error is not None and broken.error.endswith(
        "nvidia-smi failed (exit 9): NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
        "driver. Make sure that the latest NVIDIA driver is installed and running.")
    hung = agent.gpus({"PATH": str(fake_nvidia_smi(tmp_path / "hung", "exec sleep 30\n"))}, timeout=0.5)
    assert hung.gpus == [] and hung.error is not None and hung.error.endswith("did not answer within 0.5 s")
    # the preflight check carries it
    assert agent.check(str(tmp_path), [], {"PATH": str(four)}).gpus == report


# -- a CPU host ---------------------------------------------------------------------------------------

def test_cpu_host_is_quiet_and_gpus_per_worker_fails_before_anything_starts(tmp_path):
    home = tmp_path / "home"
    empty = tmp_path / "empty"
    empty.mkdir()
    env = cli_env(home, PATH=str(empty))              # no nvidia-smi: a CPU host
    env.pop("CUDA_VISIBLE_DEVICES", None)
    show = script(tmp_path, "show.py", SHOW)
    res = run_cli(["launch", "-n", "2", "-s", "0", show], env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert shows(res.stdout)[1] == {"argv": [], "RANK": "1", "LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": None,
                                    "CUDA_DEVICE_ORDER": None}
    assert "GPU" not in res.stderr and "warning" not in res.stderr     # quiet: a CPU host is fine

    res = run_cli(["launch", "-n", "2", "-s", "1", "--gpus-per-worker", "1", show], env)
    assert res.returncode == 3, res.stdout + res.stderr
    text = flat(res.stderr)
    assert "preflight failed: nothing was started" in text and "localhost: has no GPU, but its 2 workers" in text
    assert "leave --gpus-per-worker out" in text and "SHOW" not in res.stdout
    # nothing started and the panel said why: no placement line, no job recorded
    assert "processes on" not in text and [r["state"] for r in records(home)] == ["succeeded"], text
    assert text.endswith("preflight failed on localhost (the panel above): nothing was started, no job recorded")
    assert_nothing_left(home)


def test_a_failing_nvidia_smi_is_named_when_gpus_are_asked_for(tmp_path):
    home = tmp_path / "home"
    env = cli_env(home, PATH=str(fake_nvidia_smi(tmp_path / "bin", NO_DRIVER)))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    res = run_cli(["launch", "-n", "1", "-s", "0", "--gpus-per-worker", "1", script(tmp_path, "show.py", SHOW)], env)
    assert res.returncode == 3, res.stdout + res.stderr
    assert "NVIDIA-SMI has failed" in res.stderr                     # in the preflight table
    text = " ".join(res.stderr.replace("│", " ").split())
    want = (f"localhost: has no GPU ({tmp_path}/bin/nvidia-smi failed (exit 9): "
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    assert want in text and "), but its 1 worker x --gpus-per-worker 1 need 1 GPU" in text, text
    assert_nothing_left(home)


# -- GPUs (a stand-in nvidia-smi) -------------------------------------------------------------------

def test_gpus_per_worker_gives_each_worker_its_devices(tmp_path):
    home = tmp_path / "home"
    env = cli_env(home, PATH=f"{fake_nvidia_smi(tmp_path / 'bin', FOUR_H200)}:/usr/bin:/bin")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.pop("CUDA_DEVICE_ORDER", None)
    show = script(tmp_path, "show.py", SHOW)
    res = run_cli(["launch", "-n", "2", "-s", "0", "--gpus-per-worker", "2", "--pass-local-rank", show, "x"], env)
    assert res.returncode == 0, res.stdout + res.stderr
    seen = shows(res.stdout)
    assert seen == {
        0: {"argv": ["--local_rank=0", "x"], "RANK": "0", "LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "0,1",
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
        1: {"argv": ["--local_rank=1", "x"], "RANK": "1", "LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "2,3",
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}}
    assert "GPUs on localhost: 4 GPUs 0,1,2,3 (4 x NVIDIA H200, 140 GiB each)" in res.stderr
    assert "worker 1 @ localhost: CUDA_VISIBLE_DEVICES=2,3, LOCAL_RANK 1 -> cuda:0-1" in res.stderr
    assert "warning" not in res.stderr               # 2 GPUs each: --local_rank 0 and 1 both exist

    # the default leaves visibility alone; a fifth worker has no cuda:LOCAL_RANK: a warning
    res = run_cli(["launch", "-n", "5", "-s", "0", show], env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert {r: s["CUDA_VISIBLE_DEVICES"] for r, s in shows(res.stdout).items()} == dict.fromkeys(range(5))
    assert "worker 3 @ localhost: all GPUs visible, LOCAL_RANK 3 -> cuda:3" in res.stderr
    assert "localhost runs 5 workers but shows 4 GPUs: cuda:LOCAL_RANK does not exist for local rank 4" \
        in flat(res.stderr)

    # the user's CUDA_VISIBLE_DEVICES is the host's list: its entries are handed out
    res = run_cli(["launch", "-n", "3", "-s", "0", "--gpus-per-worker", "1", show],
                  {**env, "CUDA_VISIBLE_DEVICES": "3,1,2"})
    assert res.returncode == 0, res.stdout + res.stderr
    assert [(s["CUDA_VISIBLE_DEVICES"], s["CUDA_DEVICE_ORDER"]) for _, s in sorted(shows(res.stdout).items())] == [
        ("3", None), ("1", None), ("2", None)]
    assert "GPUs on localhost: CUDA_VISIBLE_DEVICES=3,1,2: 3 GPUs of the 4 GPUs nvidia-smi lists" in res.stderr
    assert_nothing_left(home)


# -- --pass-local-rank: scripts written for torch.distributed.launch --------------------------------

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")


@needs_torch
def test_pass_local_rank_runs_a_torch_distributed_launch_script_unchanged(tmp_path):
    home = tmp_path / "home"
    env = cli_env(home)
    seed = script(tmp_path, "seed.py", SEED)
    res = run_cli(["launch", "-n", "2", "-s", "0", "--pass-local-rank", seed, "--batch_size", "4"], env,
                  timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    for rank in (0, 1):
        assert f"SEED rank {rank} local_rank {rank} LOCAL_RANK {rank} grad 6.0" in res.stdout, res.stdout
    # without the flag such a script stops at its argument parser, and the job says why
    res = run_cli(["launch", "-n", "2", "-s", "0", seed], env, timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "the following arguments are required: --local_rank" in res.stdout + res.stderr
    assert_nothing_left(home)


@needs_torch
def test_ddp_gloo_example_with_pass_local_rank(tmp_path):
    home = tmp_path / "home"
    res = run_cli(["launch", "-n", "2", "-s", "0", "--pass-local-rank", "examples/ddp_gloo.py", "--epochs", "1"],
                  cli_env(home), timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "ddp_gloo: backend=gloo world_size=2 local_rank=0 device=cpu" in res.stdout
    assert "accuracy=0.9" in res.stdout
    assert latest(home)["command"][:2] == ["examples/ddp_gloo.py", "--epochs"]
    assert_nothing_left(home)
