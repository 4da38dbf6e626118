"""MXNet's calling forms in a real dist_sync job (2 workers, 2 servers, a key split over both):
the same meaning as on the 'local' store (tests/unit/test_forms.py), exact values."""
from __future__ import annotations

import textwrap

import pytest

from tests.support.cluster import PRELUDE, ok, run_job

FORMS = """
S, B = (2, 3), (40, 5)                 # B has 200 elements: split over both servers
kv.init('200', [np.full(S, 2, np.float32)])
kv.init(['a', 'b'], [[np.zeros(S, np.float32)], [np.zeros(B, np.float32)]])
kv.init('e', np.zeros(B, np.float32), stype='row_sparse')
check(kv.pull('200'), np.full(S, 2, np.float32), "init with a one-element list")
g = float(r + 1)                        # rank r pushes r + 1; the sum over workers is T
T = W * (W + 1) / 2
kv.push(['a', 'b'], [[np.full(S, g, np.float32)] * 2, [np.full(B, g, np.float32)] * 3])
outs = [np.zeros(S, np.float32), np.zeros(S, np.float32)]
kv.pull('a', out=outs)
for o in outs:
    check(o, np.full(S, 2 * T, np.float32), "push of a list of lists, pull into a list")
check(kv.pull('b'), np.full(B, 3 * T, np.float32), "split key, list of three arrays")
vals = [np.full(S, g, np.float32), np.full(S, g, np.float32)]
kv.pushpull('a', vals)                 # out None: the result lands in every value
for v in vals:
    check(v, np.full(S, 2 * T, np.float32), "pushpull into the values")
out = np.zeros(B, np.float32)
kv.pushpull(['a', 'b'], [np.full(S, g, np.float32), [np.full(B, g, np.float32)]], out=[outs, out])
check(outs[1], np.full(S, T, np.float32), "pushpull of a list of keys")
check(out, np.full(B, T, np.float32), "pushpull of a split key")
rows = np.arange(40).reshape(20, 2)[:, :1] + 0.0    # 2-d float row ids, as MXNet's test sends
mine = np.array([r, 39 - r])
data = np.full((2, 5), g, np.float32)
kv.push('e', psnode.sparse.row_sparse_array((data, mine), shape=B))
got = kv.row_sparse_pull('e', row_ids=rows)
want = np.zeros(B, np.float32)
for w in range(W):
    want[[w, 39 - w]] += w + 1
check(got.indices, np.arange(0, 40, 2), "row ids")
check(got.data, want[0:40:2], "rows from both servers")
two = [np.zeros(B, np.float32), np.zeros(B, np.float32)]
kv.row_sparse_pull('e', out=two, row_ids=[np.array([39]), np.array([0, 1])])
check(two[0][39], want[39], "one row id array per output")
check(two[1][:2], want[:2], "one row id array per output")
kv.close()
print("OK")
"""


SLICED = textwrap.dedent('''
    import numpy as np, psnode
    kv = psnode.kv.create("dist_sync")
    init = np.arange(2500, dtype=np.float32).reshape(50, 50)
    kv.init("w", init)
    out = np.empty((50, 50), np.float32)
    kv.pull("w", out=out)
    assert (out == init).all(), out
    parts = kv._placer.placed["w"].parts
    assert len(parts) == 40 and [p.server for p in parts] == [0, 1] * 20, parts   # 10000 bytes, 256 each
    for step in range(3):
        g = np.full((50, 50), kv.rank + 1 + step, np.float32) * np.arange(2500, dtype=np.float32).reshape(50, 50)
        if step == 1:
            kv.pushpull("w", g, out=out)
        else:
            kv.push("w", g)
            kv.pull("w", out=out)
        want = (1.5 + step) * np.arange(2500, dtype=np.float32).reshape(50, 50)
        assert (out == want).all(), (step, out[:2, :4])
    print("SLICED OK", len(parts), flush=True)
    kv.close()
''')


@pytest.mark.parametrize("shm", ["0", "1"])
def test_sliced_big_keys_in_a_job(shm: str) -> None:
    """PSNODE_SLICE_BYTES: a big key in many parts dealt round-robin over the servers; push, pull
    and pushpull give the exact mean, init values arrive whole; over TCP (where a worker keeps
    two slices unanswered per server) and the same-host link."""
    job = run_job(SLICED, 2, 2, env={"PSNODE_BIG_ARRAY_BOUND": "100", "PSNODE_SLICE_BYTES": "256", "PSNODE_SHM": shm})
    ok(job)
    assert all("SLICED OK 40" in w.out for w in job.workers), job.describe()


def test_mxnet_calling_forms_in_a_job() -> None:
    job = run_job(PRELUDE + FORMS, 2, 2, args=["dist_sync", "sum"], env={"PSNODE_BIG_ARRAY_BOUND": "100"})
    ok(job)
    assert all("OK" in w.out for w in job.workers), job.describe()
