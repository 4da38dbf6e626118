"""The slow worker named (psnode.scheduler.slowness): a real job of 3 workers, one of them
sleeping at every step; ``mxdist status --json`` names it within 10 s, a long wait is warned
of naming it, and the job's closing line names it."""
from __future__ import annotations

import json
import textwrap
import threading
import time
from pathlib import Path

from tests.support.cli import assert_nothing_left, cli_env, kill_cli, latest, run_cli, start_cli, wait_for

SLOWED = textwrap.dedent("""
    import sys, time, pathlib, numpy as np, psnode
    stop = pathlib.Path(sys.argv[1])
    kv = psnode.kv.create('dist_sync')
    kv.init('w', np.zeros(2, np.float32))
    step = 0
    while True:
        kv.push('w', np.ones(2, np.float32)); kv.pull('w')
        if step == 1:
            print("TRAINING", flush=True)
        if kv.rank == 2:
            time.sleep(5.0 if (stop.parent / 'stall').exists() and step % 1000 == 0 else 0.5)
        done = np.zeros(1, np.float32) + stop.exists()
        kv.push('done', done) if step else kv.init('done', done)
        if kv.pull('done')[0] > 0:
            break
        step += 1
    print("STEPS", step, flush=True)
    kv.close()
""")


def test_status_names_the_slowed_worker_and_so_do_a_stall_warning_and_the_closing_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = cli_env(home)
    job = tmp_path / "job.py"
    job.write_text(SLOWED)
    stop = tmp_path / "stop"
    (tmp_path / "stall").touch()   # rank 2's step 0 sleeps 5 s: a stall of more than --stall-warning
    proc = start_cli(["launch", "-n", "3", "-s", "1", "--heartbeat-interval", "0.5", "--stall-warning", "3",
                      str(job), str(stop)], env)
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
            named.update(rows=rows)
            return rows[2]["waited_for"] >= 0.6 and all(rows[r]["waited_for"] < 0.2 for r in (0, 1))

        wait_for(slow_named, 10, "status --json to name worker 2 as the one the others wait for")
        took = time.monotonic() - t0
        table = run_cli(["status", job_id], env)
        assert "worker 2  slow: the others waited for it " in table.stdout, table.stdout
        assert "worker 0  slow" not in table.stdout and "worker 1  slow" not in table.stdout
        stop.touch()
        proc.wait(60)
        reader.join(10)
    finally:
        kill_cli(proc)
    text = "".join(out)
    assert proc.returncode == 0, text
    stalls = [line for line in out if "stall: worker" in line]
    assert stalls and all("for worker 2" in line and "in the pull of 'w'" in line for line in stalls), text
    assert {line.split("stall: worker ")[1].split()[0] for line in stalls} <= {"0", "1"}
    closing = [line for line in out if line.startswith(f"job {job_id} succeeded")]
    assert closing and "the others waited most for worker 2 (" in closing[-1], text
    print(f"named within {took:.1f} s; rows {named['rows']}; {closing[-1].strip()}")
    assert_nothing_left(home)
