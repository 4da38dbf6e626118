"""A job on the SSH testbed (hosts on 127.0.0.2-4), against another Unix user and another job.

The same attack as ``tests/cluster/test_launch_auth.py`` (``tests/support/intruders.py``), on a
job that ``mxdist launch -H`` started with its default security: the secret was delivered to
each host over SSH, and the processes on every host refuse the other user's STOP, STATUS,
REGISTER and push on every TCP port and its HELLO on every same-host address, and the same from
a worker of another job (its own secret, delivered the same way).  The job ends with exact
values and its secret is gone from every host.
"""
from __future__ import annotations

from pathlib import Path

from psnode.net.security import Mode, Security
from tests.support.cli import assert_nothing_left, records, start_cli, wait_for
from tests.support.intruders import TRAIN, attack_a_running_job, finish_attacked_job, script


def test_another_user_and_another_job_cannot_touch_an_ssh_job(ssh_cluster, other_user, home, tmp_path):
    env = ssh_cluster.env(home)
    go = tmp_path / "go"
    proc = start_cli(["launch", "-H", "node1,node2", "-n", "2", "-s", "2", str(script(tmp_path, "train.py", TRAIN)),
                      str(go)], env)
    try:
        rec = wait_for(lambda: (r := records(home)) and r[-1]["state"] == "running" and r[-1], 90, "the job to run")
        assert Security.load(rec["key_file"]).mode is Mode.AUTHENTICATED
        remote = dict(rec["remote_keys"])
        assert set(remote) == {"node1", "node2"} and all(Path(p).read_bytes() == Path(rec["key_file"]).read_bytes()
                                                         for p in remote.values())
        assert {p["address"] for p in rec["procs"]} == {"127.0.0.2", "127.0.0.3"}
        attack_a_running_job(other_user, home, env, rec, ["launch", "-H", "node1", "-n", "1", "-s", "0"], tmp_path)
    finally:
        go.touch()
    finish_attacked_job(proc, home, rec)
    assert not Path(rec["key_file"]).exists() and not any(Path(p).exists() for p in remote.values())
    assert_nothing_left(home)
