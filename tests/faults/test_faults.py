"""Faults against real psnode jobs on 127.0.0.1: kill -9 and SIGSTOP of every role, a member dying
during a barrier or a sync round, duplicated messages, fuzzed frames at every port.

Heartbeats every 0.2 s, liveness 5: a silent node is dead after 1 s.  Every test is bounded by
deadlines and ends by checking that no process of the job is left (zombies count as dead).
The partition test (network namespaces) is in test_partition.py.
"""
from __future__ import annotations

import os
import re
import signal
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import zmq

from psnode.protocol import (
    DATA_VERSION,
    VERSION,
    Command,
    Flush,
    GetStates,
    Init,
    LoadStates,
    Message,
    Pull,
    Push,
    PushPull,
    SetOptimizer,
    encode,
)
from psnode.scheduler import client as control
from psnode.worker.ioloop import EXIT_GRACE  # a worker outside psnode exits by itself within it
from tests.support import wait_for
from tests.support.cluster import start_job
from tests.support.faults import (
    DEAD_AFTER,
    FAST_ENV,
    TRAIN,
    assert_none_left,
    header,
    listen_ports,
    markers,
)

BOUND = DEAD_AFTER + 5   # the bound: the heartbeat timeout plus a few seconds

@contextmanager
def job_ctx(tmp_path: Path, mode: str, workers: int = 2, servers: int = 2, env: dict | None = None):
    job = start_job(TRAIN, workers, servers, env={**FAST_ENV, "FAULT_DIR": str(tmp_path), **(env or {})},
                    args=[mode], tmp=tmp_path)
    dr = job.drained
    try:
        yield job, dr
    finally:
        dr.finish()


def proc(job, role: str, rank: int):
    return next(p for p in job.procs if p.role == role and p.rank == rank)


def silent_re(name: str) -> str:
    return re.escape(name) + r" stopped responding \(\d+\.\d s without a heartbeat\)"


def inject(tmp_path: Path, victim_role: str, victim_rank: int, sig: int, mode: str = "forever",
           bound: float = BOUND):
    """Start a 2x2 job, wait until it trains, send ``sig`` to the victim, wait for the others."""
    ctx = job_ctx(tmp_path, mode)
    job, dr = ctx.__enter__()
    try:
        wait_for(lambda: markers(tmp_path, "ready", 2), 40, "training to start", describe=dr.describe, poll=dr.poll)
        victim = proc(job, victim_role, victim_rank)
        others = [p for p in job.procs if p is not victim]
        dr.poll()
        assert not dr.exited, "a process exited before the fault:\n" + dr.describe()
        t0 = time.monotonic()
        os.kill(victim.popen.pid, sig)
        all_out = dr.wait(others, t0 + bound)
        late = [f"{p.role} {p.rank}" for p in others if p.popen.pid not in dr.exited]
        assert all_out, f"still running {bound:g} s after the fault: {late}\n" + dr.describe()
        for p in others:
            took = dr.exited[p.popen.pid] - t0
            assert p.popen.returncode != 0, f"{p.role} {p.rank} exited 0 after the fault\n" + dr.describe()
            assert took <= bound, (p.role, p.rank, took)
        return ctx, job, dr, victim, others
    except BaseException:
        ctx.__exit__(None, None, None)
        raise


# --------------------------------------------------------------------------- kill -9

def test_kill9_worker_mid_training(tmp_path: Path) -> None:
    ctx, job, dr, victim, others = inject(tmp_path, "worker", 1, signal.SIGKILL)
    try:
        name = f"worker 1 on 127.0.0.1 (pid {victim.popen.pid})"
        w0 = proc(job, "worker", 0)
        assert w0.popen.returncode == 5, "worker 0 should raise PeerLost in its pull\n" + dr.describe()
        for p in others:
            assert re.search(silent_re(name), dr.err(p)), f"{p.role} {p.rank} does not name {name}\n" + dr.describe()
    finally:
        ctx.__exit__(None, None, None)
    assert_none_left(job)


def test_kill9_server_mid_training(tmp_path: Path) -> None:
    ctx, job, dr, victim, others = inject(tmp_path, "server", 1, signal.SIGKILL)
    try:
        name = f"server 1 on 127.0.0.1 (pid {victim.popen.pid})"
        for w in job.workers:
            assert w.popen.returncode == 5, dr.describe()
        for p in others:
            assert re.search(silent_re(name), dr.err(p)), f"{p.role} {p.rank} does not name {name}\n" + dr.describe()
    finally:
        ctx.__exit__(None, None, None)
    assert_none_left(job)


def test_kill9_scheduler_mid_training(tmp_path: Path) -> None:
    ctx, job, dr, victim, others = inject(tmp_path, "scheduler", 0, signal.SIGKILL)
    try:
        for w in job.workers:
            assert w.popen.returncode == 5, dr.describe()
        for p in others:
            assert re.search(r"the scheduler \(pid \d+\) at 127\.0\.0\.1:\d+ stopped responding \(\d+\.\d s without",
                             dr.err(p)), f"{p.role} {p.rank}: no clear error\n" + dr.describe()
        # the error names the dead node's pid too (the scheduler's is not known to nodes)
        for p in others:
            assert f"pid {victim.popen.pid}" in dr.err(p), \
                f"{p.role} {p.rank}: the scheduler's pid is not named:\n{dr.err(p)}"
    finally:
        ctx.__exit__(None, None, None)
    assert_none_left(job)


# --------------------------------------------------------------------------- SIGSTOP

@pytest.mark.parametrize("role", ["worker", "server"])
def test_sigstop(tmp_path: Path, role: str) -> None:
    """A stopped process keeps its sockets open: only heartbeats can tell.  Once resumed
    (the job gone), the stopped process must also exit by itself."""
    ctx, job, dr, victim, others = inject(tmp_path, role, 1, signal.SIGSTOP)
    try:
        name = f"{role} 1 on 127.0.0.1 (pid {victim.popen.pid})"
        for p in others:
            assert re.search(silent_re(name), dr.err(p)), f"{p.role} {p.rank} does not name {name}\n" + dr.describe()
        assert victim.popen.poll() is None
        t0 = time.monotonic()
        os.kill(victim.popen.pid, signal.SIGCONT)
        resumed_out = dr.wait([victim], t0 + DEAD_AFTER + EXIT_GRACE + 3)
        assert resumed_out, f"the resumed {role} did not exit by itself\n" + dr.describe()
        assert victim.popen.returncode != 0
    finally:
        ctx.__exit__(None, None, None)   # SIGKILLs the victim if it is still there
    assert_none_left(job)


# --------------------------------------------------------------------------- blocked calls

def test_worker_blocked_in_barrier_gets_peerlost(tmp_path: Path) -> None:
    ctx, job, dr, victim, others = inject(tmp_path, "worker", 1, signal.SIGKILL, mode="barrier")
    try:
        w0 = proc(job, "worker", 0)
        assert w0.popen.returncode == 5, "barrier() did not raise PeerLost\n" + dr.describe()
        assert "BARRIER RETURNED" not in dr.out(w0)
        assert re.search(silent_re(f"worker 1 on 127.0.0.1 (pid {victim.popen.pid})"), dr.err(w0)), dr.describe()
    finally:
        ctx.__exit__(None, None, None)
    assert_none_left(job)


def test_worker_in_user_code_exits_by_itself(tmp_path: Path) -> None:
    """Worker 0 is in a long computation outside psnode when worker 1 dies: it cannot raise
    there, so psnode must end the process within EXIT_GRACE."""
    ctx, job, dr, victim, others = inject(tmp_path, "worker", 1, signal.SIGKILL, mode="compute",
                                          bound=BOUND + EXIT_GRACE)
    try:
        w0 = proc(job, "worker", 0)
        assert w0.popen.returncode == 1, dr.describe()
        assert "exiting: the job failed" in dr.err(w0), dr.describe()
        assert f"pid {victim.popen.pid}" in dr.err(w0), dr.describe()
    finally:
        ctx.__exit__(None, None, None)
    assert_none_left(job)


FAIL_SCRIPT = """
import sys, time
import numpy as np, psnode
kv = psnode.kv.create('dist_sync')
kv.init('a', np.zeros(10, np.float32))
for step in range(1, 10**6):
    kv.push('a', np.ones(10, np.float32))
    kv.pull('a')
    if kv.rank == 1 and step == 5:
        raise RuntimeError("boom in user code")
    time.sleep(0.01)
"""


def test_worker_exception_fails_the_job(tmp_path: Path) -> None:
    """Worker 1 dies of an uncaught exception (exit 1).  In dist_sync this is a dead worker:
    the others must fail with an error naming it, not train on alone as if it had finished."""
    job = start_job(FAIL_SCRIPT, 2, 1, env=FAST_ENV, tmp=tmp_path)
    dr = job.drained
    try:
        w1 = proc(job, "worker", 1)
        assert dr.wait([w1], time.monotonic() + 40), dr.describe()
        assert w1.popen.returncode == 1 and "boom" in dr.err(w1), dr.describe()
        others = [p for p in job.procs if p is not w1]
        ended = dr.wait(others, dr.exited[w1.popen.pid] + BOUND)
        assert ended, "the job goes on after worker 1 failed:\n" + dr.describe()
        for p in others:
            assert p.popen.returncode != 0, f"{p.role} {p.rank} exited 0\n" + dr.describe()
            assert "worker 1" in dr.err(p), dr.describe()
    finally:
        dr.finish()
    assert_none_left(job)


# --------------------------------------------------------------------------- duplicates

DUP_PRELUDE = """
import copy
import numpy as np
import psnode.net.transport as T
_send = T.Channel.send
_last = {}
def _dup(self, cmd, body=None, arrays=None, to=None, track=False, ops=None):
    # every message a worker sends goes out twice; DATA messages are also replayed late
    # (after the next one), i.e. stale duplicates of earlier pushes/pulls/inits
    prev = _last.get(id(self))
    got = _send(self, cmd, body, arrays, to, track, ops)
    _send(self, cmd, body, arrays, to, False, ops)
    if prev is not None:
        _send(self, *prev)
    if getattr(cmd, 'value', cmd) == 'data':   # (typed ops: a deep copy keeps their arrays)
        _last[id(self)] = (cmd, body, [np.array(a, copy=True) for a in (arrays or [])], to, False,
                           copy.deepcopy(ops))
    return got
T.Channel.send = _dup
"""

DUP_SCRIPT = DUP_PRELUDE + """
import os, sys, time
from pathlib import Path
import psnode
D = Path(os.environ["FAULT_DIR"])
kind = sys.argv[1]
kv = psnode.kv.create(kind, aggregator='sum')
r, W = kv.rank, kv.num_workers
STEPS = 20
if kind == 'dist_async':
    kv.set_optimizer(psnode.optimizer.create('sgd', learning_rate=1.0))
for k in ('a', 'b'):
    kv.init(k, np.zeros(64, np.float32))
for step in range(1, STEPS + 1):
    for k in ('a', 'b'):
        kv.push(k, np.full(64, (r + 1) * step, np.float32))
    if kind == 'dist_sync':
        for k in ('a', 'b'):
            got = kv.pull(k)
            want = np.full(64, sum(range(1, W + 1)) * step, np.float32)
            if not np.array_equal(got, want):
                print(f"MISMATCH step {step} {k}: {got[:3]} want {want[:3]}", flush=True); sys.exit(3)
kv.barrier()
if kind == 'dist_async':
    want = -np.full(64, sum(range(1, W + 1)) * sum(range(1, STEPS + 1)), np.float32)
    for k in ('a', 'b'):
        got = kv.pull(k)
        if not np.array_equal(got, want):
            print(f"MISMATCH async {k}: {got[:3]} want {want[:3]}", flush=True); sys.exit(3)
(D / f"ready.{r}").touch()
deadline = time.monotonic() + 20
while not (D / "go").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
kv.close()
print("DONE", flush=True)
"""


@pytest.mark.parametrize("kind", ["dist_sync", "dist_async"])
def test_duplicated_messages_applied_once(tmp_path: Path, kind: str) -> None:
    # PSNODE_SHM=0: the duplicates are made by a stand-in for the TCP channel's send
    env = {**FAST_ENV, "FAULT_DIR": str(tmp_path), "PSNODE_SHM": "0"}
    job = start_job(DUP_SCRIPT, 2, 2, env=env, args=[kind], tmp=tmp_path)
    dr = job.drained
    try:
        wait_for(lambda: markers(tmp_path, "ready", 2) or dr.exited, 60, "workers to check values", describe=dr.describe, poll=dr.poll)
        assert markers(tmp_path, "ready", 2), "a worker failed:\n" + dr.describe()
        sched = proc(job, "scheduler", 0)
        addr = f"127.0.0.1:{listen_ports(sched.popen.pid)[0]}"
        want = 2 * 2 * 20   # workers x keys x steps: the pushes the servers should count

        def pushes():
            rows = control.status(addr, job.job_id).to_body()["nodes"]
            return sum(row["pushes"] for row in rows if row["role"] == "server")
        # heartbeats carry the counters; wait (bounded) until they are up to date
        wait_for(lambda: pushes() >= want, 5, "server push counters", describe=dr.describe, poll=dr.poll)
        time.sleep(3 * 0.2)   # three more heartbeats: a counter above `want` would show now
        assert pushes() == want, "duplicated pushes were counted (applied?) more than once"
        (tmp_path / "go").touch()
        assert dr.wait(job.procs, time.monotonic() + 20), dr.describe()
        assert [p.popen.returncode for p in job.procs] == [0] * len(job.procs), dr.describe()
    finally:
        dr.finish()
    assert_none_left(job)


# --------------------------------------------------------------------------- fuzzed frames

def wire_corpus(job_id: str) -> list[list[bytes]]:
    """Malformed frames: every one must be dropped (logged, counted), never fatal."""
    rng = np.random.default_rng(6)
    rnd = lambda n: rng.integers(0, 256, n, dtype=np.uint8).tobytes()
    h = lambda **kw: header(kw.pop("c", "data"), kw.pop("j", job_id), **kw)
    return [
        [rnd(1)], [rnd(64)], [rnd(8), rnd(300), rnd(40)],                 # random bytes
        [b"PSN0", h(body={"ops": []})], [b"", h()], [rnd(4096), h()],        # wrong version
        [VERSION, b"\xff\xfe not json"], [VERSION, b"[1, 2]"], [VERSION, b"null"],
        [VERSION, h(c="no-such-command")],
        [VERSION, header("data", "some-other-job", body={"ops": []})],       # other job id
        [VERSION, b'{"c": "data", "j": 7, "s": [], "b": 1, "a": []}'],       # wrong types
        [VERSION],                                                           # truncated multipart
        [VERSION, h(arrays=[["float32", [4]]])],                              # declared, frame missing
        [VERSION, h(arrays=[["float32", [4]], ["float32", [4]]]), b"\0" * 16],
        [VERSION, h(), b"\0" * 16],                                          # frame not declared
        [VERSION, h(arrays=[["float32", [2**40]]]), b"\0" * 16],              # huge declared shapes
        [VERSION, h(arrays=[["float64", [2**31, 2**31]]]), b"\0" * 8],
        [VERSION, h(arrays=[["float32", [0, 10**30]]]), b""],                 # zero size, absurd dim
        [VERSION, h(arrays=[["float32", [0, 2**40, 2**40]]]), b""],
        [VERSION, h(arrays=[["float32", [-1]]]), b"\0" * 4],                  # wrong arrays
        [VERSION, h(arrays=[["float32", [1.5]]]), b"\0" * 4],
        [VERSION, h(arrays=[["float32", [True]]]), b"\0" * 4],
        [VERSION, h(arrays=[["object", [1]]]), b"\0" * 8],
        [VERSION, h(arrays=[["float32", [3]]]), b"\0" * 11],
        [VERSION, h(arrays=[["float32", [1] * 40]]), b"\0" * 4],
        [VERSION, h(arrays=[["float32"]]), b"\0" * 4],
        [VERSION, h(arrays=["float32"]), b"\0" * 4],
        [VERSION, b"[" * 100_000],                                           # deep JSON
        [VERSION, b'{"c": "data", "b": ' + b"{\"x\": " * 50_000],
        [DATA_VERSION, rnd(3)], [DATA_VERSION, rnd(300)], [DATA_VERSION, rnd(40), rnd(4096)],   # binary data
        [DATA_VERSION, b"\x01\x00\x01\x00\x00\x00" + bytes([len(job_id)]) + job_id.encode() + rnd(30)],
    ]


def _data(job_id: str, *ops) -> list[bytes]:
    return [f if isinstance(f, bytes) else bytes(memoryview(f))
            for f in encode(Message(Command.DATA, job_id, "fuzz", ops=list(ops)))]


def ops_corpus(job_id: str) -> list[list[bytes]]:
    """Well-formed data messages (sent as worker rank 7 of a 2-worker job) carrying operations
    that do not fit the job's keys (binary data encoding, psnode.protocol)."""
    f32 = np.zeros(1000, np.float32)
    d = lambda *ops: _data(job_id, *ops)  # noqa: E731
    return [
        d(Pull("missing", 0, 0, id=1)), d(Push("missing", 0, 1, f32, id=2)),
        d(Push("a", 0, 1, f32.astype(np.float64), id=3)),                       # wrong dtype
        d(Push("a", 0, 1, f32, np.arange(1000), id=4)),                          # rows of a dense key
        d(Pull("a", 9, 0, id=5)), d(Init("a", 0, "float32", (7,), id=6)),        # no such part, shape
        d(SetOptimizer({"name": "no-such-optimizer"}, id=7)), d(SetOptimizer({"spec": "rm -rf /"}, id=8)),
        d(LoadStates([("a", 0, "mom")], [f32], id=9)), d(GetStates(id=10)),
        d(Flush([("a", 0, [1, 2])], id=11)), d(Flush([("a", 0, [5])], id=12, durable=False)),
        d(PushPull("a", 0, 1, f32, id=13), Push("a", 0, 10**9, f32, id=14)),
    ]


def bad_bodies() -> list[tuple[Command, dict]]:
    """Control bodies that do not decode: each field of a well-formed body of every command
    (psnode.protocol.control) replaced by a value of the wrong type or range."""
    from psnode.errors import ProtocolError
    from psnode.protocol.control import (
        Barrier,
        BarrierDone,
        Beats,
        BeatsAck,
        Bye,
        Counters,
        Heartbeat,
        JobEnd,
        Membership,
        Register,
        ServerAddress,
        Servers,
        StatusAnswer,
        Stop,
        Welcome,
        decode_body,
    )
    book = (ServerAddress(0, "127.0.0.1", 4000),)
    samples = [(Command.REGISTER, Register("worker", "127.0.0.1", 0, 1, 1)),
               (Command.WELCOME, Welcome(0, book, 1, 2, 1, (0, 1))), (Command.HEARTBEAT, Heartbeat(Counters(pushes=1))),
               (Command.BARRIER, Barrier(1)), (Command.BARRIER_DONE, BarrierDone(1)),
               (Command.MEMBERSHIP, Membership((0,))), (Command.SERVERS, Servers(down=0)),
               (Command.SERVERS, Servers(restored=0, servers=book)), (Command.SHUTDOWN, JobEnd(True, "x")),
               (Command.PEER_LOST, JobEnd(False, "x")), (Command.BYE, Bye(error="x")), (Command.STOP, Stop("x")),
               (Command.STATUS_REPLY, StatusAnswer("j", 1.0, True, 0)),
               (Command.HEARTBEATS, Beats(1, ((b"n0", Counters(pushes=1)),))), (Command.HEARTBEATS_ACK, BeatsAck(1))]
    out = [(Command.HEARTBEATS, {"n": 1, "beats": beats}) for beats in (   # a batch with one bad entry
        [["n0", {"pushes": 1}], "n0"], [["n0", {"pushes": 1}], []], [[5, {}]], [["", {}]], [["n0", []]],
        [["n0", {"pushes": -1}]], [["n\u00e9", {}]], [["n0", {}, 1]], [["x" * 256, {}]], [["n0", {}]] * 4097)]
    for cmd, body in samples:
        wire = body.to_body()
        for name in wire:
            for value in ("x", -1, 1.5, [None], {"a": 1}):
                bad = {**wire, name: value}
                try:
                    decode_body(cmd, bad)
                except ProtocolError:
                    out.append((cmd, bad))
    return out


def sched_corpus(job_id: str) -> list[list[bytes]]:
    """Frames to the scheduler from a peer that is not a node of the job: valid ones, and
    malformed control bodies (:func:`bad_bodies`)."""
    h = lambda c, b=None: [VERSION, header(c, job_id, b)]
    return [
        h("heartbeat", {"stats": {"pushes": 10**9}}), h("heartbeat", {"stats": {"wait": {"what": "barrier"}}}),
        h("barrier"), h("finish"), h("bye", {"error": "x"}),
        h("heartbeat_ack"), h("welcome", {"rank": 0}), h("peer_lost", {"reason": "fake"}),
        h("register", {"role": "worker", "host": "127.0.0.1", "port": 0, "pid": 1, "rank": 1}),
        h("register", {"role": "nobody"}), h("register", {"role": ["worker"]}),
        h("register", {"role": "server", "port": "x", "pid": 1}),
        h("register", {"role": "worker", "port": None, "pid": {"a": 1}, "host": 5}),
        *(h(cmd.value, body) for cmd, body in bad_bodies()),
    ]


def send_all(addr: str, identity: bytes, messages: list[list[bytes]]) -> list[list[bytes]]:
    """Send ``messages`` from a raw DEALER; return the replies that arrive within 1 s."""
    ctx = zmq.Context()
    try:
        s = ctx.socket(zmq.DEALER)
        s.linger = 2000
        s.identity = identity
        s.connect(f"tcp://{addr}")
        for m in messages:
            s.send_multipart(m)
        replies, deadline = [], time.monotonic() + 1.0
        while (left := deadline - time.monotonic()) > 0:
            if s.poll(int(left * 1000)):
                replies.append(s.recv_multipart())
        s.close(linger=2000)
        return replies
    finally:
        ctx.term()


def _ports(job) -> dict[str, str]:
    out = {}
    for p in job.by_role("server") + job.by_role("scheduler"):
        ports = listen_ports(p.popen.pid)
        assert len(ports) == 1, (p.role, p.rank, ports)
        out[f"{p.role} {p.rank}"] = f"127.0.0.1:{ports[0]}"
    return out


def _finishes_exactly(job, dr) -> None:
    finished = dr.wait(job.procs, time.monotonic() + 60)
    assert finished, "the job did not finish after the fuzzing\n" + dr.describe()
    codes = {f"{p.role} {p.rank}": p.popen.returncode for p in job.procs}
    assert all(c == 0 for c in codes.values()), f"{codes}\n" + dr.describe()
    for w in job.workers:
        assert "DONE 150" in dr.out(w), dr.describe()


def test_fuzzed_frames_every_port(tmp_path: Path) -> None:
    """Malformed frames at each server's port and the scheduler's while a valid job trains:
    every one is dropped and logged, and the job completes with exact values."""
    with job_ctx(tmp_path, "steps:1500") as (job, dr):
        wait_for(lambda: markers(tmp_path, "ready", 2), 40, "training to start", describe=dr.describe, poll=dr.poll)
        wire = wire_corpus(job.job_id)
        # the scheduler first: each send_all waits for replies, and the job must still run
        for name, addr in sorted(_ports(job).items(), key=lambda item: item[0] != "scheduler 0"):
            send_all(addr, b"fuzz-" + name.replace(" ", "").encode(), wire)
        _finishes_exactly(job, dr)
        for p in job.by_role("server") + job.by_role("scheduler"):
            n = dr.err(p).count("dropped a message")
            assert n >= len(wire) - 3, f"{p.role} {p.rank} logged {n} drops of {len(wire)}"
    assert_none_left(job)


def test_bad_operations_at_servers(tmp_path: Path) -> None:
    """Well-formed frames with bad operations from a rank outside the job: dropped (not
    answered, never fatal); the bad operations themselves are answered with errors in
    tests/unit/test_core_pure.py::test_bad_operations_are_answered_not_raised."""
    with job_ctx(tmp_path, "steps:150") as (job, dr):
        wait_for(lambda: markers(tmp_path, "ready", 2), 40, "training to start", describe=dr.describe, poll=dr.poll)
        corpus = ops_corpus(job.job_id)
        for name, addr in _ports(job).items():
            if name.startswith("server"):
                assert send_all(addr, b"w7", corpus) == [], f"{name} answered a non-member"
        _finishes_exactly(job, dr)
        for p in job.by_role("server"):
            assert dr.err(p).count("no such worker") == len(corpus), dr.describe()
    assert_none_left(job)


def test_bad_messages_at_scheduler(tmp_path: Path) -> None:
    """Well-formed frames from a peer that is not a node of the job (fake heartbeats,
    barriers, late or malformed registrations) never end or corrupt the job."""
    with job_ctx(tmp_path, "steps:150") as (job, dr):
        wait_for(lambda: markers(tmp_path, "ready", 2), 40, "training to start", describe=dr.describe, poll=dr.poll)
        send_all(_ports(job)["scheduler 0"], b"fuzz-s", sched_corpus(job.job_id))
        _finishes_exactly(job, dr)
    assert_none_left(job)


def test_push_from_rank_outside_the_job_is_refused(tmp_path: Path) -> None:
    """A well-formed push from routing identity w7 (the job has workers 0 and 1) must not
    join the sync rounds of the real workers."""
    with job_ctx(tmp_path, "steps:150", servers=1) as (job, dr):
        wait_for(lambda: markers(tmp_path, "ready", 2), 40, "training to start", describe=dr.describe, poll=dr.poll)
        port = listen_ports(proc(job, "server", 0).popen.pid)[0]
        f32 = np.full(1000, 100, np.float32)
        msgs = [_data(job.job_id, Push(k, 0, q, f32, id=q)) for q in range(1, 160) for k in ("a", "b")]
        send_all(f"127.0.0.1:{port}", b"w7", msgs)
        assert dr.wait(job.procs, time.monotonic() + 60), dr.describe()
        codes = [p.popen.returncode for p in job.procs]
        assert codes == [0] * len(codes), dr.describe()
    assert_none_left(job)


# --------------------------------------------------------------------------- pinpoints (no jobs)

def test_decode_raises_only_protocol_error() -> None:
    """Receivers catch ProtocolError only: any other exception from decode() kills the role."""
    from psnode.errors import ProtocolError
    from psnode.protocol import decode
    bad = []
    for frames in wire_corpus("J"):
        try:
            decode(frames, "J", 4 * 2**30)
        except ProtocolError:
            continue
        except Exception as exc:
            bad.append(f"{frames[1][:60] if len(frames) > 1 else frames!r}: {type(exc).__name__}: {exc}")
    assert not bad, "decode() raised other than ProtocolError:\n" + "\n".join(bad)


def test_scheduler_survives_bad_register_bodies() -> None:
    from psnode.config import NodeConfig, Role
    from psnode.protocol import Command, Message
    from psnode.scheduler.loop import Scheduler
    from tests.support.cluster import free_port
    cfg = NodeConfig(role=Role.SCHEDULER, scheduler_host="127.0.0.1", scheduler_port=free_port(),
                     num_workers=1, num_servers=1, job_id="jreg", host="127.0.0.1")
    s = Scheduler(cfg)
    bad = []
    try:
        for i, body in enumerate([{"role": "server", "port": "x", "pid": 1},
                                  {"role": "worker", "port": None, "pid": {"a": 1}, "host": 5},
                                  {"role": "worker", "port": 1, "pid": 1, "rank": True}]):
            try:
                s._dispatch(f"bad{i}".encode(), Message(Command.REGISTER, "jreg", "x", body))
            except Exception as exc:
                bad.append(f"{body}: {type(exc).__name__}: {exc}")
    finally:
        s.t.close()
    assert not bad, "a REGISTER body crashed the scheduler:\n" + "\n".join(bad)


def test_scheduler_survives_bad_bodies_of_every_command() -> None:
    """Malformed bodies of every control command from a registered node are dropped: nothing
    raised, nothing changed, and the node's next heartbeat is taken."""
    from psnode.config import NodeConfig, Role
    from psnode.protocol import Message
    from psnode.protocol.control import Register
    from psnode.protocol.status import NodeState
    from psnode.scheduler.loop import Scheduler
    from tests.support.cluster import free_port
    cfg = NodeConfig(role=Role.SCHEDULER, scheduler_host="127.0.0.1", scheduler_port=free_port(),
                     num_workers=2, num_servers=1, job_id="jbad", host="127.0.0.1")
    s = Scheduler(cfg)
    bad = []
    try:
        s._dispatch(b"n0", Message(Command.REGISTER, "jbad", "x", Register("worker", "127.0.0.1", 0, 1, 0).to_body()))
        corpus = bad_bodies()
        assert len(corpus) > 50
        for cmd, body in corpus:
            try:
                s._dispatch(b"n0", Message(cmd, "jbad", "x", body))
            except Exception as exc:  # noqa: BLE001 - what the test looks for
                bad.append(f"{cmd.value} {body}: {type(exc).__name__}: {exc}")
        node = s.nodes[b"n0"]
        assert (node.state, s.exit_code, s.ending, s.barrier, node.stats.pushes) == (NodeState.REGISTERED, None,
                                                                                    None, {}, 0)
        s._dispatch(b"n0", Message(Command.HEARTBEAT, "jbad", "x", {"stats": {"pushes": 7}}))
        assert node.stats.pushes == 7
    finally:
        s.t.close()
    assert not bad, "a control body crashed the scheduler:\n" + "\n".join(bad)


def test_scheduler_takes_a_relayed_batch_as_each_nodes_heartbeat() -> None:
    """A host's relay (psnode.net.relay) sends HEARTBEATS: each entry is its node's HEARTBEAT
    (counters taken, the node seen), an entry of a node the scheduler does not know is dropped
    as that node's own heartbeat would be, and the relay gets one answer naming the batch."""
    from psnode.config import NodeConfig, Role
    from psnode.protocol import Message
    from psnode.protocol.control import Beats, Counters, Register
    from psnode.scheduler.loop import Scheduler
    from tests.support.cluster import free_port
    cfg = NodeConfig(role=Role.SCHEDULER, scheduler_host="127.0.0.1", scheduler_port=free_port(),
                     num_workers=2, num_servers=1, job_id="jrel", host="127.0.0.1")
    s = Scheduler(cfg)
    sent: list[tuple[object, object, object]] = []
    real_send = s.chan.send
    s.chan.send = lambda cmd, body=None, arrays=None, to=None, **kw: sent.append((cmd, body, to))  # type: ignore
    try:
        for i in range(2):
            s._dispatch(f"n{i}".encode(), Message(Command.REGISTER, "jrel", "x",
                                                  Register("worker", "127.0.0.1", 0, 1 + i, i).to_body()))
        s.nodes[b"n0"].last_seen = s.nodes[b"n1"].last_seen = 0.0
        batch = Beats(7, ((b"n0", Counters(pushes=3)), (b"n1", Counters(pushes=4)), (b"who", Counters(pushes=5))))
        s._dispatch(b"relay-1", Message(Command.HEARTBEATS, "jrel", "x", batch.to_body()))
        assert (s.nodes[b"n0"].stats.pushes, s.nodes[b"n1"].stats.pushes, b"who" in s.nodes) == (3, 4, False)
        assert s.nodes[b"n0"].last_seen > 0 and s.nodes[b"n1"].last_seen > 0
        assert sent == [(Command.HEARTBEATS_ACK, {"n": 7, "unknown": ["who"]}, b"relay-1")], sent
        assert s.relayed == 3
    finally:
        s.chan.send = real_send  # type: ignore[method-assign]
        s.t.close()
