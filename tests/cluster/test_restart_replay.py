"""A restarted worker whose script starts over (no ``kv.num_pushes``) replays: its pushes of
rounds the servers already applied are recognised and not applied again, its barriers already
passed are answered at once, and the job ends with the values of an uninterrupted run; a script
that resumes gets the same result (and stops resending)."""
from __future__ import annotations

import time

import pytest

from tests.support.cluster import restart_worker, start_job, wait_job

SCRIPT = """
import os, sys, numpy as np, psnode
MODE = sys.argv[1]
kv = psnode.kv.create('dist_sync')
kv.set_optimizer(psnode.optimizer.create('sgd', learning_rate=0.125))
kv.init('w', np.zeros(3, np.float32))
kv.init('v', np.zeros(100, np.float32))
start = kv.num_pushes('w') if MODE == 'resume' else 0
print("START", start, "RESTARTS", kv.restarts, flush=True)
for step in range(start, 8):
    if kv.rank == 1 and step == 5 and os.environ.get('PSNODE_RESTART_COUNT', '0') == '0':
        os._exit(9)
    kv.push(['w', 'v'], [np.full(3, (kv.rank + 1) * (step + 1), np.float32),
                         np.full(100, kv.rank + 1, np.float32)])
    kv.pull(['w', 'v'])
    if step % 2 == 1:
        kv.barrier()
print("FINAL", kv.pull('w').tolist(), kv.pull('v')[:2].tolist(), "PUSHES", kv.num_pushes('w'), flush=True)
kv.close()
"""


@pytest.mark.parametrize("mode", ["replay", "resume"])
def test_restarted_worker_that_starts_over_or_resumes_ends_exactly(mode: str) -> None:
    job = start_job(SCRIPT, 2, 2, env={"PSNODE_MAX_RESTARTS": "1", "PSNODE_RETRY_TIMEOUT": "0.5",
                                       "PSNODE_LOG_LEVEL": "DEBUG"},   # (resends are said at DEBUG)
                    args=[mode])
    first = next(p for p in job.workers if p.rank == 1)
    deadline = time.monotonic() + 30
    while first.popen.poll() is None:
        assert time.monotonic() < deadline, "worker 1 did not crash"
        time.sleep(0.05)
    assert first.popen.returncode == 9
    again = restart_worker(job, 1, 1)
    started = time.monotonic()
    wait_job(job, 60)
    assert time.monotonic() - started < 20, "the restarted job took too long"
    assert [(p.role, p.rank, p.code) for p in job.procs if p.code != 0] == [("worker", 1, 9)], job.describe()
    # uninterrupted: w = -0.125 * sum_s 1.5 (s + 1), v = -0.125 * 8 * 1.5
    want = f"FINAL {[-0.125 * 1.5 * sum(range(1, 9))] * 3} {[-0.125 * 8 * 1.5] * 2} PUSHES 8"
    finals = [line for p in job.workers for line in p.out.splitlines() if line.startswith("FINAL")]
    assert finals == [want] * 2, job.describe()
    assert f"START {5 if mode == 'resume' else 0} RESTARTS 1" in again.out
    resends = sum(p.err.count("sending again") for p in job.workers)
    assert resends <= 4, job.describe()          # never a resend loop
