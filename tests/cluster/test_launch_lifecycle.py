"""What users do to a launch, end to end on this machine: Ctrl-C through a real terminal on
``launch ... 2>&1 | tee log`` and ``launch ... | head -20`` (before head has its lines),
``| head -2`` returning while the job goes on detached, closing the terminal (SIGHUP),
``mxdist stop`` racing an attached launch, detached jobs that succeed, fail and are stopped,
status and jobs after a preflight failure and on a hand-damaged record, the root-cause
headline of a worker that raises, a command without psnode that ends at once.

Every test ends with a final state in the record and no process of the job left.
"""
from __future__ import annotations

import json
import os
import random
import shlex
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from tests.support.cli import (
    PY,
    ROOT,
    assert_nothing_left,
    cli_env,
    kill_cli,
    latest,
    records,
    run_cli,
    start_cli,
    wait_for,
)
from tests.support.terminal import Terminal

MXDIST = f"{shlex.quote(PY)} -m mxdist"

SLEEPER = textwrap.dedent("""
    import os, time
    print("started rank", os.environ["RANK"], flush=True)
    time.sleep(300)
""")

CHATTY = textwrap.dedent("""
    import os, time
    for i in range(20):
        print("line", i, "rank", os.environ["RANK"], flush=True)
        time.sleep(0.05)
""")

RAISES = textwrap.dedent("""
    import time, numpy as np, psnode
    kv = psnode.kv.create('dist_sync')
    kv.init('w', np.zeros(2, np.float32))
    for step in range(200):
        if kv.rank == 1 and step == 3:
            raise ValueError(f"bad batch at step {step}")
        kv.push('w', np.ones(2, np.float32)); kv.pull('w')
        time.sleep(0.02)
    kv.close()
""")

QUICK = textwrap.dedent("""
    import numpy as np, psnode
    kv = psnode.kv.create('dist_sync')
    kv.init('w', np.zeros(2, np.float32))
    kv.push('w', np.full(2, kv.rank + 1, np.float32))
    print("W", kv.pull('w').tolist(), flush=True)
    kv.close()
""")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "mxdist-home"


def script(tmp_path: Path, text: str, name: str = "job.py") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def wait_final(home: Path, timeout: float = 60) -> dict:
    return wait_for(lambda: (r := latest(home)) and r["state"] not in ("starting", "running") and r,
                    timeout, "the job's final state")


def supervisor_gone(rec: dict) -> bool:
    pid = rec["supervisor"]["pid"]
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.parametrize("pipe", ["2>&1 | tee {log}", "| head -20"])
def test_ctrl_c_in_a_terminal_through_a_pipe_stops_everything(home, tmp_path, pipe):
    """Ctrl-C while the pipe's reader still reads (head -20 of a job that prints 2 lines: head
    cannot have returned, which would detach the job; the next test covers that)."""
    log = tmp_path / "train.log"
    cmd = f"{MXDIST} launch -n 2 -s 1 {shlex.quote(script(tmp_path, SLEEPER))} {pipe.format(log=log)}"
    term = Terminal(["bash", "-c", cmd], cli_env(home), cwd=ROOT)
    try:
        wait_for(lambda: records(home) and all(p["pid"] for p in latest(home)["procs"])
                 and latest(home)["state"] == "running", 60, "the job to run")
        logs = [Path(p["log"]) for p in latest(home)["procs"] if p["role"] == "worker"]
        wait_for(lambda: all(f.exists() and "started rank" in f.read_text() for f in logs), 60,
                 "both workers' first line")
        wait_for(lambda: term.raw().count("started rank") == 2, 60, "both lines through the pipe")
        term.ctrl_c()
        rec = wait_final(home, 60)
        term.wait(30)
    finally:
        term.close()
    assert rec["state"] == "stopped" and rec["exit_code"] == 130 and rec["stopped_by"] == "Ctrl-C"
    wait_for(lambda: supervisor_gone(rec), 10, "mxdist launch to exit")
    assert_nothing_left(home)
    if "tee" in pipe:
        assert "started rank 1" in log.read_text()


def test_closing_the_terminal_stops_the_job_with_129(home, tmp_path):
    argv = [PY, "-m", "mxdist", "launch", "-n", "2", "-s", "1", script(tmp_path, SLEEPER)]
    term = Terminal(argv, cli_env(home), cwd=ROOT)
    wait_for(lambda: term.raw().count("started rank") == 2, 60, "both workers' first line")
    term.hang_up()
    rec = wait_final(home, 60)
    assert term.wait(30) == 129
    assert rec["state"] == "stopped" and rec["exit_code"] == 129 and "hangup" in rec["stopped_by"]
    assert_nothing_left(home)


WAITS_FOR_GO = textwrap.dedent("""
    import os, sys, time
    for i in range(5):
        print("line", i, "rank", os.environ["RANK"], flush=True)
    deadline = time.monotonic() + 120
    while not os.path.exists(sys.argv[1]):      # the job ends when the test says so
        if time.monotonic() > deadline:
            sys.exit("no go file")
        time.sleep(0.05)
    print("done rank", os.environ["RANK"], flush=True)
""")


def test_head_returns_when_it_has_read_and_the_job_goes_on_detached(home, tmp_path):
    """``launch | head -2``: the prompt comes back once head has its lines, the job runs on
    detached (stderr says how to follow and stop it) and ends as it would have."""
    go = tmp_path / "go"
    cmd = f"{MXDIST} launch -n 2 -s 1 {shlex.quote(script(tmp_path, WAITS_FOR_GO))} {shlex.quote(str(go))} | head -2"
    res = subprocess.run(["bash", "-c", cmd], env=cli_env(home), cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0 and len(res.stdout.splitlines()) == 2, res.stdout + res.stderr
    rec = latest(home)
    job = rec["id"]
    assert rec["state"] in ("starting", "running") and not go.exists()     # it cannot have ended: no go file
    assert f"job {job} goes on in the background" in " ".join(res.stderr.split()), res.stderr
    for command in (f"mxdist logs {job} -f", f"mxdist status {job}", f"mxdist stop {job}"):
        assert command in res.stderr
    assert not supervisor_gone(latest(home))
    go.touch()
    rec = wait_final(home, 60)
    assert rec["state"] == "succeeded" and rec["exit_code"] == 0 and rec["supervisor"]["detached"], rec
    wait_for(lambda: supervisor_gone(rec), 10, "the supervisor to exit")   # (its closing line follows the record)
    assert f"job {job} succeeded" in (home / "jobs" / job / "supervisor.log").read_text()
    assert_nothing_left(home)


def test_stop_racing_an_attached_launch_always_ends_stopped(home, tmp_path):
    env = cli_env(home)
    sleeper = script(tmp_path, SLEEPER)
    rng = random.Random(13)
    for attempt in range(10):
        before = {r["id"] for r in records(home)}
        proc = start_cli(["launch", "-n", "1", "-s", "0", "--grace", "1", sleeper], env)
        try:
            job = wait_for(lambda seen=before: next((r["id"] for r in records(home) if r["id"] not in seen), None),
                           60, "the launch to record its job")
            time.sleep(rng.uniform(0.0, 1.5))
            stop = run_cli(["stop", job, "--grace", "1"], env)
            assert stop.returncode == 0, (attempt, stop.stdout + stop.stderr)
            out, _ = proc.communicate(timeout=60)
        finally:
            kill_cli(proc)
        rec = json.loads((home / "jobs" / f"{job}.json").read_text())
        assert rec["state"] == "stopped" and rec["exit_code"] == 143, (attempt, rec, out)
        assert proc.returncode == 143, (attempt, out)
        assert_nothing_left(home)


def test_detached_jobs_succeed_fail_and_stop(home, tmp_path):
    env = cli_env(home)

    def detached(text: str, name: str) -> str:
        res = run_cli(["launch", "-d", "-n", "2", "-s", "1", script(tmp_path, text, name)], env)
        assert res.returncode == 0, res.stderr
        return res.stdout.strip().splitlines()[-1]

    def final(job: str) -> dict:
        return wait_for(lambda: (v := json.loads(run_cli(["status", job, "--json"], env).stdout))["state"]
                        not in ("starting", "running") and v, 60, f"job {job} to end")

    ok = final(detached(QUICK, "quick.py"))
    assert ok["state"] == "succeeded" and ok["exit_code"] == 0
    bad = final(detached(RAISES, "raises.py"))
    assert bad["state"] == "failed" and bad["exit_code"] == 1
    assert bad["root_cause"] == "worker 1 on localhost: ValueError: bad batch at step 3"
    job = detached(SLEEPER, "sleeper.py")
    wait_for(lambda: "started rank 1" in run_cli(["logs", job], env).stdout, 30, "worker 1's first line")
    stop = run_cli(["stop", job], env)
    assert stop.returncode == 0 and "localhost: nothing of the job left" in stop.stderr, stop.stderr
    stopped = json.loads(run_cli(["status", job, "--json"], env).stdout)
    assert stopped["state"] == "stopped" and stopped["exit_code"] == 143
    listing = json.loads(run_cli(["jobs", "--json"], env).stdout)["jobs"]
    assert [j["state"] for j in listing] == ["succeeded", "failed", "stopped"]
    assert_nothing_left(home)


def test_root_cause_headline_for_a_worker_that_raises(home, tmp_path):
    res = run_cli(["launch", "-n", "2", "-s", "2", script(tmp_path, RAISES)], cli_env(home))
    assert res.returncode == 1, res.stdout + res.stderr
    assert "worker 1 on localhost: ValueError: bad batch at step 3" in res.stderr
    assert "failed in" in res.stderr.splitlines()[-1]
    worker0 = [line for line in res.stdout.splitlines() if line.startswith("[worker 0 @ localhost]")]
    assert len(worker0) == 1 and "job" in worker0[0] and "ended" in worker0[0], worker0   # one line
    assert "Traceback" not in "\n".join(worker0)
    rec = latest(home)
    assert rec["state"] == "failed" and rec["root_cause"]["name"] == "worker-1"
    assert_nothing_left(home)


def test_a_command_without_psnode_ends_without_waiting_out_a_grace(home, tmp_path):
    """Workers that never register (``hostname``) end the job as they exit: it never waits out the
    servers' finish grace (10 s) or a TERM-to-KILL grace (5 s).  About 2.5 s here, the launcher's
    own start included; the bound stays under the shortest of those waits."""
    t0 = time.monotonic()
    res = run_cli(["launch", "-n", "2", "-s", "1", "hostname"], cli_env(home))
    took = time.monotonic() - t0
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count(f"] {os.uname().nodename}") == 2
    assert took < 4.5, took
    assert latest(home)["state"] == "succeeded"
    assert_nothing_left(home)


def test_status_and_jobs_after_a_preflight_failure_and_on_damaged_records(home, tmp_path):
    env = cli_env(home)
    res = run_cli(["launch", "--workdir", str(tmp_path / "nope"), "-n", "1", "hostname"], env)
    assert res.returncode == 3 and "preflight failed" in res.stderr, res.stderr
    assert "no job recorded" in res.stderr and not records(home)     # in the foreground the panel said it all
    res = run_cli(["launch", "-d", "--workdir", str(tmp_path / "nope"), "-n", "1", "hostname"], env)
    assert res.returncode == 0, res.stdout + res.stderr                # detached: status says why
    wait_for(lambda: latest(home)["state"] == "failed", 30, "the detached job's preflight")
    status = run_cli(["status"], env)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "failed" in status.stdout and "does not exist" in status.stdout and "Traceback" not in status.stderr
    view = json.loads(run_cli(["status", "--json"], env).stdout)
    assert view["state"] == "failed" and view["exit_code"] == 3
    assert {n["state"] for n in view["nodes"]} == {"not started"}
    rec = latest(home)
    path = home / "jobs" / f"{rec['id']}.json"
    path.write_text('{"id": "' + rec["id"] + '", "backend": "local", "state": "running", "procs": [{"name": "x"')
    for args in (["status"], ["status", rec["id"]], ["logs", rec["id"]], ["stop", rec["id"]]):
        out = run_cli(args, env)
        assert out.returncode == 1 and "damaged job record" in out.stderr, (args, out.stderr)
        assert "Traceback" not in out.stderr
    listing = run_cli(["jobs"], env)
    assert listing.returncode == 0 and "damaged" in listing.stdout, listing.stdout + listing.stderr
    # a partial record (an older or interrupted writer): shown as far as it goes
    path.write_text(json.dumps({"id": rec["id"], "backend": "local", "state": "succeeded", "version": 1,
                                "procs": [{"name": "worker-0", "role": "worker", "rank": 0, "host": "localhost"}]}))
    view = json.loads(run_cli(["status", rec["id"], "--json"], env).stdout)
    assert view["state"] == "succeeded" and any("version 1" in n for n in view["notes"])
    clean = run_cli(["clean", "--yes"], env)
    assert clean.returncode == 0 and not records(home)


def test_quiet_prints_the_job_id_and_the_closing_line_and_ranks_filter_the_stream(home, tmp_path):
    env = cli_env(home)
    res = run_cli(["launch", "-q", "-n", "2", "-s", "1", script(tmp_path, CHATTY)], env)
    assert res.returncode == 0 and res.stdout == "", res.stdout
    job = latest(home)["id"]
    assert f"job {job}" in res.stderr.splitlines()[0]
    assert res.stderr.splitlines()[-1].startswith(f"job {job} succeeded in ")
    res = run_cli(["launch", "--ranks", "1", "-n", "2", "-s", "1", script(tmp_path, CHATTY)], env)
    assert res.returncode == 0
    assert res.stdout.count("[worker 1 @ localhost] line") == 20 and "[worker 0" not in res.stdout
    assert "line 19 rank 0" in (Path(latest(home)["procs"][-2]["log"])).read_text()   # still saved
    version = run_cli(["--version"], env)
    assert version.returncode == 0 and version.stdout.startswith("mxdist ")
    assert_nothing_left(home)


NO_RESUME = textwrap.dedent("""
    import os, numpy as np, psnode
    kv = psnode.kv.create('dist_sync')
    kv.set_optimizer(psnode.optimizer.create('sgd', learning_rate=0.125))
    kv.init('w', np.zeros(3, np.float32))
    for step in range(6):                     # no resume code: a restart begins at step 0 again
        if kv.rank == 1 and step == 3 and os.environ.get('PSNODE_RESTART_COUNT', '0') == '0':
            os._exit(9)
        kv.push('w', np.full(3, (kv.rank + 1) * (step + 1), np.float32))
        kv.pull('w')
    print("FINAL", kv.pull('w').tolist(), flush=True)
    kv.close()
""")


def test_a_restarted_worker_without_resume_code_works_or_fails_with_the_fix(home, tmp_path):
    res = run_cli(["launch", "-n", "2", "-s", "1", "--max-restarts", "1", script(tmp_path, NO_RESUME)],
                  cli_env(home), timeout=120)
    assert_nothing_left(home)
    # the replacement's repeated pushes of rounds already applied are recognised (answered, not
    # applied again): the job ends with the uninterrupted run's values on both workers
    assert res.returncode == 0, res.stdout + res.stderr
    want = [-0.125 * 1.5 * sum(range(1, 7))] * 3
    finals = [line.split("] ", 1)[1] for line in res.stdout.splitlines() if "] FINAL" in line]
    assert finals == [f"FINAL {want}"] * 2, res.stdout + res.stderr


SHM = textwrap.dedent("""
    import os, pathlib
    pathlib.Path(f"/dev/shm/psnode.{os.environ['PSNODE_JOB_ID']}.w{os.environ['RANK']}").write_bytes(b"x")
    print("left a segment", flush=True)
""")


def test_shared_memory_leftovers_are_removed_when_the_job_ends_and_by_clean(home, tmp_path):
    env = cli_env(home)
    res = run_cli(["launch", "-n", "2", "-s", "1", script(tmp_path, SHM)], env)
    assert res.returncode == 0, res.stdout + res.stderr
    job = latest(home)["id"]
    assert not list(Path("/dev/shm").glob(f"psnode.{job}.*"))
    assert_nothing_left(home)
    stale = Path(f"/dev/shm/psnode.{job}.stale")       # as a host that was down at the end would keep
    stale.write_bytes(b"x")
    try:
        assert run_cli(["clean", job], env).returncode == 0
        assert not stale.exists() and not records(home)
    finally:
        stale.unlink(missing_ok=True)
