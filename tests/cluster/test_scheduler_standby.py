"""A standby scheduler takes the job over when the scheduler dies: the nodes go over to it
after the heartbeat timeout and it rebuilds the job from them, while the rounds go on.

Real processes on 127.0.0.1 through the env contract (no launcher): W=3 workers, S=2
servers, the scheduler and a standby (``PSNODE_STANDBY=1`` at its own port; every node has
``PSNODE_SCHEDULER_STANDBY``).  The scheduler is killed with SIGKILL after round 5; every
round is checked against its closed form (rank r pushes (r+1)*(step+1): the average is
2*(step+1)), every process but the killed one exits 0.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.cluster import Proc, free_port, start_job, wait_for_file, wait_job
from tests.support.scheduler_restart import ROUNDS

ROUNDS_RUN = 60


def test_a_killed_scheduler_hands_the_job_to_the_standby_with_exact_rounds(tmp_path: Path) -> None:
    standby = f"127.0.0.1:{free_port()}"
    job = start_job(ROUNDS, 3, 2, env={"PSNODE_SCHEDULER_STANDBY": standby}, args=[str(tmp_path), str(ROUNDS_RUN)],
                    tmp=tmp_path)
    primary = job.by_role("scheduler")[0]
    env = {k: v for k, v in primary.env.items() if k != "PSNODE_SCHEDULER_STANDBY"}
    env.update(PSNODE_SCHEDULER=standby, PSNODE_STANDBY="1")
    argv = [sys.executable, "-m", "psnode"]
    job.add(Proc("scheduler", 1, subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                  text=True, start_new_session=True), argv, env))
    wait_for_file(tmp_path / "round5", 60)
    os.kill(primary.popen.pid, signal.SIGKILL)
    wait_job(job, 120)
    second = job.by_role("scheduler")[1]
    codes = sorted((p.role, p.rank, p.code) for p in job.procs)
    assert codes == [("scheduler", 0, -signal.SIGKILL), ("scheduler", 1, 0), ("server", 0, 0), ("server", 1, 0),
                     ("worker", 0, 0), ("worker", 1, 0), ("worker", 2, 0)], job.describe()
    for w in job.workers:
        assert f"RANK {w.rank} ROUNDS {ROUNDS_RUN} BAD []" in w.out, job.describe()
        assert f"going over to the standby scheduler at {standby}" in w.err, job.describe()
    for s in job.by_role("server"):
        assert f"going over to the standby scheduler at {standby}" in s.err, job.describe()
    assert "taking the job" in second.err and "over from its live nodes" in second.err, job.describe()


def test_a_node_cut_off_from_a_live_scheduler_is_refused_by_the_standby(tmp_path: Path) -> None:
    """Worker 1 cannot reach the scheduler (its address leads nowhere: a partition between them)
    while the scheduler runs.  It goes over to the standby, which asks the scheduler first
    (``PSNODE_PRIMARY``), finds it alive and refuses the node: it never takes the job over, so no
    two schedulers hold parts of one job; the job fails, naming the worker that never came."""
    standby = f"127.0.0.1:{free_port()}"
    nowhere = f"127.0.0.1:{free_port()}"
    job = start_job(ROUNDS, 2, 1, env={"PSNODE_SCHEDULER_STANDBY": standby, "PSNODE_REGISTER_TIMEOUT": "6"},
                    args=[str(tmp_path), "5"], tmp=tmp_path, worker_env={1: {"PSNODE_SCHEDULER": nowhere}})
    primary = job.by_role("scheduler")[0]
    env = {k: v for k, v in primary.env.items() if k != "PSNODE_SCHEDULER_STANDBY"}
    env.update(PSNODE_SCHEDULER=standby, PSNODE_STANDBY="1", PSNODE_PRIMARY=job.scheduler)
    argv = [sys.executable, "-m", "psnode"]
    second = job.add(Proc("scheduler", 1, subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                                           stderr=subprocess.PIPE, text=True, start_new_session=True),
                           argv, env))
    try:
        rest = [p for p in job.procs if p is not second]
        assert job.drained.wait(rest, time.monotonic() + 60), job.describe()
    finally:
        second.popen.terminate()
        wait_job(job, 30)
    worker1 = next(w for w in job.workers if w.rank == 1)
    assert worker1.code == 1 and "cut off from the scheduler at " + job.scheduler in worker1.err, job.describe()
    assert "still answers: not taking over" in second.err and "taking the job" not in second.err, job.describe()
    assert primary.code == 1 and "only 1 of 2 workers" in primary.err, job.describe()
