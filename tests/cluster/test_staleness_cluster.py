"""dist_ssp in a real job (scheduler, 2 servers, 3 workers on 127.0.0.1): every pull shows
exactly which pushes its value holds, and the staleness bound is never exceeded.

Each worker's push t of a key adds 1 at its own slot (rank, t) (SGD at lr 1 on the servers, a
gradient of -1 there), so a pulled value names the (rank, clock) pushes it contains.  Workers
sleep a seeded random time per step; worker 2 is the slow one.
"""
from __future__ import annotations

import json

import pytest

from tests.support.cluster import restart_worker, run_job, start_job, wait_job

T = 16   # steps per worker

BOUND_JOB = f"""
import json, sys, time
import numpy as np, psnode
s, comp = int(sys.argv[1]), sys.argv[2]
kv = psnode.kv.create('dist_ssp', staleness=s)
W, r, T = kv.num_workers, kv.rank, {T}
kv.set_optimizer(psnode.optimizer.create('sgd', learning_rate=1.0))
if comp != 'none':
    kv.set_gradient_compression({{'type': comp}})
kv.init('d', np.zeros(W * T, np.float32))              # split over both servers (bound 16)
kv.init('rs', psnode.sparse.zeros((W * T, 2), np.float32))
rng = np.random.default_rng(1000 + r)
rows = np.arange(W * T)

def held(v):
    '''per worker, the clocks whose push the value holds'''
    return [[t + 1 for t in range(T) if v[w * T + t] == 1] for w in range(W)]

for t in range(1, T + 1):
    time.sleep(0.06 if r == 2 else rng.uniform(0, 0.01))   # compute
    g = np.zeros(W * T, np.float32); g[r * T + t - 1] = -1
    kv.push('d', g)
    if comp == 'none':   # (compression is for dense keys)
        kv.push('rs', psnode.sparse.row_sparse_array((-np.ones((1, 2), np.float32), [r * T + t - 1]),
                                                     shape=(W * T, 2)))
    d = kv.pull('d')
    rec = {{"t": t, "d": held(d)}}
    if comp == 'none':
        rs = np.zeros((W * T, 2), np.float32)
        kv.row_sparse_pull('rs', out=rs, row_ids=rows)
        assert (rs[:, 0] == rs[:, 1]).all()
        rec["rs"] = held(rs[:, 0])
    print("PULL " + json.dumps(rec), flush=True)
kv.close()
"""


def pulls(job) -> list[tuple[int, int, str, list[list[int]]]]:
    """(rank, t, key, clocks held per worker) for every pull of every worker."""
    out = []
    for p in job.workers:
        for line in p.out.splitlines():
            if line.startswith("PULL "):
                rec = json.loads(line[5:])
                out.extend((p.rank, rec["t"], key, rec[key]) for key in ("d", "rs") if key in rec)
    return out


@pytest.mark.parametrize("s,comp", [(1, "none"), (3, "fp16")])
def test_every_pull_holds_every_push_within_the_bound(s: int, comp: str) -> None:
    job = run_job(BOUND_JOB, 3, 2, timeout=120, args=[str(s), comp], env={"PSNODE_BIG_ARRAY_BOUND": "16"})
    assert [p.code for p in job.procs] == [0] * len(job.procs), job.describe()
    seen = pulls(job)
    assert len(seen) == 3 * T * (2 if comp == "none" else 1)
    lags = []
    for rank, t, key, held in seen:
        assert set(range(1, t + 1)) <= set(held[rank]), (rank, t, key, held)    # its own pushes
        for w in range(3):
            assert set(range(1, t - s + 1)) <= set(held[w]), (rank, t, key, w, held)   # the bound
            assert all(c <= 16 for c in held[w])
        lags.append(t - min(len(h) for h in held))
    # the fast workers ran ahead of the slow one as far as the bound let them, never further
    assert max(lags) == s, sorted(lags)


SAME_JOB = """
import sys, hashlib
import numpy as np, psnode
kv = psnode.kv.create(sys.argv[1], staleness=int(sys.argv[2]) if sys.argv[1] == 'dist_ssp' else None)
W, r = kv.num_workers, kv.rank
kv.set_optimizer(psnode.optimizer.create('sgd', learning_rate=0.1, momentum=0.9, wd=0.01))
kv.init('big', np.linspace(-1, 1, 40, dtype=np.float32))     # split over both servers (bound 16)
kv.init('small', np.ones(5, np.float32))                     # in a bucket
kv.init('rs', psnode.sparse.zeros((10, 3), np.float32))
rng = np.random.default_rng(7 + r)
def grad(*shape):   # (eighths: their sums are exact in any order, as a round's arrival order varies)
    return (rng.integers(-16, 16, shape) / 8).astype(np.float32)
h = hashlib.sha256()
for t in range(1, 9):
    kv.push('big', grad(40))
    kv.push('small', grad(5))
    ids = rng.choice(10, 3, replace=False)
    kv.push('rs', psnode.sparse.row_sparse_array((grad(3, 3), ids), shape=(10, 3)))
    rs = np.zeros((10, 3), np.float32)
    kv.row_sparse_pull('rs', out=rs, row_ids=np.arange(10))
    for v in (kv.pull('big'), kv.pull('small'), rs):
        h.update(np.ascontiguousarray(v).tobytes())
print("HASH", h.hexdigest(), flush=True)
kv.close()
"""


def test_staleness_zero_gives_dist_sync_values_exactly() -> None:
    hashes = {}
    for args in (["dist_sync"], ["dist_ssp", "0"]):
        job = run_job(SAME_JOB, 3, 2, timeout=90, args=args, env={"PSNODE_BIG_ARRAY_BOUND": "16"})
        assert [p.code for p in job.procs] == [0] * len(job.procs), job.describe()
        hashes[args[0]] = {p.rank: p.out.split("HASH ")[1].split()[0] for p in job.workers}
    assert hashes["dist_ssp"] == hashes["dist_sync"]
    assert len(set(hashes["dist_sync"].values())) == 1   # (every worker pulled the same values)


TORCH_JOB = """
import torch
import numpy as np, psnode, psnode.torch
import time
torch.set_num_threads(1)
kv = psnode.kv.create('dist_ssp', staleness=1)
r = kv.rank
model = torch.nn.Linear(4, 1, bias=False)
torch.nn.init.ones_(model.weight)
trainer = psnode.torch.DistributedTrainer(model, kv, psnode.optimizer.create('sgd', learning_rate=2.0 ** -10))
for t in range(1, 13):
    if r == 1:
        time.sleep(0.03)   # (the slow one)
    model.weight.grad = torch.full((1, 4), float(r + 1))    # rank r's gradient: r + 1
    trainer.step()
    n = (1 - model.weight.detach().numpy()) * 1024          # = own pushes * (r + 1) + other's * (2 - r)
    other = (n - t * (r + 1)) / (2 - r)
    assert (other == other[0, 0]).all() and other[0, 0] >= t - 1, (t, other)
    print("OTHER", t, int(other[0, 0]), flush=True)
kv.barrier()
final = kv.pull('weight')
assert np.array_equal(final, np.full((1, 4), 1 - 3 * 12 / 1024, np.float32)), final
print("OK", flush=True)
kv.close()
"""


def test_torch_trainer_on_dist_ssp() -> None:
    pytest.importorskip("torch")
    job = run_job(TORCH_JOB, 2, 1, timeout=120)
    assert [p.code for p in job.procs] == [0] * len(job.procs), job.describe()
    assert all("OK" in p.out for p in job.workers)


RESTART_JOB = """
import os, numpy as np, psnode
kv = psnode.kv.create('dist_ssp', staleness=1)
kv.set_optimizer(psnode.optimizer.create('sgd', learning_rate=0.125))
kv.init('w', np.zeros(3, np.float32))
start = kv.num_pushes('w')
print("START", start, "RESTARTS", kv.restarts, flush=True)
for step in range(start, 6):
    if kv.rank == 1 and step == 3 and os.environ.get('PSNODE_RESTART_COUNT', '0') == '0':
        os._exit(9)                                   # a hard crash after three pushes
    kv.push('w', np.full(3, (kv.rank + 1) * (step + 1), np.float32))
    kv.pull('w')
kv.barrier()
print("FINAL", kv.pull('w').tolist(), flush=True)
kv.close()
"""


def test_a_restarted_worker_resumes_its_clock_and_every_push_counts_once() -> None:
    job = start_job(RESTART_JOB, 2, 2, env={"PSNODE_MAX_RESTARTS": "1"})
    first = next(p for p in job.workers if p.rank == 1)
    first.popen.wait(30)
    assert first.popen.returncode == 9
    restart_worker(job, 1, 1)
    wait_job(job, 60)
    codes = [(p.role, p.rank, p.code) for p in job.procs]
    assert [c for c in codes if c[2] != 0] == [("worker", 1, 9)], job.describe()
    # every push applied once, each on its own: w = -lr * sum_s (1 + 2) (s + 1)
    want = [-0.125 * 3 * sum(range(1, 7))] * 3
    finals = [line for p in job.workers for line in p.out.splitlines() if line.startswith("FINAL")]
    assert finals == [f"FINAL {want}"] * 2, job.describe()
    assert "START 3 RESTARTS 1" in job.workers[-1].out
