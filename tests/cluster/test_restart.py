"""A worker that dies and is restarted with its rank rejoins and the job ends exactly; one that
was only stopped past the heartbeat timeout goes on when it resumes."""
from __future__ import annotations

import os
import signal
import time

import pytest

from psnode.scheduler.client import status
from tests.support import wait_for
from tests.support.cluster import restart_worker, start_job, wait_job

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


EXITS = """
import os, sys, numpy as np, psnode
kv = psnode.kv.create('dist_sync')
kv.init('w', np.zeros(1, np.float32))
kv.push('w', np.ones(1, np.float32)); kv.pull('w')
if kv.rank == 1 and os.environ.get('PSNODE_RESTART_COUNT', '0') == '0':
    sys.exit(3)                                      # counts as finished: cannot be restarted
import time, pathlib
deadline = time.monotonic() + 30                     # rank 0 keeps the job alive meanwhile
while not pathlib.Path(sys.argv[1]).exists() and time.monotonic() < deadline:
    time.sleep(0.02)
kv.close()
"""


def test_a_worker_that_called_sys_exit_is_told_why_it_cannot_rejoin(tmp_path) -> None:
    done = tmp_path / "done"
    job = start_job(EXITS, 2, 1, env={"PSNODE_MAX_RESTARTS": "1"}, args=[str(done)], tmp=tmp_path)
    first = next(p for p in job.workers if p.rank == 1)
    first.popen.wait(30)
    assert first.popen.returncode == 3
    again = restart_worker(job, 1, 1)
    again.popen.wait(30)
    done.touch()
    wait_job(job, 60)
    assert again.code == 1
    assert "worker 1 already finished" in again.err and "instead of calling sys.exit(n)" in again.err, again.err


STOPPED = """
import os, pathlib, sys, time, numpy as np, psnode
flags = pathlib.Path(sys.argv[1])
kv = psnode.kv.create('dist_sync')
kv.set_optimizer(psnode.optimizer.create('sgd', learning_rate=0.125))
kv.init('w', np.zeros(3, np.float32))
for step in range(6):
    if kv.rank == 1 and step == 3:
        (flags / 'at3').touch()                      # the test stops this process here (SIGSTOP)
        time.sleep(1.0)
    kv.push('w', np.full(3, (kv.rank + 1) * (step + 1), np.float32))
    kv.pull('w')
    kv.barrier()                                     # (no barrier completes while a restart is awaited)
print("FINAL", kv.pull('w').tolist(), "RESTARTS", kv.restarts, flush=True)
kv.close()
"""


@pytest.mark.parametrize("relay", ["off", "on"])
def test_a_worker_stopped_past_the_timeout_goes_on_when_it_resumes(tmp_path, relay: str) -> None:
    """Worker 1 is stopped (SIGSTOP) until the scheduler takes it for silent and awaits its
    restart (``--max-restarts``); resumed (SIGCONT), it is taken back, its heartbeats and
    barrier entries direct or through the host's relay: no restart is awaited (none comes: its
    process never exited), its barrier completes, every process exits 0 and the final values
    are exact."""
    job = start_job(STOPPED, 2, 2, env={"PSNODE_MAX_RESTARTS": "1", "PSNODE_HEARTBEAT_RELAY": relay},
                    args=[str(tmp_path)])
    first = next(p for p in job.workers if p.rank == 1)
    try:
        wait_for(lambda: (tmp_path / "at3").exists(), 30, "worker 1 at step 3")
        os.kill(first.popen.pid, signal.SIGSTOP)
        wait_for(lambda: any(n.role == "worker" and n.rank == 1 and n.state == "restarting"
                             for n in status(job.scheduler, job.job_id, timeout=2.0).nodes),
                 10, "the scheduler awaiting worker 1's restart")
    finally:
        os.kill(first.popen.pid, signal.SIGCONT)
    wait_job(job, 15)   # (less than the 20 s the job would wait for a restart)
    codes = [(p.role, p.rank, p.code) for p in job.procs]
    assert all(c == 0 for _, _, c in codes), job.describe()
    scheduler = job.by_role("scheduler")[0]
    assert "worker 1 on 127.0.0.1" in scheduler.err and "speaks again (stopped or starved, not dead)" in scheduler.err, \
        job.describe()
    want = [-0.125 * 1.5 * sum(range(1, 7))] * 3
    finals = [line for p in job.workers for line in p.out.splitlines() if line.startswith("FINAL")]
    assert finals == [f"FINAL {want} RESTARTS 0"] * 2, job.describe()
