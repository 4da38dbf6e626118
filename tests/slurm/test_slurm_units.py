"""Pure parts of mxdist.backends.slurm (no cluster needed)."""
from __future__ import annotations

import pytest

from mxdist.backends.registry import make_backend
from mxdist.backends.slurm import HOW_TO_ALLOCATE, SlurmError, exit_code, from_allocation, parse_counts, step_name


@pytest.mark.parametrize("spec, expected", [
    ("2", [2]), ("2(x3)", [2, 2, 2]), ("2(x2),1", [2, 2, 1]), ("4,1(x2),3", [4, 1, 1, 3]),
])
def test_parse_counts(spec, expected):
    assert parse_counts(spec) == expected


def test_parse_counts_rejects_garbage():
    with pytest.raises(SlurmError):
        parse_counts("2(y3)")


def test_exit_code_from_srun():
    assert exit_code(0, "") == 0
    assert exit_code(3, "srun: error: n1: task 0: Exited with exit code 3") == 3
    assert exit_code(137, "srun: error: n1: task 0: Killed") == -9
    assert exit_code(143, "srun: error: n1: task 0: Terminated") == -15
    assert exit_code(137, "srun: error: n1: task 0: Exited with exit code 137") == 137
    assert exit_code(None, "") is None


def test_outside_an_allocation():
    with pytest.raises(SlurmError, match="salloc"):
        from_allocation({}, "/tmp", "python3", "job")
    assert "sbatch" in HOW_TO_ALLOCATE


def test_srun_argv_carries_no_environment_values():
    backend = make_backend("slurm", {"workdir": "/w", "python": "python3", "job_id": "12", "tag": "t",
                                     "cpus": {"n1": 4}})
    argv = backend.srun_argv("n1", step_name("t", "worker-0"), ["python3", "train.py", "a b"])
    assert argv[0] == "srun" and argv[-4:] == ["--", "python3", "train.py", "a b"]
    assert {"--jobid=12", "--overlap", "--nodelist=n1", "--job-name=mxdist.t.worker-0", "--export=ALL",
            "--cpus-per-task=4", "--chdir=/w"} <= set(argv)
    assert not any("PSNODE" in a or "KEY" in a for a in argv)
    assert backend.options()["job_id"] == "12"
