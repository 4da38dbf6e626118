"""MXNet 1.9.1 KVStore (``dist_sync``, ps-lite) on the workload: the worker side.

Runs under the MXNet venv's Python (benchmarks/kvstore/mxnet_job.py makes the venv and starts the
processes); imports only the standard library, numpy, mxnet and benchmarks/cases.py.

    python -m benchmarks.kvstore.mxnet_peer bench <cases-json> <quick 0|1>
    python -m benchmarks.kvstore.mxnet_peer launch <t0>

The scheduler and the servers are ``python -c "import mxnet"`` with ``DMLC_ROLE`` set (MXNet
runs its server loop at import); workers run this module.  Every process gets the ``DMLC_*``
variables by hand (see mxnet_job.dmlc_env).

What a round is, exactly as for psnode (benchmarks/kvstore/psnode_worker.py): push the K gradients,
pull the K values into reused ``out`` arrays, wait until they are readable
(``wait_to_read``).  MXNet's server without an updater stores the *sum* of the pushes
(``CopyFromTo(merged, stored)``), so the check round pushes rank+1 and expects exactly
W(W+1)/2, where psnode's expects the average.  Dense cases run first, with no updater on the
servers; then, for the row_sparse case, every worker sets server SGD with learning rate -1 and
``lazy_update=True`` (stored += sum of the pushes, rows present only): MXNet's
``row_sparse_pull`` returns stale values without an updater.  The row_sparse round: the worker
builds a ``RowSparseNDArray`` of its 1% rows (ids drawn and sorted outside the timing: MXNet
requires sorted ids), pushes it and ``row_sparse_pull``s the same rows into a row_sparse
``out``.  Keys are ints: ``1000 * case index + key``.
"""
from __future__ import annotations

import sys
import time

T_START = time.time()

import numpy as np  # noqa: E402

from benchmarks.cases import SPARSE_COLS, SPARSE_FRACTION, SPARSE_ROWS, Case, decode_cases, fail, report, summarize  # noqa: E402


def _mx():
    import mxnet as mx
    return mx


def dense_case(kv, index: int, c: Case, quick: bool) -> None:
    mx = _mx()
    W, rank = kv.num_workers, kv.rank
    shape = (SPARSE_ROWS, SPARSE_COLS) if c.name == "densetable" else (c.elems,)
    keys = [1000 * index + i for i in range(c.keys)]
    kv.init(keys, [mx.nd.zeros(shape) for _ in keys])
    grads = [mx.nd.full(shape, rank + 1) for _ in keys]
    outs = [mx.nd.empty(shape) for _ in keys]
    kv._barrier()
    kv.push(keys, grads)                            # check round: the exact sum of 1..W
    kv.pull(keys, out=outs)
    expect = np.float32(W * (W + 1) / 2)
    for k, o in zip(keys, outs, strict=False):
        got = o.asnumpy()
        if not (got == expect).all():
            fail(f"mxnet {c.name} key {k}: pulled {got.reshape(-1)[:4]}..., expected {expect}")
    times = []
    for i in range(c.warm(quick) + c.timed(quick)):
        t0 = time.perf_counter()
        kv.push(keys, grads)
        kv.pull(keys, out=outs)
        for o in outs:
            o.wait_to_read()
        t1 = time.perf_counter()
        if i >= c.warm(quick):
            times.append(t1 - t0)
    kv._barrier()
    report(system="mxnet", case=c.name, rank=rank, bytes=2 * c.keys * c.nbytes, **summarize(times))


def sparse_case(kv, index: int, c: Case, quick: bool) -> None:
    mx = _mx()
    W, rank = kv.num_workers, kv.rank
    R, C = SPARSE_ROWS, SPARSE_COLS
    n = int(R * SPARSE_FRACTION)
    key = 1000 * index
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=-1.0, lazy_update=True))  # stored += sum
    kv._barrier()
    # every row stored (MXNet refuses to init a row_sparse key with no rows), all zero
    kv.init(key, mx.nd.sparse.row_sparse_array((np.zeros((R, C), np.float32), np.arange(R)), shape=(R, C)))
    out = mx.nd.sparse.zeros("row_sparse", (R, C))
    kv._barrier()
    ids = np.sort(np.random.default_rng(7).choice(R, n, replace=False))  # check round: same rows
    kv.push(key, mx.nd.sparse.row_sparse_array((np.full((n, C), rank + 1, np.float32), ids), shape=(R, C)))
    kv.row_sparse_pull(key, out=out, row_ids=mx.nd.array(ids, dtype="int64"))
    expect = np.float32(W * (W + 1) / 2)
    got_ids, got = out.indices.asnumpy(), out.data.asnumpy()
    if not (np.array_equal(got_ids, ids) and (got == expect).all()):
        fail(f"mxnet {c.name}: pulled rows {got[:2, :3]} (ids equal: {np.array_equal(got_ids, ids)}), "
             f"expected {expect}")
    rng = np.random.default_rng(1000 + rank)
    data = rng.standard_normal((n, C)).astype(np.float32)
    times = []
    for i in range(c.warm(quick) + c.timed(quick)):
        ids = np.sort(rng.choice(R, n, replace=False))   # fresh rows each round, outside the timing
        t0 = time.perf_counter()
        kv.push(key, mx.nd.sparse.row_sparse_array((data, ids), shape=(R, C)))
        kv.row_sparse_pull(key, out=out, row_ids=mx.nd.array(ids, dtype="int64"))
        out.wait_to_read()
        t1 = time.perf_counter()
        if i >= c.warm(quick):
            times.append(t1 - t0)
    kv._barrier()
    report(system="mxnet", case=c.name, rank=rank, bytes=2 * n * C * 4, **summarize(times))


def bench(cases_json: str, quick: bool) -> None:
    kv = _mx().kv.create("dist_sync")
    cases = list(enumerate(decode_cases(cases_json)))
    for i, c in cases:                 # dense first: no updater on the servers
        if c.kind != "sparse":
            dense_case(kv, i, c, quick)
    for i, c in cases:                 # then server SGD (lr -1) for row_sparse
        if c.kind == "sparse":
            sparse_case(kv, i, c, quick)
    kv._barrier()


def launch(t0: float) -> None:
    mx = _mx()
    kv = mx.kv.create("dist_sync")
    a = mx.nd.zeros((1024,))
    kv.init(0, a)
    kv.push(0, mx.nd.full((1024,), kv.rank + 1))
    kv.pull(0, out=a)
    got = a.asnumpy()
    t = time.time()
    W = kv.num_workers
    if not (got == np.float32(W * (W + 1) / 2)).all():
        fail(f"mxnet launch: pulled {got[:4]}")
    report(system="mxnet", case="launch", rank=kv.rank, wall=t - t0, interp=T_START - t0)


if __name__ == "__main__":
    if sys.argv[1] == "bench":
        bench(sys.argv[2], sys.argv[3] == "1")
    elif sys.argv[1] == "launch":
        launch(float(sys.argv[2]))
    else:
        raise SystemExit(f"unknown mode {sys.argv[1]!r}")
