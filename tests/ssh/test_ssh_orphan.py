"""A job on the SSH testbed whose supervisor (``mxdist launch -H``, attached or ``-d``) is
killed with SIGKILL while the job runs: ``mxdist stop <id>``, or the ``mxdist status`` after the
job ended by itself, ends every process on every host and removes the job's secret files, the
launcher's copy and ``<run dir>/job.key`` on each host (delivered there over SSH).  See
``tests/support/orphans.py``; every test ends with ``assert_nothing_left``.
"""
from __future__ import annotations

import pytest

from tests.support.orphans import let_it_finish, start_and_kill_the_supervisor, stop_it


@pytest.mark.parametrize("detached, end", [(True, "stop"), (False, "finish")],
                         ids=["detached-stop", "attached-finish"])
def test_an_ssh_job_whose_supervisor_was_killed_loses_its_secrets_when_it_ends(ssh_cluster, home, tmp_path,
                                                                                 detached, end):
    env = ssh_cluster.env(home)
    rec, go = start_and_kill_the_supervisor(["-H", "node1,node2", "-n", "2", "-s", "2"], detached, env, home,
                                            tmp_path, hosts=2)
    try:
        assert set(rec["remote_keys"]) == {"node1", "node2"}
        assert {p["address"] for p in rec["procs"]} == {"127.0.0.2", "127.0.0.3"}
        if end == "stop":
            stop_it(rec, env, home)
        else:
            let_it_finish(rec, go, env, home)
    finally:
        go.touch()
