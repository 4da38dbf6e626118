"""The elastic rounds job of the launch tests (this machine and SSH hosts): :data:`ROUNDS`, a
worker script whose rank r pushes r+1 per round for :data:`TOTAL` rounds (``ctl/hold-<k>``
holds every rank before round k), and readers of what its roles logged."""
from __future__ import annotations

import re
import textwrap
from pathlib import Path

from tests.support.cli import latest, wait_for

ROUNDS = textwrap.dedent("""
    import os, pathlib, sys, time
    import numpy as np, psnode
    ctl, total = pathlib.Path(sys.argv[1]), int(sys.argv[2])
    kv = psnode.kv.create('dist_sync')
    kv.init('w', np.zeros(4, np.float32))
    rank, start = kv.rank, kv.num_pushes('w')
    print("START", rank, start, flush=True)
    for step in range(start, total):
        said = False
        deadline = time.monotonic() + 120
        while (ctl / f"hold-{step}").exists() and time.monotonic() < deadline:
            if kv.leaving and not said:
                print("LEAVING", rank, flush=True)
                said = True
            time.sleep(0.02)
        kv.push('w', np.full(4, rank + 1, np.float32))
        got = kv.pull('w')
        assert (got == got[0]).all(), got
        print("ROUND", step + 1, rank, float(got[0]), flush=True)
    print("DONE", rank, flush=True)
    kv.close()
""")
TOTAL = 24


def role_log(home: Path, job: str, name: str) -> str:
    """What role ``name`` of ``job`` logged so far under ``home`` ('' before its log exists)."""
    path = home / "jobs" / job / f"{name}.log"
    return path.read_text() if path.exists() else ""


def rounds_of(text: str, rank: int) -> dict[int, float]:
    """{round: value} that ``rank`` printed in ``text`` (``ROUND n rank value`` lines)."""
    return {int(k): float(v) for k, r, v in re.findall(r"^ROUND (\d+) (\d+) (\S+)$", text, re.M) if int(r) == rank}


def printed(home: Path, job: str, name: str, pattern: str) -> re.Match[str] | None:
    """The first line of role ``name``'s log that matches ``pattern`` (multi-line), or None."""
    return re.search(pattern, role_log(home, job, name), re.M)


def final_state(home: Path, timeout: float = 90) -> dict:
    """The job record under ``home`` once its state is final (waits up to ``timeout`` s)."""
    return wait_for(lambda: (r := latest(home)) and r["state"] not in ("starting", "running") and r,
                    timeout, "the job's final state")
