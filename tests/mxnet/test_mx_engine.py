"""``mxdist launch --engine mxnet`` on this machine: MXNet's own ps-lite job (a scheduler and
servers ``python -c "import mxnet"`` with the ``DMLC_*`` variables, the workers the script) on
127.0.0.1, the mxnet venv's interpreter for every process.

* examples/gluon_mlp.py with 2 workers and 2 servers on MXNet's dist_sync against one process
  with twice the batch: the same accuracy band (within a point), both ranks end with equal
  weights, close to the single process's; the scheduler and servers end by themselves
  (``--no-update-on-kvstore`` with ``-e MXNET_ENGINE_TYPE=NaiveEngine``, as docs/mxnet.md says);
* Ctrl-C and ``mxdist stop`` (of a detached job, whose status says it cannot ask ps-lite) leave
  no MXNet process (found by the job's ``DMLC_PS_ROOT_PORT`` in /proc, whoever started it);
* a worker that raises is the root cause, and the job ends (MXNet alone would hang it);
* psnode-only options are refused before anything starts;
* the worker bootstrap runs a script exactly as ``python script.py`` does (output, exit codes).
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import mxnet  # noqa: F401 - this tier runs in MXNet's venv (PSNODE_TEST_MXNET=1: a missing MXNet fails it)
import pytest

from mxdist.planning.engines import MXNET, MXNET_BOOT
from tests.support.cli import ROOT, assert_nothing_left, cli_env, kill_cli, latest, run_cli, start_cli, wait_for
from tests.support.mxnet_engine import (
    FAILING,
    WAITER,
    assert_matches_one_process,
    assert_no_mxnet_left,
    logs_say,
    mxnet_processes,
    port_of,
    write,
)

EXAMPLE = str(ROOT / "examples" / "gluon_mlp.py")
ENGINE = ["launch", "--engine", "mxnet"]


@pytest.mark.parametrize("update", ["--update-on-kvstore", "--no-update-on-kvstore"])
def test_gluon_example_on_mxnet_dist_sync_matches_one_process(tmp_path: Path, update: str) -> None:
    home = tmp_path / "home"
    args = ["--epochs", "3", update]
    # MXNet's own race (docs/mxnet.md): without update on the kvstore, its threaded engine can
    # leave a worker a stale gradient sum under load; the remedy docs/mxnet.md gives: the
    # synchronous engine
    naive = ["-e", "MXNET_ENGINE_TYPE=NaiveEngine"] if update == "--no-update-on-kvstore" else []
    r = run_cli([*ENGINE, "-n", "2", "-s", "2", *naive, EXAMPLE, *args, "--batch-size", "32",
                 "--save", str(tmp_path / "w{rank}.npz")], cli_env(home), timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "kvstore=dist_sync workers=2 servers=2" in r.stdout, r.stdout      # MXNet's own store
    assert f"update_on_kvstore={update == '--update-on-kvstore'}" in r.stdout
    assert MXNET.UNAUTHENTICATED in r.stderr
    acc_dist, acc_one = assert_matches_one_process(r.stdout, tmp_path, home, args, timeout=240)
    print(f"accuracy {update}: mxnet engine W=2 b=32 {acc_dist:.4f}, one process b=64 {acc_one:.4f}")
    rec = latest(home)
    assert (rec["engine"], rec["security"], rec["state"], rec["exit_code"]) == ("mxnet", "insecure", "succeeded", 0)
    # MXNet's scheduler and servers ended by themselves once the workers' kvstores closed
    names = ("scheduler", "server-0", "server-1", "worker-0", "worker-1")
    assert {p["name"]: (p["state"], p["exit_code"]) for p in rec["procs"]} == dict.fromkeys(names, ("exited", 0))
    assert_nothing_left(home)
    assert_no_mxnet_left(port_of(rec))


def test_ctrl_c_leaves_no_mxnet_process(tmp_path: Path) -> None:
    home = tmp_path / "home"
    proc = start_cli([*ENGINE, "--insecure", "-n", "2", "-s", "2", "--grace", "3", write(tmp_path, "w.py", WAITER)],
                     cli_env(home))
    try:
        wait_for(lambda: (home / "jobs").is_dir() and any((home / "jobs").glob("*.json")), 60, "the job record")
        rec = wait_for(lambda: (r := latest(home)) and logs_say(r, "ready rank", ("worker-0", "worker-1")) and r,
                       180, "both workers past their first barrier")
        assert len(mxnet_processes(port_of(rec))) >= 5     # (their reapers carry the variables too)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 130, out
    finally:
        kill_cli(proc)
    assert "pulled [3.0, 3.0, 3.0, 3.0] type dist_sync" in out, out          # 1 + 2, summed by MXNet's servers
    assert "does not authenticate" not in out                                # --insecure: no note
    rec = latest(home)
    assert (rec["state"], rec["stopped_by"], rec["exit_code"]) == ("stopped", "Ctrl-C", 130)
    assert_nothing_left(home)
    assert_no_mxnet_left(port_of(rec))


def test_detached_job_status_and_stop(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = cli_env(home)
    res = run_cli([*ENGINE, "--detach", "--insecure", "-n", "2", "-s", "1", write(tmp_path, "w.py", WAITER)], env)
    assert res.returncode == 0, res.stdout + res.stderr
    job = res.stdout.strip().splitlines()[-1]
    wait_for(lambda: logs_say(latest(home), "ready rank", ("worker-0", "worker-1")), 180,
             "both workers past their first barrier")
    view = json.loads(run_cli(["status", job, "--json"], env).stdout)
    assert view["engine"] == "mxnet" and view["state"] == "running"
    assert view["source"] == "checked on this machine" and MXNET.status_note in view["notes"]
    assert [(n["role"], n["state"]) for n in view["nodes"]] == [
        ("scheduler", "running"), ("server", "running"), ("worker", "running"), ("worker", "running")]
    table = run_cli(["status", job], env)
    assert table.returncode == 0 and "has no status to ask" in table.stdout, table.stdout
    stop = run_cli(["stop", job], env)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    rec = latest(home)
    assert (rec["state"], rec["stopped_by"], rec["exit_code"]) == ("stopped", "mxdist stop", 143)
    assert_nothing_left(home)
    assert_no_mxnet_left(port_of(rec))


def test_failing_worker_is_the_root_cause_and_ends_the_job(tmp_path: Path) -> None:
    home = tmp_path / "home"
    start = time.monotonic()
    r = run_cli([*ENGINE, "--insecure", "-n", "2", "-s", "1", "--grace", "3", write(tmp_path, "f.py", FAILING)],
                cli_env(home), timeout=180)
    took = time.monotonic() - start
    assert r.returncode == 1, r.stdout + r.stderr
    assert "worker 1 on localhost: ValueError: bad batch" in r.stderr, r.stderr
    assert "[worker 1 @ localhost] ValueError: bad batch" in r.stdout            # its traceback, streamed
    rec = latest(home)
    assert rec["state"] == "failed" and rec["root_cause"]["name"] == "worker-1"
    assert "worker 0 on localhost: ended with the job" in rec["consequences"]
    states = {p["name"]: p["state"] for p in rec["procs"]}
    assert states["worker-1"] == "failed" and states["worker-0"] == "stopped"
    assert took < 120, took       # the failed worker exited: nothing waited for its kvstore's exit barrier
    assert_nothing_left(home)
    assert_no_mxnet_left(port_of(rec))


@pytest.mark.parametrize("args, named", [
    (["--checkpoint-dir", "ck"], "--checkpoint-dir: MXNet's servers keep no checkpoints"),
    (["--max-restarts", "2"], "--max-restarts: ps-lite cannot take a restarted worker"),
    (["--encrypt"], "--encrypt: ps-lite neither authenticates nor encrypts"),
    (["-s", "0"], "-s 0: --engine mxnet needs at least 1 server"),
    (["-e", "DMLC_PS_ROOT_PORT=9"], "-e DMLC_PS_ROOT_PORT: set by mxdist for every process, from --port"),
])
def test_psnode_only_options_are_refused_before_anything_starts(tmp_path: Path, args: list[str], named: str) -> None:
    home = tmp_path / "home"
    r = run_cli([*ENGINE, *args, write(tmp_path, "w.py", WAITER)], cli_env(home), timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert named in " ".join(r.stderr.split()), r.stderr
    assert not (home / "jobs").exists() or not any((home / "jobs").glob("*.json"))   # nothing recorded


SHOW = textwrap.dedent("""
    import pickle, sys
    class Thing: pass
    print("name", __name__, "file", __file__, "argv", sys.argv, "path0", sys.path[0], "spec", __spec__)
    print("pickled", type(pickle.loads(pickle.dumps(Thing()))).__name__, flush=True)
    how = sys.argv[1]
    if how == "raise":
        raise ValueError("bad batch")
    if how == "exit":
        sys.exit(int(sys.argv[2]) if sys.argv[2].isdigit() else sys.argv[2])
""")


@pytest.mark.parametrize("how", [["ok"], ["raise"], ["exit", "3"], ["exit", "0"], ["exit", "giving up"], ["syntax"]])
def test_worker_bootstrap_runs_a_script_as_python_does(tmp_path: Path, how: list[str]) -> None:
    sub = tmp_path / "sub"
    sub.mkdir()
    script = sub / "show.py"
    script.write_text(SHOW if how != ["syntax"] else "x = (\n")
    argvs = ([sys.executable, "sub/show.py", *how], [sys.executable, "-c", MXNET_BOOT, "sub/show.py", *how])
    runs = [subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=60) for argv in argvs]
    plain, booted = ((r.returncode, r.stdout, r.stderr) for r in runs)
    assert booted == plain
    assert plain[0] == {"ok": 0, "raise": 1, "exit": int(how[-1]) if how[-1].isdigit() else 1, "syntax": 1}[how[0]]
