"""The job commands agree with each other, as a user types them on this machine: a job that is
not there is ``no such job`` (exit 1) for ``clean`` as for status/stop/logs; with two jobs
running, ``logs`` without a job refuses as ``stop`` does, naming both; counts of one are singular.
"""
from __future__ import annotations

import textwrap

from tests.support.cli import assert_nothing_left, cli_env, run_cli, wait_for

SLEEPER = textwrap.dedent("""
    import os, time
    print("started rank", os.environ["RANK"], flush=True)
    time.sleep(300)
""")


def flat(text: str) -> str:
    return " ".join(text.replace("│", " ").split())


def test_clean_of_a_job_that_is_not_there_says_no_such_job(tmp_path):
    home = tmp_path / "home"
    env = cli_env(home)
    for command in (["status"], ["stop"], ["logs"], ["clean"]):
        res = run_cli([*command, "nosuchjob"], env)
        assert res.returncode == 1, (command, res.stdout + res.stderr)
        assert "no such job" in res.stderr and "no job 'nosuchjob' in" in flat(res.stderr), (command, res.stderr)
    res = run_cli(["clean", "--older-than", "1"], env)
    assert res.returncode == 0 and "no finished job to remove older than 1 day\n" in res.stderr, res.stderr


def test_logs_without_a_job_refuses_while_two_run_as_stop_does(tmp_path):
    home = tmp_path / "home"
    env = cli_env(home)
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text(SLEEPER)
    ids = []
    try:
        for _ in range(2):
            res = run_cli(["launch", "-d", "-n", "1", "-s", "0", str(sleeper)], env)
            assert res.returncode == 0, res.stdout + res.stderr
            ids.append(res.stdout.strip().splitlines()[-1])
        for command in (["logs"], ["stop"]):
            res = run_cli(command, env)
            assert res.returncode == 2, (command, res.stdout + res.stderr)
            assert f"2 jobs are running: {ids[0]}, {ids[1]}" in flat(res.stderr), (command, res.stderr)
        assert "name one: mxdist logs JOB" in flat(run_cli(["logs"], env).stderr)
        wait_for(lambda: "started rank 0" in run_cli(["logs", ids[0]], env).stdout, 60, "the first job's log")
    finally:
        res = run_cli(["stop", "--all"], env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert_nothing_left(home)


def test_one_slot_is_singular(tmp_path):
    res = run_cli(["launch", "--dry-run", "-H", "localhost", "-n", "2", "-s", "0", "echo", "hi"],
                  cli_env(tmp_path / "home"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "2 workers but the hosts have 1 slot: some hosts run more workers than slots" in flat(res.stderr)


ARGS = textwrap.dedent("""
    import argparse
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=1)
    p.parse_args()
""")


def test_a_scripts_usage_error_is_the_root_cause_in_its_own_words(tmp_path):
    home = tmp_path / "home"
    script = tmp_path / "train.py"
    script.write_text(ARGS)
    res = run_cli(["launch", "-n", "1", "-s", "0", str(script), "--epochs", "2", "--bogus"], cli_env(home))
    assert res.returncode == 1, res.stdout + res.stderr
    assert ("failed in" in res.stderr and res.stderr.rstrip().endswith(
        "worker 0 on localhost: train.py: error: unrecognized arguments: --bogus (exit code 2)")), res.stderr
    assert_nothing_left(home)
