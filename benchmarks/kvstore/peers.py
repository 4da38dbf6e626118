"""The peers, on the same workload: raw pyzmq request/reply, torch gloo all_reduce, and a bare PS.

python -m benchmarks.kvstore.peers zmq-server <port>
python -m benchmarks.kvstore.peers zmq-client <port> <cases-json> <quick>
python -m benchmarks.kvstore.peers gloo <rank> <world> <port> <cases-json> <quick> <t0>
python -m benchmarks.kvstore.peers bare-server <port> <W>
python -m benchmarks.kvstore.peers bare-worker <rank> <W> <port,port,...> <cases-json> <quick>

zmq: one DEALER (client) and one ROUTER (server) over tcp://127.0.0.1; the server echoes every
request frame back (zero-copy).  A round sends the K requests of B bytes (K in flight) and
receives the K replies: 2*K*B bytes per round, the same accounting as a psnode push+pull.
gloo: a round is K all_reduce(SUM) calls issued async (K in flight), then waited for.
bare PS: the smallest parameter server on pyzmq + numpy, no framework, W workers and S servers
placed like psnode (see bare_parts); a round is a fused push+pull of every key part: the server
averages the W pushes of a part and replies the average to each worker.  It is what any Python
PS over ZeroMQ TCP can reach here, so a ceiling for psnode's copy-bound (big key) cases; it does
not fuse small keys into one message, so it is no ceiling for many small keys.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

T_START = time.time()

import numpy as np  # noqa: E402

from benchmarks.cases import (  # noqa: E402
    SPARSE_COLS,
    SPARSE_FRACTION,
    SPARSE_ROWS,
    Case,
    KiB,
    decode_cases,
    fail,
    leave_gloo,
    report,
    summarize,
)
from psnode.worker.placement import split_ranges  # noqa: E402  (psnode's placement rule)


def _shape(c: Case) -> tuple[int, ...]:
    return (SPARSE_ROWS, SPARSE_COLS) if c.name == "densetable" else (c.elems,)


def zmq_server(port: int) -> None:
    import zmq
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.linger = 0
    sock.bind(f"tcp://127.0.0.1:{port}")
    while True:
        frames = sock.recv_multipart(copy=False)
        if len(frames) == 3 and len(frames[2]) == 4 and frames[2].bytes == b"QUIT":
            sock.send_multipart([frames[0], b"BYE"])
            break
        sock.send_multipart(frames, copy=False)
    sock.close()
    ctx.term()


def zmq_client(port: int, cases_json: str, quick: bool) -> None:
    import zmq
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(f"tcp://127.0.0.1:{port}")
    for c in decode_cases(cases_json):
        if c.kind != "dense":
            continue
        grads = [np.full(_shape(c), 1, np.float32) for _ in range(c.keys)]
        sock.send_multipart([b"%d" % 0, grads[0]], copy=False)     # connect + check round
        back = np.frombuffer(sock.recv_multipart(copy=False)[1].buffer, np.float32)
        if not (back == 1).all():
            fail(f"zmq {c.name}: echo differs")
        times = []
        for i in range(c.warm(quick) + c.timed(quick)):
            t0 = time.perf_counter()
            for k, g in enumerate(grads):
                sock.send_multipart([b"%d" % k, g], copy=False)
            for _ in grads:
                np.frombuffer(sock.recv_multipart(copy=False)[1].buffer, np.float32)
            t1 = time.perf_counter()
            if i >= c.warm(quick):
                times.append(t1 - t0)
        report(system="zmq", case=c.name, rank=0, bytes=2 * c.keys * c.nbytes, **summarize(times))
    sock.send_multipart([b"q", b"QUIT"])
    sock.recv_multipart()
    sock.close()
    ctx.term()


def gloo(rank: int, world: int, port: int, cases_json: str, quick: bool, t0_launch: float) -> None:
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    first = torch.full((1024,), float(rank + 1))                  # launch to first all_reduce
    dist.all_reduce(first)
    report(system="gloo", case="launch", rank=rank, wall=time.time() - t0_launch,
           interp=T_START - t0_launch)
    for c in decode_cases(cases_json):
        if c.kind != "dense":
            continue
        ts = [torch.full(_shape(c), float(rank + 1)) for _ in range(c.keys)]
        for w in [dist.all_reduce(t, async_op=True) for t in ts]:  # check round (average)
            w.wait()
        expect = (world + 1) / 2
        for t in ts:
            t.div_(world)
            if not bool((t == expect).all()):
                fail(f"gloo {c.name}: got {t.reshape(-1)[:4]}, expected {expect}")
        dist.barrier()
        times = []
        for i in range(c.warm(quick) + c.timed(quick)):
            t0 = time.perf_counter()
            for w in [dist.all_reduce(t, async_op=True) for t in ts]:
                w.wait()
            t1 = time.perf_counter()
            if i >= c.warm(quick):
                times.append(t1 - t0)
        dist.barrier()
        report(system="gloo", case=c.name, rank=rank, bytes=2 * c.keys * c.nbytes, **summarize(times))
    leave_gloo(dist)


# ---------------------------------------------------------------- bare PS
BIG_ARRAY_BOUND = 1_000_000   # elements: psnode's default big_array_bound (psnode/config.py)
ZERO_COPY_BYTES = 64 * KiB    # frames this big or bigger are sent zero-copy, smaller ones copied
IDLE_SECONDS = 60.0           # a bare node that hears nothing for this long fails
QUIT_LINGER_MS = 10_000       # a worker's QUIT may take this long to leave before its socket closes


@dataclass(frozen=True)
class BarePart:
    """Elements [lo, hi) of key ``key`` of a case, held by server ``server``; ``pid`` names it on the wire."""
    pid: bytes
    key: int
    server: int
    lo: int
    hi: int


def bare_parts(case_index: int, c: Case, S: int) -> list[BarePart]:
    """Placement, psnode's rule: a key of more than BIG_ARRAY_BOUND elements is cut into S
    contiguous slices, slice i on server i; a smaller key lives whole on server key % S.
    Part ids start with the case index and a dot (``b"3.0.1"``): servers drop a case's
    accumulators when the next case starts."""
    n = c.elems
    out = []
    for k in range(c.keys):
        if n > BIG_ARRAY_BOUND and S > 1:
            out += [BarePart(b"%d.%d.%d" % (case_index, k, i), k, i, lo, hi)
                    for i, (lo, hi) in enumerate(split_ranges(n, S))]
        else:
            out.append(BarePart(b"%d.%d.0" % (case_index, k), k, k % S, 0, n))
    return out


def _poll_or_fail(poller, who: str) -> list:
    """poller.poll bounded by IDLE_SECONDS; fail() if nothing arrived."""
    ready = poller.poll(int(IDLE_SECONDS * 1000))
    if not ready:
        fail(f"{who}: nothing heard for {IDLE_SECONDS:.0f} s")
    return ready


def _receive(poller, who: str, count: int, handle) -> None:
    """Receive ``count`` replies [pid, data] from any of the sockets in ``poller`` and call
    ``handle(sock, pid, data)`` for each (bounded: fail() after IDLE_SECONDS of silence)."""
    import zmq
    while count:
        for sock, _ in _poll_or_fail(poller, who):
            while True:
                try:
                    pid, data = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                handle(sock, pid.bytes, data)
                count -= 1


@dataclass
class BareAccumulator:
    """The server side of one key part: two accumulators used in alternate rounds.

    Round r sums into ``bufs[r % 2]``, which is then sent zero-copy to the W workers.  Before a
    buffer is overwritten (round r + 2) the MessageTracker of its replies is waited for, so zmq
    never sends a buffer that is being changed.  (It is done by then anyway: a push of round
    r + 2 comes after every worker got its round r + 1 reply, hence its round r reply.)
    """
    bufs: list[np.ndarray]
    trackers: list = field(default_factory=lambda: [None, None])
    turn: int = 0
    idents: list[bytes] = field(default_factory=list)

    @classmethod
    def of(cls, n: int) -> BareAccumulator:
        return cls([np.empty(n, np.float32), np.empty(n, np.float32)])

    def add(self, ident: bytes, data: np.ndarray, who: str) -> None:
        """Add one worker's push to this round's sum (the first push is copied in)."""
        import zmq
        if ident in self.idents:
            fail(f"{who}: {ident!r} pushed twice in one round")
        buf = self.bufs[self.turn]
        if not self.idents:
            tracker = self.trackers[self.turn]
            if tracker is not None and not tracker.done:
                try:
                    tracker.wait(IDLE_SECONDS)
                except zmq.NotDone:
                    fail(f"{who}: replies of two rounds ago still unsent after {IDLE_SECONDS:.0f} s")
            np.copyto(buf, data)
        else:
            np.add(buf, data, out=buf)
        self.idents.append(ident)

    def reply(self, sock, pid: bytes, W: int) -> None:
        """Average this round's sum, send it to each pusher, and switch to the other buffer."""
        import zmq
        buf = self.bufs[self.turn]
        if W > 1:                      # (psnode skips it too: the average of one push is the push)
            buf *= 1 / W
        big = buf.nbytes >= ZERO_COPY_BYTES
        frame = zmq.Frame(buf, track=True) if big else buf   # one frame, shared by the W replies
        self.trackers[self.turn] = frame.tracker if big else None
        for ident in self.idents:
            sock.send(ident, zmq.SNDMORE)
            sock.send(pid, zmq.SNDMORE)
            sock.send(frame, copy=not big)
        del frame          # the tracker is done only once every reference to the frame is gone
        self.idents.clear()
        self.turn ^= 1


def bare_server(port: int, W: int) -> None:
    """ROUTER on ``port``.  Messages: [ident, pid, float32 data] a push of one key part of this
    round, [ident, pid, int64 row ids, float32 rows] a row_sparse push (rows of this server's
    part of the table, see BareSparse), [ident, b"QUIT"] that worker is done.  When the W
    pushes of a part are in, each of the W workers gets [pid, average].  Exits 0 when all W
    said QUIT; fails (exit 3) after IDLE_SECONDS of silence or on a malformed message."""
    import zmq
    who = f"bare-server :{port}"
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.linger = 0
    sock.bind(f"tcp://127.0.0.1:{port}")
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    parts: dict[bytes, BareAccumulator] = {}
    sparse: dict[bytes, BareSparse] = {}
    case = b""
    quit_from: set[bytes] = set()
    while len(quit_from) < W:
        _poll_or_fail(poller, who)
        frames = sock.recv_multipart(copy=False)
        ident = frames[0].bytes
        if len(frames) == 2 and frames[1].bytes == b"QUIT":
            quit_from.add(ident)
            continue
        if len(frames) == 4:            # a row_sparse push: [ident, pid, row ids, rows]
            pid = frames[1].bytes
            sp = sparse.get(pid)
            if sp is None:
                sp = sparse[pid] = BareSparse.of(pid)
            sp.add(ident, np.frombuffer(frames[2], np.int64), np.frombuffer(frames[3], np.float32), who)
            if len(sp.got) == W:
                sp.reply(sock, pid, W)
            continue
        if len(frames) != 3:
            fail(f"{who}: message of {len(frames)} frames from {ident!r}")
        pid = frames[1].bytes
        acc = parts.get(pid)
        if acc is None:
            prefix = pid.split(b".", 1)[0]
            if prefix != case:       # a new case: every push of the previous one is in
                parts.clear()
                case = prefix
            acc = parts[pid] = BareAccumulator.of(len(frames[2]) // 4)
        acc.add(ident, np.frombuffer(frames[2], np.float32), who)
        if len(acc.idents) == W:
            acc.reply(sock, pid, W)
    sock.close()
    ctx.term()


@dataclass
class BareSparse:
    """The server side of a row_sparse table part (``pid`` = b"<case>.s<rows>.<cols>").

    A round: each of the W workers pushes sorted unique row ids (local to this part) and their
    gradient rows; once all W are in, the rows are summed (rows missing from a push count as
    zero), averaged over W, written into the table (lazily: only those rows change), and each
    worker gets back the current values of the rows it pushed (its row_sparse_pull).
    Replies are copies (``value[ids]``), so nothing sent is ever overwritten.
    """
    value: np.ndarray
    got: list[tuple[bytes, np.ndarray, np.ndarray]] = field(default_factory=list)

    @classmethod
    def of(cls, pid: bytes) -> BareSparse:
        rows, cols = pid.split(b".s", 1)[1].split(b".")
        return cls(np.zeros((int(rows), int(cols)), np.float32))

    def add(self, ident: bytes, ids: np.ndarray, data: np.ndarray, who: str) -> None:
        if any(g[0] == ident for g in self.got):
            fail(f"{who}: {ident!r} pushed twice in one round")
        self.got.append((ident, ids, data.reshape(len(ids), self.value.shape[1])))

    def reply(self, sock, pid: bytes, W: int) -> None:
        import zmq
        rows = np.unique(np.concatenate([g[1] for g in self.got]))
        acc = np.zeros((len(rows), self.value.shape[1]), np.float32)
        for _, ids, data in self.got:
            acc[np.searchsorted(rows, ids)] += data       # ids unique within one push
        if W > 1:
            acc *= 1 / W
        self.value[rows] = acc
        for ident, ids, _ in self.got:
            sock.send(ident, zmq.SNDMORE)
            sock.send(pid, zmq.SNDMORE)
            part = self.value[ids]
            sock.send(part, copy=part.nbytes < ZERO_COPY_BYTES)
        self.got.clear()


def bare_sparse_case(socks: list, poller, case_index: int, c: Case, rank: int, W: int, quick: bool) -> None:
    """The row_sparse workload (benchmarks/cases.py): table SPARSE_ROWS x SPARSE_COLS split into
    S row ranges, one per server; a round pushes 1% random rows (fresh each round, drawn
    outside the timing; sorted and cut per server inside it, as psnode's push does) and copies
    the returned rows into the worker's table.  Check round: every worker pushes rank+1 on the
    same rows and must get exactly the mean of 1..W back."""
    who = f"bare-worker {rank} {c.name}"
    R, C = SPARSE_ROWS, SPARSE_COLS
    n = int(R * SPARSE_FRACTION)
    S = len(socks)
    ranges = split_ranges(R, S)
    pids = [b"%d.s%d.%d" % (case_index, hi - lo, C) for lo, hi in ranges]
    cuts = [lo for lo, _ in ranges[1:]]
    table = np.zeros((R, C), np.float32)

    def one_round(ids: np.ndarray, data: np.ndarray) -> None:
        order = np.argsort(ids)
        sids, sdata = ids[order], data[order]            # (copies: the push copies)
        bounds = [0, *np.searchsorted(sids, cuts), len(sids)]
        sent = []
        for i, sock in enumerate(socks):
            a, b = bounds[i], bounds[i + 1]
            local = sids[a:b] - ranges[i][0]
            rows = sdata[a:b]
            sock.send_multipart([pids[i], local, rows], copy=rows.nbytes < ZERO_COPY_BYTES)
            sent.append(sids[a:b])
        def store(sock, pid: bytes, got) -> None:
            table[sent[socks.index(sock)]] = np.frombuffer(got, np.float32).reshape(-1, C)
        _receive(poller, who, S, store)

    rng = np.random.default_rng(7)
    ids = rng.choice(R, n, replace=False)                # check round: same rows everywhere
    one_round(ids, np.full((n, C), rank + 1, np.float32))
    expect = np.float32((W + 1) / 2)
    if not (table[ids] == expect).all():
        fail(f"{who}: pulled rows {table[ids][:2, :3]}, expected {expect}")
    rng = np.random.default_rng(1000 + rank)
    data = rng.standard_normal((n, C)).astype(np.float32)
    times = []
    for i in range(c.warm(quick) + c.timed(quick)):
        ids = rng.choice(R, n, replace=False)
        t0 = time.perf_counter()
        one_round(ids, data)
        t1 = time.perf_counter()
        if i >= c.warm(quick):
            times.append(t1 - t0)
    report(system="bare", case=c.name, rank=rank, bytes=2 * n * C * 4, **summarize(times))


@dataclass
class BareSlot:
    """The worker side of one key part: where its gradient comes from, its send buffer (the
    push copies the caller's gradient, as psnode's does), and where the average goes."""
    part: BarePart
    sock: object
    grad: np.ndarray     # view into the worker's gradient of the key
    send: np.ndarray     # reused send buffer
    out: np.ndarray      # view into the worker's out array of the key
    big: bool


def _bare_round(slots: list[BareSlot], by_pid: dict[bytes, BareSlot], poller, who: str) -> None:
    """One fused push+pull: send every part, then copy each part's reply into its ``out``.

    Reusing a send buffer next round is safe: the reply to a part comes after the server read
    all W pushes of it, so zmq has finished reading this worker's buffer."""
    pending: dict[object, int] = {}
    for s in slots:
        np.copyto(s.send, s.grad)
        s.sock.send_multipart([s.part.pid, s.send], copy=not s.big)
        pending[s.sock] = pending.get(s.sock, 0) + 1

    def store(sock, pid: bytes, data) -> None:
        s = by_pid.get(pid)
        if s is None or s.sock is not sock or not pending.get(sock):
            fail(f"{who}: unexpected reply for part {pid!r}")
        np.copyto(s.out, np.frombuffer(data, np.float32))
        pending[sock] -= 1
    _receive(poller, who, len(slots), store)


def bare_case(socks: list, poller, case_index: int, c: Case, rank: int, W: int, quick: bool) -> None:
    """Check round (push rank+1, pull exactly the mean of 1..W), warm-up, timed rounds; report."""
    who = f"bare-worker {rank} {c.name}"
    grads = [np.full(c.elems, rank + 1, np.float32) for _ in range(c.keys)]
    outs = [np.empty(c.elems, np.float32) for _ in range(c.keys)]
    slots = [BareSlot(p, socks[p.server], grads[p.key][p.lo:p.hi], np.empty(p.hi - p.lo, np.float32),
                      outs[p.key][p.lo:p.hi], (p.hi - p.lo) * 4 >= ZERO_COPY_BYTES)
             for p in bare_parts(case_index, c, len(socks))]
    by_pid = {s.part.pid: s for s in slots}
    _bare_round(slots, by_pid, poller, who)
    expect = np.float32((W + 1) / 2)
    for k, o in enumerate(outs):
        if not (o == expect).all():
            fail(f"{who} key {k}: pulled {o[:4]}..., expected {expect}")
    times = []
    for i in range(c.warm(quick) + c.timed(quick)):
        t0 = time.perf_counter()
        _bare_round(slots, by_pid, poller, who)
        t1 = time.perf_counter()
        if i >= c.warm(quick):
            times.append(t1 - t0)
    report(system="bare", case=c.name, rank=rank, bytes=2 * c.keys * c.nbytes, **summarize(times))


def bare_worker(rank: int, W: int, ports: list[int], cases_json: str, quick: bool) -> None:
    """One DEALER (identity ``w<rank>``) per server; runs the dense cases (densetable as a flat
    key of the same size) and the row_sparse case, then sends QUIT to every server."""
    import zmq
    ctx = zmq.Context()
    socks = []
    poller = zmq.Poller()
    for port in ports:
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0          # a failing worker exits at once (the QUIT gets a linger of its own)
        sock.identity = b"w%d" % rank
        sock.connect(f"tcp://127.0.0.1:{port}")
        poller.register(sock, zmq.POLLIN)
        socks.append(sock)
    for i, c in enumerate(decode_cases(cases_json)):
        if c.kind == "dense":
            bare_case(socks, poller, i, c, rank, W, quick)
        elif c.kind == "sparse":
            bare_sparse_case(socks, poller, i, c, rank, W, quick)
    for sock in socks:
        sock.send(b"QUIT")
        sock.close(linger=QUIT_LINGER_MS)
    ctx.term()


# ---------------------------------------------------------------- memory bound
COPIES_PER_WORKER = 3   # a same-host round copies the model 3W times (benchmarks/report.py)


def membw(cpu: int, W: int, cores: int, cases_json: str, quick: bool) -> None:
    """Core ``cpu``'s share of the memory bound of a W-worker round, run while every other core
    runs its share: of the round's 3W copies of the model, copies cpu, cpu+cores, ...; each
    copy between its own pair of arrays (as the round's copies are: gradient into the staging
    slot, the slot into the sum, the result into ``out``), so the working set is the round's.
    Per dense case: the time those copies take per round (median over the case's timed rounds).
    Every case starts together on every core: this process says READY on stdout and waits for a
    line on stdin (benchmarks/kvstore/peers_run.run_membw)."""
    import os
    os.sched_setaffinity(0, {cpu})
    mine = len(range(cpu, COPIES_PER_WORKER * W, cores))
    for c in decode_cases(cases_json):
        if c.kind != "dense":
            continue
        pairs = [(np.ones(c.elems, np.float32), np.empty(c.elems, np.float32))
                 for _ in range(mine * c.keys)]
        for a, b in pairs:         # (every page touched before the start)
            np.copyto(b, a)
        print("READY", flush=True)
        sys.stdin.readline()
        times = []
        for i in range(c.warm(quick) + c.timed(quick)):
            t0 = time.perf_counter()
            for a, b in pairs:
                np.copyto(b, a)
            if i >= c.warm(quick):
                times.append(time.perf_counter() - t0)
        report(system="membw", case=c.name, rank=cpu, copies=mine, bytes=c.keys * c.nbytes, **summarize(times))

if __name__ == "__main__":
    role, args = sys.argv[1], sys.argv[2:]
    if role == "zmq-server":
        zmq_server(int(args[0]))
    elif role == "zmq-client":
        zmq_client(int(args[0]), args[1], args[2] == "1")
    elif role == "gloo":
        gloo(int(args[0]), int(args[1]), int(args[2]), args[3], args[4] == "1", float(args[5]))
    elif role == "bare-server":
        bare_server(int(args[0]), int(args[1]))
    elif role == "membw":
        membw(int(args[0]), int(args[1]), int(args[2]), args[3], args[4] == "1")
    elif role == "bare-worker":
        bare_worker(int(args[0]), int(args[1]), [int(x) for x in args[2].split(",")], args[3], args[4] == "1")
    else:
        raise SystemExit(f"unknown role {role}")
