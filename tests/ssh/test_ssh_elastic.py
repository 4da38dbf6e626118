"""Elastic jobs over real SSH (the sshd fixtures: node1..node3 on 127.0.0.2-4): ``mxdist scale``
onto a host that ran nothing of the job (prepared first: preflight and the job's secret), and a
host discovery script whose hosts come and go.  Values exact on every rank (the ROUNDS script of
tests/cluster/test_launch_elastic.py); nothing left on any host.
"""
from __future__ import annotations

import stat
from pathlib import Path

from tests.support.cli import assert_nothing_left, latest, run_cli, wait_for
from tests.support.elastic import ROUNDS, TOTAL, final_state, printed, role_log, rounds_of


def _launch(tmp_path: Path, env: dict, holds: tuple[int, ...], *options: str) -> tuple[str, Path]:
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    for k in holds:
        (ctl / f"hold-{k}").touch()
    script = tmp_path / "rounds.py"
    script.write_text(ROUNDS)
    done = run_cli(["launch", "-d", "-s", "1", *options, str(script), str(ctl), str(TOTAL)], env, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip().splitlines()[-1], ctl


def _stop(env: dict, home: Path) -> None:
    rec = latest(home)
    if rec["state"] in ("starting", "running"):
        run_cli(["stop", rec["id"]], env, timeout=120)


def test_scale_up_onto_a_second_host(ssh_cluster, home, tmp_path):
    env = ssh_cluster.env(home)
    hosts = tmp_path / "hosts"
    hosts.write_text("node1 slots=2\nnode2\n")
    job, ctl = _launch(tmp_path, env, (4,), "-H", str(hosts), "-n", "2", "--max-workers", "3")
    try:
        wait_for(lambda: all(printed(home, job, f"worker-{r}", r"^ROUND 4 ") for r in (0, 1)), 120,
                 "workers 0 and 1 to finish round 4")
        up = run_cli(["scale", job, "3"], env, timeout=150)
        assert up.returncode == 0, up.stderr
        assert up.stdout.splitlines() == [f"job {job}: scaled from 2 to 3 workers",
                                          "started worker 2 on node2 (local rank 0)"]
        rec = latest(home)
        joiner = next(p for p in rec["procs"] if p["name"] == "worker-2")
        assert joiner["host"] == "node2" and joiner["address"] == ssh_cluster.addresses[1]
        assert set(rec["remote_keys"]) == {"node1", "node2"}
        start = wait_for(lambda: printed(home, job, "worker-2", r"^START 2 (\d+)$"), 120, "the joiner's start")
        (ctl / "hold-4").unlink()
        rec = final_state(home, 120)
    finally:
        _stop(env, home)
    assert rec["state"] == "succeeded", rec.get("root_cause")
    joined_at = int(start.group(1))
    assert joined_at == 5
    assert rounds_of(role_log(home, job, "worker-2"), 2) == dict.fromkeys(range(joined_at + 1, TOTAL + 1), 2.0)
    expected = {k: (2.0 if k > joined_at else 1.5) for k in range(1, TOTAL + 1)}
    for rank in (0, 1):
        assert rounds_of(role_log(home, job, f"worker-{rank}"), rank) == expected
    assert_nothing_left(home)


def test_discovery_script_hosts_come_and_go(ssh_cluster, home, tmp_path):
    env = ssh_cluster.env(home)
    listed = tmp_path / "listed"
    listed.write_text("node1:2\n")
    find = tmp_path / "find.sh"
    find.write_text(f"#!/bin/sh\ncat {listed}\n")
    find.chmod(find.stat().st_mode | stat.S_IXUSR)
    job, ctl = _launch(tmp_path, env, (4, 10), "--host-discovery-script", str(find), "-n", "2",
                       "--max-workers", "3")
    try:
        wait_for(lambda: all(printed(home, job, f"worker-{r}", r"^ROUND 4 ") for r in (0, 1)), 120,
                 "workers 0 and 1 to finish round 4")
        full = run_cli(["scale", job, "3"], env)
        assert full.returncode == 2 and "1 more worker needs 1 free slot, the hosts have 0" in full.stderr
        listed.write_text("node1:2\nnode2:1\n")
        wait_for(lambda: any(h["name"] == "node2" for h in latest(home)["hosts"]), 30, "node2 to be discovered")
        up = run_cli(["scale", job, "3"], env, timeout=150)
        assert up.returncode == 0, up.stderr
        assert up.stdout.splitlines()[1] == "started worker 2 on node2 (local rank 0)"
        start = wait_for(lambda: printed(home, job, "worker-2", r"^START 2 (\d+)$"), 120, "the joiner's start")
        (ctl / "hold-4").unlink()
        wait_for(lambda: all(printed(home, job, f"worker-{r}", r"^ROUND 10 ") for r in (0, 1, 2)), 120,
                 "every worker to finish round 10")
        listed.write_text("node1:2\n")
        wait_for(lambda: latest(home)["changes"][-1]["change"] == "lost", 60, "worker 2 to be lost")
        (ctl / "hold-10").unlink()
        rec = final_state(home, 120)
    finally:
        _stop(env, home)
    assert rec["state"] == "succeeded", rec.get("root_cause")
    assert [(c["change"], c["rank"], c["host"]) for c in rec["changes"]] == [("joined", 2, "node2"),
                                                                             ("lost", 2, "node2")]
    assert rec["changes"][1]["why"] == "stopped: its host node2 left the discovered hosts"
    joined_at = int(start.group(1))
    assert joined_at == 5
    assert rounds_of(role_log(home, job, "worker-2"), 2) == dict.fromkeys(range(joined_at + 1, 11), 2.0)
    expected = {k: (2.0 if joined_at < k <= 10 else 1.5) for k in range(1, TOTAL + 1)}
    for rank in (0, 1):
        assert rounds_of(role_log(home, job, f"worker-{rank}"), rank) == expected
    supervisor = (home / "jobs" / job / "supervisor.log").read_text()
    assert "host discovery: node2 added (1 slot)" in supervisor
    assert "host discovery: node2 is gone: its worker worker-2 is lost" in supervisor
    assert_nothing_left(home)
