"""Server checkpoints (atomic, resumable) and the non-finite gradient guard."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np

from tests.support.cluster import PRELUDE, ROOT, ok, run_job


def test_checkpoint_then_resume_in_a_new_job(tmp_path) -> None:
    ckpt = str(tmp_path / "ckpt")
    env = {"PSNODE_CHECKPOINT_DIR": ckpt, "PSNODE_CHECKPOINT_ROUNDS": "1"}
    first = run_job(PRELUDE + """
kv.set_optimizer(psnode.optimizer.create('sgd', learning_rate=0.5, momentum=0.5))
kv.init('w', np.zeros(4, np.float32)); kv.init('e', np.zeros((6, 2), np.float32), stype='row_sparse')
for s in range(3):
    kv.push('w', np.full(4, r + 1, np.float32))
    kv.push('e', psnode.sparse.row_sparse_array((np.ones((1, 2), np.float32), [s]), shape=(6, 2)))
    kv.pull('w')
print("W", kv.pull('w').tolist()); print("E", kv.pull('e').tolist())
kv.close()
""", 2, 2, env=env)
    ok(first)
    files = os.listdir(ckpt)      # each server's chain: its base, and the deltas after it
    assert {"server-0.npz", "server-1.npz"} <= set(files) and all(f.startswith("server-") for f in files), files
    w_line = next(x for x in first.workers[0].out.splitlines() if x.startswith("W"))
    e_line = next(x for x in first.workers[0].out.splitlines() if x.startswith("E"))
    second = run_job(PRELUDE + """
kv.set_optimizer(psnode.optimizer.create('sgd', learning_rate=0.5, momentum=0.5))
w = np.full(4, 99, np.float32); kv.init('w', w)            # the checkpoint wins over init
e = np.full((6, 2), 99, np.float32); kv.init('e', e, stype='row_sparse')
assert (e == 99).all()                                       # (a row_sparse init writes no array)
print("W", w.tolist()); print("E", kv.pull('e').tolist())
kv.push('w', np.zeros(4, np.float32))                        # momentum state was restored too
print("NEXT", kv.pull('w').tolist())
kv.close()
""", 2, 2, env={**env, "PSNODE_RESUME": "1"})
    ok(second)
    out = second.workers[1].out.splitlines()
    assert w_line in out and e_line in out
    w = np.array(eval(w_line[2:]), np.float32)
    # sgd momentum: mom_{t+1} = 0.5 mom_t - 0.5 g; with g = 0 the weights still move by 0.5 mom
    assert next(x for x in out if x.startswith("NEXT")) != f"NEXT {w.tolist()}"


WRITER = """
import sys, numpy as np
from psnode.math import optimizers as optimizer
from psnode.math.aggregation import AVERAGE
from psnode.server import chain as disk
from psnode.server.keypart import Entry, note_change
from psnode.server.store import Store
ROWS = 400_000
store = Store(1)
store.track_changes = True
store.optimizer = optimizer.create('adam')
table = np.zeros((ROWS, 4), np.float32)
store.entries[('emb', 0)] = Entry(value=table, sparse=True, sync=True, aggregation=AVERAGE,
                                  state=store.optimizer.create_state(table))
chain = disk.Chain(sys.argv[1], 0, 'job')
i = 0
while True:
    if i:   # point i: half the rows (drawn from i) and the version key become i
        rows = np.random.default_rng(i).integers(0, ROWS, ROWS // 2)
        table[rows] = i
        note_change(store.entries[('emb', 0)], rows)
    store.entries[('v', 0)] = Entry(value=np.full(1, i, np.float32), sparse=False, sync=True, aggregation=AVERAGE)
    chain.point(store).result()
    store.forget_changes()
    print(i, flush=True)
    i += 1
"""


def test_a_kill_at_any_point_of_the_chains_writes_leaves_the_last_point_loadable(tmp_path) -> None:
    """A writer makes durable points as fast as it can: each changes half the rows of a 400,000-row
    table (so deltas, compactions and their installs all happen) and is killed at 10 moments.
    Each time, what is on disk restores one whole point, at least the last one reported: the
    version key says which, and exactly the rows that point wrote hold its number."""
    from psnode.server import chain as disk
    from psnode.server.store import Store

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for delay in (0.05, 0.2, 0.35, 0.5, 0.65, 0.8, 0.95, 1.1, 1.25, 1.4):
        p = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path / str(delay))], env=env,
                             stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "0"     # the base exists
        time.sleep(delay)                             # then kill it, at some point of some write
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        reported = [int(x) for x in p.stdout.read().split()]
        p.stdout.close()
        store = Store(1)
        disk.load(str(tmp_path / str(delay)), 0, store, same_job=True)
        version = int(store.entries[("v", 0)].value[0])
        assert version >= (reported[-1] if reported else 0)
        table = store.entries[("emb", 0)].value
        if version:
            want = np.random.default_rng(version).integers(0, len(table), len(table) // 2)
            assert (table[want] == version).all() and table.max() == version


def test_nonfinite_round_is_skipped_and_reported() -> None:
    job = run_job(PRELUDE + """
kv.init('w', np.ones(3, np.float32))
g = np.full(3, np.nan if r == 1 else 5.0, np.float32)
kv.push('w', g)
check(kv.pull('w'), np.ones(3, np.float32), "skipped round keeps the value")
kv.push('w', np.full(3, r + 1, np.float32))
check(kv.pull('w'), np.full(3, 1.5, np.float32), "next round applies")
kv.close()
""", 2, 1, env={"PSNODE_SKIP_NONFINITE": "1"})
    ok(job)
    server = job.by_role("server")[0]
    assert "key 'w': round 1 skipped: non-finite gradient from worker(s) [1]" in server.err
