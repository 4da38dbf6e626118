"""Tables without a row count with real processes: every row's value, admission and eviction
checked exactly (psnode.server.dyntable), rows spread by the id hash (psnode.math.dynrows)."""
from __future__ import annotations

import numpy as np
import pytest

import psnode
from psnode.math.sparse import row_sparse_array
from tests.support import wait_for
from tests.support.cluster import (
    PRELUDE,
    alive,
    kill_and_restart_server,
    ok,
    run_job,
    start_job,
    wait_for_file,
    wait_job,
)

DYN = PRELUDE.replace("aggregator=sys.argv[2] if len(sys.argv) > 2 else 'average')",
                      "aggregator=sys.argv[2] if len(sys.argv) > 2 else 'average', "
                      "**({'staleness': 1} if sys.argv[1] == 'dist_ssp' else {}))") + """
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


@pytest.mark.parametrize("mode", ["dist_sync", "dist_async", "dist_ssp"])
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
    a = initial([i])[0]
    if i == 2 and not sync:   # (the two workers' pushes applied in either order)
        if not (np.array_equal(got[i], a - np.float32(1) - np.float32(4))
                or np.array_equal(got[i], a - np.float32(4) - np.float32(1))):
            check(got[i], a - np.float32(5), "row 2 after step 1")
        continue
    check(got[i], a - np.float32(g * scale), f"row {i} after step 1")
check(got[77], initial([77])[0], "a row only pulled: its initial values")
for step in (2, 3, 4):                                  # only id 2 is touched from here on
    push('emb', [2], 1.0)
    got = pull('emb', [2])
if sync:                                                # rounds 2..4 completed without 1, BIG, NEG, 77:
    kv.barrier()                                        # expired (ttl 1) and made again from (seed, key, id)
    got = pull('emb', [1, BIG, 2])
    check(got[1], initial([1])[0], "row 1 evicted and made again")
    check(got[BIG], initial([BIG])[0], "row BIG evicted and made again")
    check(got[2], initial([2])[0] - np.float32(5 / W) - np.float32(1) - np.float32(1) - np.float32(1), "row 2 kept")
kv.close()
print("OK")
""", 2, 2, args=[mode])
    ok(job)


#: two workers train a table without a row count (Adagrad, ttl 2: rows expire and come back)
#: and a dense key; rank 1 waits at step 5 for ``argv[1]/go``, rank 0 marks ``argv[1]/pushed``
KILL = """
import sys, time, pathlib, numpy as np, psnode
from psnode.math.sparse import row_sparse_array
flags = pathlib.Path(sys.argv[1])
kv = psnode.kv.create('dist_sync')
""" + """{train}
for i, v in zip(ids, kv.row_sparse_pull('emb', row_ids=ids).data):
    print('FINAL', i, v.tolist(), flush=True)
print('FINAL w', kv.pull('w').tolist(), flush=True)
kv.close()
"""

TRAIN = """
kv.set_optimizer(psnode.optimizer.create('adagrad', learning_rate=0.5))
kv.init('emb', psnode.sparse.table(3, ttl=2), psnode.init.ps_initializer(psnode.init.Uniform(0.5), 11))
kv.init('w', np.zeros(2, np.float32))
for step in range(8):
    if RANK == 1 and step == 5:
        deadline = time.monotonic() + 60
        while not (flags / 'go').exists():
            assert time.monotonic() < deadline
            time.sleep(0.02)
    for rank in RANKS:
        ids = np.array([step * 10 + rank, 2**50 + step % 3, -1 - rank], np.int64)
        g = np.arange(9, dtype=np.float32).reshape(3, 3) * (rank + 1) + step
        GRADS.append((ids, g))
    PUSH()
    if RANK == 0 and step == 5:
        (flags / 'pushed').touch()
    kv.row_sparse_pull('emb', row_ids=np.array([2**50, 2**50 + 1, 2**50 + 2, -1, -2, step * 10]))
ids = np.array([0, 1, 10, 70, 71, 2**50, 2**50 + 1, 2**50 + 2, -1, -2], np.int64)
"""

WORKER = TRAIN.replace("RANKS", "[kv.rank]").replace("RANK", "kv.rank").replace(
    "GRADS.append((ids, g))", "kv.push('emb', row_sparse_array((g, ids), shape=(None, 3)))").replace(
    "PUSH()", "kv.push('w', np.ones(2, np.float32) * (kv.rank + 1) * (step + 1))")


def _reference() -> dict[str, str]:
    """The same training on one 'local' store fed the workers' average gradient."""
    out: dict[str, str] = {}
    kv = psnode.kv.create("local")
    grads: list = []

    def push() -> None:
        ids = np.concatenate([i for i, _ in grads])
        data = np.concatenate([g for _, g in grads])
        uniq, inv = np.unique(ids, return_inverse=True)
        total = np.zeros((len(uniq), 3), np.float32)
        np.add.at(total, inv, data)
        kv.push("emb", row_sparse_array((total * np.float32(0.5), uniq), shape=(None, 3)))
        grads.clear()
    names = {"kv": kv, "np": np, "psnode": psnode, "time": None, "flags": None, "RANK": -1, "RANKS": [0, 1],
             "GRADS": grads, "PUSH": lambda: (push(), kv.push("w", np.ones(2, np.float32) * np.float32(1.5)
                                                               * (names["step"] + 1)))}
    exec(TRAIN.replace("RANK == ", "RANK == 99 and 0 == "), names)
    for i, v in zip(names["ids"], kv.row_sparse_pull("emb", row_ids=names["ids"]).data, strict=True):
        out[str(i)] = str(v.tolist())
    out["w"] = str(kv.pull("w").tolist())
    return out


@pytest.mark.parametrize("held", ["replica", "checkpoint"])
def test_killed_server_restores_its_rows_and_the_job_ends_exactly(tmp_path, held: str) -> None:
    """kill -9 of server 1 mid-round; its replacement restores from its replica on server 0
    (``--replicas 2``, no disk) or from its checkpoint chain (a base and deltas on disk)."""
    flags = tmp_path / "flags"
    flags.mkdir()
    env = {"PSNODE_MAX_RESTARTS": "1", "PSNODE_CHECKPOINT_ROUNDS": "1", "PSNODE_RETRY_TIMEOUT": "2",
           **({"PSNODE_REPLICAS": "2"} if held == "replica" else {"PSNODE_CHECKPOINT_DIR": str(tmp_path / "ckpt")})}
    job = start_job(KILL.replace("{train}", WORKER), 2, 2, env=env, args=[str(flags)], tmp=tmp_path)
    try:
        wait_for_file(flags / "pushed", 60)
        replacement = kill_and_restart_server(job, 1)
        wait_for(lambda: "serving again" in replacement.err, 30, "server 1's replacement to serve")
        (flags / "go").touch()
    finally:
        wait_job(job, 120)
    codes = sorted((p.role, p.rank, p.code) for p in job.procs)
    assert codes == [("scheduler", 0, 0), ("server", 0, 0), ("server", 1, -9), ("server", 1, 0),
                     ("worker", 0, 0), ("worker", 1, 0)], job.describe()
    want = _reference()
    for w in job.workers:
        got = {line.split()[1]: line.split(" ", 2)[2] for line in w.out.splitlines() if line.startswith("FINAL")}
        assert got == want, job.describe()
    restored = job.by_role("server")[-1]
    assert "server 1 restored 1 key parts" in restored.err, restored.err
    assert ("from its replica on server 0" in restored.err) == (held == "replica"), restored.err
    assert not [p.popen.pid for p in job.procs if alive(p.popen.pid)]


def test_admission_cap_and_export_with_every_row_checked(tmp_path) -> None:
    """One server (so the cap is per table), min_count 2, max_rows 3, sgd lr 1, sum of both
    workers' gradients: every admission, dropped gradient and eviction is known in advance;
    two exports load with plain numpy."""
    job = run_job(DYN + """
import pathlib
out = pathlib.Path(sys.argv[3])
kv.set_optimizer(psnode.optimizer.create('sgd', learning_rate=1.0))
kv.init('emb', psnode.sparse.table(4, min_count=2, max_rows=3, absent='zeros'), psnode.init.ps_initializer(INIT, SEED))
# step 1: both push id 1 (the push that arrives 2nd admits it and counts; the 1st was dropped),
# rank 0 pushes 2 (its 1st occurrence: dropped)
push('emb', {0: [1, 2], 1: [1]}[r], 1.0)
got = pull('emb', [1, 2, 3])
check(got[1], initial([1])[0] - np.float32(1), "id 1: admitted at its 2nd occurrence")
check(got[2], np.zeros(4, np.float32), "id 2: one occurrence, not admitted: zeros")
check(got[3], np.zeros(4, np.float32), "id 3: never pushed: zeros")
# step 2: rank 1 pushes 2 (2nd occurrence: admitted, this gradient counts), 5 and 6 by both (as id 1)
push('emb', {0: [5, 6], 1: [2, 5, 6]}[r], 1.0)
kv.barrier()                      # 4 trained rows (1, 2, 5, 6) over the cap of 3: 1, untouched since step 1, goes
got = pull('emb', [2, 5, 6])
check(got[2], initial([2])[0] - np.float32(1), "id 2: admitted, one gradient")
check(got[5], initial([5])[0] - np.float32(1), "id 5")
check(got[6], initial([6])[0] - np.float32(1), "id 6")
if r == 0:
    n = psnode.export(kv, 'emb', str(out / 'a.npz'))
    assert n == 3, n
kv.barrier()
push('emb', [5], 1.0)             # only row 5 changes after the first export
kv.barrier()
if r == 0:
    assert psnode.export(kv, 'emb', str(out / 'b.npz'), since=str(out / 'a.npz')) == 1
kv.barrier()
got = pull('emb', [1])            # evicted: made again, provisional until its next 2 occurrences
check(got[1], np.zeros(4, np.float32), "id 1 after eviction: zeros (a new id again)")
kv.close()
print("OK")
""", 2, 1, args=["dist_sync", "sum", str(tmp_path)])
    ok(job)
    a, b = np.load(tmp_path / "a.npz"), np.load(tmp_path / "b.npz")
    from psnode.math import dynrows
    ref = {i: dynrows.row_values(psnode.init.Normal(1.0), 7, "emb", dynrows.mix(np.array([i])), 4, np.float32)[0]
           for i in (2, 5, 6)}
    assert a["ids"].tolist() == [2, 5, 6] and a["values"].dtype == np.float32
    np.testing.assert_array_equal(a["values"], np.stack([ref[2] - 1, ref[5] - 1, ref[6] - 1]))
    assert b["ids"].tolist() == [5]
    np.testing.assert_array_equal(b["values"], (ref[5] - np.float32(1) - np.float32(2))[None])
    assert str(a["key"]) == "emb" and b["since"].tolist() == a["versions"].tolist()


@pytest.mark.parametrize(("mode", "opt"), [("dist_sync", "sgd"), ("dist_sync", "adagrad"), ("dist_sync", "adam"),
                                           ("dist_async", "adam"), ("dist_ssp", "adagrad")])
def test_optimizer_state_is_per_row_and_goes_with_an_evicted_row(mode: str, opt: str) -> None:
    """A table without a row count (a short ttl) beside a fixed table, both from the same constant, fed
    the same gradients: a row trained throughout equals the fixed table's row bit for bit (same
    optimizer, same update count); an evicted row pushed again equals a fixed row pushed for the
    first time in that round (initial values, zero state); an evicted row only pulled is its
    initial value.  dist_async: only rank 0 pushes (Adam's update count then follows one order);
    dist_ssp: each rank pushes its own rows (ids + 40 * rank)."""
    job = run_job(DYN + """
OPTS = {'sgd': dict(momentum=0.9), 'adagrad': {}, 'adam': {}}
kv.set_optimizer(psnode.optimizer.create(sys.argv[3], learning_rate=0.25, **OPTS[sys.argv[3]]))
C = psnode.init.ps_initializer(psnode.init.Constant(0.5), SEED)
sync = sys.argv[1] == 'dist_sync'
kv.init('dyn', psnode.sparse.table(4, ttl=1 if sync else 4), C)   # (async: ticks are pushes, of either rank)
kv.init('fix', psnode.sparse.zeros((128, 4)), C)
pusher = sync or r == 0 or sys.argv[1] == 'dist_ssp'
o = 0 if sync else 40 * r
def both(ids, twin, step):
    g = (np.arange(len(ids) * 4, dtype=np.float32).reshape(-1, 4) - 3) * np.float32(step + r + 1)
    if pusher:
        kv.push('dyn', row_sparse_array((g, np.asarray(ids, np.int64) + o), shape=(None, 4)))
        kv.push('fix', row_sparse_array((g, np.asarray(twin, np.int64) + o), shape=(128, 4)))
both([1, 2, 3], [1, 2, 3], 1)
for step in range(2, 10):                 # only row 2 is touched: rows 1 and 3 expire
    both([2], [2], step)
    if pusher:
        kv.row_sparse_pull('fix', row_ids=np.array([2 + o]))
kv.barrier()
both([2, 1], [2, 33], 10)                 # row 1 made again; fixed row 33 pushed for the first time
kv.barrier()
if pusher:
    dyn, fix = pull('dyn', np.array([1, 2, 3]) + o), pull('fix', np.array([1, 2, 33]) + o)
    check(dyn[2 + o], fix[2 + o], "row 2: trained throughout, as the fixed table's")
    check(dyn[1 + o], fix[33 + o], "row 1: evicted, pushed again: initial values, zero state")
    check(dyn[3 + o], np.full(4, 0.5, np.float32), "row 3: evicted, pulled: initial values")
    assert not np.array_equal(dyn[1 + o], fix[1 + o]), "row 1 kept its state: not evicted"
kv.close()
print("OK")
""", 2, 1, args=[mode, "average", opt])
    ok(job)
