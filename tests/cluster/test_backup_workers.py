"""Backup workers (psnode.server.rounds): ``mxdist launch --backup-workers 1`` on 3 workers, a
schedule that fixes who is late (worker 2 pushes step s only once worker 0 saw round s
complete), and a kill -9 of worker 2 restarted by ``--max-restarts``: every round is exactly
the average of workers 0 and 1, none waits for worker 2 (nor for its replacement), and
``mxdist status --json`` counts every push of worker 2 as late, once."""
from __future__ import annotations

import contextlib
import json
import subprocess
import textwrap
import threading
from pathlib import Path

from tests.support.cli import assert_nothing_left, cli_env, kill_cli, latest, run_cli, start_cli, wait_for

STEPS = 30
KILL_AT = 12

JOB = textwrap.dedent(f"""
    import os, signal, sys, time, pathlib, numpy as np, psnode
    d = pathlib.Path(sys.argv[1])

    def await_file(p):
        deadline = time.monotonic() + 60
        while not p.exists():
            assert time.monotonic() < deadline, f"no {{p}} within 60 s"
            time.sleep(0.002)

    kv = psnode.kv.create('dist_sync')
    assert kv.backup_workers == 1, kv.backup_workers
    kv.init('w', np.zeros(2, np.float32))
    start = kv.num_pushes('w') + 1
    print("START", kv.rank, start, flush=True)
    for s in range(start, {STEPS} + 1):
        if kv.rank == 2:
            await_file(d / f"round-{{s}}")           # round s completed without worker 2
            if s == {KILL_AT} and os.environ.get('PSNODE_RESTART_COUNT', '0') == '0':
                os.kill(os.getpid(), signal.SIGKILL)
        kv.push('w', np.full(2, (kv.rank + 1) * s, np.float32))
        got = kv.pull('w')
        if kv.rank < 2:
            assert got.tolist() == [1.5 * s] * 2, (s, got.tolist())
            if kv.rank == 0:
                (d / f"round-{{s}}").touch()
        else:
            k = got[0] / 1.5
            assert k == int(k) and k >= s and got[0] == got[1], (s, got.tolist())
    print("EXACT", kv.rank, flush=True)
    (d / f"finished-{{kv.rank}}").touch()
    await_file(d / "exit")
    kv.close()
""")


def test_rounds_complete_without_the_late_worker_exactly_across_its_kill(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = cli_env(home)
    job = tmp_path / "job.py"
    job.write_text(JOB)
    d = tmp_path / "sync"
    d.mkdir()
    proc = start_cli(["launch", "-n", "3", "-s", "1", "--backup-workers", "1", "--max-restarts", "1",
                      "--heartbeat-interval", "0.5", str(job), str(d)], env)
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(iter(proc.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
    reader.start()
    try:
        wait_for(lambda: all((d / f"finished-{r}").exists() for r in range(3)), 120,
                 "every worker to finish its steps", describe=lambda: "".join(out))
        # (the server reports its late counts in its heartbeats: the replacement's last pushes
        # reach ``mxdist status`` within an interval of its last step)
        rows: dict[int, dict] = {}

        def counted() -> bool:
            view = json.loads(run_cli(["status", latest(home)["id"], "--json"], env).stdout)
            rows.update({n["rank"]: n for n in view["nodes"] if n["role"] == "worker"})
            return rows.get(2, {}).get("late", 0) >= STEPS

        wait_for(counted, 20, f"worker 2's {STEPS} late pushes in mxdist status", describe=lambda: str(rows))
        table = run_cli(["status", latest(home)["id"]], env).stdout
    finally:
        (d / "exit").touch()   # (passed or failed, the job ends itself: nothing is left running)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(90)
        kill_cli(proc)
        reader.join(10)
    text = "".join(out)
    assert proc.returncode == 0, text
    assert {r: rows[r]["late"] for r in rows} == {0: 0, 1: 0, 2: STEPS}, rows
    assert rows[2]["restarts"] == 1 and not any(rows[r]["slow"] for r in rows), rows
    assert f"worker 2  late: {STEPS} pushes came after their round completed" in table, table
    assert all(sum(f"] EXACT {r}" in line for line in out) == 1 for r in range(3)), text
    assert f"] START 2 {KILL_AT}" in text, text   # (the replacement resumed at the push it was killed before)
    assert_nothing_left(home)
