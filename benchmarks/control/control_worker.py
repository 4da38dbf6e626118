"""A worker of benchmarks/control/control_plane.py (started by the test harness: PSNODE_* env).

argv: <config-json> with barriers, rounds, idle (seconds), keys.

Every worker: after its imports, stamps ``t_ready`` (time.time()), creates the kvstore (REGISTER
until WELCOME: ``t_welcome``), inits ``keys`` tiny keys (16 float32 each), then

1. ``barriers`` barriers, each timed;
2. an idle window of ``idle`` seconds between two barriers (only heartbeats reach the scheduler);
3. ``rounds`` rounds of push+pull of the tiny keys, each timed;
4. a barrier, then ``kv.close()`` (FINISH until acknowledged), stamped before and after.

Rank 0 also samples the scheduler's CPU time (every thread of it: /proc/PID/task/*/schedstat,
nanoseconds) right after its WELCOME, and right after the barriers that open and close the
barrier loop and the idle window, so the driver can divide by the messages the scheduler
handled in each.  The
scheduler is found by its environment (PSNODE_ROLE=scheduler and this job's PSNODE_JOB_ID; the
same user can read it).  One BENCHRESULT line per worker.
"""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

import psnode
from benchmarks.cases import report


def find_scheduler(job_id: str) -> int | None:
    want = {b"PSNODE_ROLE=scheduler", f"PSNODE_JOB_ID={job_id}".encode()}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = set(fh.read().split(b"\0"))
        except OSError:
            continue
        if want <= env:
            return int(entry)
    return None


def cpu_ns(pid: int | None) -> int | None:
    """CPU time of every thread of ``pid`` (ns), from schedstat; None if unreadable."""
    if pid is None:
        return None
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                total += int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return total


def main(cfg: dict) -> None:
    t_ready = time.time()
    kv = psnode.kv.create("dist_sync")
    t_welcome = time.time()
    rank = kv.rank
    sched = find_scheduler(os.environ.get("PSNODE_JOB_ID", "")) if rank == 0 else None
    cpu_welcomed = cpu_ns(sched)
    keys = [f"tiny{i}" for i in range(cfg["keys"])]
    kv.init(keys, [np.zeros(16, np.float32) for _ in keys])
    kv.barrier()
    cpu = {"welcomed": cpu_welcomed, "barrier_start": cpu_ns(sched), "t_barrier_start": time.monotonic()}
    barrier = []
    for _ in range(cfg["barriers"]):
        t0 = time.perf_counter()
        kv.barrier()
        barrier.append(time.perf_counter() - t0)
    cpu.update(barrier_end=cpu_ns(sched), t_barrier_end=time.monotonic())
    time.sleep(cfg["idle"])
    cpu.update(idle_end=cpu_ns(sched), t_idle_end=time.monotonic())
    kv.barrier()
    grads = [np.full(16, rank + 1, np.float32) for _ in keys]
    outs = [np.empty(16, np.float32) for _ in keys]
    W = kv.num_workers
    rounds = []
    for i in range(cfg["rounds"] + 1):
        t0 = time.perf_counter()
        kv.push(keys, grads)
        kv.pull(keys, out=outs)
        rounds.append(time.perf_counter() - t0)
        if i == 0 and not all((o == np.float32((W + 1) / 2)).all() for o in outs):
            raise SystemExit(f"worker {rank}: pulled {outs[0][:2]}, expected {(W + 1) / 2}")
    kv.barrier()
    t_close = time.time()
    kv.close()
    report(system="psnode", case="control", rank=rank, t_ready=t_ready, t_welcome=t_welcome,
           barrier=barrier, rounds=rounds[1:], scheduler_pid=sched, cpu=cpu if rank == 0 else None,
           t_close=t_close, t_closed=time.time())


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
