"""A big table with ``--replicas 2``: every loop keeps turning while its state moves, and
``mxdist status`` says what moves.

A row_sparse table of 20M x 16 float32 (1.28 GB: 640 MB per server; a whole copy of one
server's part takes seconds here), given whole by rank 0 (or, in one case, as a template with
no rows: made on the servers, copied as its spec and the rows touched), on two servers, each
holding the other's replica; two workers push rows whose count changes every step (sgd with
learning rate 1, integer gradients: every row's value is exactly minus the mean of how often
the workers touched it). While the job runs, the test asks the scheduler for its STATUS as fast
as it answers and keeps, per process, the longest loop gap it ever reported (psnode.loopgap:
the gap in progress counts, so a loop held during a copy shows while it is held); the bound
(``LIMIT``) is a fifth of the heartbeat timeout: generous on a loaded machine, far below the
point where a process is taken for dead; the test ends the job at once (``mxdist stop``) when a
loop passes it. One ``mxdist status --json`` mid-job shows each server's state size, its bytes
copied per round and its holder's lag. The job must end exactly, with nothing left running.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from psnode.config import default
from psnode.launcher import status
from tests.support.cli import assert_nothing_left, cli_env, latest, records, run_cli, start_cli

ROWS, DIM, STEPS = 20_000_000, 16, 100

SCRIPT = """
import pathlib, sys, time
import numpy as np
import psnode
from psnode.sparse import row_sparse_array

N, D, STEPS = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
kv = psnode.kv.create('dist_sync')
W, r = kv.num_workers, kv.rank
kv.set_optimizer(psnode.optimizer.create('sgd', learning_rate=1.0))
if sys.argv[5] == 'given':   # (rank 0's array: the table travels whole)
    kv.init('emb', np.zeros((N, D), np.float32), stype='row_sparse')
else:                        # (a template with no rows: zeros made on the servers)
    kv.init('emb', psnode.sparse.zeros((N, D)))


def ids(worker, step):   # every worker's rows of every step, known to all (row counts change)
    rng = np.random.default_rng(1000 * worker + step)
    return np.unique(rng.integers(0, N, 200 + 97 * ((step + worker) % 7)))


touched = {}
for step in range(STEPS):
    mine = ids(r, step)
    kv.push('emb', row_sparse_array((np.ones((len(mine), D), np.float32), mine), shape=(N, D)))
    for w in range(W):
        for i in ids(w, step):
            touched[int(i)] = touched.get(int(i), 0) + 1
    if step % 10 == 9:
        kv.pull('emb', row_ids=mine[:8])   # (a round trip now and then)
rows = np.array(sorted(touched)[::7] + [N - 1], np.int64)
got = kv.row_sparse_pull('emb', row_ids=rows)
want = -np.array([touched.get(int(i), 0) for i in got.indices], np.float32)[:, None] / W
assert list(got.indices) == sorted(set(rows.tolist())), 'ids'
assert np.array_equal(got.data, np.broadcast_to(want, got.data.shape)), 'values'
pathlib.Path(sys.argv[4] + f'.trained{r}').touch()
go = pathlib.Path(sys.argv[4] + '.go')
kv.init('halt', np.zeros(1, np.float32))
step = STEPS
for _ in range(1200):   # (rounds go on while the test looks at the job's status, then it ends: at most 120 s)
    kv.push('halt', np.full(1, go.exists(), np.float32))
    if kv.pull('halt')[0] != 0:   # (a round of every worker's: they all leave after the same step)
        break
    mine = ids(r, step)
    kv.push('emb', row_sparse_array((np.ones((len(mine), D), np.float32), mine), shape=(N, D)))
    kv.pull('emb', row_ids=mine[:8])
    step += 1
    time.sleep(0.1)
kv.barrier()
print('EXACT', len(rows), flush=True)
kv.close()
"""


def _watch(home: Path, stop: threading.Event, seen: dict[str, float], samples: list[dict],
           now: dict[str, float] | None = None) -> None:
    """Ask the scheduler for its STATUS until ``stop``: per process, the longest loop gap it
    reported (servers and workers from their heartbeats, the scheduler its own); in ``now``,
    the last one each reported."""
    while not stop.is_set():
        recs = records(home)
        if not recs or not recs[-1].get("scheduler"):
            time.sleep(0.1)
            continue
        rec = recs[-1]
        try:
            answer = status(rec["scheduler"], rec["id"], key_file=rec.get("key_file") or None, timeout=1.0)
        except Exception:  # noqa: BLE001 - not up yet, or gone at the end
            time.sleep(0.1)
            continue
        seen["scheduler"] = max(seen.get("scheduler", 0.0), answer.loop_gap)
        for n in answer.nodes:
            if n.loop_gap is not None and n.rank is not None:
                name = f"{n.role} {n.rank}"
                seen[name] = max(seen.get(name, 0.0), n.loop_gap)
                if now is not None:
                    now[name] = n.loop_gap
            if n.role == "server":
                samples.append(n.to_dict())
        time.sleep(0.05)


#: the bound on every loop's longest gap: a fifth of the heartbeat timeout (1 s by default), ten
#: times what a loop may be held for (psnode.loopgap), generous on a loaded machine
LIMIT = default("heartbeat_interval") * default("heartbeat_liveness") / 5


def _start(tmp_path: Path, now: dict[str, float] | None = None, init: str = "given"):
    """Launch the job (``--replicas 2``; ``init``: the table ``given`` whole by rank 0, or a
    ``template`` with no rows) and the watcher of its loops' gaps (``now``: as _watch)."""
    home = tmp_path / "home"
    script = tmp_path / "big.py"
    script.write_text(SCRIPT)
    flags = tmp_path / "flag"
    env = cli_env(home)
    proc = start_cli(["launch", "-n", "2", "-s", "2", "--replicas", "2", "--max-restarts", "1",
                      str(script), str(ROWS), str(DIM), str(STEPS), str(flags), init], env)
    stop = threading.Event()
    seen: dict[str, float] = {}
    samples: list[dict] = []
    watcher = threading.Thread(target=_watch, args=(home, stop, seen, samples, now), daemon=True)
    watcher.start()
    return home, env, flags, proc, stop, seen, samples, watcher


@pytest.mark.parametrize("init", ["given", "template"])
def test_big_table_with_replicas_keeps_every_loop_turning_and_status_shows_the_state(tmp_path, init: str) -> None:
    """``given``: rank 0's array of zeros, copied to the holder whole; ``template``:
    ``psnode.sparse.zeros`` (no rows), made on the servers: its copies are the spec and the rows
    touched, whatever the table's size."""
    home, env, flags, proc, stop, seen, samples, watcher = _start(tmp_path, init=init)
    mid: dict = {}
    try:
        deadline = time.monotonic() + 240
        while not all(Path(f"{flags}.trained{r}").exists() for r in range(2)):
            assert max(seen.values(), default=0.0) < LIMIT, f"a loop held for longer than {LIMIT:g} s: {seen}"
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "the workers did not train within 240 s"
            time.sleep(0.1)
        while not any(s.get("copied_per_round") is not None for s in samples):   # (two heartbeats with rounds between)
            assert max(seen.values(), default=0.0) < LIMIT, f"a loop held for longer than {LIMIT:g} s: {seen}"
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            assert time.monotonic() < deadline, f"no server reported its bytes per round: {samples[-4:]}"
            time.sleep(0.1)
        shown = run_cli(["status", latest(home)["id"], "--json"], env, timeout=60)
        Path(f"{flags}.go").touch()
        assert shown.returncode == 0, shown.stderr
        mid = json.loads(shown.stdout)
        out, _ = proc.communicate(timeout=max(10.0, deadline - time.monotonic()))
    finally:
        stop.set()
        watcher.join(10)
        if proc.poll() is None:   # (a failed check: the job ends now, by the launcher's own stop)
            run_cli(["stop", latest(home)["id"]], env, timeout=90)
            proc.communicate(timeout=60)
    print("longest loop gaps (s):", json.dumps({k: round(v, 3) for k, v in sorted(seen.items())}), file=sys.stderr)
    assert proc.returncode == 0, out[-4000:]
    assert out.count("EXACT") == 2, out[-4000:]
    # what users see: each server's state (its half of the table), its copies, its holder's lag
    servers = {n["rank"]: n for n in mid["nodes"] if n["role"] == "server"}
    half = ROWS * DIM * 4 // 2
    assert sorted(servers) == [0, 1], mid
    assert all(n["source"] == "scheduler" for n in servers.values()), mid
    for rank, n in servers.items():
        assert half <= n["state_bytes"] <= half + 2**20, n
        if init == "given":
            assert n["copied"] >= half, n          # (the new table went to its holder whole, once)
        else:
            assert 0 < n["copied"] < half // 100, n   # (its spec and the rows touched)
        assert n["lag"] is not None and [e[0] for e in n["lag"]] == [1 - rank], n
    assert any(s.get("copied_per_round") is not None for s in samples), samples[-4:]
    # the loops: every one reported, none held near the heartbeat timeout
    assert {"scheduler", "server 0", "server 1", "worker 0", "worker 1"} <= set(seen), seen
    assert max(seen.values()) < LIMIT, seen
    assert_nothing_left(home)
    assert not os.environ.get("PSNODE_HEARTBEAT_INTERVAL")


def test_a_replaced_holder_gets_the_big_table_whole_while_every_loop_keeps_turning(tmp_path) -> None:
    """Server 1 is killed (-9) once the workers trained: its replacement restores from server 0's
    copy, and server 0 sends its own half (640 MB) whole to the replacement's keeper while the
    rounds go on (read in place: the rounds write the rows they touch, saved first).  No loop
    of a process that lives through it is held past ``LIMIT``: not server 0's (a copy on
    write of its half held it for about a second), not the workers' (their same-host handshake
    with the replacement, which answers once it restored, goes on beside their loop); the job
    ends exact.  (The replacement's own loop restores the state before it serves, pumping its
    heartbeats: it is not measured here.)  The replacement copies server 0 only what changed
    since it restored: server 0 holds the very copy it restored from, so its half does not go
    back whole."""
    now: dict[str, float] = {}
    home, env, flags, proc, stop, seen, samples, watcher = _start(tmp_path, now)
    half = ROWS * DIM * 4 // 2
    try:
        deadline = time.monotonic() + 300
        while not all(Path(f"{flags}.trained{r}").exists() for r in range(2)) or (
                max(now.values(), default=1.0) > LIMIT / 10):   # (and the gaps of the table's creation, past)
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            assert time.monotonic() < deadline, f"the workers did not train within 300 s: {now}"
            time.sleep(0.1)
        seen.clear()
        killed = next(p["pid"] for p in latest(home)["procs"] if p["name"] == "server-1")
        os.kill(killed, 9)

        def whole_again() -> bool:   # (server 0 copied its half a second time: to the new keeper)
            return any(s.get("rank") == 0 and (s.get("copied") or 0) >= 2 * half for s in samples[-8:])
        while not whole_again():
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            assert time.monotonic() < deadline, f"server 0 did not copy its state to the new holder: {samples[-4:]}"
            time.sleep(0.1)
        time.sleep(2 * default("heartbeat_interval"))   # (the gaps of the rounds after it, reported)
        restarted = [s for s in samples[-8:] if s.get("rank") == 1 and s.get("restarts")]
        Path(f"{flags}.go").touch()
        out, _ = proc.communicate(timeout=max(10.0, deadline - time.monotonic()))
    finally:
        stop.set()
        watcher.join(10)
        if proc.poll() is None:
            run_cli(["stop", latest(home)["id"]], env, timeout=90)
            proc.communicate(timeout=60)
    print("longest loop gaps after the kill (s):", json.dumps({k: round(v, 3) for k, v in sorted(seen.items())}),
          file=sys.stderr)
    assert proc.returncode == 0, out[-4000:]
    assert out.count("EXACT") == 2, out[-4000:]
    assert "server 1 restored 1 key parts from its replica on server 0" in out, out[-4000:]
    assert restarted and all(0 < (s.get("copied") or 0) < half // 100 for s in restarted), \
        [s.get("copied") for s in restarted]
    assert "no same-host link" not in out, out[-4000:]   # (the handshakes ended once it restored)
    assert {"server 0", "worker 0", "worker 1"} <= set(seen), seen
    assert max(v for k, v in seen.items() if k != "server 1") < LIMIT, seen
    assert_nothing_left(home)
