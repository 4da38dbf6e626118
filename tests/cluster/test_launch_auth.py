"""A job started by ``mxdist launch`` on this machine, against another Unix user and another job.

The launcher gives the job a fresh secret (authenticated by default; ``--encrypt`` too).  A real
second user (``other_user``) learns the job id from ``/proc/*/cmdline``, the ports from
``/proc/net/tcp`` and the same-host addresses from ``/proc/net/unix``, and sends STOP, STATUS,
REGISTER and a push to every TCP port of the job and a HELLO to every same-host address
(``tests/support/intruders.py``); a worker of a second ``mxdist launch`` job (its own secret)
does the same speaking psnode properly.  Every attempt is refused and counted by the node it
was aimed at, and the job ends with exact values; its secret never appears on a command line
or in the record, and is gone when the job ends.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from psnode.net.security import Mode, Security
from tests.support.cli import assert_nothing_left, cli_env, records, start_cli, wait_for
from tests.support.intruders import TRAIN, attack_a_running_job, finish_attacked_job, script


@pytest.mark.parametrize("flags, mode", [([], Mode.AUTHENTICATED), (["--encrypt"], Mode.ENCRYPTED)],
                         ids=["default", "encrypt"])
def test_another_user_and_another_job_cannot_touch_a_launched_job(other_user, tmp_path, flags, mode):
    home = tmp_path / "home"
    env = cli_env(home)
    go = tmp_path / "go"
    proc = start_cli(["launch", *flags, "-n", "2", "-s", "2", str(script(tmp_path, "train.py", TRAIN)), str(go)],
                     env)
    try:
        rec = wait_for(lambda: (r := records(home)) and r[-1]["state"] == "running" and r[-1], 60, "the job to run")
        assert Security.load(rec["key_file"]).mode is mode
        key_file = Path(rec["key_file"])
        attack_a_running_job(other_user, home, env, rec, ["launch", *flags, "-n", "1", "-s", "0"], tmp_path)
    finally:
        go.touch()
    finish_attacked_job(proc, home, rec)
    assert not key_file.exists()                                         # the secret is gone with the job
    assert_nothing_left(home)
