"""A local job whose supervisor (``mxdist launch``, attached or ``-d``) is killed with SIGKILL
while the job runs: ``mxdist stop <id>``, or the ``mxdist status`` after the job ended by itself,
ends every process and removes the job's secret (``MXDIST_HOME/jobs/<id>/job.key``).  See
``tests/support/orphans.py``; every test ends with ``assert_nothing_left``.
"""
from __future__ import annotations

import pytest

from tests.support.cli import cli_env
from tests.support.orphans import let_it_finish, start_and_kill_the_supervisor, stop_it


@pytest.mark.parametrize("detached", [False, True], ids=["attached", "detached"])
@pytest.mark.parametrize("end", ["stop", "finish"])
def test_a_job_whose_supervisor_was_killed_loses_its_secret_when_it_ends(tmp_path, detached, end):
    home = tmp_path / "home"
    env = cli_env(home)
    rec, go = start_and_kill_the_supervisor(["-n", "2", "-s", "2"], detached, env, home, tmp_path)
    try:
        assert rec["key_file"] == str(home / "jobs" / rec["id"] / "job.key")
        if end == "stop":
            stop_it(rec, env, home)
        else:
            let_it_finish(rec, go, env, home)
    finally:
        go.touch()
