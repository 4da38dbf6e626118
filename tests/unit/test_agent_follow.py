"""The host agent's follow over a real process (started by the agent's spawn, under its reaper):
every byte of its log, written before and after quiet stretches, then its exit status."""
from __future__ import annotations

import sys
from pathlib import Path

from mxdist.backends import agent

CHATTY_THEN_QUIET = "import sys, time\nprint('first', flush=True)\ntime.sleep(0.8)\nprint('last', flush=True)\nsys.exit(3)\n"


def test_follow_streams_every_line_across_a_quiet_stretch_and_returns_the_exit_status(tmp_path: Path) -> None:
    [started] = agent.spawn(str(tmp_path), str(tmp_path / "run"), sys.executable, [
        agent.SpawnItem("worker-0", [sys.executable, "-c", CHATTY_THEN_QUIET], {},
                        str(tmp_path / "run" / "worker-0.failure.json"))])
    got: list[bytes] = []
    result = agent.follow(started.log, started.rc, started.pid, started.offset, True, got.append)
    assert b"".join(got) == b"first\nlast\n"
    assert result == agent.FollowReply(3, len(b"first\nlast\n"))
    assert agent.follow(started.log, started.rc, started.pid, 0, False, got.append).rc == 3
