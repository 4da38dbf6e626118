"""A scheduler killed with kill -9 on its host, over real SSH (three sshd "hosts" on
127.0.0.2-4, see conftest.py): the launcher restarts it there, at its address, the nodes on
every host rejoin it, and the job ends exactly (the same job as
tests/cluster/test_scheduler_restart.py)."""
from __future__ import annotations

import json
import os
import signal

from tests.support.cli import assert_nothing_left, kill_cli, latest, run_cli, start_cli, wait_for
from tests.support.scheduler_restart import ROUNDS


def test_remote_scheduler_killed_is_restarted_on_its_host_and_the_job_ends_exactly(ssh_cluster, home, tmp_path):
    flags = tmp_path / "flags"
    flags.mkdir()
    job = tmp_path / "job.py"
    job.write_text(ROUNDS)
    env = ssh_cluster.env(home)
    proc = start_cli(["launch", "-H", "node1,node2,node3", "-n", "3", "-s", "2", str(job), str(flags), "150"], env)
    try:
        wait_for(lambda: (flags / "round5").exists(), 90, "worker 0 to finish round 5")
        sched = next(p for p in latest(home)["procs"] if p["name"] == "scheduler")
        os.killpg(sched["pid"], signal.SIGKILL)     # the scheduler and its reaper, on its host
        out, _ = proc.communicate(timeout=180)
    finally:
        kill_cli(proc)
    assert proc.returncode == 0, out
    host = sched["host"]
    assert f"scheduler on {host} ended without an exit status (killed together with its reaper?): " \
           f"restarting it at" in out, out
    ranks = sorted(line.split("] ", 1)[-1] for line in out.splitlines() if "] RANK " in line)
    assert ranks == [f"RANK {r} ROUNDS 150 BAD []" for r in range(3)], out
    last = out.splitlines()[-1]
    assert "succeeded in" in last and last.endswith(": scheduler restarted 1 time"), out
    rec = latest(home)
    assert rec["state"] == "succeeded"
    after = next(p for p in rec["procs"] if p["name"] == "scheduler")
    assert after["restarts"] == 1 and after["host"] == host
    status = json.loads(run_cli(["status", rec["id"], "--json"], env).stdout)
    assert next(n for n in status["nodes"] if n["role"] == "scheduler")["restarts"] == 1
    assert_nothing_left(home)
