"""Elastic jobs through ``mxdist launch``, as users run them: ``mxdist scale`` up and down, a
worker lost above and below ``--min-workers``, ``scale --dry-run`` and its refusals.

The workers run :data:`ROUNDS`: rank r pushes r+1 per round (the ``average`` aggregator, no
optimizer: after round k the key holds the average of round k's pushes), pulls, and prints
``ROUND k rank value``.  Each round's contributors are known from the workers' own lines (a
joiner prints its first round, a leaver its last), so every value is checked exactly.  Hold
files pace the workers: a worker waits before its push of round k+1 while ``hold-k`` exists,
which gives ``mxdist scale`` and kill -9 a controlled point.  Nothing of any job is left at the
end of each test.
"""
from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest

from tests.support.cli import assert_nothing_left, cli_env, latest, run_cli, wait_for
from tests.support.elastic import ROUNDS, TOTAL, final_state, printed, role_log, rounds_of


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "mxdist-home"


def _job(tmp_path: Path, home: Path, *options: str, holds: tuple[int, ...] = ()) -> tuple[str, Path, dict]:
    """Launch the ROUNDS script detached with ``options``; (job id, control dir, cli env)."""
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    for k in holds:
        (ctl / f"hold-{k}").touch()
    script = tmp_path / "rounds.py"
    script.write_text(ROUNDS)
    env = cli_env(home)
    done = run_cli(["launch", "-d", "-s", "1", *options, str(script), str(ctl), str(TOTAL)], env)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip().splitlines()[-1], ctl, env


def _status(env: dict, job: str) -> dict:
    done = run_cli(["status", job, "--json"], env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _kill_worker(home: Path, name: str) -> None:
    """kill -9 of the worker's own process (under its reaper, which reports the signal)."""
    reaper = next(p["pid"] for p in latest(home)["procs"] if p["name"] == name)
    children = Path(f"/proc/{reaper}/task/{reaper}/children").read_text().split()
    os.kill(int(children[0]), signal.SIGKILL)


def _stop(env: dict, home: Path) -> None:
    """Stop whatever still runs (a failed assertion must leave nothing behind)."""
    rec = latest(home)
    if rec["state"] in ("starting", "running"):
        run_cli(["stop", rec["id"]], env, timeout=120)


def test_scale_up_then_down_exact_values_on_every_rank(home, tmp_path):
    job, ctl, env = _job(tmp_path, home, "-n", "2", "--max-workers", "3", holds=(6, 14))
    try:
        wait_for(lambda: all(printed(home, job, f"worker-{r}", r"^ROUND 6 ") for r in (0, 1)), 90,
                 "workers 0 and 1 to finish round 6")
        before = _status(env, job)["membership"]
        assert before["members"] == [0, 1] and before["target"] == 2 and before["max_workers"] == 3

        dry = run_cli(["scale", job, "3", "--dry-run"], env)
        assert dry.returncode == 0, dry.stderr
        assert dry.stdout.splitlines() == [f"job {job}: would scale from 2 to 3 workers",
                                           "would start worker 2 on localhost (local rank 2)"]
        assert not (home / "jobs" / job / "worker-2.log").exists()

        up = run_cli(["scale", job, "3"], env)
        assert up.returncode == 0, up.stderr
        assert up.stdout.splitlines() == [f"job {job}: scaled from 2 to 3 workers",
                                          "started worker 2 on localhost (local rank 2)"]
        start = wait_for(lambda: printed(home, job, "worker-2", r"^START 2 (\d+)$"), 90, "the joiner's start")
        joined_at = int(start.group(1))
        grown = wait_for(lambda: (m := _status(env, job)["membership"]) and m["members"] == [0, 1, 2] and m, 30,
                         "three members")
        assert grown["joined"] == 1 and grown["generation"] > before["generation"] and grown["target"] == 3
        (ctl / "hold-6").unlink()

        wait_for(lambda: all(printed(home, job, f"worker-{r}", r"^ROUND 14 ") for r in (0, 1, 2)), 90,
                 "every worker to finish round 14")
        down = run_cli(["scale", job, "2"], env)
        assert down.returncode == 0, down.stderr
        assert down.stdout.splitlines() == [
            f"job {job}: scaled from 3 to 2 workers",
            "asked worker 2 to leave: it ends at the next round boundary, exit code 0"]
        wait_for(lambda: printed(home, job, "worker-2", r"^LEAVING 2$"), 30, "worker 2 to know it leaves")
        (ctl / "hold-14").unlink()
        rec = final_state(home)
        shrunk = _status(env, job)
    finally:
        _stop(env, home)
    assert rec["state"] == "succeeded" and rec["exit_code"] == 0
    assert [p["exit_code"] for p in rec["procs"] if p["role"] == "worker"] == [0, 0, 0]
    assert [(c["change"], c["rank"]) for c in rec["changes"]] == [("joined", 2), ("left", 2)]
    assert shrunk["membership"]["joined"] == 1 and shrunk["membership"]["left"] == 1
    # the joiner's first round is two after the last one completed when it joined (rounds 1..6)
    assert joined_at == 7
    joiner = rounds_of(role_log(home, job, "worker-2"), 2)
    assert sorted(joiner) == list(range(joined_at + 1, 15)), joiner
    expected = {k: (2.0 if k in joiner else 1.5) for k in range(1, TOTAL + 1)}
    for rank in (0, 1):
        assert rounds_of(role_log(home, job, f"worker-{rank}"), rank) == expected
    assert joiner == dict.fromkeys(joiner, 2.0)
    # the closing line; the slowest worker is named after it when the others waited for one
    log = (home / "jobs" / job / "supervisor.log").read_text()
    assert re.search(r": workers: 1 joined, 1 left, 0 lost(; the others waited most for worker \d \(\d+% of the job\))?\n",
                     log), log
    assert_nothing_left(home)


def test_lost_worker_above_min_workers_the_job_goes_on(home, tmp_path):
    job, ctl, env = _job(tmp_path, home, "-n", "3", "--min-workers", "2", holds=(5,))
    try:
        wait_for(lambda: all(printed(home, job, f"worker-{r}", r"^ROUND 5 ") for r in (0, 1, 2)), 90,
                 "every worker to finish round 5")
        _kill_worker(home, "worker-2")
        wait_for(lambda: (m := _status(env, job)["membership"]) and m["members"] == [0, 1], 30,
                 "worker 2 out of the membership")
        (ctl / "hold-5").unlink()
        rec = final_state(home)
    finally:
        _stop(env, home)
    assert rec["state"] == "succeeded" and rec["exit_code"] == 0
    assert [(c["change"], c["rank"], c["why"]) for c in rec["changes"]] == [("lost", 2, "killed by SIGKILL")]
    expected = {k: (2.0 if k <= 5 else 1.5) for k in range(1, TOTAL + 1)}
    for rank in (0, 1):
        assert rounds_of(role_log(home, job, f"worker-{rank}"), rank) == expected
    supervisor = (home / "jobs" / job / "supervisor.log").read_text()
    assert ("warning: worker-2 on localhost killed by SIGKILL, no restart left: lost; the job goes on with "
            "2 workers (--min-workers 2)") in supervisor
    assert f"job {job} succeeded in " in supervisor and ": workers: 0 joined, 0 left, 1 lost\n" in supervisor
    assert_nothing_left(home)


def test_fewer_than_min_workers_fails_the_job_naming_the_reason(home, tmp_path):
    job, _, env = _job(tmp_path, home, "-n", "3", "--min-workers", "3", "--max-workers", "4", holds=(3,))
    try:
        wait_for(lambda: all(printed(home, job, f"worker-{r}", r"^ROUND 3 ") for r in (0, 1, 2)), 90,
                 "every worker to finish round 3")
        _kill_worker(home, "worker-1")
        rec = final_state(home)
    finally:
        _stop(env, home)
    assert rec["state"] == "failed" and rec["exit_code"] == 1
    assert "2 workers live, at least 3 needed (--min-workers)" in rec["root_cause"]["headline"]
    assert rec["root_cause"]["name"] == "worker-1"
    assert_nothing_left(home)


def test_scale_refusals(home, tmp_path):
    job, ctl, env = _job(tmp_path, home, "-n", "2", "--min-workers", "2", "--max-workers", "3", holds=(2,))
    try:
        wait_for(lambda: all(printed(home, job, f"worker-{r}", r"^ROUND 2 ") for r in (0, 1)), 90,
                 "workers to finish round 2")
        high = run_cli(["scale", job, "4"], env)
        assert high.returncode == 2
        assert "4 workers is above the job's --max-workers 3" in high.stderr
        low = run_cli(["scale", job, "1"], env)
        assert low.returncode == 2
        assert "1 worker is below the job's --min-workers 2" in low.stderr
        same = run_cli(["scale", job, "2"], env)
        assert same.returncode == 0 and same.stdout.strip() == f"job {job} runs 2 workers already: nothing to change"
        assert latest(home)["changes"] == []
        (ctl / "hold-2").unlink()
        rec = final_state(home)
    finally:
        _stop(env, home)
    assert rec["state"] == "succeeded"
    ended = run_cli(["scale", job, "3"], env)
    assert ended.returncode == 1 and f"job {job} is not running (succeeded)" in ended.stderr
    assert_nothing_left(home)


def test_scale_a_job_of_fixed_size_is_refused(home, tmp_path):
    job, ctl, env = _job(tmp_path, home, "-n", "2", holds=(1,))
    try:
        wait_for(lambda: all(printed(home, job, f"worker-{r}", r"^ROUND 1 ") for r in (0, 1)), 90,
                 "workers to finish round 1")
        done = run_cli(["scale", job, "3"], env)
        assert done.returncode == 2
        assert "was launched without --min-workers/--max-workers: it keeps its 2 workers" in done.stderr
        (ctl / "hold-1").unlink()
        rec = final_state(home)
    finally:
        _stop(env, home)
    assert rec["state"] == "succeeded" and rec["elastic"] is None
    assert_nothing_left(home)


def test_the_elastic_example_takes_a_joiner_and_a_leaver(home, tmp_path):
    env = cli_env(home)
    example = Path(__file__).resolve().parents[2] / "examples" / "elastic_numpy.py"
    done = run_cli(["launch", "-d", "-n", "2", "-s", "1", "--max-workers", "3", str(example),
                    "--steps", "1000000", "--steps-per-epoch", "20", "--step-time", "0"], env)
    assert done.returncode == 0, done.stdout + done.stderr
    job = done.stdout.strip().splitlines()[-1]
    try:
        wait_for(lambda: printed(home, job, "worker-0", r"^epoch 1: .* workers=2 generation=0$"), 90,
                 "worker 0's second epoch")
        assert run_cli(["scale", job, "3"], env).returncode == 0
        start = wait_for(lambda: printed(home, job, "worker-2", r"^worker 2: starts at step (\d+) of 1000000, "
                                                                 r"members \[0, 1, 2\]$"), 90, "the joiner")
        assert int(start.group(1)) > 20
        wait_for(lambda: printed(home, job, "worker-0", r"^epoch \d+: .* workers=3 generation=1$"), 90,
                 "an epoch over three workers")
        assert run_cli(["scale", job, "2"], env).returncode == 0
        wait_for(lambda: printed(home, job, "worker-2", r"^worker 2: leaves at step \d+$"), 90, "the leaver")
        wait_for(lambda: printed(home, job, "worker-0", r"^epoch \d+: .* workers=2 generation=2$"), 90,
                 "an epoch over two workers again")
        stop = run_cli(["stop", job], env, timeout=120)
        assert stop.returncode == 0, stop.stderr
    finally:
        _stop(env, home)
    rec = latest(home)
    assert rec["state"] == "stopped"
    assert next(p for p in rec["procs"] if p["name"] == "worker-2")["exit_code"] == 0
    assert [(c["change"], c["rank"]) for c in rec["changes"]] == [("joined", 2), ("left", 2)]
    assert_nothing_left(home)
