"""Jobs that can never progress end by themselves, through ``mxdist launch`` as users run it.

* A wait-for cycle in user code: rank 0 enters ``kv.barrier()`` while rank 1 waits in
  ``kv.pull`` for rank 0's next push.  The scheduler ends the job within the heartbeat timeout
  plus a few seconds, and the root-cause panel names the cycle (psnode.scheduler.waitfor).
* A slow worker still computing, its peers waiting for it longer than that, is no deadlock.
* A crash loop: a replacement that fails the same way as its predecessor within seconds of its
  start, three times in a row, ends the job naming the failure, long before ``--max-restarts
  50`` is spent, the restarts backing off (mxdist.job.lifecycle).

Each ends with exit code 1 (or 0 for the slow worker), a final state, and nothing left.
"""
from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

from tests.support.cli import assert_nothing_left, cli_env, latest, run_cli

CYCLE = textwrap.dedent("""
    import numpy as np, psnode
    kv = psnode.kv.create('dist_sync')
    kv.init('w', np.zeros(2, np.float32))
    kv.push('w', np.ones(2, np.float32))
    kv.pull('w')
    if kv.rank == 0:
        kv.barrier()                  # waits for rank 1 ...
    else:
        kv.push('w', np.ones(2, np.float32))
        kv.pull('w')                  # ... which waits for rank 0's push 2
    print("never here", flush=True)
""")

SLOW = textwrap.dedent("""
    import time, numpy as np, psnode
    kv = psnode.kv.create('dist_sync')
    kv.init('w', np.zeros(2, np.float32))
    for step in range(2):
        if kv.rank == 0 and step == 1:
            time.sleep(12)            # computing: longer than the heartbeat timeout
        kv.push('w', np.full(2, kv.rank + 1, np.float32))
        print("W", step, kv.pull('w').tolist(), flush=True)
    kv.close()
""")

CRASHES = textwrap.dedent("""
    import os, numpy as np, psnode
    kv = psnode.kv.create('dist_sync')
    kv.init('w', np.zeros(2, np.float32))
    if kv.rank == 1:
        raise RuntimeError("the data shard /data/part-1 is missing")
    kv.push('w', np.ones(2, np.float32))
    kv.pull('w')
    kv.close()
""")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "mxdist-home"


def _script(tmp_path: Path, text: str) -> str:
    path = tmp_path / "job.py"
    path.write_text(text)
    return str(path)


def test_a_wait_for_cycle_ends_the_job_naming_it(home: Path, tmp_path: Path) -> None:
    t0 = time.monotonic()
    res = run_cli(["launch", "-n", "2", "-s", "1", _script(tmp_path, CYCLE)], cli_env(home), timeout=120)
    took = time.monotonic() - t0
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    cycle = ("deadlock: worker 0 waits in barrier 1 for worker 1; "
             "worker 1 waits in the pull of 'w' (push 2) for worker 0")
    assert cycle in res.stderr, out                       # the root-cause panel
    assert "never here" not in out
    rec = latest(home)
    assert rec["state"] == "failed" and cycle in rec["root_cause"]["headline"], rec["root_cause"]
    assert took < 30, f"the deadlock took {took:.1f} s to end"
    assert_nothing_left(home)


def test_a_slow_worker_still_computing_is_no_deadlock(home: Path, tmp_path: Path) -> None:
    res = run_cli(["launch", "-n", "2", "-s", "1", _script(tmp_path, SLOW)], cli_env(home), timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("W 1 [1.5, 1.5]") == 2, res.stdout
    assert "deadlock" not in res.stdout + res.stderr
    assert_nothing_left(home)


def test_a_crash_loop_ends_early_naming_its_cause(home: Path, tmp_path: Path) -> None:
    t0 = time.monotonic()
    res = run_cli(["launch", "-n", "2", "-s", "1", "--max-restarts", "50", _script(tmp_path, CRASHES)],
                  cli_env(home), timeout=180)
    took = time.monotonic() - t0
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    assert "restarting it with rank 1 (restart 1 of 50)" in res.stderr, out                 # at once, then
    assert "rank 1 in 1 s" in res.stderr and "rank 1 in 2 s" in res.stderr, out             # backing off
    rec = latest(home)
    headline = rec["root_cause"]["headline"]
    assert headline.startswith("worker 1 on localhost: RuntimeError: the data shard /data/part-1 is missing "
                               "(crash loop: worker-1 failed the same way 4 times in a row"), headline
    assert next(p for p in rec["procs"] if p["name"] == "worker-1")["restarts"] == 3
    assert "crash loop: worker-1" in res.stderr
    assert took < 90, f"{took:.0f} s"
    assert_nothing_left(home)
