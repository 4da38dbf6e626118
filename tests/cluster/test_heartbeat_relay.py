"""Heartbeats relayed per host (psnode.net.relay), with real processes on 127.0.0.1.

``PSNODE_HEARTBEAT_RELAY=on``: every node of the job sends its heartbeats to the host's relay,
which sends the scheduler one batch per interval.  The relay here is a process of its own
started first (:func:`psnode.net.relayhost.start`, the code a node runs when it is the first of
the job on its host), so the test knows which process to kill.  W=3 workers, S=1 server, the
rounds of :data:`tests.support.scheduler_restart.ROUNDS` (rank r pushes (r+1)*(step+1): the
average is 2*(step+1), checked every round), heartbeat 0.2 s, timeout 1 s.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from psnode.net.security import Mode
from psnode.net.transport import new_security
from psnode.scheduler.client import status
from tests.support import wait_for
from tests.support.cluster import ROOT, Job, Proc, free_port, start_job, wait_for_file, wait_job
from tests.support.scheduler_restart import ROUNDS

RELAY = {"PSNODE_HEARTBEAT_RELAY": "on", "PSNODE_HEARTBEAT_INTERVAL": "0.2", "PSNODE_HEARTBEAT_LIVENESS": "5"}
HOLD = ("import sys; from psnode.config import NodeConfig; from psnode.net import relayhost\n"
        "relay = relayhost.start(NodeConfig.from_env())\n"
        "print('RELAY', relay is not None, flush=True); sys.stdin.read()\n")


def _with_relay(tmp_path: Path, rounds: int, secure: dict[str, str]) -> tuple[Job, Proc]:
    """The relay first (its own process, holding the job's relay address on this host), then
    the job of :data:`ROUNDS` (``secure``: its key file, or nothing: insecure)."""
    return _with_relay_script(tmp_path, ROUNDS, [str(tmp_path), str(rounds)], secure)


def _with_relay_script(tmp_path: Path, script: str, args: list[str],
                       secure: dict[str, str] | None = None) -> tuple[Job, Proc]:
    """The relay first, then W=3 workers of ``script`` and one server."""
    secure = secure or {}
    job_id, address = f"t{uuid.uuid4().hex[:10]}", f"127.0.0.1:{free_port()}"
    env = {**os.environ, **RELAY, **secure, "PYTHONPATH": str(ROOT), "PSNODE_ROLE": "worker",
           "PSNODE_SCHEDULER": address,
           "PSNODE_JOB_ID": job_id, "PSNODE_NUM_WORKERS": "3", "PSNODE_NUM_SERVERS": "1"}
    popen = subprocess.Popen([sys.executable, "-c", HOLD], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert popen.stdout is not None
    first = popen.stdout.readline()   # (bounded: the relay answers within 5 s or exits)
    if first.strip() != "RELAY True":
        popen.kill()
        raise AssertionError(f"the relay did not start: {first!r} {popen.communicate(timeout=10)}")
    job = start_job(script, 3, 1, env={**RELAY, **secure, "PSNODE_JOB_ID": job_id, "PSNODE_SCHEDULER": address},
                    args=args, tmp=tmp_path)
    job.job_id, job.scheduler = job_id, address
    return job, job.add(Proc("relay", 0, popen, [], env))


def _ended_well_but_the_relay(job: Job) -> None:
    """Every process of the job exited 0; the relay was killed (SIGKILL)."""
    codes = sorted((p.role, p.rank, p.code) for p in job.procs)
    assert codes == [("relay", 0, -signal.SIGKILL), ("scheduler", 0, 0), ("server", 0, 0), ("worker", 0, 0),
                     ("worker", 1, 0), ("worker", 2, 0)], job.describe()


def _relayed(job: Job) -> int:
    return status(job.scheduler, job.job_id, key_file=job.procs[0].env.get("PSNODE_KEY_FILE"), timeout=2.0).relayed


def test_the_scheduler_gets_batches_and_the_job_outlives_its_relay(tmp_path: Path) -> None:
    """The relay is killed with SIGKILL mid-job: every node heartbeats directly within 2.5
    intervals, nobody is taken for dead, one of the job's nodes becomes the host's relay at its
    next try (10 intervals) and the others use it, and every round of the job completes
    exactly.  The job is encrypted (CURVE): the relay's sockets use the job's keys like every
    other."""
    keyfile = tmp_path / "job.key"
    new_security(Mode.ENCRYPTED).save(str(keyfile))
    job, relay = _with_relay(tmp_path, 160, {"PSNODE_KEY_FILE": str(keyfile)})
    try:
        wait_for_file(tmp_path / "round5", 60)
        wait_for(lambda: _relayed(job) >= 20, 20, "relayed heartbeats at the scheduler")
        os.kill(relay.popen.pid, signal.SIGKILL)
        relay.popen.wait(10)
        before = _relayed(job)
        time.sleep(2.0)   # (twice the heartbeat timeout: a false death would end the job meanwhile)
        answer = status(job.scheduler, job.job_id, key_file=str(keyfile), timeout=2.0)
        assert sorted((n.role, n.rank, n.state) for n in answer.nodes) == [
            ("server", 0, "alive"), ("worker", 0, "alive"), ("worker", 1, "alive"), ("worker", 2, "alive")]
        wait_for(lambda: _relayed(job) >= before + 20, 10, "a new relay's batches at the scheduler")
    finally:
        relay.popen.kill()
        wait_job(job, 90)
    _ended_well_but_the_relay(job)
    for w in job.workers:
        assert "RANK %d ROUNDS 160 BAD []" % w.rank in w.out, job.describe()
    nodes = job.workers + job.by_role("server")
    for p in nodes:
        assert "heartbeat relay of this host" in p.err and "does not answer" in p.err, job.describe()
    assert sum("answers again" in p.err for p in nodes) >= 3, job.describe()   # (the new relay's users)


def test_a_killed_worker_is_named_within_the_heartbeat_timeout_while_the_relay_serves_the_rest(
        tmp_path: Path) -> None:
    job, relay = _with_relay(tmp_path, 400, {})
    try:
        wait_for_file(tmp_path / "round5", 60)
        wait_for(lambda: _relayed(job) >= 20, 20, "relayed heartbeats at the scheduler")
        os.kill(job.workers[2].popen.pid, signal.SIGKILL)
        killed = time.monotonic()
        sched = job.by_role("scheduler")[0]
        sched.popen.wait(20)
        took = time.monotonic() - killed
    finally:
        relay.popen.kill()
        wait_job(job, 60)
    assert sched.code == 1, job.describe()
    assert "worker 2 on 127.0.0.1" in sched.err and "stopped responding" in sched.err, job.describe()
    # the timeout (1 s), a relayed heartbeat's lateness (an interval) and the failed job's last second
    assert took < 1.0 + 0.2 + 1.0 + 1.0, (took, job.describe())
    for w in job.workers[:2]:
        assert w.code == 1 and "worker 2" in w.err, job.describe()


BARRIERS = """
import pathlib, sys, time, psnode
flags = pathlib.Path(sys.argv[1])
kv = psnode.kv.create('dist_sync')
bad = []
for b in range(1, 9):
    if kv.rank == 2 and b == 4:
        while not (flags / 'relay-killed').exists():   # (the relay dies while the others wait in barrier 4)
            time.sleep(0.05)
    (flags / f'entered-{b}-{kv.rank}').touch()
    kv.barrier()
    came = sorted(int(p.name.rsplit('-', 1)[1]) for p in flags.glob(f'entered-{b}-*'))
    if came != list(range(kv.num_workers)):
        bad.append((b, came))
print('RANK', kv.rank, 'BARRIERS 8 BAD', bad, flush=True)
kv.close()
"""


def test_barriers_go_through_the_relay_and_one_survives_its_death_mid_barrier(tmp_path: Path) -> None:
    """Every barrier's entries go through the host's relay (the scheduler counts them), and no
    worker leaves a barrier before every worker entered it.  The relay is killed with SIGKILL
    while workers 0 and 1 wait in barrier 4, their entries sent: worker 2 enters after, the
    others send theirs again directly once the relay is silent, and all 8 barriers complete
    with every worker's exit code 0."""
    job, relay = _with_relay_script(tmp_path, BARRIERS, [str(tmp_path)])
    try:
        for rank in (0, 1):
            wait_for_file(tmp_path / f"entered-4-{rank}", 60)
        wait_for(lambda: status(job.scheduler, job.job_id, timeout=2.0).relayed_barriers >= 3 * 3 + 2, 20,
                 "the entries of barriers 1 to 3 and of workers 0 and 1 into barrier 4 through the relay")
        os.kill(relay.popen.pid, signal.SIGKILL)
        relay.popen.wait(10)
        (tmp_path / "relay-killed").touch()
    finally:
        relay.popen.kill()
        wait_job(job, 90)
    _ended_well_but_the_relay(job)
    for w in job.workers:
        assert f"RANK {w.rank} BARRIERS 8 BAD []" in w.out, job.describe()


LAUNCHED = """
import os, time, numpy as np, psnode.kv
from psnode import launcher
kv = psnode.kv.create('dist_sync')
kv.init(3, np.zeros(4, np.float32))
kv.push(3, np.full(4, kv.rank + 1, np.float32))
out = np.empty(4, np.float32)
kv.pull(3, out=out)
assert (out == (kv.num_workers + 1) / 2).all(), out
relayed, deadline = 0, time.monotonic() + 30
while kv.rank == 0 and relayed == 0 and time.monotonic() < deadline:
    time.sleep(0.2)
    relayed = launcher.status(os.environ["PSNODE_SCHEDULER"], os.environ["PSNODE_JOB_ID"],
                              key_file=os.environ.get("PSNODE_KEY_FILE"), timeout=5.0).relayed
kv.barrier()
print("rank", kv.rank, "host processes", os.environ.get("PSNODE_HOST_PROCESSES"), "relayed", relayed > 0, flush=True)
kv.close()
"""


def test_mxdist_launch_relays_the_heartbeats_of_a_host_with_nine_nodes(tmp_path: Path) -> None:
    """``mxdist launch -n 8 -s 1`` on this machine: 9 nodes on one host, so each is told so
    (PSNODE_HOST_PROCESSES) and, by default (``auto``), heartbeats through the host's relay: the
    scheduler counts relayed heartbeats while the job runs, and the job ends well."""
    from tests.support.cli import assert_nothing_left, cli_env, run_cli
    home = tmp_path / "mxdist-home"
    (tmp_path / "job.py").write_text(LAUNCHED)
    res = run_cli(["launch", "-n", "8", "-s", "1", str(tmp_path / "job.py")], cli_env(home), timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    for rank in range(8):
        assert f"rank {rank} host processes 9 relayed {rank == 0}" in res.stdout, res.stdout + res.stderr
    assert_nothing_left(home)
