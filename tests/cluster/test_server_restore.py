"""A server killed mid-job is restarted, restores its shard and optimizer state from its last
checkpoint, and the job ends with exactly the values of an uninterrupted run.

Worker 0 pushes round 5 and waits in its pull; worker 1 has not pushed round 5 yet.  The test
kills server 1 (kill -9) right then, starts its replacement (as ``mxdist launch --max-restarts``
does), and only then lets worker 1 go on.  Pushes sent to the dead server, the parked pull and
the round in progress are all recovered: the replacement restores exactly its checkpointed
state (written before any answer that needed it) and the workers resend what it lacks.
"""
from __future__ import annotations

import os
import signal

from tests.support.cluster import alive, restart_worker, start_job, wait_for_file, wait_job
from tests.support.server_restore import finals, kill_servers_mid_round, reference


def test_killed_server_restores_from_checkpoint_and_the_job_ends_exactly(tmp_path) -> None:
    env = {"PSNODE_MAX_RESTARTS": "1", "PSNODE_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
           "PSNODE_CHECKPOINT_ROUNDS": "1", "PSNODE_BIG_ARRAY_BOUND": "8",
           "PSNODE_RETRY_TIMEOUT": "1"}
    job = kill_servers_mid_round(tmp_path, env, [1])
    codes = sorted((p.role, p.rank, p.code) for p in job.procs)
    assert codes == [("scheduler", 0, 0), ("server", 0, 0), ("server", 1, -9), ("server", 1, 0),
                     ("worker", 0, 0), ("worker", 1, 0)], job.describe()
    want = {k: str(v) for k, v in reference().items()}
    for w in job.workers:
        assert finals(w.out) == want, job.describe()
        assert "server 1 restarted at" in w.err, w.err   # reconnected, resent
    restored = job.by_role("server")[-1]
    assert "server 1 restored 3 key parts" in restored.err and "serving again" in restored.err, restored.err
    assert not [p.popen.pid for p in job.procs if alive(p.popen.pid)]


SPARSE = """
import sys, time, pathlib, numpy as np, psnode
flags = pathlib.Path(sys.argv[1])
kv = psnode.kv.create('dist_sync')
kv.set_optimizer(psnode.optimizer.create('sgd', learning_rate=1.0))
kv.init('w', np.zeros(2, np.float32))
kv.push('w', np.ones(2, np.float32))
kv.pull('w')
(flags / 'ready').touch()
deadline = time.monotonic() + 60
while not (flags / 'go').exists():
    assert time.monotonic() < deadline
    time.sleep(0.02)
kv.push('w', np.full(2, 2, np.float32))
print('FINAL', kv.pull('w').tolist(), flush=True)
kv.close()
"""


def _kill_and_restart_server(job, flags) -> None:
    wait_for_file(flags / "ready", 30)
    server = job.by_role("server")[0]
    os.kill(server.popen.pid, signal.SIGKILL)
    server.popen.wait(10)


def test_a_server_restored_from_a_checkpoint_older_than_what_it_revealed_is_given_the_pushes_back(
        tmp_path) -> None:
    """--checkpoint-rounds 1000: round 1 was answered but never checkpointed (only the new key
    was).  The worker kept push 1 (its durable watermark said 0), resends it to the restored
    server, and the job ends as if nothing had happened: push 1 applied once, not lost."""
    flags = tmp_path / "flags"
    flags.mkdir()
    env = {"PSNODE_MAX_RESTARTS": "1", "PSNODE_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
           "PSNODE_CHECKPOINT_ROUNDS": "1000"}
    job = start_job(SPARSE, 1, 1, env=env, args=[str(flags)], tmp=tmp_path)
    try:
        _kill_and_restart_server(job, flags)
        restart_worker(job, 0, 1, role="server")
        (flags / "go").touch()
    finally:
        wait_job(job, 60)
    assert job.workers[0].code == 0, job.describe()
    assert [line for line in job.workers[0].out.splitlines() if line.startswith("FINAL")] == ["FINAL [-3.0, -3.0]"]
    assert not [p.popen.pid for p in job.procs if alive(p.popen.pid)]


def test_server_restarted_without_its_checkpoint_fails_the_job_naming_why(tmp_path) -> None:
    flags = tmp_path / "flags"
    flags.mkdir()
    ckpt = tmp_path / "ckpt"
    env = {"PSNODE_MAX_RESTARTS": "1", "PSNODE_CHECKPOINT_DIR": str(ckpt), "PSNODE_CHECKPOINT_ROUNDS": "1"}
    job = start_job(SPARSE, 1, 1, env=env, args=[str(flags)], tmp=tmp_path)
    try:
        _kill_and_restart_server(job, flags)
        (ckpt / "server-0.npz").unlink()          # (e.g. a directory the restarted server does not see)
        restart_worker(job, 0, 1, role="server")
    finally:
        wait_job(job, 60)
    replacement = job.by_role("server")[-1]
    assert replacement.code == 1
    assert "cannot restore its shard: no checkpoint for server 0" in replacement.err, replacement.err
    assert "where the job's servers can all write" in replacement.err
    assert job.by_role("scheduler")[0].code == 1
    worker = job.workers[0]
    # the worker says in one line who ended the job (the reason is said once, by the server)
    assert worker.code == 1 and "ended: server 0 on 127.0.0.1" in worker.err, job.describe()
    assert not [p.popen.pid for p in job.procs if alive(p.popen.pid)]
