"""The real scheduler serves 1,000 simulated workers and 100 servers on 138 simulated hosts
through a seeded fault schedule (benchmarks/control/simulate.py: its own run loop and socket,
the nodes' messages through psnode's codec, ``status`` asked from another process), their
heartbeats and barrier entries batched by one relay per host (psnode.net.relay).

The simulation raises at the first broken invariant: a live node called silent, a silenced one
not called so within twice the heartbeat timeout, a barrier answered twice to a worker.  Here:
the job starts, every step completes, the last barrier is answered to each of the 1,000 workers
(the lost host's and the silent worker's replacements included), and STOP ends the scheduler
with exit code 0.
"""
from __future__ import annotations

import logging

from benchmarks.control.simulate import SimConfig, simulate


def test_the_real_scheduler_serves_a_thousand_simulated_workers_through_lost_nodes_and_a_partition() -> None:
    logging.getLogger("psnode").setLevel(logging.ERROR)   # (a replaced node's warnings)
    try:
        got = simulate(SimConfig(1000, spread=1.0, idle=1.0, barriers=2, status_queries=1, seed=7, step_timeout=90))
    finally:
        logging.getLogger("psnode").setLevel(logging.NOTSET)
    print({k: round(v, 3) if isinstance(v, float) else v for k, v in got.items()})
    assert (got["exit"], got["workers"], got["servers"]) == (0, 1000, 100)
    assert got["hosts"] == 138 + 2                       # 1,100 processes 8 to a host, and two hosts of replacements
    assert got["barriers_answered"] == 1000
    # liveness through the relays: a batch per host per interval, not a message per process (1,100)
    assert got["relay"] and got["relayed"] > 1100 and got["idle_msgs_per_s"] < 1100 / 2
    # barriers counted per host: a barrier's 1,000 entries reach the scheduler in about one message per host
    assert got["barrier_msgs"] < 1000 / 4, got["barrier_msgs"]
    assert 0 < got["detect_node_s"] <= 2 * got["dead_after_s"] and 0 < got["detect_host_s"] <= 2 * got["dead_after_s"]
