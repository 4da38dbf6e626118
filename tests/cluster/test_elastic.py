"""Elastic membership with real processes (scheduler, servers, workers; no launcher): a worker
joins the running job and later leaves it gracefully; a worker killed with kill -9 is reported
lost and the job completes without it.  Values are closed-form: rank r pushes r + 1 in every
round, so the value after round k is the mean of r + 1 over the ranks that pushed round k.
"""
from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

from psnode.scheduler.client import report_lost, request_leave, status
from tests.support.cluster import Job, Proc, start_job, wait_for_file, wait_job

SCRIPT = """
import json, os, sys, time
import numpy as np, psnode
from psnode.math.sparse import row_sparse_array
tmp, R = sys.argv[1], int(sys.argv[2])
kv = psnode.kv.create('dist_sync')
r = kv.rank
kv.init('w', np.zeros(3, np.float32))                    # small: a bucket of one key
kv.init('big', np.zeros(40, np.float32))                 # above PSNODE_BIG_ARRAY_BOUND: split over servers
kv.init('emb', psnode.sparse.zeros((6, 2)))              # row_sparse
done = kv.num_pushes('w')
starts = {k: kv.num_pushes(k) for k in ('w', 'big', 'emb')}
changes = []
kv.on_membership_change(lambda g, m: changes.append([g, m]))
print("START", json.dumps({"rank": r, "start": done + 1, "starts": starts, "gen": kv.generation,
                           "members": kv.members}), flush=True)
if done:                                                  # a joiner: the others may go on
    open(f"{tmp}/joined", "w").write(str(done + 1))
w, big = np.zeros(3, np.float32), np.zeros(40, np.float32)
for step in range(done + 1, R + 1):
    kv.push('w', np.full(3, r + 1, np.float32))
    kv.push('big', np.full(40, r + 1, np.float32))
    kv.push('emb', row_sparse_array((np.full((6, 2), r + 1, np.float32), np.arange(6)), shape=(6, 2)))
    if os.environ.get("DIE_AFTER_PUSH") == f"{r}:{step}":   # its pushes of this round arrived; no pull
        kv.wait_all()
        os.kill(os.getpid(), 9)
    kv.pull('w', out=w)
    kv.pull('big', out=big)
    emb = kv.row_sparse_pull('emb', row_ids=np.arange(6)).data
    vals = {float(v) for v in (*w, *big, *emb.reshape(-1))}
    print("REC", json.dumps({"rank": r, "step": step, "vals": sorted(vals), "n": kv.num_workers}), flush=True)
    if r == 0 and step == 5 and os.environ.get("GATE_JOIN"):   # round 5 done: a joiner may come
        open(f"{tmp}/at5", "w").write("")
        while not os.path.exists(f"{tmp}/joined"):
            time.sleep(0.01)
    if done and step == done + 3:                         # the joiner: the test asks it to leave now
        open(f"{tmp}/pushed3", "w").write("")
        deadline = time.monotonic() + 20
        while not kv.leaving and time.monotonic() < deadline:
            time.sleep(0.01)
    if os.environ.get("DIE_AT") == f"{r}:{step}":
        os.kill(os.getpid(), 9)
    time.sleep(0.02)
print("END", json.dumps({"rank": r, "changes": changes, "gen": kv.generation, "members": kv.members}), flush=True)
kv.close()
"""


def _start_worker(job: Job, rank: int, env: dict[str, str]) -> Proc:
    """Start one more copy of the job's worker script with ``rank`` (a joiner)."""
    base = job.workers[0]
    e = dict(base.env, PSNODE_RANK=str(rank), **env)
    p = subprocess.Popen(base.argv, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    return job.add(Proc("worker", rank, p, base.argv, e))


def _records(proc: Proc, tag: str) -> list[dict]:
    return [json.loads(line.split(" ", 1)[1]) for line in proc.out.splitlines() if line.startswith(tag + " ")]


def _check_rounds(job: Job, spans: dict[int, tuple[int, int]], unseen: int = 0) -> None:
    """Every worker's value after round k is the mean of r + 1 over the ranks r whose span
    (first, last round pushed) holds k, on every key (``unseen``: rounds pushed whose value
    their worker never pulled)."""
    seen = 0
    for p in job.workers:
        for rec in _records(p, "REC"):
            k = rec["step"]
            ranks = [r for r, (a, b) in spans.items() if a <= k <= b]
            want = sum(r + 1 for r in ranks) / len(ranks)
            assert rec["vals"] == [want], (p.rank, rec, ranks, job.describe())
            seen += 1
    assert seen == sum(b - a + 1 for a, b in spans.values()) - unseen, job.describe()


def test_join_then_graceful_leave_exact_values(tmp_path: Path) -> None:
    R = 30
    env = {"PSNODE_MAX_WORKERS": "3", "PSNODE_MIN_WORKERS": "2", "PSNODE_BIG_ARRAY_BOUND": "10"}
    job = start_job(SCRIPT, 2, 2, env=env, args=[str(tmp_path), str(R)],
                    worker_env={0: {"GATE_JOIN": "1"}})
    try:
        wait_for_file(tmp_path / "at5")
        joiner = _start_worker(job, 2, {})
        wait_for_file(tmp_path / "joined")
        s = int((tmp_path / "joined").read_text())
        got = status(job.scheduler, job.job_id)
        assert (got.generation, got.members, got.joined, got.left, got.lost) == (1, (0, 1, 2), 1, 0, 0)
        wait_for_file(tmp_path / "pushed3")
        assert request_leave(job.scheduler, job.job_id, [2])
        assert joiner.popen.wait(30) == 0, job.describe()
        got = status(job.scheduler, job.job_id)
        assert (got.generation, got.members, got.joined, got.left, got.lost) == (2, (0, 1), 1, 1, 0)
    finally:
        wait_job(job, 60)
    assert [p.code for p in job.procs] == [0] * len(job.procs), job.describe()
    start = _records(joiner, "START")[0]
    assert start["starts"] == {"w": s - 1, "big": s - 1, "emb": s - 1} and s == 7, start   # (round 6 opened)
    assert start["gen"] == 1 and start["members"] == [0, 1, 2]
    _check_rounds(job, {0: (1, R), 1: (1, R), 2: (s, s + 2)})   # (it pushed rounds s .. s + 2)
    ends = {p.rank: _records(p, "END") for p in job.workers}
    assert ends[2] == []     # it left at its push: psnode.errors.Leave, code 0
    for r in (0, 1):
        assert ends[r][0]["gen"] == 2 and ends[r][0]["members"] == [0, 1]
        assert ends[r][0]["changes"] == [[1, [0, 1, 2]], [2, [0, 1]]]
    assert "left the job" in joiner.err


def test_lost_worker_is_reported_and_the_job_completes_exactly(tmp_path: Path) -> None:
    R = 20
    env = {"PSNODE_MAX_WORKERS": "3", "PSNODE_MIN_WORKERS": "2", "PSNODE_BIG_ARRAY_BOUND": "10"}
    job = start_job(SCRIPT, 3, 2, env=env, args=[str(tmp_path), str(R)], worker_env={2: {"DIE_AT": "2:8"}})
    try:
        victim = job.workers[2]
        assert victim.popen.wait(30) == -signal.SIGKILL, job.describe()
        assert report_lost(job.scheduler, job.job_id, 2)   # (its heartbeats may have said so first)
        got = status(job.scheduler, job.job_id)
        assert (got.generation, got.members, got.lost) == (1, (0, 1), 1)
    finally:
        wait_job(job, 60)
    assert [p.code for p in job.procs if p is not victim] == [0] * (len(job.procs) - 1), job.describe()
    _check_rounds(job, {0: (1, R), 1: (1, R), 2: (1, 8)})


def test_a_rank_in_use_is_refused_by_name(tmp_path: Path) -> None:
    env = {"PSNODE_MAX_WORKERS": "3"}
    job = start_job(SCRIPT, 2, 1, env=env, args=[str(tmp_path), "12"], worker_env={0: {"GATE_JOIN": "1"}})
    try:
        wait_for_file(tmp_path / "at5")
        extra = _start_worker(job, 1, {})
        assert extra.popen.wait(30) != 0
        (tmp_path / "joined").write_text("0")
    finally:
        wait_job(job, 60)
    assert "rank 1 is in use" in extra.err, job.describe()
    assert [p.code for p in job.procs if p is not extra] == [0, 0, 0, 0], job.describe()


SAMPLER = """
import json, sys
import numpy as np, psnode
from psnode.data import ShardSampler
kv = psnode.kv.create('dist_sync')
sampler = ShardSampler(12, kv=kv, seed=5)
for epoch in range(3):
    if kv.rank == 2 and epoch == 1:
        break                                          # rank 2 ends after epoch 0
    sampler.set_epoch(epoch)
    print("EPOCH", json.dumps({"rank": kv.rank, "epoch": epoch, "idx": sampler.indices().tolist(),
                               "members": sampler.num_replicas}), flush=True)
kv.close()
"""


def test_the_sampler_covers_each_epoch_once_over_that_epochs_members() -> None:
    job = start_job(SAMPLER, 3, 1, env={"PSNODE_MIN_WORKERS": "2"})
    wait_job(job, 60)
    assert [p.code for p in job.procs] == [0] * len(job.procs), job.describe()
    by_epoch: dict[int, list[int]] = {}
    for p in job.workers:
        for rec in _records(p, "EPOCH"):
            by_epoch.setdefault(rec["epoch"], []).extend(rec["idx"])
            assert rec["members"] == (3 if rec["epoch"] == 0 else 2), rec
    assert sorted(by_epoch) == [0, 1, 2]
    for epoch, idx in by_epoch.items():
        assert sorted(idx) == list(range(12)), (epoch, idx)


def test_a_silent_worker_is_removed_and_its_open_rounds_push_is_kept(tmp_path: Path) -> None:
    """No report_lost: its heartbeats stop (min 2 of 3).  It pushed round 9 on every key and
    died before the others did: round 9 counts it, later rounds complete over the rest."""
    R = 16
    env = {"PSNODE_MIN_WORKERS": "2", "PSNODE_BIG_ARRAY_BOUND": "10"}
    job = start_job(SCRIPT, 3, 2, env=env, args=[str(tmp_path), str(R)], worker_env={2: {"DIE_AFTER_PUSH": "2:9"}})
    try:
        victim = job.workers[2]
        assert victim.popen.wait(30) == -signal.SIGKILL, job.describe()
    finally:
        wait_job(job, 60)
    assert [p.code for p in job.procs if p is not victim] == [0] * (len(job.procs) - 1), job.describe()
    _check_rounds(job, {0: (1, R), 1: (1, R), 2: (1, 9)}, unseen=1)
    assert "worker 2" in job.procs[0].err and "lost" in job.procs[0].err, job.describe()


PLAIN = """
import json, sys, time
import numpy as np, psnode
kv = psnode.kv.create('dist_sync')
kv.init('w', np.zeros(5, np.float32))
start = kv.num_pushes('w') + 1
print("START", json.dumps({"rank": kv.rank, "start": start}), flush=True)
w = np.zeros(5, np.float32)
for step in range(start, 41):
    kv.push('w', np.full(5, kv.rank + 1, np.float32))
    kv.pull('w', out=w)
    print("REC", json.dumps({"rank": kv.rank, "step": step, "vals": sorted({float(v) for v in w})}), flush=True)
    time.sleep(0.01)
kv.close()
"""


def test_a_joiner_at_any_moment_gets_exact_values() -> None:
    """A joiner started with the job (it may register before the first generation is
    complete: it waits, then joins) or a little later: every round's value is exact over the
    ranks whose start is at or before it."""
    job = start_job(PLAIN, 2, 1, env={"PSNODE_MAX_WORKERS": "3"})
    try:
        joiner = _start_worker(job, 2, {})
    finally:
        wait_job(job, 60)
    assert [p.code for p in job.procs] == [0] * len(job.procs), job.describe()
    starts = {p.rank: _records(p, "START")[0]["start"] for p in job.workers}
    assert starts[0] == starts[1] == 1 and starts[2] >= 2, starts
    _check_rounds(job, {r: (s, 40) for r, s in starts.items()})
    assert joiner.code == 0
