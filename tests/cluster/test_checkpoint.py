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
    assert sorted(os.listdir(ckpt)) == ["server-0.npz", "server-1.npz"]
    w_line = next(x for x in first.workers[0].out.splitlines() if x.startswith("W"))
    e_line = next(x for x in first.workers[0].out.splitlines() if x.startswith("E"))
    second = run_job(PRELUDE + """
kv.set_optimizer(psnode.optimizer.create('sgd', learning_rate=0.5, momentum=0.5))
w = np.full(4, 99, np.float32); kv.init('w', w)            # the checkpoint wins over init
e = np.full((6, 2), 99, np.float32); kv.init('e', e, stype='row_sparse')
print("W", w.tolist()); print("E", e.tolist())
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
from psnode.server import checkpoint
from psnode.math import optimizers as optimizer
from psnode.server.keypart import Entry
from psnode.server.store import Store
store = Store(1)
store.optimizer = optimizer.create('adam')
i = 0
while True:
    i += 1
    v = np.full(4_000_000, i, np.float32)
    store.entries[('w', 0)] = Entry(value=v, sparse=False, sync=True, average=True,
                                    state=store.optimizer.create_state(v))
    checkpoint.save_server(sys.argv[1], 0, store)
    print(i, flush=True)
"""


def test_kill_during_checkpoint_write_leaves_the_previous_one_loadable(tmp_path) -> None:
    from psnode.server import checkpoint
    from psnode.server.store import Store

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for delay in (0.35, 0.6, 0.9):
        p = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], env=env,
                             stdout=subprocess.PIPE, text=True)
        first = p.stdout.readline()            # one complete checkpoint exists
        assert first.strip() == "1"
        time.sleep(delay)                      # then kill it, most likely mid-write
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        p.stdout.close()
        store = Store(1)
        assert checkpoint.load_server(str(tmp_path), 0, store) == 1
        value = store.entries[("w", 0)].value
        assert value[0] >= 1 and (value == value[0]).all()     # one whole version
        assert store.entries[("w", 0)].state is not None


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
