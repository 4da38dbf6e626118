"""``--standby-scheduler`` over real SSH (three sshd "hosts" on 127.0.0.2-4, see conftest.py):
the scheduler on node1 is killed with its reaper (kill -9 of its process group); it is not
restarted: the standby on node2 takes the job over, the nodes on every host go over to it, and
the job ends exactly (the job of tests/cluster/test_scheduler_restart.py)."""
from __future__ import annotations

import json
import os
import signal

from tests.support.cli import assert_nothing_left, kill_cli, latest, run_cli, start_cli, wait_for
from tests.support.scheduler_restart import ROUNDS


def test_a_killed_scheduler_hands_the_job_to_the_standby_on_another_host(ssh_cluster, home, tmp_path):
    flags = tmp_path / "flags"
    flags.mkdir()
    job = tmp_path / "job.py"
    job.write_text(ROUNDS)
    env = ssh_cluster.env(home)
    proc = start_cli(["launch", "-H", "node1,node2,node3", "-n", "3", "-s", "2", "--standby-scheduler",
                      str(job), str(flags), "150"], env)
    try:
        wait_for(lambda: (flags / "round5").exists(), 90, "worker 0 to finish round 5")
        procs = {p["name"]: p for p in latest(home)["procs"]}
        assert (procs["scheduler"]["host"], procs["scheduler-1"]["host"]) == ("node1", "node2")
        os.killpg(procs["scheduler"]["pid"], signal.SIGKILL)     # the scheduler and its reaper, on its host
        out, _ = proc.communicate(timeout=180)
    finally:
        kill_cli(proc)
    assert proc.returncode == 0, out
    assert "scheduler on node1 ended without an exit status (killed together with its reaper?): the standby " \
           "scheduler on node2 takes the job over at 127.0.0.3:" in out, out
    assert "restarting it" not in out, out
    ranks = sorted(line.split("] ", 1)[-1] for line in out.splitlines() if "] RANK " in line)
    assert ranks == [f"RANK {r} ROUNDS 150 BAD []" for r in range(3)], out
    assert out.count("going over to the standby scheduler at 127.0.0.3:") >= 5, out   # 3 workers, 2 servers
    last = out.splitlines()[-1]
    assert "succeeded in" in last and "the standby scheduler on node2 took the job over" in last, out
    rec = latest(home)
    assert rec["state"] == "succeeded" and rec["failover"] == "node2"
    assert rec["scheduler"].startswith("127.0.0.3:")
    status = run_cli(["status", rec["id"]], env)
    assert "the standby scheduler on node2" in status.stdout and "took the job over at" in status.stdout, \
        status.stdout + status.stderr
    assert json.loads(run_cli(["status", rec["id"], "--json"], env).stdout)["state"] == "succeeded"
    assert_nothing_left(home)


def test_without_a_failure_the_idle_standby_is_stopped_with_the_job(ssh_cluster, home, tmp_path):
    flags = tmp_path / "flags"
    flags.mkdir()
    job = tmp_path / "job.py"
    job.write_text(ROUNDS)
    res = run_cli(["launch", "-H", "node1,node2", "-n", "3", "-s", "2", "--standby-scheduler", str(job), str(flags),
                   "10"], ssh_cluster.env(home), timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "took the job over" not in res.stderr and "standby" not in res.stderr.splitlines()[-1], res.stderr
    rec = latest(home)
    assert rec["state"] == "succeeded" and rec["failover"] is None
    assert {p["name"]: p["host"] for p in rec["procs"]}["scheduler-1"] == "node2"
    assert_nothing_left(home)


def test_one_host_is_refused_with_the_reason(home, tmp_path):
    from tests.support.cli import cli_env

    res = run_cli(["launch", "-n", "2", "-s", "1", "--standby-scheduler", "--dry-run", "python", "-c", "pass"],
                  cli_env(home), timeout=60)
    assert res.returncode != 0
    assert "--standby-scheduler needs a second host" in res.stdout + res.stderr, res.stdout + res.stderr
