"""psnode worker for the benchmark (run by the harness or by ``mxdist launch``).

argv: bench <cases-json> <quick 0|1> [dir]   run the cases, one BENCHRESULT line per case
      launch <t0> [dir]                        first push+pull, report wall time since t0 (time.time())
With ``dir`` the lines are also appended to ``dir/worker-<rank>.jsonl``.
"""
from __future__ import annotations

import sys
import time

T_START = time.time()

import numpy as np  # noqa: E402

import psnode  # noqa: E402
from benchmarks.cases import (  # noqa: E402
    RESULT_FILE,
    SPARSE_COLS,
    SPARSE_FRACTION,
    SPARSE_ROWS,
    Case,
    decode_cases,
    fail,
    report,
    summarize,
)
from psnode.math.sparse import row_sparse_array  # noqa: E402


def links(kv) -> int:
    """Servers this worker reaches over the same-host link (shared memory); the others: TCP."""
    engine = getattr(kv, "_engine", None)
    return sum(bool(engine.same_host(s)) for s in range(kv.num_servers)) if engine is not None else 0


def dense_case(kv, c: Case, quick: bool) -> None:
    W, rank = kv.num_workers, kv.rank
    shape = (SPARSE_ROWS, SPARSE_COLS) if c.name == "densetable" else (c.elems,)
    keys = [f"{c.name}/{i}" for i in range(c.keys)]
    kv.init(keys, [np.zeros(shape, np.float32) for _ in keys])
    grads = [np.full(shape, rank + 1, np.float32) for _ in keys]
    outs = [np.empty(shape, np.float32) for _ in keys]
    kv.barrier()
    kv.push(keys, grads)                        # check round: the exact average of 1..W
    kv.pull(keys, out=outs)
    expect = np.float32((W + 1) / 2)
    for k, o in zip(keys, outs, strict=False):
        if not (o == expect).all():
            fail(f"{c.name} key {k}: pulled {o.reshape(-1)[:4]}..., expected {expect}")
    times = []
    for i in range(c.warm(quick) + c.timed(quick)):
        t0 = time.perf_counter()
        kv.push(keys, grads)
        kv.pull(keys, out=outs)
        t1 = time.perf_counter()
        if i >= c.warm(quick):
            times.append(t1 - t0)
    kv.barrier()
    report(system="psnode", case=c.name, rank=rank, bytes=2 * c.keys * c.nbytes, links=links(kv),
           **summarize(times))


def sparse_case(kv, c: Case, quick: bool) -> None:
    W, rank = kv.num_workers, kv.rank
    R, C = SPARSE_ROWS, SPARSE_COLS
    n = int(R * SPARSE_FRACTION)
    key = "emb"
    kv.init(key, np.zeros((R, C), np.float32), stype="row_sparse")
    table = np.zeros((R, C), np.float32)   # the worker's copy of the embedding table
    kv.barrier()
    ids = np.random.default_rng(7).choice(R, n, replace=False)  # check round: same rows everywhere
    kv.push(key, row_sparse_array((np.full((n, C), rank + 1, np.float32), ids), shape=(R, C)))
    kv.row_sparse_pull(key, out=table, row_ids=ids)
    expect = np.float32((W + 1) / 2)
    if not (table[ids] == expect).all():
        fail(f"{c.name}: pulled rows {table[ids][:2, :3]}, expected {expect}")
    total = c.warm(quick) + c.timed(quick)
    rng = np.random.default_rng(1000 + rank)
    data = rng.standard_normal((n, C)).astype(np.float32)
    times = []
    for i in range(total):
        ids = rng.choice(R, n, replace=False)  # fresh rows each round (drawn outside the timing)
        t0 = time.perf_counter()
        kv.push(key, row_sparse_array((data, ids), shape=(R, C)))
        kv.row_sparse_pull(key, out=table, row_ids=ids)
        t1 = time.perf_counter()
        if i >= c.warm(quick):
            times.append(t1 - t0)
    kv.barrier()
    report(system="psnode", case=c.name, rank=rank, bytes=2 * n * C * 4, **summarize(times))


def _result_file(kv, out_dir: str | None) -> None:
    if out_dir:
        RESULT_FILE[:] = [f"{out_dir}/worker-{kv.rank}.jsonl"]


def bench(cases_json: str, quick: bool, out_dir: str | None = None) -> None:
    kv = psnode.kv.create("dist_sync")
    _result_file(kv, out_dir)
    for c in decode_cases(cases_json):
        (sparse_case if c.kind == "sparse" else dense_case)(kv, c, quick)
    kv.close()


def launch(t0: float, out_dir: str | None = None) -> None:
    kv = psnode.kv.create("dist_sync")
    _result_file(kv, out_dir)
    a = np.zeros(1024, np.float32)
    kv.init(0, a)
    kv.push(0, np.full(1024, kv.rank + 1, np.float32))
    kv.pull(0, out=a)
    t = time.time()
    if not (a == np.float32((kv.num_workers + 1) / 2)).all():
        fail(f"launch: pulled {a[:4]}")
    report(system="psnode", case="launch", rank=kv.rank, wall=t - t0, interp=T_START - t0)
    kv.close()


if __name__ == "__main__":
    if sys.argv[1] == "bench":
        bench(sys.argv[2], sys.argv[3] == "1", sys.argv[4] if len(sys.argv) > 4 else None)
    else:
        launch(float(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None)
