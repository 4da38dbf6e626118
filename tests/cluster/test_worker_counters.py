"""Worker heartbeats carry the worker's own counters: the scheduler's status table shows each
worker's pushes, pulls, rounds, bytes and resends (they used to read 0/0)."""
from __future__ import annotations

import time

from psnode.scheduler.client import status as scheduler_status
from tests.support.cluster import ok, start_job, wait_for_file, wait_job

SCRIPT = """
import sys, pathlib, time, numpy as np, psnode
kv = psnode.kv.create('dist_sync')
kv.init(['a', 'b'], [np.zeros(1000, np.float32)] * 2)
for step in range(5):
    kv.push(['a', 'b'], [np.ones(1000, np.float32)] * 2)
    kv.pull(['a', 'b'])
pathlib.Path(sys.argv[1] + str(kv.rank)).touch()
deadline = time.monotonic() + 30
while not pathlib.Path(sys.argv[2]).exists() and time.monotonic() < deadline:
    time.sleep(0.02)
kv.close()
"""


def test_status_shows_worker_pushes_pulls_and_rounds(tmp_path) -> None:
    ready, go = tmp_path / "ready", tmp_path / "go"
    job = start_job(SCRIPT, 2, 1, args=[str(ready), str(go)], tmp=tmp_path)
    try:
        for r in range(2):
            wait_for_file(tmp_path / f"ready{r}")
        deadline = time.monotonic() + 10
        while True:     # the next heartbeat (every 0.2 s) carries the final counts
            rows = [n for n in scheduler_status(job.scheduler, job.job_id).to_body()["nodes"] if n["role"] == "worker"]
            if all(n["rounds"] == 5 for n in rows) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        for n in rows:
            assert (n["pushes"], n["pulls"], n["rounds"], n["retries"]) == (10, 10, 5, 0), n
            assert n["bytes_out"] >= 10 * 4000 and n["bytes_in"] >= 10 * 4000, n
    finally:
        go.touch()
        wait_job(job, 30)
    ok(job)
