"""Authenticated jobs against a real second Unix user and against a process of another job.

The job runs through the test harness (scheduler, 2 servers, 2 workers on 127.0.0.1) with a
secret file written by psnode (``new_security``).  Another user, created for these tests,
learns what any local user can (job ids from /proc/*/cmdline, listening ports from
/proc/net/tcp) and sends STOP, STATUS, REGISTER and a DATA push to every port of the job,
speaking ZMTP by hand with the NULL and PLAIN mechanisms (tests/support/outsider.py): every
attempt is refused at the handshake and counted, and the job ends with exact values.  The
same outsider against an insecure job gets its STATUS answered and stops the job: the attack
is real.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from psnode.errors import PeerLost
from psnode.net.security import Mode
from psnode.net.transport import new_security
from psnode.protocol import decode
from psnode.scheduler.client import status as scheduler_status
from tests.support import wait_for
from tests.support.cluster import Job, alive, start_job, wait_job
from tests.support.intruders import (
    OTHER_JOB,
    OUTSIDER,
    TRAIN,
    check_other_job,
    check_outsider,
    other_job_report,
    run_outsider,
)

HERE = Path(__file__).resolve().parent
JOB_REGEX = r"/(t[0-9a-f]{10})\.py"      # the harness runs workers as python /tmp/<job id>.py


def _status(job: Job, key: str | None) -> dict | None:
    try:
        return scheduler_status(job.scheduler, job.job_id, key_file=key, timeout=1.0).to_body()
    except PeerLost:
        return None


def _started(job: Job, key: str | None) -> dict:
    return wait_for(lambda: (st := _status(job, key)) and st["started"] and st, 20, "the job to start",
                    describe=job.describe)


def _wait_status(job: Job, key: str, pred, what: str) -> dict:
    return wait_for(lambda: (st := _status(job, key)) and pred(st) and st, 15, what, describe=job.describe)


def _targets(job: Job, st: dict) -> list[str]:
    return [job.scheduler] + [f"{n['host']}:{n['port']}" for n in st["nodes"] if n["role"] == "server"]


def _server_counts(st: dict) -> list[int]:
    """Refusals of each server, in the order of ``_targets``."""
    return [n["refused"] for n in st["nodes"] if n["role"] == "server"]


def _none_left(job: Job) -> None:
    assert not [p.popen.pid for p in job.procs if alive(p.popen.pid)], "processes of the job left"


def test_the_outsiders_messages_are_well_formed() -> None:
    """What the outsider sends decodes as psnode messages of the job (so a refusal is the
    authentication's doing, not a malformed frame's)."""
    ns: dict = {}
    exec(compile(OUTSIDER, "outsider.py", "exec"), ns)
    for cmd in ("stop", "status", "register", "data"):
        ident, frames = ns["frames"](cmd, "tabc")
        msg = decode(frames, "tabc", 2**20)
        assert msg.cmd.value == cmd and (ident == b"w0") == (cmd == "data")
    assert msg.arrays[0].tolist() == [1000.0] * 4


@pytest.mark.parametrize("mode", [Mode.AUTHENTICATED, Mode.ENCRYPTED])
def test_another_user_and_another_job_are_refused_and_the_job_is_exact(other_user, tmp_path, mode) -> None:
    key = tmp_path / "job.key"
    new_security(mode).save(str(key))
    go = tmp_path / "go"
    job = start_job(TRAIN, 2, 2, env={"PSNODE_KEY_FILE": str(key)}, args=[str(go)], tmp=tmp_path)
    try:
        st = _started(job, str(key))
        targets = _targets(job, st)
        seen = run_outsider(other_user, targets, JOB_REGEX)
        # every connection refused once, and counted: the scheduler's and each server's count
        tried = check_outsider(seen, job.job_id, targets, [])
        want = [tried[t] for t in targets]
        st = _wait_status(job, str(key), lambda s: all(
            n >= w for n, w in zip([s["refused"], *_server_counts(s)], want, strict=True)),
            f"refusal counts {want} (scheduler, servers)")
        assert [st["refused"], *_server_counts(st)] == want, (st, tried)

        # a process of another job: its own secret, this job's id and addresses
        other = tmp_path / "other.key"
        new_security(mode).save(str(other))
        with pytest.raises(PeerLost):
            scheduler_status(job.scheduler, job.job_id, key_file=str(other), timeout=0.5)
        env = dict(os.environ, PYTHONPATH=str(HERE.parents[1]), PSNODE_KEY_FILE=str(other))
        res = subprocess.run([sys.executable, "-c", textwrap.dedent(OTHER_JOB), job.job_id, *targets],
                             capture_output=True, text=True, timeout=60, env=env)
        assert res.returncode == 0, res.stderr
        check_other_job(other_job_report(res.stdout), job.job_id, links=len(targets), unix=0)
        st = _wait_status(job, str(key), lambda s: all(
            n > w for n, w in zip([s["refused"], *_server_counts(s)], want, strict=True)),
            "the other job's refusals counted by the scheduler and each server")
        assert all(n["state"] == "alive" and n["pushes"] == 0 for n in st["nodes"] if n["role"] == "server")
        assert sum(n["role"] == "worker" for n in st["nodes"]) == 2
    finally:
        go.write_text("go")
    wait_job(job, 60)
    assert [p.code for p in job.procs] == [0] * len(job.procs), job.describe()
    assert all("PULLED [1.5, 1.5, 1.5, 1.5]" in w.out for w in job.workers), job.describe()
    _none_left(job)


def test_without_authentication_the_same_outsider_reads_and_stops_the_job(other_user, tmp_path) -> None:
    """The control: against an insecure job the outsider's STATUS is answered and its STOP
    ends the job."""
    go = tmp_path / "go"
    job = start_job(TRAIN, 1, 1, args=[str(go)], tmp=tmp_path)
    try:
        _started(job, None)
        seen = run_outsider(other_user, [job.scheduler], JOB_REGEX, OUTSIDER_COMMANDS="status,stop",
                            OUTSIDER_MECHANISMS="NULL")
        assert job.job_id in seen["jobs"]
        assert [(a["cmd"], a["peer_mechanism"], a["answer"]) for a in seen["attempts"] if a["job"] == job.job_id] == [
            ("status", "NULL", "status_reply"), ("stop", "NULL", "stop_ack")], seen["attempts"]
    finally:
        go.write_text("go")
    wait_job(job, 30)
    assert job.workers[0].code != 0 and f"job {job.job_id} ended: an outsider stopped it" in job.workers[0].err
    _none_left(job)
