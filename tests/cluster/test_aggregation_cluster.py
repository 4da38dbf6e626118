"""The ``max`` aggregator in a real dist_sync job (3 workers, 2 servers): small keys pushed as
one bucket, a key split over both servers, a row_sparse key and a pushpull, exact values."""
from __future__ import annotations

from tests.support.cluster import PRELUDE, ok, run_job

MAX = """
assert kv.aggregator == 'max', kv.aggregator
def grad(w, rnd, shape):   # worker w's push in round rnd: each worker is highest somewhere
    n = int(np.prod(shape))
    return (((np.arange(n) + w) % W) * 10.0 - rnd * w).reshape(shape).astype(np.float32)
def want(rnd, shape):
    return np.max([grad(w, rnd, shape) for w in range(W)], axis=0)
shapes = {'a': (3,), 'b': (2, 4), 'big': (3000,)}    # 'big' is above the bound: split over both servers
kv.init(list(shapes), [np.zeros(s, np.float32) for s in shapes.values()])
kv.init('e', np.full((6, 2), -100, np.float32), stype='row_sparse')
for rnd in (1, 2):
    kv.push(list(shapes), [grad(r, rnd, s) for s in shapes.values()])
    for k, s in shapes.items():
        check(kv.pull(k), want(rnd, s), f"round {rnd} key {k}")
out = np.zeros(3, np.float32)
kv.pushpull('a', grad(r, 3, (3,)), out=out)
check(out, want(3, (3,)), "pushpull")
rows = np.array([r, r + 1])                        # rows 0..W: each pushed by one or two workers
kv.push('e', psnode.sparse.row_sparse_array((np.full((2, 2), float(r), np.float32), rows), shape=(6, 2)))
got = kv.row_sparse_pull('e', row_ids=np.arange(6))
expect = np.full((6, 2), -100, np.float32)
for w in range(W):                                 # (w rising: the last write to a row is its maximum)
    expect[[w, w + 1]] = w
check(got.data, expect, "row_sparse rows")
kv.close()
print("OK")
"""


def test_max_aggregator_over_buckets_split_keys_and_rows() -> None:
    job = run_job(PRELUDE + MAX, 3, 2, args=["dist_sync", "max"], env={"PSNODE_BIG_ARRAY_BOUND": "1000"})
    ok(job)
    assert all("OK" in w.out for w in job.workers)
