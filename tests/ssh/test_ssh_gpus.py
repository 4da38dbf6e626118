"""GPUs over real SSH (three sshd "hosts" on 127.0.0.2-4, see conftest.py): the agent reports
each host's GPUs at preflight.  These hosts are this machine, which has no GPU: the report says
so quietly, and ``--gpus-per-worker`` fails before anything starts, one row per host.
"""
from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest

from tests.support.cli import assert_nothing_left, records, run_cli

SHOW = textwrap.dedent("""
    import json, os
    print("SHOW " + json.dumps({k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES")}))
""")

pytestmark = pytest.mark.skipif(shutil.which("nvidia-smi") is not None,
                                reason="this machine has nvidia-smi: its fake SSH hosts are not CPU hosts")


def script(tmp_path: Path) -> str:
    path = tmp_path / "show.py"
    path.write_text(SHOW)
    return str(path)


def flat(text: str) -> str:
    return " ".join(text.replace("│", " ").split())


def test_cpu_hosts_report_no_gpu_and_refuse_gpus_per_worker(ssh_cluster, home, tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    env = ssh_cluster.env(home)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    show = script(tmp_path)
    res = run_cli(["launch", "-H", "node1,node2", "-s", "0", show], env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "GPU" not in res.stderr                       # CPU hosts are fine, and quiet

    res = run_cli(["launch", "-H", "node1,node2,node3", "-n", "4", "-s", "1", "--gpus-per-worker", "1", show], env)
    assert res.returncode == 3, res.stdout + res.stderr
    text = flat(res.stderr)
    assert "preflight failed: nothing was started" in text
    assert all(f"{host}: has no GPU, but its" in text for host in ("node1", "node2", "node3")), text
    for line in ("node1: has no GPU, but its 2 workers x --gpus-per-worker 1 need 2 GPUs",
                 "node2: has no GPU, but its 1 worker x --gpus-per-worker 1 need 1 GPU",
                 "node3: has no GPU, but its 1 worker x --gpus-per-worker 1 need 1 GPU"):
        assert line in text, text
    assert [r["state"] for r in records(home)] == ["succeeded"]     # the failed preflight left no record
    assert_nothing_left(home)


def test_the_users_visible_devices_are_each_hosts_list(ssh_cluster, home, tmp_path):
    res = run_cli(["launch", "-H", "node1,node2", "-n", "4", "-s", "0", "--gpus-per-worker", "1",
                   "-e", "CUDA_VISIBLE_DEVICES=5,7", script(tmp_path)], ssh_cluster.env(home))
    assert res.returncode == 0, res.stdout + res.stderr
    seen = {int(s["RANK"]): s for s in (json.loads(line.split("SHOW ", 1)[1])
                                        for line in res.stdout.splitlines() if "SHOW {" in line)}
    # 4 workers on 2 hosts of 1 slot: local ranks 0, 0, 1, 1 -> entries 0, 0, 1, 1 of 5,7
    assert {r: (s["LOCAL_RANK"], s["CUDA_VISIBLE_DEVICES"]) for r, s in seen.items()} == {
        0: ("0", "5"), 1: ("0", "5"), 2: ("1", "7"), 3: ("1", "7")}
    for host in ("node1", "node2"):
        assert f"GPUs on {host}: CUDA_VISIBLE_DEVICES=5,7: 2 GPUs" in res.stderr
    assert_nothing_left(home)


def test_dry_run_claims_no_gpu_device_on_hosts_it_has_not_checked(ssh_cluster, home, tmp_path):
    """A dry run does not connect: the hosts' GPUs are not known, so no worker row names a cuda
    device (these hosts have none)."""
    train = tmp_path / "train.py"
    train.write_text("print('hi')\n")
    res = run_cli(["launch", "--dry-run", "-H", "node1,node2", "-n", "2", "-s", "0", str(train)],
                  ssh_cluster.env(home))
    assert res.returncode == 0, res.stdout + res.stderr
    rows = [line for line in res.stdout.splitlines() if line.startswith("│") and "│ worker " in line]
    assert len(rows) == 2 and all(f"{train}" in row for row in rows), res.stdout
    assert "cuda" not in res.stdout and "node1: known at preflight" in res.stdout, res.stdout
