"""The CPU scheduling policy of psnode's processes (``PSNODE_CPU_POLICY``, ``mxdist launch --cpu-policy``).

Under ``batch`` (the default) a scheduler, server or worker process runs under Linux's
``SCHED_BATCH``: same share of the CPU as before (the nice value is kept), but a process woken
by a message does not preempt the one that is running.  A parameter-server round is a chain
of short messages; on a host with more busy processes than cores (the local default: W
workers, S servers and the scheduler on one machine) normal scheduling hands the core to each
message's receiver at once, so the sender stops mid-work, and every round pays several extra
context switches.  ``benchmarks/kvstore/run.py`` measures the difference (README, Performance).

``normal`` leaves the policy as the process got it.  Nothing here raises: where the policy
cannot be set (not Linux, a sandbox refusing sched_setscheduler) the process runs as it was and
:func:`apply` says so in its result.
"""
from __future__ import annotations

import contextlib
import os
import threading

from psnode.config import CpuPolicy


def apply(policy: CpuPolicy, whole_process: bool = False) -> bool:
    """Run this thread under ``policy`` (with ``whole_process``: every thread the process has
    now, as a worker's may already run others, e.g. torch's); threads started later inherit it
    from the thread that starts them.  Only threads under the normal policy (SCHED_OTHER)
    change: one the program put under another policy on purpose (SCHED_IDLE, a real-time
    one) keeps it.  True if this thread runs under ``policy`` afterwards."""
    if policy is CpuPolicy.NORMAL:
        return False
    setter = getattr(os, "sched_setscheduler", None)
    batch, other = getattr(os, "SCHED_BATCH", None), getattr(os, "SCHED_OTHER", None)
    if setter is None or batch is None:
        return False
    me = threading.get_native_id()
    tids = [me]
    if whole_process:
        with contextlib.suppress(OSError):
            tids = [int(t) for t in os.listdir("/proc/self/task")]
    done = False
    for tid in tids:
        try:
            if os.sched_getscheduler(tid) == other:
                setter(tid, batch, os.sched_param(0))
            done = done or (tid == me and os.sched_getscheduler(tid) == batch)
        except OSError:   # (a thread that ended meanwhile, or a sandbox that refuses)
            continue
    return done


__all__ = ["apply"]
