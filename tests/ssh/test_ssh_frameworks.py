"""PyTorch Lightning, Hugging Face Accelerate and torch's ``@record``, unmodified, under ``mxdist
launch -s 0`` on two real sshd hosts (127.0.0.2 and .3, two slots each; conftest.py) and on one.

The scripts are examples/lightning_ddp.py and examples/accelerate_ddp.py (a few steps of a tiny
regression, one torch thread).  CI installs the frameworks (``pip install -e '.[test,frameworks]'``):
there a missing one fails these tests; elsewhere they are skipped.
"""
from __future__ import annotations

import importlib.util
import json
import re
import textwrap
from pathlib import Path

import pytest

from tests.ssh.mxdist_testing import ROOT, assert_nothing_left, latest, run_cli
from tests.support import require

EXAMPLES = ROOT / "examples"
TORCHRUN = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "GROUP_WORLD_SIZE",
            "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
            "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_ERROR_FILE")


def need(module: str) -> None:
    require(None if importlib.util.find_spec(module) else f"{module} is not installed",
            "pip install -e '.[test,frameworks]'")


def two_by_two(tmp_path: Path) -> str:
    hosts = tmp_path / "hosts"
    hosts.write_text("node1 slots=2\nnode2 slots=2\n")
    return str(hosts)


def results(stdout: str) -> dict[int, dict]:
    """Each worker's ``RESULT {json}`` line, by rank, with the host its line came from."""
    out = {}
    for m in re.finditer(r"^\[worker (\d+) @ (\S+)\] RESULT (.*)$", stdout, re.M):
        out[int(m.group(1))] = {**json.loads(m.group(3)), "host": m.group(2)}
    return out


def test_every_worker_gets_torchruns_environment_on_two_hosts(ssh_cluster, home, tmp_path):
    show = tmp_path / "show.py"
    show.write_text(textwrap.dedent(f"""
        import json, os
        print("ENV " + json.dumps({{k: os.environ.get(k) for k in {TORCHRUN!r}}}))
    """))
    res = run_cli(["launch", "-H", two_by_two(tmp_path), "-n", "4", "-s", "0", "--max-restarts", "2", str(show)],
                  ssh_cluster.env(home), timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    job = latest(home)["id"]
    envs = {int(m.group(1)): json.loads(m.group(2))
            for m in re.finditer(r"^\[worker (\d+) @ \S+\] ENV (.*)$", res.stdout, re.M)}
    run_dir = f"{home / 'remote'}/{job}"
    same = {"WORLD_SIZE": "4", "ROLE_WORLD_SIZE": "4", "GROUP_WORLD_SIZE": "2", "ROLE_NAME": "default",
            "MASTER_ADDR": "127.0.0.2", "TORCHELASTIC_RUN_ID": job, "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "2"}
    assert {r: {k: v for k, v in e.items() if k != "MASTER_PORT"} for r, e in envs.items()} == {
        r: {**same, "RANK": str(r), "ROLE_RANK": str(r), "LOCAL_RANK": str(r % 2), "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": str(r // 2), "NODE_RANK": str(r // 2),
            "TORCHELASTIC_ERROR_FILE": f"{run_dir}/worker-{r}.torch-error.json"} for r in range(4)}
    assert len({e["MASTER_PORT"] for e in envs.values()}) == 1
    assert_nothing_left(home)


def test_lightning_ddp_on_two_hosts_with_two_slots_each(ssh_cluster, home, tmp_path):
    need("lightning")
    res = run_cli(["launch", "-H", two_by_two(tmp_path), "-n", "4", "-s", "0", str(EXAMPLES / "lightning_ddp.py"),
                   "--devices", "2", "--num-nodes", "2"], ssh_cluster.env(home), timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    got = results(res.stdout)
    assert {r: (g["rank"], g["world"], g["local_rank"], g["node_rank"], g["host"], g["env"]) for r, g in got.items()} \
        == {r: (r, 4, r % 2, r // 2, f"node{r // 2 + 1}", "TorchElasticEnvironment") for r in range(4)}
    assert len({json.dumps(g["weights"]) for g in got.values()}) == 1
    assert latest(home)["state"] == "succeeded"
    assert_nothing_left(home)


@pytest.mark.parametrize("workers", [2, 4])
def test_lightning_ddp_on_one_host(ssh_cluster, home, tmp_path, workers):
    need("lightning")
    hosts = tmp_path / "hosts"
    hosts.write_text(f"node1 slots={workers}\n")
    res = run_cli(["launch", "-H", str(hosts), "-n", str(workers), "-s", "0", str(EXAMPLES / "lightning_ddp.py"),
                   "--devices", str(workers)], ssh_cluster.env(home), timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    got = results(res.stdout)
    assert {r: (g["rank"], g["world"], g["local_rank"], g["node_rank"]) for r, g in got.items()} == {
        r: (r, workers, r, 0) for r in range(workers)}
    assert len({json.dumps(g["weights"]) for g in got.values()}) == 1
    assert_nothing_left(home)
