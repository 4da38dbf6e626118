"""mxdist status: a server's state size, bytes copied and checkpointed per round, its holders'
lag, and every process's longest loop gap (table and --json)."""
from __future__ import annotations

import io

from rich.console import Console

from cli import ui
from cli.job.records import JobState
from cli.view import JobView
from psnode.launcher import NodeRow


def _view() -> JobView:
    rows = [NodeRow("scheduler", None, "h", "running", loop_gap=0.004, source="host"),
            NodeRow("server", 0, "h", "alive", state_bytes=3 * 2**30, copied=10 * 2**20, checkpointed=2**20,
                    copied_per_round=512 * 1024, checkpointed_per_round=64 * 1024, lag=[[1, 0]], loop_gap=0.031),
            NodeRow("server", 1, "h", "alive", state_bytes=2**30, copied=2**20, checkpointed=0,
                    copied_per_round=None, checkpointed_per_round=0, lag=[[0, 2, 3 * 2**28, 2**30]],
                    loop_gap=0.0125),
            NodeRow("worker", 0, "h", "alive", loop_gap=0.002)]
    return JobView(id="j", state=JobState.RUNNING, scheduler="h:1", backend="local", security=None,
                   exit_code=None, created=0.0, ended=None, duration=None, root_cause=None, nodes=rows)


def test_the_table_shows_big_state_and_loop_gaps() -> None:
    buf = io.StringIO()
    Console(file=buf, width=240, highlight=False).print(ui.status_table(_view()))
    text = buf.getvalue()
    header = next(line for line in text.splitlines() if "node" in line and "gap" in line)
    for col in ("size", "copy/rnd", "ckpt/rnd", "lag", "gap"):
        assert col in header, text
    server0 = next(line for line in text.splitlines() if "server-0" in line or "server 0" in line)
    assert "3.0GiB" in server0 and "512.0KiB" in server0 and "64.0KiB" in server0 and "1:0" in server0
    assert "31ms" in server0
    server1 = next(line for line in text.splitlines() if "server-1" in line or "server 1" in line)
    assert "0:2 whole 75%" in server1 and "12ms" in server1   # (a holder getting the state whole)
    assert "4ms" in next(line for line in text.splitlines() if "scheduler" in line and "h " in line)


def test_json_has_every_big_state_field() -> None:
    nodes = _view().to_dict()["nodes"]
    s0 = next(n for n in nodes if n["role"] == "server" and n["rank"] == 0)
    assert (s0["state_bytes"], s0["copied"], s0["checkpointed"], s0["lag"], s0["loop_gap"]) == \
        (3 * 2**30, 10 * 2**20, 2**20, [[1, 0]], 0.031)
    assert s0["copied_per_round"] == 512 * 1024 and s0["checkpointed_per_round"] == 64 * 1024


def test_a_job_without_replicas_or_checkpoints_shows_no_such_columns() -> None:
    view = _view()
    for n in view.nodes:
        n.copied = n.checkpointed = 0
        n.lag = None
    buf = io.StringIO()
    Console(file=buf, width=240, highlight=False).print(ui.status_table(view))
    header = next(line for line in buf.getvalue().splitlines() if "node" in line)
    assert "copy/rnd" not in header and "ckpt/rnd" not in header and "lag" not in header and "size" in header


def test_the_scheduler_turns_a_servers_totals_into_bytes_per_round() -> None:
    """Bytes copied and checkpointed per round: over the heartbeats of the last second or more
    in which rounds completed (a quiet spell's bytes go to the next rounds)."""
    from psnode.protocol.control import Counters
    from psnode.scheduler.loop import Node

    n = Node(role="server", host="h", port=1, pid=2, ident=b"s", wish=None, rank=0)
    n.update_stats(Counters(rounds=10, copied=5000, checkpointed=0, state_bytes=64, lag=((1, 0),)), 0.0)
    assert n.row(0.0).copied_per_round is None and n.row(0.0).lag == [[1, 0]]
    n.update_stats(Counters(rounds=20, copied=7000, checkpointed=100), 1.5)
    row = n.row(1.5)
    assert (row.copied_per_round, row.checkpointed_per_round, row.copied) == (200, 10, 7000)
    n.update_stats(Counters(rounds=20, copied=9000, checkpointed=100), 3.0)      # no round: kept
    n.update_stats(Counters(rounds=22, copied=9400, checkpointed=100), 4.5)
    assert n.row(4.5).copied_per_round == 1200
    worker = Node(role="worker", host="h", port=1, pid=3, ident=b"w", wish=None, rank=0)
    worker.update_stats(Counters(loop_gap_us=25_000), 0.0)
    assert worker.row(0.0).loop_gap == 0.025 and worker.row(0.0).state_bytes is None
