"""row_sparse keys with real processes: exact values, lazy updates, bytes on the wire."""
from __future__ import annotations

import pytest

from tests.support.cluster import PRELUDE, ok, run_job

SPARSE = PRELUDE + """
from psnode.math.sparse import row_sparse_array
"""


@pytest.mark.parametrize("mode", ["dist_sync", "dist_async"])
def test_overlapping_disjoint_and_empty_rows(mode: str) -> None:
    job = run_job(SPARSE + """
N = 12
kv.set_optimizer(psnode.optimizer.create('sgd', learning_rate=1.0))
kv.init('emb', psnode.sparse.zeros((N, 3)))                 # init with no rows present
rows = {0: [1, 5, 5, 9], 1: [5, 2], 2: []}[r]                # overlap on 5, disjoint, none
data = np.ones((len(rows), 3), np.float32) * (r + 1)
kv.push('emb', row_sparse_array((data, rows), shape=(N, 3)))
if sys.argv[1] == 'dist_async':
    kv.barrier()
got = kv.row_sparse_pull('emb', row_ids=np.array([9, 5, 1, 2, 5, 0]))
dense = np.zeros((N, 3), np.float32)
for q, rr in {0: [1, 5, 5, 9], 1: [5, 2], 2: []}.items():
    for i in rr:
        dense[i] += q + 1
if sys.argv[1] == 'dist_sync':
    dense /= W
want = -dense
check(got.indices, np.array([0, 1, 2, 5, 9]), "unique sorted ids")
check(got.data, want[[0, 1, 2, 5, 9]], "rows")
out = np.full((N, 3), 7, np.float32)
kv.pull('emb', out=out, row_ids=[2, 3])
exp = np.full((N, 3), 7, np.float32); exp[[2, 3]] = want[[2, 3]]
check(out, exp, "dense out: only those rows written")
try:
    kv.row_sparse_pull('emb', row_ids=[N])
    sys.exit(4)
except ShapeMismatch as e:
    assert str(N) in str(e) and "'emb'" in str(e)
kv.close()
print("OK")
""", 3, 2, args=[mode])
    ok(job)


def test_large_table_split_by_rows_and_lazy_adam() -> None:
    job = run_job(SPARSE + """
N, D = 40_000, 8                                   # above the bound: rows split over 3 servers
kv.set_optimizer(psnode.optimizer.create('adam', learning_rate=0.1))
table = np.ones((N, D), np.float32)
kv.init('t', table, stype='row_sparse')
ref = psnode.optimizer.create('adam', learning_rate=0.1)
ref_w = np.ones((N, D), np.float32); state = ref.create_state(ref_w)
ids = {0: np.array([0, 13_333, 13_334, 39_999]), 1: np.array([13_334, 26_700])}
for step in range(3):
    g = np.full((len(ids[r]), D), 0.5 * (r + 1) * (step + 1), np.float32)
    kv.push('t', row_sparse_array((g, ids[r]), shape=(N, D)))
    dense = np.zeros((N, D), np.float32)
    for q in range(W):
        dense[ids[q]] += np.float32(0.5 * (q + 1) * (step + 1))
    dense /= np.float32(W)
    touched = np.unique(np.concatenate(list(ids.values())))
    ref.update_rows(ref_w, touched, dense[touched], state)
    got = kv.pull('t')
    check(got, ref_w, f"lazy adam step {step}")
    assert (got[5] == 1).all()                      # untouched rows: unchanged, state too
kv.close()
print("OK")
""", 2, 3, env={"PSNODE_BIG_ARRAY_BOUND": "100000"})
    ok(job)


def test_bytes_on_the_wire_scale_with_touched_rows() -> None:
    job = run_job(SPARSE + """
import json
N, D = 200_000, 64
kv.init('emb', np.zeros((N, D), np.float32), stype='row_sparse')
eng = kv._engine
def sent():
    kv.wait_all()   # counted before sending: all of it is in once the flush is answered
    return eng.stats.bytes_out
before = sent()
ids = np.arange(r, N, 100)[:2000]                           # 1% of rows
kv.push('emb', row_sparse_array((np.ones((len(ids), D), np.float32), ids), shape=(N, D)))
kv.row_sparse_pull('emb', row_ids=ids)
after = sent()
print("BYTES", json.dumps([after - before, len(ids) * (D * 4 + 8 + 8), N * D * 4, eng.retries]))  # rows + ids pushed, ids pulled
kv.close()
""", 2, 2, env={"PSNODE_RETRY_TIMEOUT": "60"})
    ok(job)
    import json

    for w in job.workers:
        line = next(x for x in w.out.splitlines() if x.startswith("BYTES"))
        sent, touched, table, retries = json.loads(line[6:])
        assert retries == 0        # a resend (an answer later than the retry timeout) sends its bytes again
        assert touched <= sent < touched + 8192, (sent, touched)   # rows + ids + small headers
        assert sent * 50 < table
