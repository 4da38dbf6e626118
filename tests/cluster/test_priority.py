"""When requests queue up, higher priority goes out first (real processes).

Synchronisation, no sleeps: worker 0 parks a pull of 'block' (round 1 needs worker 1's push)
and waits, bounded, until it is in flight, so the window (one pull) is full; its next four pulls
then queue (``submit`` adds them to the tracker before returning).  Worker 1 pushes 'block' only
after the barrier, which worker 0 enters after queueing them: they leave in priority order.
"""
from __future__ import annotations

from tests.support.cluster import PRELUDE, ok, run_job


def test_queued_pulls_leave_in_priority_order() -> None:
    job = run_job(PRELUDE + """
import time, threading
from psnode.protocol import Pull
def until(cond, what, limit=20.0):
    deadline = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < deadline, f"not within {limit} s: {what}"
        time.sleep(0.001)
kv.init(['block', 'a', 'b', 'c', 'd'], [np.zeros(4, np.float32)] * 5)
if r == 1:
    kv.barrier()                    # worker 0 has queued its pulls behind 'block'
    kv.push('block', np.ones(4, np.float32))
    kv.close(); sys.exit(0)
eng = kv._engine
eng.tracker.window_bytes = 1        # one pull in flight per server: the rest queue
kv.push('block', np.ones(4, np.float32))
first = eng.submit(0, Pull("block", 0, 1), 16)  # parked: round 1
order, done = [], threading.Event()
def record(name):
    def cb(answer):
        order.append(name)
        if len(order) == 4:
            done.set()
    return cb
until(lambda: eng.tracker.inflight[0] > 0, "the pull of 'block' in flight")
for name, prio in (("a", 1), ("b", 7), ("c", -3), ("d", 4)):
    eng.submit(0, Pull(name, 0, 0), 16, prio, record(name))
kv.barrier()
eng.wait(first)
assert done.wait(10), order
print("ORDER", order, flush=True)
assert order == ["b", "d", "a", "c"], order
kv.close()
""", 2, 1)
    ok(job)
