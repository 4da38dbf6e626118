"""A worker that dies and is restarted with its rank rejoins and the job ends exactly."""
from __future__ import annotations

import time

import pytest

from harness import restart_worker, start_job, wait_job

SCRIPT = """
import os, sys, numpy as np, psnode
CRASH = sys.argv[1]
kv = psnode.kv.create('dist_sync')
kv.set_optimizer(psnode.optimizer.create('sgd', learning_rate=0.125))
kv.init('w', np.zeros(3, np.float32))
start = kv.num_pushes('w')
print("START", start, "RESTARTS", kv.restarts, flush=True)
for step in range(start, 6):
    if kv.rank == 1 and step == 3 and os.environ.get('PSNODE_RESTART_COUNT', '0') == '0':
        if CRASH == 'raise':
            raise RuntimeError('boom')               # an uncaught exception after three rounds
        os._exit(9)                                   # a hard crash after three rounds
    kv.push('w', np.full(3, (kv.rank + 1) * (step + 1), np.float32))
    kv.pull('w')
print("FINAL", kv.pull('w').tolist(), flush=True)
kv.close()
"""


@pytest.mark.parametrize("crash,code", [("exit", 9), ("raise", 1)])
def test_restarted_worker_rejoins_with_the_same_final_values(crash: str, code: int) -> None:
    job = start_job(SCRIPT, 2, 2, env={"PSNODE_MAX_RESTARTS": "1"}, args=[crash])
    deadline = time.monotonic() + 30
    first = next(p for p in job.workers if p.rank == 1)
    while first.popen.poll() is None:
        assert time.monotonic() < deadline, "worker 1 did not crash"
        time.sleep(0.05)
    assert first.popen.returncode == code
    restart_worker(job, 1, 1)
    wait_job(job, 60)
    codes = [(p.role, p.rank, p.code) for p in job.procs]
    assert [c for c in codes if c[2] != 0] == [("worker", 1, code)], job.describe()
    # uninterrupted closed form: w = -lr * sum_s mean_grad_s = -0.125 * sum_s 1.5 (s + 1)
    want = [-0.125 * 1.5 * sum(range(1, 7))] * 3
    finals = [line for p in job.workers for line in p.out.splitlines() if line.startswith("FINAL")]
    assert finals == [f"FINAL {want}"] * 2, job.describe()
    assert "START 3 RESTARTS 1" in job.workers[-1].out
