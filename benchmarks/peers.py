"""The peers, on the same workload: raw pyzmq request/reply and torch gloo all_reduce.

python -m benchmarks.peers zmq-server <port>
python -m benchmarks.peers zmq-client <port> <cases-json> <quick>
python -m benchmarks.peers gloo <rank> <world> <port> <cases-json> <quick> <t0>

zmq: one DEALER (client) and one ROUTER (server) over tcp://127.0.0.1; the server echoes every
request frame back (zero-copy).  A round sends the K requests of B bytes (K in flight) and
receives the K replies: 2*K*B bytes per round, the same accounting as a psnode push+pull.
gloo: a round is K all_reduce(SUM) calls issued async (K in flight), then waited for.
"""
from __future__ import annotations

import sys
import time

T_START = time.time()

import numpy as np  # noqa: E402

from benchmarks.cases import (SPARSE_COLS, SPARSE_ROWS, Case, decode_cases, fail,  # noqa: E402
                              report, summarize)


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
    dist.destroy_process_group()


if __name__ == "__main__":
    role, args = sys.argv[1], sys.argv[2:]
    if role == "zmq-server":
        zmq_server(int(args[0]))
    elif role == "zmq-client":
        zmq_client(int(args[0]), args[1], args[2] == "1")
    elif role == "gloo":
        gloo(int(args[0]), int(args[1]), int(args[2]), args[3], args[4] == "1", float(args[5]))
    else:
        raise SystemExit(f"unknown role {role}")
