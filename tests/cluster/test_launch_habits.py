"""torchrun habits at ``mxdist launch`` on this machine, end to end: ``-m MODULE``,
``--nproc-per-node``, ``--start-timeout`` and an unknown option typed before the script.

Each test runs the CLI as a subprocess with a private MXDIST_HOME and ends by checking that no
process of the job remains.
"""
from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

from tests.support.cli import assert_nothing_left, cli_env, latest, records, run_cli

MODULE = textwrap.dedent("""
    import os, sys
    import numpy as np, psnode.kv
    kv = psnode.kv.create('dist_sync')
    kv.init(3, np.zeros(2, np.float32))
    kv.push(3, np.full(2, kv.rank + 1, np.float32))
    out = np.empty(2, np.float32); kv.pull(3, out=out)
    print("module", __name__, "rank", kv.rank, "of", kv.num_workers, "local", os.environ["LOCAL_RANK"],
          "args", sys.argv[1:], "sum", float(out[0]) * kv.num_workers)
    kv.close()
""")

LATE = textwrap.dedent("""
    import os, time
    import psnode.kv
    if os.environ["RANK"] == "1":
        time.sleep(120)              # never registers
    kv = psnode.kv.create('dist_sync')
    kv.close()
""")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "mxdist-home"


@pytest.fixture
def package(tmp_path: Path) -> Path:
    """``work/trainer/main.py``: a module of a package in a working directory."""
    work = tmp_path / "work"
    (work / "trainer").mkdir(parents=True)
    (work / "trainer" / "__init__.py").write_text("")
    (work / "trainer" / "main.py").write_text(MODULE)
    return work


def test_module_runs_on_every_worker_as_python_m(home, package):
    res = run_cli(["launch", "--workdir", str(package), "-n", "2", "-m", "trainer.main", "--lr", "3", "-n", "9"],
                  cli_env(home))
    assert res.returncode == 0, res.stdout + res.stderr
    for rank in range(2):
        assert (f"[worker {rank} @ localhost] module __main__ rank {rank} of 2 local {rank} "
                f"args ['--lr', '3', '-n', '9'] sum 3.0") in res.stdout
    assert latest(home)["command"] == ["-m", "trainer.main", "--lr", "3", "-n", "9"]
    assert_nothing_left(home)


def test_a_missing_module_fails_preflight(home, package):
    res = run_cli(["launch", "--workdir", str(package), "-n", "2", "-m", "trainer.mian"], cli_env(home))
    assert res.returncode == 3, res.stdout + res.stderr
    text = " ".join(res.stderr.replace("│", " ").split())
    assert f"localhost: no module trainer.mian in {package} (python -m trainer.mian: not found)" in text
    assert "fix: python -m runs a module of the working directory (--workdir) or of PYTHONPATH" in text
    assert_nothing_left(home)


def test_nproc_per_node_on_this_machine(home, package):
    res = run_cli(["launch", "--workdir", str(package), "--nproc-per-node", "3", "-m", "trainer.main"], cli_env(home))
    assert res.returncode == 0, res.stdout + res.stderr
    for rank in range(3):
        assert f"[worker {rank} @ localhost] module __main__ rank {rank} of 3 local {rank} args [] sum 6.0" in res.stdout
    assert_nothing_left(home)


def test_start_timeout_ends_a_job_whose_worker_never_registers(home, tmp_path):
    job = tmp_path / "late.py"
    job.write_text(LATE)
    began = time.monotonic()
    res = run_cli(["launch", "-n", "2", "--start-timeout", "3", "--grace", "1", str(job)], cli_env(home))
    took = time.monotonic() - began
    assert res.returncode == 1, res.stdout + res.stderr
    assert "only 1 of 2 workers and 1 of 1 servers registered within 3 s" in " ".join(res.stderr.split())
    assert took < 60, took                  # not the 120 s default
    assert latest(home)["state"] == "failed"
    assert_nothing_left(home)


def test_a_typo_before_the_script_starts_nothing_and_records_nothing(home):
    res = run_cli(["launch", "--dryrun", "-n", "2", "examples/mlp_numpy.py"], cli_env(home))
    assert res.returncode == 2, res.stdout + res.stderr
    text = " ".join(res.stderr.replace("│", " ").split())
    assert "unknown option --dryrun before the command; did you mean --dry-run?" in text
    assert "command not found" not in res.stdout + res.stderr
    assert records(home) == []


@pytest.mark.parametrize("spec", ["localhost:2", "127.0.0.1:2"])
def test_hosts_naming_this_machine_run_here_without_ssh(home, package, spec):
    """horovodrun's ``-H localhost:2``: this machine's entries run without SSH (no sshd on port 22
    needed); the dry run says so, and ``--launcher ssh`` logs in over SSH."""
    env = cli_env(home, MXDIST_SSH_CONFIG=str(package / "no-ssh-config"))
    dry = run_cli(["launch", "--dry-run", "-H", spec, "-s", "1", "--workdir", str(package), "-m", "trainer.main"], env)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    said = " ".join(dry.stdout.split())
    assert (f"how the processes start: on this machine, without SSH (-H {spec} names this machine; "
            "--launcher ssh logs in over SSH)") in said, dry.stdout
    res = run_cli(["launch", "-H", spec, "-s", "1", "--workdir", str(package), "-m", "trainer.main"], env)
    assert res.returncode == 0, res.stdout + res.stderr
    for rank in range(2):
        assert f"[worker {rank} @ localhost] module __main__ rank {rank} of 2 local {rank} args [] sum 3.0" \
            in res.stdout, res.stdout
    assert latest(home)["backend"] == "local"
    ssh = run_cli(["launch", "--dry-run", "--launcher", "ssh", "-H", spec, "-m", "trainer.main"], env)
    assert ssh.returncode == 0 and "how the processes start: over SSH, on every host" in " ".join(
        ssh.stdout.split()), ssh.stdout + ssh.stderr
    assert_nothing_left(home)
