"""Tables without a row count with real processes: every row's value, admission and eviction
checked exactly (psnode.server.dyntable), rows spread by the id hash (psnode.math.dynrows)."""
from __future__ import annotations

import pytest

from tests.support.cluster import PRELUDE, ok, run_job

DYN = PRELUDE + """
from psnode.math import dynrows
from psnode.math.sparse import row_sparse_array
INIT, SEED = psnode.init.Normal(1.0), 7
def initial(ids, key='emb', width=4):
    return dynrows.row_values(INIT, SEED, key, dynrows.mix(np.asarray(ids, np.int64)), width, np.float32)
def push(key, ids, g, width=4):
    kv.push(key, row_sparse_array((np.full((len(ids), width), g, np.float32), ids), shape=(None, width)))
def pull(key, ids):
    got = kv.row_sparse_pull(key, row_ids=np.asarray(ids, np.int64))
    check(got.indices, np.unique(np.asarray(ids, np.int64)), f"{key}: ids of a pull")
    return dict(zip(got.indices.tolist(), got.data))
"""


@pytest.mark.parametrize("mode", ["dist_sync", "dist_async"])
def test_known_pushes_to_open_ids_give_exact_rows_and_expired_rows_start_again(mode: str) -> None:
    job = run_job(DYN + """
kv.set_optimizer(psnode.optimizer.create('sgd', learning_rate=1.0))
kv.init('emb', psnode.sparse.table(4, ttl=1), psnode.init.ps_initializer(INIT, SEED))
sync = sys.argv[1] == 'dist_sync'
BIG, NEG = 2**62 + 3, -(2**63)
mine = {0: [1, 2, BIG], 1: [2, NEG, 2]}[r]              # repeats add up; any int64 is a row
push('emb', mine, r + 1)
if not sync:
    kv.barrier()
got = pull('emb', [1, 2, BIG, NEG, 77])
scale = 1 / W if sync else 1.0
want = {1: 1, 2: 1 + 2 * 2, BIG: 1, NEG: 2}
for i, g in want.items():
    check(got[i], initial([i])[0] - np.float32(g * scale), f"row {i} after step 1")
check(got[77], initial([77])[0], "a row only pulled: its initial values")
for step in (2, 3, 4):                                  # only id 2 is touched from here on
    push('emb', [2], 1.0)
    got = pull('emb', [2])
if sync:                                                # rounds 2..4 completed without 1, BIG, NEG, 77:
    kv.barrier()                                        # expired (ttl 1) and made again from (seed, key, id)
    got = pull('emb', [1, BIG, 2])
    check(got[1], initial([1])[0], "row 1 evicted and made again")
    check(got[BIG], initial([BIG])[0], "row BIG evicted and made again")
    check(got[2], initial([2])[0] - np.float32(5 / W) - np.float32(3 * W / W), "row 2 kept")
kv.close()
print("OK")
""", 2, 2, args=[mode])
    ok(job)
