"""Faults on the same-host data path (psnode.samehost.link, shared memory): kill -9 of a worker or a
server mid-round, a restarted server mapped again, rogue connections and corrupt descriptors.

Every test checks that the links really carried the data, and ends with no process of the job
left and nothing of its shared memory: no file in /dev/shm, no process mapping a segment.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import struct
import time
from pathlib import Path

import pytest

from psnode.protocol.codec import ARRAY, HEAD, RECORD
from psnode.samehost import handshake as shmhandshake
from psnode.samehost import segments as shm
from psnode.worker.ioloop import EXIT_GRACE  # a worker outside psnode exits by itself within it
from tests.support import require, wait_for
from tests.support.cluster import kill_and_restart_server, start_job, wait_job
from tests.support.faults import DEAD_AFTER, FAST_ENV, assert_none_left, listen_ports, markers


@pytest.fixture(autouse=True)
def _shared_memory_available() -> None:
    """The same-host path needs memfd_create and file seals (Linux >= 3.17): skipped without,
    a failure under CI."""
    require(None if shm.available() else "memfd_create with file seals is not available",
            "run on Linux 3.17 or later")
BOUND = DEAD_AFTER + 5

LINKED = """
import os, sys, time
from pathlib import Path
import numpy as np, psnode
D = Path(os.environ["FAULT_DIR"])
kv = psnode.kv.create('dist_sync')
r, W = kv.rank, kv.num_workers
keys = ['a', 'b', 'big']
for k in keys:
    kv.init(k, np.zeros(300_000 if k == 'big' else 1000, np.float32))
want_links = set(range(kv.num_servers)) if os.environ.get("PSNODE_SHM", "1") == "1" else set()
assert kv._engine.links.local == want_links, kv._engine.links.local
limit = int(sys.argv[1])
step = 0
while step < limit:
    step += 1
    kv.push(keys, [np.full(300_000 if k == 'big' else 1000, (r + 1) * step, np.float32) for k in keys])
    for k, got in zip(keys, kv.pull(keys)):
        if not (got == np.float32(sum(range(1, W + 1)) / W * step)).all():
            print(f"MISMATCH step {step} key {k}: {got[:3]}", flush=True)
            sys.exit(3)
    if step == 3:
        (D / f"ready.{r}").touch()
    time.sleep(0.005)
print("LINKS", sorted(kv._engine.links.local), flush=True)
kv.close()
print("DONE", step, flush=True)
"""


@pytest.mark.parametrize("role,rank", [("worker", 1), ("server", 0)])
def test_kill_9_mid_round_on_the_same_host_path_leaves_nothing(tmp_path: Path, role: str, rank: int) -> None:
    env = {**FAST_ENV, "FAULT_DIR": str(tmp_path), "PSNODE_BIG_ARRAY_BOUND": "100000"}
    job = start_job(LINKED, 2, 2, env=env, args=[str(10**9)], tmp=tmp_path)
    dr = job.drained
    try:
        wait_for(lambda: markers(tmp_path, "ready", 2) or dr.exited, 40, "training to start", describe=dr.describe, poll=dr.poll)
        assert markers(tmp_path, "ready", 2), dr.describe()
        assert len(shm.holders(job.job_id)) == 4, shm.holders(job.job_id)   # workers and servers map
        victim = next(p for p in job.procs if p.role == role and p.rank == rank)
        os.kill(victim.popen.pid, signal.SIGKILL)
        others = [p for p in job.procs if p is not victim]
        assert dr.wait(others, time.monotonic() + BOUND), "the job went on:\n" + dr.describe()
        assert all(p.popen.returncode != 0 for p in others), dr.describe()
        for p in others:
            assert f"{role} {rank}" in dr.err(p), dr.describe()
    finally:
        dr.finish()
    assert_none_left(job)



@pytest.mark.parametrize("role,rank", [("server", 0), ("worker", 1)])
def test_sigstop_on_the_same_host_path_is_named_and_leaves_nothing(tmp_path: Path, role: str, rank: int) -> None:
    """A stopped process keeps its segments mapped and its sockets open: only heartbeats tell.
    Every other process exits 1 (the scheduler's verdict, psnode.server.loop's and a worker's
    uncaught PeerLost) naming the stopped one as silent, within the heartbeat timeout plus a few
    seconds; nobody blocks on a ring to it.  Resumed, the victim exits by itself; then nothing
    of the job is left (processes, /dev/shm, memfds mapped by any process)."""
    env = {**FAST_ENV, "FAULT_DIR": str(tmp_path), "PSNODE_BIG_ARRAY_BOUND": "100000"}
    job = start_job(LINKED, 2, 2, env=env, args=[str(10**9)], tmp=tmp_path)
    dr = job.drained
    victim = next(p for p in job.procs if p.role == role and p.rank == rank)
    stopped = False
    try:
        wait_for(lambda: markers(tmp_path, "ready", 2) or dr.exited, 40, "training to start",
                 describe=dr.describe, poll=dr.poll)
        assert markers(tmp_path, "ready", 2), dr.describe()
        assert len(shm.holders(job.job_id)) == 4, shm.holders(job.job_id)   # the links are up
        others = [p for p in job.procs if p is not victim]
        t0 = time.monotonic()
        os.kill(victim.popen.pid, signal.SIGSTOP)
        stopped = True
        assert dr.wait(others, t0 + BOUND), "the job went on:\n" + dr.describe()
        name = re.escape(f"{role} {rank} on 127.0.0.1 (pid {victim.popen.pid})")
        for p in others:
            assert p.popen.returncode == 1, f"{p.role} {p.rank}: exit {p.popen.returncode}\n" + dr.describe()
            assert re.search(name + r" stopped responding \(\d+\.\d s without a heartbeat\)", dr.err(p)), \
                f"{p.role} {p.rank} does not name the stopped {role}\n" + dr.describe()
        assert victim.popen.poll() is None, dr.describe()             # still there, stopped
        t1 = time.monotonic()
        os.kill(victim.popen.pid, signal.SIGCONT)
        stopped = False
        assert dr.wait([victim], t1 + DEAD_AFTER + EXIT_GRACE + 3), f"the resumed {role} did not exit\n" + dr.describe()
        assert victim.popen.returncode == 1, dr.describe()
    finally:
        if stopped and victim.popen.poll() is None:
            os.kill(victim.popen.pid, signal.SIGCONT)
        dr.finish()
    assert_none_left(job)


def test_a_restarted_server_is_mapped_again_and_the_job_ends_exactly(tmp_path: Path) -> None:
    from tests.support.server_restore import SCRIPT, reference
    flags = tmp_path / "flags"
    flags.mkdir()
    script = SCRIPT.replace("kv.close()", "print('LINKS', sorted(kv._engine.links.local), flush=True)\nkv.close()")
    env = {"PSNODE_MAX_RESTARTS": "1", "PSNODE_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
           "PSNODE_CHECKPOINT_ROUNDS": "1", "PSNODE_BIG_ARRAY_BOUND": "8", "PSNODE_RETRY_TIMEOUT": "1"}
    job = start_job(script, 2, 2, env=env, args=[str(flags)], tmp=tmp_path)
    try:
        wait_for(lambda: (flags / "pushed").exists(), 60, "round 5 to be pushed")
        kill_and_restart_server(job, 1)
        (flags / "go").touch()
    finally:
        wait_job(job, 90)
    assert sorted(p.code for p in job.procs) == [-9, 0, 0, 0, 0, 0], job.describe()
    want = reference()
    for w in job.workers:
        finals = {line.split()[1]: line.split(" ", 2)[2] for line in w.out.splitlines() if line.startswith("FINAL")}
        assert finals == {k: str(v) for k, v in want.items()}, job.describe()
        assert "LINKS [0, 1]" in w.out, job.describe()                     # linked to the replacement too
    assert_none_left(job)


def _rogue(job_id: str, port: int, body: dict, fds: list[int] = (), first: bytes = b"H") -> bytes:
    """A HELLO from a process of this user that is not a worker of the job; the answer."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.settimeout(5)
        s.connect(shmhandshake.server_address(job_id, "127.0.0.1", port))
        hello = {"job": job_id, "rank": 0, "pid": os.getpid(), "token": None, "segs": [], **body}
        socket.send_fds(s, [first + json.dumps(hello).encode()], list(fds))
        try:
            return s.recv(4096)
        except (ConnectionResetError, TimeoutError):
            return b""
    finally:
        s.close()


def test_rogue_connections_are_refused_and_corrupt_descriptors_dropped(tmp_path: Path) -> None:
    """Worker 1 runs without the link (PSNODE_SHM=0), so a rogue can pass the handshake as rank 1
    and send descriptors outside the segments it announced: the server drops them, naming it."""
    env = {**FAST_ENV, "FAULT_DIR": str(tmp_path), "PSNODE_BIG_ARRAY_BOUND": "100000"}
    job = start_job(LINKED, 2, 1, env=env, args=["400"], tmp=tmp_path, worker_env={1: {"PSNODE_SHM": "0"}})
    dr = job.drained
    try:
        wait_for(lambda: markers(tmp_path, "ready", 2) or dr.exited, 40, "training to start", describe=dr.describe, poll=dr.poll)
        server = job.by_role("server")[0]
        port = listen_ports(server.popen.pid)[0]
        answers = [_rogue(job.job_id, port, {"job": "another-job"}),
                   _rogue(job.job_id, port, {"rank": 0}),                 # worker 0 is linked and alive
                   _rogue(job.job_id, port, {"rank": 9})]
        loose = os.memfd_create("psnode.rogue", os.MFD_CLOEXEC)
        os.fchmod(loose, 0o600)
        os.ftruncate(loose, 4096)
        answers.append(_rogue(job.job_id, port, {"rank": 1, "segs": [[0, 4096, False]]}, [loose]))
        os.close(loose)
        assert [a[:1] for a in answers] == [b"X"] * 4, answers
        assert b"already has a same-host link" in answers[1] and b"not sealed" in answers[3], answers
        # a proper handshake as rank 1, then descriptors outside the announced segment
        out = shm.Arena("rogue", 0, 4096)   # (not named after the job: the test itself maps it)
        out.array((16,), "f4")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.connect(shmhandshake.server_address(job.job_id, "127.0.0.1", port))
        hello = {"job": job.job_id, "rank": 1, "pid": os.getpid(), "token": None, "segs": [[0, 4096, False]]}
        socket.send_fds(s, [b"H" + json.dumps(hello).encode()], [out.fds[0]])
        s.settimeout(5)
        assert s.recv(4096)[:1] == b"W"
        record = RECORD.pack(2, 2, 0, 1, 1, 0, 1) + struct.pack("<Bq", 0, 1) + b"\0\0\0\0"
        for offset in (4000, 2**40):
            head = HEAD.pack(1, 0, 1, 1, len(job.job_id)) + job.job_id.encode() + \
                ARRAY.pack(10, 1, 1, 0, offset) + struct.pack("<Q", 1000) + record
            s.send(b"D" + struct.pack("<I", len(head)) + head)
        s.send(b"D\x01")
        wait_for(lambda: "truncated" in dr.err(server), 20, "the server to read the rogue's datagrams", describe=dr.describe, poll=dr.poll)
        s.close()
        out.close()
        assert dr.wait(job.procs, time.monotonic() + 60), dr.describe()
        assert [p.popen.returncode for p in job.procs] == [0] * 4, dr.describe()
        assert all("DONE 400" in dr.out(w) for w in job.workers), dr.describe()
        err = dr.err(server)
        assert err.count("refused a same-host connection") == 4, err
        assert err.count("lie outside segment 0") == 2, err
        assert "worker 1 (pid" in err, err
    finally:
        dr.finish()
    assert_none_left(job)
