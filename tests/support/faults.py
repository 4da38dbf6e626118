"""Helpers for fault tests: the training script, markers, server ports, raw frames.

Output draining and exit timing are the harness's (``job.drained``: :class:`tests.support.Drained`).

Every wait here has a deadline; nothing sleeps "to hope".
"""
from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

from tests.support.cluster import Job, alive

INTERVAL = 0.2
LIVENESS = 5
DEAD_AFTER = INTERVAL * LIVENESS
FAST_ENV = {"PSNODE_HEARTBEAT_INTERVAL": str(INTERVAL), "PSNODE_HEARTBEAT_LIVENESS": str(LIVENESS),
            "PSNODE_REGISTER_TIMEOUT": "20"}


# A dist_sync training loop with exact values: rank r pushes (r+1)*step to keys 'a' and 'b'
# (one per server with 2 servers); the pulled value must be mean(1..W)*step exactly.
# argv[1]: 'forever' | 'steps:N' | 'compute' (rank 0 sleeps in user code at step 3)
#          | 'barrier' (rank 0 blocks in barrier(), rank 1 sleeps)
TRAIN = """
import os, sys, time
from pathlib import Path
import numpy as np, psnode
from psnode.errors import PeerLost
D = Path(os.environ["FAULT_DIR"])
mode = sys.argv[1]
kv = psnode.kv.create(os.environ.get("FAULT_KV", "dist_sync"))
r, W = kv.rank, kv.num_workers
keys, n = ['a', 'b'], 1000
try:
    for k in keys:
        kv.init(k, np.zeros(n, np.float32))
    if mode == 'barrier':
        (D / f"ready.{r}").touch()
        if r == 0:
            kv.barrier()
            print("BARRIER RETURNED", flush=True)
        else:
            time.sleep(600)
        sys.exit(0)
    mean = sum(range(1, W + 1)) / W
    limit = int(mode.split(':')[1]) if mode.startswith('steps') else 10**9
    step = 0
    while step < limit:
        step += 1
        for k in keys:
            kv.push(k, np.full(n, (r + 1) * step, np.float32))
        for k in keys:
            got = kv.pull(k)
            if not np.array_equal(got, np.full(n, mean * step, np.float32)):
                print(f"MISMATCH step {step} key {k}: {got[:3]}", flush=True)
                sys.exit(3)
        if step == 3:
            (D / f"ready.{r}").touch()
            if mode == 'compute' and r == 0:
                time.sleep(600)          # long user code outside psnode
        time.sleep(0.01)
    kv.close()
    print("DONE", step, flush=True)
except PeerLost as e:
    print(f"PEERLOST: {e}", file=sys.stderr, flush=True)
    sys.exit(5)
"""


def assert_none_left(job: Job, extra_pids: tuple[int, ...] = ()) -> None:
    """No process of the job is alive (zombies count as dead); waits up to 3 s for reaping."""
    pids = [p.popen.pid for p in job.procs] + list(extra_pids)
    deadline = time.monotonic() + 3
    while (left := [pid for pid in pids if alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"processes of the job still alive: {left}"
    # nothing of the job's shared memory is left: no named segment, no process mapping one
    from psnode.samehost import segments as shm
    assert not shm.leftovers(job.job_id), shm.leftovers(job.job_id)
    assert not shm.holders(job.job_id), f"processes still map the job's segments: {shm.holders(job.job_id)}"


def markers(d: Path, name: str, count: int) -> bool:
    return all((d / f"{name}.{r}").exists() for r in range(count))


def listen_ports(pid: int) -> list[int]:
    """TCP ports ``pid`` listens on (from ``ss -ltnp``)."""
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, timeout=10).stdout
    ports = []
    for line in out.splitlines():
        if re.search(rf"pid={pid},", line):
            local = line.split()[3]
            ports.append(int(local.rsplit(":", 1)[1]))
    return ports


def header(cmd: str, job: str, body: dict | None = None, arrays: list | None = None,
           sender: str = "fuzz") -> bytes:
    return json.dumps({"c": cmd, "j": job, "s": sender, "b": body or {}, "a": arrays or []}).encode()
