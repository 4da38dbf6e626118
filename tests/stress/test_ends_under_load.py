"""The paths where processes end or leave, each run many times beside CPU-bound processes.

A race in a teardown shows only when the machine is loaded, and then in a few runs of many:
every test here starts one busy-looping process per core (killed by pid at the end of the
module), then runs the same real ``mxdist launch`` job ``RUNS`` times, on the default data path
(same-host shared memory) and over TCP (``--no-shm``).  Each run must end as it should, with
exact values where the job computes any, its root cause where it fails, and nothing of it left
running.  The paths: workers finishing unevenly and closing (``kv.close()``), a worker failing,
a graceful elastic leave (``mxdist scale`` down) and Ctrl-C to the launcher's process group.

``PSNODE_STRESS_RUNS`` changes the count (default 15 for the uneven finish, a third of it for
the slower paths; more when hunting a race).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli import PY, ROOT, assert_nothing_left, cli_env, latest, run_cli, wait_for

RUNS = int(os.environ.get("PSNODE_STRESS_RUNS", "15"))
SLOW_RUNS = max(1, RUNS // 3)
PATHS = [pytest.param([], id="shm"), pytest.param(["--no-shm"], id="tcp")]


@pytest.fixture(scope="module", autouse=True)
def hogs() -> Iterator[list[int]]:
    """One CPU-bound process per core for the whole module (killed by pid)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait(10)


def _script(tmp_path: Path, text: str) -> str:
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(text))
    return str(path)


def _runs(count: int, one_run) -> None:
    """Run ``one_run(i)`` ``count`` times; fail with every failed run's story."""
    failed = []
    for i in range(count):
        problem = one_run(i)
        if problem:
            failed.append(f"run {i}: {problem}")
    assert not failed, f"{len(failed)} of {count} runs failed:\n" + "\n\n".join(failed[:3])


UNEVEN = """
    import sys, numpy as np, psnode
    kv = psnode.kv.create('dist_sync')
    kv.init('w', np.zeros(4, np.float32))
    out = np.empty(4, np.float32)
    for s in range(5 + 3 * kv.rank):          # rank 0 leaves after 5 rounds, rank 1 after 8
        kv.pushpull('w', np.full(4, kv.rank + 1, np.float32), out=out)
        want = 2.0 if s < 5 else 2.5 if s < 8 else 3.0   # the average of the workers still in
        if not (out == want).all():
            print(f"MISMATCH rank {kv.rank} step {s}: {out} != {want}", flush=True)
            sys.exit(3)
    kv.close()
    print("done", kv.rank, flush=True)
"""


@pytest.mark.parametrize("path", PATHS)
def test_workers_finishing_unevenly_and_closing(tmp_path, path) -> None:
    script = _script(tmp_path, UNEVEN)

    def one_run(i: int) -> str | None:
        home = tmp_path / f"home{i}"
        res = run_cli(["launch", "-n", "3", "-s", "1", *path, script], cli_env(home), timeout=120)
        done = sorted(line.split()[-1] for line in res.stdout.splitlines() if line.split()[-2:-1] == ["done"])
        if res.returncode != 0 or done != ["0", "1", "2"]:
            return f"exit {res.returncode}, done {done}\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}"
        assert_nothing_left(home)
        return None

    _runs(RUNS, one_run)


FAILS = """
    import time, numpy as np, psnode
    kv = psnode.kv.create('dist_sync')
    kv.init('w', np.zeros(2, np.float32))
    for step in range(100_000):
        if kv.rank == 1 and step == 3:
            raise ValueError(f"bad batch at step {step}")
        kv.push('w', np.ones(2, np.float32)); kv.pull('w')
"""


@pytest.mark.parametrize("path", PATHS)
def test_a_failing_worker_is_the_root_cause_every_time(tmp_path, path) -> None:
    script = _script(tmp_path, FAILS)

    def one_run(i: int) -> str | None:
        home = tmp_path / f"home{i}"
        res = run_cli(["launch", "-n", "3", "-s", "2", *path, script], cli_env(home), timeout=120)
        rec = latest(home)
        if res.returncode != 1 or rec["state"] != "failed" or rec["root_cause"]["name"] != "worker-1" \
                or "ValueError: bad batch at step 3" not in res.stderr or "SIGABRT" in res.stderr:
            return f"exit {res.returncode}, state {rec['state']}, root cause {rec.get('root_cause')}\n" \
                   f"{res.stderr[-2000:]}"
        assert_nothing_left(home)
        return None

    _runs(SLOW_RUNS, one_run)


LEAVES = """
    import sys, numpy as np, psnode
    from pathlib import Path
    ctl = Path(sys.argv[1])
    kv = psnode.kv.create('dist_sync')
    kv.init('w', np.zeros(2, np.float32))
    # Rounds of all three average to 2.0; once worker 2 left (on its own push, after the scale
    # down), rounds of workers 0 and 1 average to 1.5: both see the same round first.
    for step in range(1, 100_000):
        last = kv.pushpull('w', np.full(2, kv.rank + 1, np.float32))
        if step == 3:
            (ctl / f"ready-{kv.rank}").touch()
        if last[0] != 2.0:
            break
    for _ in range(3):
        last = kv.pushpull('w', np.full(2, kv.rank + 1, np.float32))
    print("last", kv.rank, last.tolist(), flush=True)
    kv.close()
"""


@pytest.mark.parametrize("path", PATHS)
def test_a_graceful_elastic_leave(tmp_path, path) -> None:
    script = _script(tmp_path, LEAVES)

    def one_run(i: int) -> str | None:
        home, ctl = tmp_path / f"home{i}", tmp_path / f"ctl{i}"
        ctl.mkdir()
        env = cli_env(home)
        res = run_cli(["launch", "-d", "-n", "3", "-s", "1", "--min-workers", "2", *path, script, str(ctl)], env)
        if res.returncode != 0:
            return f"launch: exit {res.returncode}\n{res.stderr[-2000:]}"
        job = res.stdout.strip().splitlines()[-1]
        try:
            wait_for(lambda: all((ctl / f"ready-{r}").exists() for r in range(3)), 90, "three workers' rounds")
            scaled = run_cli(["scale", job, "2"], env)
            if scaled.returncode != 0:
                return f"scale: exit {scaled.returncode}\n{scaled.stderr[-2000:]}"
            rec = wait_for(lambda: (r := latest(home)) and r["state"] not in ("starting", "running") and r, 90,
                           "the job's end")
        finally:
            if latest(home)["state"] in ("starting", "running"):
                run_cli(["stop", job], env, timeout=120)
        logs = run_cli(["logs", job], env).stdout
        lasts = sorted(line.split("] ", 1)[1] for line in logs.splitlines() if "] last " in line)
        left = "worker 2 left the job (asked to leave)" in logs
        if rec["state"] != "succeeded" or lasts != ["last 0 [1.5, 1.5]", "last 1 [1.5, 1.5]"] or not left:
            return f"state {rec['state']}, root cause {rec.get('root_cause')}, lasts {lasts}\n{logs[-2000:]}"
        assert_nothing_left(home)
        return None

    _runs(SLOW_RUNS, one_run)


FOREVER = """
    import sys, numpy as np, psnode
    from pathlib import Path
    kv = psnode.kv.create('dist_sync')
    kv.init('w', np.zeros(1000, np.float32))
    for step in range(10**9):
        kv.pushpull('w', np.ones(1000, np.float32))
        if step == 2:
            Path(sys.argv[1], f"ready-{kv.rank}").touch()
"""


@pytest.mark.parametrize("path", PATHS)
def test_ctrl_c_to_the_process_group_mid_round(tmp_path, path) -> None:
    script = _script(tmp_path, FOREVER)

    def one_run(i: int) -> str | None:
        home, ctl = tmp_path / f"home{i}", tmp_path / f"ctl{i}"
        ctl.mkdir()
        launch = subprocess.Popen([PY, "-m", "mxdist", "launch", "-n", "3", "-s", "2", *path, script, str(ctl)],
                                  env=cli_env(home), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, start_new_session=True)
        try:
            wait_for(lambda: all((ctl / f"ready-{r}").exists() for r in range(3)) or launch.poll() is not None,
                     90, "three workers' rounds")
            os.killpg(launch.pid, signal.SIGINT)          # what the terminal does on Ctrl-C
            out, err = launch.communicate(timeout=60)
        finally:
            if launch.poll() is None:
                launch.kill()
                launch.wait(10)
        rec = latest(home)
        if launch.returncode != 130 or rec["state"] != "stopped" or rec.get("stopped_by") != "Ctrl-C":
            return f"exit {launch.returncode}, state {rec['state']}, root cause {rec.get('root_cause')}\n{err[-2000:]}"
        assert_nothing_left(home)
        return None

    _runs(SLOW_RUNS, one_run)


def test_the_hogs_really_load_the_machine(hogs) -> None:
    """The runs above happen on a loaded machine: every hog is alive and burning CPU."""
    def cpu(pid: int) -> int:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    before = [cpu(p) for p in hogs]
    time.sleep(0.5)
    assert all(cpu(p) > b for p, b in zip(hogs, before, strict=True))
