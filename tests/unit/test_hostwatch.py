"""mxdist.supervisor.hostwatch: which hosts the watch probes (pure), and when a node is late."""
from __future__ import annotations

import pytest

from mxdist.planning.hosts import Host
from mxdist.planning.plan import NodeOptions, PlanRequest, make_plan
from mxdist.supervisor.hostwatch import late_after, to_probe
from psnode.config import NodeConfig, Role
from psnode.launcher import NodeRow, NodeState


def row(host: str, state: NodeState, age: float | None = 0.2, role: str = "worker") -> NodeRow:
    return NodeRow(role=role, rank=0, host=host, state=state.value, heartbeat_age=age)


def test_silent_and_late_nodes_hosts_are_probed_once_each() -> None:
    """A node the scheduler calls silent, or alive without a heartbeat for half its timeout, has
    its host probed (once, however many of its nodes are late); a node on time, a finished or
    a dead one (already handled) and an age the table lacks do not."""
    rows = [row("10.0.0.1", NodeState.ALIVE, 0.9), row("10.0.0.2", NodeState.ALIVE, 2.5),
            row("10.0.0.2", NodeState.ALIVE, 3.1, role="server"), row("10.0.0.3", NodeState.RESTARTING, None),
            row("10.0.0.4", NodeState.FINISHED, 9.0), row("10.0.0.5", NodeState.DEAD, 9.0),
            row("10.0.0.6", NodeState.ALIVE, None)]
    assert to_probe(rows, 2.5) == ["10.0.0.2", "10.0.0.3"]
    assert to_probe(rows, 5.0) == ["10.0.0.3"]
    assert to_probe([], 2.5) == []


def test_a_node_is_late_after_half_the_timeout_its_scheduler_reads() -> None:
    """The watch's lateness is half of psnode's own dead-after time (NodeConfig.dead_after), as the
    job's scheduler reads it from its environment: 0.4 s x 3 heartbeats -> 0.6 s."""
    hosts = [Host("a", address="10.0.0.1", slots=2), Host("b", address="10.0.0.2", slots=2)]
    plan = make_plan(PlanRequest(job_id="job-1", command=["train.py"], hosts=hosts, python="/usr/bin/python3",
                                 scheduler_port=9000, master_port=9001, num_servers=2,
                                 node=NodeOptions(heartbeat_interval=0.4, heartbeat_liveness=3)))
    [scheduler] = plan.of_role(Role.SCHEDULER)
    assert late_after(plan) == NodeConfig.from_env(scheduler.env).dead_after / 2 == pytest.approx(0.6)
