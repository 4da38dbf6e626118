"""The server-restore job (tests/cluster/test_server_restore.py, tests/faults/test_shm_faults.py):
:data:`SCRIPT`, two workers training five keys with momentum SGD for :data:`STEPS` steps (rank 1
waits for ``argv[1]/go`` at step 5, rank 0 marks ``argv[1]/pushed``; with ``argv[2]`` = s, also
``go2`` and ``pushed2`` at step s), and :func:`reference`,
the same training on one 'local' store; :func:`kill_servers_mid_round` runs it, killing servers
at that moment."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

import psnode
from psnode.scheduler.client import status as scheduler_status
from tests.support import wait_for
from tests.support.cluster import Job, kill_and_restart_server, start_job, wait_for_file, wait_job

STEPS = 8
KEYS = ["a", "b", "c", "d", "big"]

SCRIPT = """
import os, sys, time, pathlib, numpy as np, psnode
flags = pathlib.Path(sys.argv[1])
kv = psnode.kv.create('dist_sync')
kv.set_optimizer(psnode.optimizer.create('sgd', learning_rate=0.25, momentum=0.5))
keys = ['a', 'b', 'c', 'd', 'big']
shapes = {'a': 4, 'b': 4, 'c': 4, 'd': 4, 'big': 16}
for k in keys:
    kv.init(k, np.zeros(shapes[k], np.float32))
pauses = {5: ''} if len(sys.argv) < 3 else {5: '', int(sys.argv[2]): '2'}   # step -> flag suffix
for step in range(8):
    if kv.rank == 1 and step in pauses:
        deadline = time.monotonic() + 60
        while not (flags / ('go' + pauses[step])).exists():
            assert time.monotonic() < deadline
            time.sleep(0.02)
    for i, k in enumerate(keys):
        kv.push(k, np.arange(shapes[k], dtype=np.float32) * (kv.rank + 1) + step + i)
    if kv.rank == 0 and step in pauses:
        (flags / ('pushed' + pauses[step])).touch()
    for k in keys:
        kv.pull(k)
for k in keys:
    print('FINAL', k, kv.pull(k).tolist(), flush=True)
kv.close()
"""


def reference() -> dict[str, list[float]]:
    """The same training on a 'local' store fed the workers' average gradient."""
    kv = psnode.kv.create("local")
    kv.set_optimizer(psnode.optimizer.create("sgd", learning_rate=0.25, momentum=0.5))
    shapes = {"a": 4, "b": 4, "c": 4, "d": 4, "big": 16}
    for k in KEYS:
        kv.init(k, np.zeros(shapes[k], np.float32))
    for step in range(STEPS):
        for i, k in enumerate(KEYS):
            g = [np.arange(shapes[k], dtype=np.float32) * (r + 1) + step + i for r in (0, 1)]
            kv.push(k, (g[0] + g[1]) * np.float32(0.5))
    return {k: kv.pull(k).tolist() for k in KEYS}


def _server_row(job: Job, rank: int) -> Any:
    """Server ``rank``'s row of the scheduler's STATUS (None without an answer)."""
    try:
        answer = scheduler_status(job.scheduler, job.job_id, timeout=1.0)
    except Exception:  # noqa: BLE001 - no answer yet: asked again
        return None
    return next((n for n in answer.nodes if n.role == "server" and n.rank == rank), None)


def _copied_everywhere(job: Job, rank: int, copied: int, since: float) -> bool:
    """Server ``rank``'s status, sent after ``since`` (its heartbeat's age says when), shows its
    copies grew past ``copied`` and every holder it has acknowledged its latest copy (a stale row
    could still show a holder that is gone)."""
    row = _server_row(job, rank)
    return (row is not None and time.monotonic() - (row.heartbeat_age or 0.0) > since
            and (row.copied or 0) > copied and bool(row.lag) and all(len(e) == 2 and e[1] == 0 for e in row.lag))


def kill_servers_mid_round(tmp_path: Path, env: dict[str, str], ranks: list[int]) -> Job:
    """:data:`SCRIPT` on 2 workers and 2 servers with ``env``; once worker 0 pushed round 5 and
    worker 1 has not, kill -9 each server of ``ranks`` in turn and start its replacement (each
    one serving before the next kill, and the next one's state copied to every holder it has
    then: its copies grew since the first kill, and no holder lags), then let worker 1 go on;
    the finished job."""
    flags = tmp_path / "flags"
    flags.mkdir()
    job = start_job(SCRIPT, 2, 2, env=env, args=[str(flags)], tmp=tmp_path)
    try:
        wait_for_file(flags / "pushed", 60)
        copied = {r: wait_for(lambda r=r: _server_row(job, r), 30, f"server {r}'s status").copied or 0
                  for r in ranks[1:]}
        served = 0.0   # (when the last replacement was seen serving)
        for i, rank in enumerate(ranks):
            if i:   # (its holders hold its state: a replaced one got it whole; stats sent since then)
                wait_for(lambda r=rank, t=served: _copied_everywhere(job, r, copied[r], t), 30,
                         f"server {rank}'s copy at every holder")
            replacement = kill_and_restart_server(job, rank)
            wait_for(lambda r=replacement: "serving again" in r.err, 30, f"server {rank}'s replacement to serve",
                     describe=lambda: job.describe()[-8000:])
            served = time.monotonic()
        (flags / "go").touch()
    finally:
        wait_job(job, 120)
    return job


def kill_server_twice(tmp_path: Path, env: dict[str, str], rank: int) -> Job:
    """:data:`SCRIPT` on 2 workers and 2 servers with ``env``, paused at steps 5 and 7 (rank 1
    waits, rank 0 pushed): server ``rank`` is killed and replaced at the first pause, the job
    goes on to the second (rounds complete on the replacement), and the replacement is killed
    and replaced there; the finished job."""
    flags = tmp_path / "flags"
    flags.mkdir()
    job = start_job(SCRIPT, 2, 2, env=env, args=[str(flags), "7"], tmp=tmp_path)
    try:
        for mark in ("", "2"):
            wait_for_file(flags / f"pushed{mark}", 60)
            replacement = kill_and_restart_server(job, rank)
            wait_for(lambda r=replacement: "serving again" in r.err, 30, f"server {rank}'s replacement to serve")
            (flags / f"go{mark}").touch()
    finally:
        wait_job(job, 120)
    return job


def finals(out: str) -> dict[str, str]:
    """What a worker of :data:`SCRIPT` printed last, per key."""
    return {line.split()[1]: line.split(" ", 2)[2] for line in out.splitlines() if line.startswith("FINAL")}
