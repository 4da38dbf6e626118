"""psnode with real scheduler, server and worker processes on 127.0.0.1: exact values."""
from __future__ import annotations

import pytest

from tests.support.cluster import PRELUDE, ok, run_job


@pytest.mark.parametrize("agg,workers,servers", [("average", 3, 2), ("sum", 4, 3), ("average", 1, 1)])
def test_rounds_average_and_sum(agg: str, workers: int, servers: int) -> None:
    job = run_job(PRELUDE + """
keys = [0, 12, 7]              # (int keys: one store's keys are all ints or all strs)
for k in keys:
    kv.init(k, np.zeros((3, 4), np.float32))
total = sum(range(1, W + 1))
want = total / W if sys.argv[2] == 'average' else total
for rnd in range(1, 4):
    for k in keys:
        kv.push(k, np.full((3, 4), (r + 1) * rnd, np.float32))
    for k in keys:
        check(kv.pull(k), np.full((3, 4), want * rnd, np.float32), f"round {rnd} key {k}")
kv.close()
print("OK")
""", workers, servers, args=["dist_sync", agg])
    ok(job)
    assert all("OK" in w.out for w in job.workers)


def test_key_lists_big_split_and_rank0_init() -> None:
    job = run_job(PRELUDE + """
n = 2_500_001                      # above the bound: sliced over the 3 servers
big = np.full(n, r, np.float32)    # rank 0's init value (zeros) must win everywhere
kv.init('big', big)
check(big, np.zeros(n, np.float32), "init copied rank 0's value")
kv.init(['x', 'y'], [np.full(5, 10 + r, np.float64), np.full((2, 2), r, np.int32)])
g = np.arange(n, dtype=np.float32) * (r + 1)
kv.push(['big', 'x', 'y'], [g, np.full(5, r + 1.0), np.full((2, 2), 2 * (r + 1), np.int32)])
out = np.empty(n, np.float32)
kv.pull('big', out=out)
check(out, np.arange(n, dtype=np.float32) * 1.5, "big average")
xs = kv.pull(['x', 'y'])
check(xs[0], np.full(5, 1.5), "x")
check(xs[1], np.full((2, 2), 3, np.int32), "y")
# a list of values for one key is summed locally first (several devices)
kv.push('x', [np.ones(5), np.full(5, 2.0)])
check(kv.pull('x'), np.full(5, 3.0), "list push")
view = np.zeros((10, 6), np.float32)[:, ::2]       # non-contiguous out
kv.init('nc', np.zeros((10, 3), np.float32))
kv.push('nc', np.full((10, 3), r + 1, np.float32))
kv.pull('nc', out=view)
check(view, np.full((10, 3), 1.5, np.float32), "non-contiguous out")
kv.close()
print("OK")
""", 2, 3, env={"PSNODE_BIG_ARRAY_BOUND": "1000000"})
    ok(job)


def test_initializer_rank0_value_everywhere() -> None:
    job = run_job(PRELUDE + """
w = np.empty((64, 32), np.float32)
kv.init('w', w, initializer=psnode.init.Xavier(magnitude=3))
allw = kv.pull('w')
check(w, allw, "init wrote the stored value")
scale = np.sqrt(3 / ((64 + 32) / 2))
assert np.abs(w).max() <= scale and np.abs(w).max() > 0
print("SUM", float(w.astype(np.float64).sum()).hex())
kv.close()
""", 3, 1)
    ok(job)
    sums = {line for w in job.workers for line in w.out.splitlines() if line.startswith("SUM")}
    assert len(sums) == 1, sums


@pytest.mark.parametrize("name,params", [
    ("sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 0.01}),
    ("adam", {"learning_rate": 0.01}),
    ("adagrad", {"learning_rate": 0.1, "rescale_grad": 0.5, "clip_gradient": 0.7}),
])
def test_server_optimizers_match_reference(name: str, params: dict) -> None:
    job = run_job(PRELUDE + f"""
opt_name, params = {name!r}, {params!r}
kv.set_optimizer(psnode.optimizer.create(opt_name, **params))
w0 = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
kv.init('w', w0.copy())
ref = psnode.optimizer.create(opt_name, **params)
ref_w = w0.copy(); state = ref.create_state(ref_w)
for step in range(1, 5):
    grads = [np.full((3, 4), (q + 1) * 0.25 * step, np.float32) for q in range(W)]
    kv.push('w', grads[r])
    got = kv.pull('w')
    mean = np.sum(grads, axis=0, dtype=np.float32) / np.float32(W)
    ref.update(ref_w, mean, state)
    check(got, ref_w, f"step {{step}}")
kv.close()
print("OK")
""", 2, 2)
    ok(job)


def test_async_applies_each_push() -> None:
    job = run_job(PRELUDE + """
kv.set_optimizer(psnode.optimizer.create('sgd', learning_rate=1.0))
kv.init('w', np.zeros(4, np.float32))
for i in range(5):
    kv.push('w', np.full(4, r + 1, np.float32))
    mine = kv.pull('w')        # sees at least this worker's own pushes
    assert (mine <= -(i + 1) * (r + 1)).all(), mine
kv.barrier()
check(kv.pull('w'), np.full(4, -5.0 * sum(range(1, W + 1)), np.float32), "async total")
kv.close()
print("OK")
""", 3, 2, args=["dist_async"])
    ok(job)


def test_fast_worker_never_leaks_into_current_round() -> None:
    job = run_job(PRELUDE + """
import time
kv.init(1, np.zeros(3, np.float32))
if r == 1:
    for rnd in (1, 2, 3):          # three pushes before worker 0 pushes at all
        kv.push(1, np.full(3, 100.0 * rnd, np.float32))
    kv.wait_all()
    check(kv.pull(1), np.full(3, (300 + 3) / 2, np.float32), "after my third round")
else:
    time.sleep(0.5)
    for rnd in (1, 2, 3):
        kv.push(1, np.full(3, rnd, np.float32))
        check(kv.pull(1), np.full(3, (100.0 * rnd + rnd) / 2, np.float32), f"round {rnd}")
kv.close()
print("OK")
""", 2, 1)
    ok(job)


def test_errors_are_clear_and_servers_keep_serving() -> None:
    job = run_job(PRELUDE + """
kv.init('a', np.zeros((2, 2), np.float32))
def expect(exc, words, fn):
    try:
        fn()
    except exc as e:
        for w in words:
            assert w in str(e), (w, str(e))
        return
    raise AssertionError(f"no {exc.__name__}")
expect(KeyNotInitialized, ["'nope'", "kv.init"], lambda: kv.push('nope', np.zeros(2)))
expect(KeyNotInitialized, ["'nope'"], lambda: kv.pull('nope'))
expect(ShapeMismatch, ["'a'", "[2, 2]", "[3]"], lambda: kv.push('a', np.zeros(3, np.float32)))
expect(ShapeMismatch, ["'a'", "float32", "float64"], lambda: kv.push('a', np.zeros((2, 2))))
expect(ShapeMismatch, ["'a'", "re-init"], lambda: kv.init('a', np.zeros((5,), np.float32)))
expect(ConfigError, ["'rmsprop_x'"], lambda: psnode.optimizer.create('rmsprop_x'))
expect(ConfigError, [f"num_workers={W + 1}", f"{W} workers"], lambda: psnode.kv.create('dist_sync', num_workers=W + 1))
expect(ConfigError, ["'dist_syncc'"], lambda: psnode.kv.create('dist_syncc'))
expect(ConfigError, ["'momentun'"], lambda: kv.set_optimizer({'name': 'sgd', 'params': {'momentun': 0.9}}))
kv.push('a', np.full((2, 2), r + 1, np.float32))
check(kv.pull('a'), np.full((2, 2), (1 + W) / 2, np.float32), "still serving")
kv.close()
print("OK")
""", 2, 2)
    ok(job)


def test_save_and_load_optimizer_states_in_distributed_mode(tmp_path) -> None:
    first, second = tmp_path / "states.npz", tmp_path / "again.npz"
    job = run_job(PRELUDE + f"""
kv.set_optimizer(psnode.optimizer.create('adam', learning_rate=0.1))
kv.init('w', np.ones(6, np.float32)); kv.init('v', np.ones((3, 3), np.float32))
def steps(n):
    for i in range(n):
        kv.push(['w', 'v'], [np.full(6, r + i, np.float32), np.full((3, 3), r - i, np.float32)])
        kv.pull(['w', 'v'])
    kv.barrier()
steps(3)
if r == 0:
    kv.save_optimizer_states({str(first)!r})
kv.barrier()
steps(2)                       # states move on
if r == 0:
    kv.load_optimizer_states({str(first)!r})
    kv.save_optimizer_states({str(second)!r})
kv.barrier()
kv.close()
print("OK")
""", 2, 2)
    ok(job)
    import numpy as np

    with np.load(first) as a, np.load(second) as b:
        assert sorted(a.files) == sorted(b.files) and len(a.files) > 4
        for name in a.files:
            assert a[name].dtype == b[name].dtype and a[name].tobytes() == b[name].tobytes(), name
        assert any(a[n].shape == () for n in a.files)   # adam's step counter survived as 0-d


def test_uneven_work_never_hangs() -> None:
    job = run_job(PRELUDE + """
kv.init(0, np.zeros(2, np.float32))
steps = 2 if r == 1 else 4
for s in range(steps):
    kv.push(0, np.full(2, r + 1, np.float32))
    got = kv.pull(0)
    want = 1.5 if s < 2 else 1.0       # after worker 1 left, rounds are worker 0's alone
    check(got, np.full(2, want, np.float32), f"step {s}")
kv.close()
print("OK")
""", 2, 1)
    ok(job)


def test_dist_store_without_a_cluster_says_how_to_launch(monkeypatch) -> None:
    import psnode
    from psnode.errors import ConfigError

    for var in ("PSNODE_ROLE", "PSNODE_SCHEDULER"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ConfigError, match="mxdist launch"):
        psnode.kv.create("dist_sync")


def test_close_gives_the_interpreter_its_excepthook_back() -> None:
    """A distributed store installs its failure-reporting excepthook; kv.close() restores the one
    it replaced (a finished worker's later exception is no psnode failure)."""
    job = run_job("""
import sys, numpy as np, psnode
before = sys.excepthook
kv = psnode.kv.create('dist_sync')
assert sys.excepthook is not before, "no psnode hook installed"
kv.init('w', np.zeros(2, np.float32))
kv.close()
assert sys.excepthook is before, sys.excepthook
print("RESTORED", flush=True)
""", 2, 1)
    ok(job)
    assert all("RESTORED" in w.out for w in job.workers), job.describe()


def test_a_row_sparse_init_stores_rank0s_table_and_leaves_every_array_as_it_was() -> None:
    """A row_sparse key's init stores rank 0's array and its answer carries no table back (its
    rows are read with row_sparse_pull, as in MXNet): each worker's array stays as it was, so an
    init (a restarted worker's too) costs no worker the whole table, whatever its size."""
    job = run_job(PRELUDE + """
mine = np.full((1000, 4), r + 7, np.float32)
kv.init('e', mine, stype='row_sparse')
check(mine, np.full((1000, 4), r + 7, np.float32), "the array, after the init")
got = kv.row_sparse_pull('e', row_ids=np.array([999, 0]))
check(got.indices, np.array([0, 999]), "ids")
check(got.data, np.full((2, 4), 7, np.float32), "rank 0's table, stored")
kv.push('e', psnode.sparse.row_sparse_array((np.ones((1, 4), np.float32), np.array([5])), shape=(1000, 4)))
dense = np.zeros((1000, 4), np.float32)
kv.row_sparse_pull('e', out=dense, row_ids=np.array([5]))
check(dense[5], np.full(4, W, np.float32), "row 5 after a round (no optimizer: the sum of the pushes)")
kv.close()
print("OK")
""", 2, 2, args=["dist_sync", "sum"])
    ok(job)
    assert all("OK" in w.out for w in job.workers)
