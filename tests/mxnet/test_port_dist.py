"""The MXNet KVStore API on a distributed psnode store (real scheduler, server and workers on
127.0.0.1): MXNet's type names, broadcast, is_capable, a Python updater ignored as MXNet's
workers ignore it, pulls into row_sparse outputs, and int and str keys never mixed."""
from __future__ import annotations

from tests.support.cluster import run_job

SCRIPT = """
import warnings
import numpy as np, psnode
from psnode.errors import ConfigError
from psnode.math.sparse import RowSparseArray, zeros

kv = psnode.kv.create('dist_device_sync', aggregator='sum')   # MXNet's name of a dist_sync store
assert (kv.type, kv.mode) == ('dist_device_sync', 'dist_sync'), (kv.type, kv.mode)
assert kv.is_capable('optimizer')
r, W = kv.rank, kv.num_workers
out = np.zeros((2, 3), np.float32)
kv.broadcast(3, np.full((2, 3), 10 + r, np.float32), out)      # rank 0's value everywhere
assert (out == 10).all(), out
kv.broadcast(3, np.full((2, 3), 50, np.float32), out)          # again: the stored value
assert (out == 10).all(), out
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter('always')
    kv.set_updater(lambda key, recv, stored: np.add(stored, recv * 100, out=stored))
assert any('is ignored, as MXNet' in str(w.message) for w in seen), [str(w.message) for w in seen]
kv.push(3, [np.full((2, 3), r + 1, np.float32)] * 2)           # two devices: 2 (r + 1) from each
kv.pull(3, out=out)
assert (out == 2 * sum(range(1, W + 1))).all(), out               # the servers' rule: the sum
kv.init(4, zeros((5, 2)))
kv.push(4, RowSparseArray(np.ones((1, 2), np.float32), np.array([r]), (5, 2)))
rsp = zeros((5, 2))
with warnings.catch_warnings(record=True):
    warnings.simplefilter('always')
    kv.pull(4, out=rsp)                                           # ignored: a row_sparse output
assert rsp.indices.size == 0
kv.pull(4, out=rsp, ignore_sparse=False)                          # every row
want = np.zeros((5, 2), np.float32); want[:W] = 1
assert (rsp.todense() == want).all(), rsp.todense()
try:
    kv.init('a', np.zeros(2, np.float32))
except ConfigError as exc:
    assert "keys are all ints or all strs" in str(exc)
else:
    raise AssertionError('a str key in an int store was accepted')
kv.close()
print('OK', r)
"""


def test_mxnet_api_on_a_dist_store() -> None:
    job = run_job(SCRIPT, 2, 1)
    assert [p.code for p in job.procs] == [0] * len(job.procs), job.describe()
    assert all(f"OK {w.rank}" in w.out for w in job.workers), job.describe()
