"""mxdist.supervisor.hostwatch.to_probe: which hosts the watch probes (pure)."""
from __future__ import annotations

from mxdist.supervisor.hostwatch import to_probe
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
