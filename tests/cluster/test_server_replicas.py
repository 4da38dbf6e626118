"""A server killed mid-job (kill -9) is replaced with no checkpoint directory: the replacement
copies its state back from the replica its holder keeps in memory (psnode.server.replicas), and
the job ends with exactly the values of an uninterrupted run.

The same moment as the checkpoint test (tests/cluster/test_server_restore.py): worker 0 pushed
round 5 and waits in its pull, worker 1 has not pushed it.  No disk is involved: the job has no
``PSNODE_CHECKPOINT_DIR``, and ``PSNODE_REPLICAS=2`` puts server 1's state on server 0.
"""
from __future__ import annotations

from tests.support.cluster import alive
from tests.support.server_restore import finals, kill_server_twice, kill_servers_mid_round, reference

#: no PSNODE_CHECKPOINT_DIR: server r's state lives in server r+1's memory only
ENV = {"PSNODE_MAX_RESTARTS": "1", "PSNODE_REPLICAS": "2", "PSNODE_CHECKPOINT_ROUNDS": "1",
       "PSNODE_BIG_ARRAY_BOUND": "8", "PSNODE_RETRY_TIMEOUT": "1"}


def test_killed_server_restores_from_its_replica_and_the_job_ends_exactly(tmp_path) -> None:
    job = kill_servers_mid_round(tmp_path, ENV, [1])
    codes = sorted((p.role, p.rank, p.code) for p in job.procs)
    assert codes == [("scheduler", 0, 0), ("server", 0, 0), ("server", 1, -9), ("server", 1, 0),
                     ("worker", 0, 0), ("worker", 1, 0)], job.describe()
    want = {k: str(v) for k, v in reference().items()}
    for w in job.workers:
        assert finals(w.out) == want, job.describe()
        assert "server 1 restarted at" in w.err, w.err   # reconnected, resent
    restored = job.by_role("server")[-1]
    assert "server 1 restored 3 key parts from its replica on server 0" in restored.err, restored.err
    assert not list(tmp_path.rglob("server-*.npz"))    # no checkpoint anywhere
    assert not [p.popen.pid for p in job.procs if alive(p.popen.pid)]


def test_both_servers_killed_in_turn_each_restores_from_the_other(tmp_path) -> None:
    """Server 1 dies, its replacement restores from server 0; then server 0 dies and restores
    from the replacement, which holds server 0's state only because server 0 copied it there
    again once it learnt of the replacement (K-safe again)."""
    job = kill_servers_mid_round(tmp_path, ENV, [1, 0])
    codes = sorted((p.role, p.rank, p.code) for p in job.procs)
    assert codes == [("scheduler", 0, 0), ("server", 0, -9), ("server", 0, 0), ("server", 1, -9),
                     ("server", 1, 0), ("worker", 0, 0), ("worker", 1, 0)], job.describe()
    want = {k: str(v) for k, v in reference().items()}
    for w in job.workers:
        assert finals(w.out) == want, job.describe()
    zero = [p for p in job.by_role("server") if p.rank == 0][-1]
    assert "server 0 restored 3 key parts from its replica on server 1" in zero.err, zero.err
    assert not [p.popen.pid for p in job.procs if alive(p.popen.pid)]


def test_the_same_server_killed_twice_restores_what_its_first_replacement_made_durable(tmp_path) -> None:
    """Server 1 dies mid-round; its replacement restores from server 0, and rounds 6 and 7
    complete on it, each copied to server 0 (so the workers forget those pushes); then the
    replacement dies too: the second replacement must restore the first one's copy (a keeper
    keeps a replacement's copies over its predecessor's, whatever their numbers), and the job
    ends exactly."""
    job = kill_server_twice(tmp_path, {**ENV, "PSNODE_MAX_RESTARTS": "2"}, 1)
    codes = sorted((p.role, p.rank, p.code) for p in job.procs)
    assert codes == [("scheduler", 0, 0), ("server", 0, 0), ("server", 1, -9), ("server", 1, -9),
                     ("server", 1, 0), ("worker", 0, 0), ("worker", 1, 0)], job.describe()
    want = {k: str(v) for k, v in reference().items()}
    for w in job.workers:
        assert finals(w.out) == want, job.describe()
    last = job.by_role("server")[-1]
    assert "server 1 restored 3 key parts from its replica on server 0" in last.err, last.err
    assert not [p.popen.pid for p in job.procs if alive(p.popen.pid)]
