"""psnode.cpupolicy: the CPU scheduling policy a psnode process puts itself under."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap


def test_cpu_policy_changes_only_normal_threads_of_the_process():
    """psnode.cpupolicy.apply in a fresh process: with whole_process every SCHED_OTHER thread
    (the caller and one already running) goes to SCHED_BATCH, a SCHED_IDLE thread keeps its
    policy, a thread started afterwards inherits batch; ``normal`` changes nothing."""
    code = textwrap.dedent("""
        import os, threading
        from psnode import cpupolicy
        from psnode.config import CpuPolicy
        go, ids = threading.Event(), {}
        def idle():
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0)); ids["idle"] = threading.get_native_id(); go.wait()
        def plain():
            ids["plain"] = threading.get_native_id(); go.wait()
        ts = [threading.Thread(target=f) for f in (idle, plain)]
        [t.start() for t in ts]
        while len(ids) < 2: pass
        print(cpupolicy.apply(CpuPolicy.NORMAL, whole_process=True), os.sched_getscheduler(0))
        print(cpupolicy.apply(CpuPolicy.BATCH, whole_process=True))
        later = threading.Thread(target=lambda: ids.update(later=os.sched_getscheduler(0)))
        later.start(); later.join()
        print(os.sched_getscheduler(0), os.sched_getscheduler(ids["plain"]), os.sched_getscheduler(ids["idle"]), ids["later"])
        go.set(); [t.join() for t in ts]
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    b, o, i = os.SCHED_BATCH, os.SCHED_OTHER, os.SCHED_IDLE
    assert out.stdout.split("\n")[:3] == [f"False {o}", "True", f"{b} {b} {i} {b}"]
