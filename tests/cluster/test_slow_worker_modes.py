"""The slow worker named in the modes where the others wait elsewhere than in a sync round:
``dist_async`` (they wait in ``kv.barrier()``) and ``dist_ssp`` (they wait in pulls once they are
``staleness`` clocks ahead).  A real job of 3 workers, worker 2 three times slower or more:
``mxdist status --json`` names it within 10 s, ``mxdist status`` marks it, and the job's
closing line names it."""
from __future__ import annotations

import json
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tests.support.cli import assert_nothing_left, cli_env, kill_cli, latest, run_cli, start_cli, wait_for

STEPS = 30

# dist_async: nothing waits in a push or a pull; a barrier every 2 steps makes the fast workers
# wait for worker 2 there.  dist_ssp, staleness 1: worker 2 takes 3x the others' step time, so
# the fast ones run 1 clock ahead and then wait in their pulls.
JOB = textwrap.dedent(f"""
    import sys, time, numpy as np, psnode
    mode = sys.argv[1]
    kv = psnode.kv.create(mode, staleness=1) if mode == 'dist_ssp' else psnode.kv.create(mode)
    kv.init('w', np.zeros(2, np.float32))
    slow, fast = (0.5, 0.05) if mode == 'dist_async' else (0.6, 0.2)
    for step in range({STEPS}):
        time.sleep(slow if kv.rank == 2 else fast)
        kv.push('w', np.ones(2, np.float32)); kv.pull('w')
        if mode == 'dist_async' and step % 2 == 1:
            kv.barrier()
        if step == 1:
            print("TRAINING", flush=True)
    kv.barrier()
    kv.close()
""")


@pytest.mark.parametrize("mode", ["dist_async", "dist_ssp"])
def test_status_names_the_slowed_worker(mode: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = cli_env(home)
    job = tmp_path / "job.py"
    job.write_text(JOB)
    proc = start_cli(["launch", "-n", "3", "-s", "1", "--heartbeat-interval", "0.5", str(job), mode], env)
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(iter(proc.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        wait_for(lambda: any("TRAINING" in line for line in out), 90, "training to start")
        t0 = time.monotonic()
        job_id = latest(home)["id"]
        named: dict[str, object] = {}

        def slow_named() -> bool:
            view = json.loads(run_cli(["status", job_id, "--json"], env).stdout)
            rows = {n["rank"]: n for n in view["nodes"] if n["role"] == "worker"}
            named.update(rows={r: rows[r]["waited_for"] for r in rows})
            return (rows[2]["waited_for"] or 0) >= 0.5 and all((rows[r]["waited_for"] or 0) < 0.2 for r in (0, 1))

        wait_for(slow_named, 10, f"status --json to name worker 2 as the one the others wait for in {mode}",
                 describe=lambda: f"waited_for per worker: {named.get('rows')}")
        took = time.monotonic() - t0
        table = run_cli(["status", job_id], env)
        assert "worker 2  slow: the others waited for it " in table.stdout, table.stdout
        assert "worker 0  slow" not in table.stdout and "worker 1  slow" not in table.stdout
        proc.wait(120)
        reader.join(10)
    finally:
        kill_cli(proc)
    text = "".join(out)
    assert proc.returncode == 0, text
    closing = [line for line in out if line.startswith(f"job {job_id} succeeded")]
    assert closing and "the others waited most for worker 2 (" in closing[-1], text
    print(f"{mode}: named within {took:.1f} s; shares {named['rows']}; {closing[-1].strip()}")
    assert_nothing_left(home)
