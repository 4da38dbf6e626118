"""The processes of benchmarks/network/clusterbench.py, each started inside one host's namespace.

argv: psnode <cases-json> <quick 0|1> <markdir>    a psnode worker (``PSNODE_*`` environment)
      gloo <cases-json> <quick 0|1> <markdir> <master-addr> <port> <rank> <world>
                                                   a torch.distributed (gloo) rank
      meshserver <addr> <port> <workers>           the raw TCP reference's server: echoes what it gets
      meshworker <cases-json> <quick 0|1> <markdir> <server,addrs> <port> <rank>
                                                   its worker: B/S to each server and back, per round
      meter <markdir> <host-index>                 this host's link counters at the marks

A round on each worker (both systems): the case's K gradients of B bytes are summed over the
workers and the sums are back on every worker.  psnode: ``kv.pushpull`` (``kv.push`` then
``kv.pull`` with ``CLUSTERBENCH_PUSHPULL=0``); gloo:
``all_reduce`` of every gradient (async, as DDP issues its buckets), then waits for all.  The
first round checks the result exactly (every worker contributes ``rank + 1``).  Then warm-up and
timed rounds; one result line per case per worker (median round time).

Rank 0 marks the timed rounds of each case for the meters: after the barrier that starts them it
creates ``<markdir>/<case>.start``, after the barrier that ends them ``<markdir>/<case>.end``.
A meter (one per host, the workers' hosts included) polls for the marks every 5 ms and
writes its host link's tx/rx byte counters at each to ``<markdir>/<case>.h<i>.json``: the bytes
every host's link carried during the timed rounds, servers' and scheduler's hosts too.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.cases import Case, decode_cases, fail, leave_gloo, report, summarize  # noqa: E402

METER_LIMIT_S = 3600.0   # a meter whose driver vanished ends by itself


def link_bytes(iface: str = "eth0") -> tuple[int, int]:
    """(tx, rx) bytes of this host's link so far."""
    base = Path("/sys/class/net") / iface / "statistics"
    return int((base / "tx_bytes").read_text()), int((base / "rx_bytes").read_text())


def mark(markdir: Path, case: str, what: str) -> None:
    (markdir / f"{case}.{what}").touch()


class Rounds:
    """The check, warm-up and timed rounds of one case (``barrier`` and ``round`` per system)."""

    def __init__(self, rank: int, markdir: Path, barrier: Any) -> None:
        self.rank, self.markdir, self.barrier = rank, markdir, barrier

    def run(self, c: Case, quick: bool, one_round: Any, system: str) -> None:
        warm, timed = c.warm(quick), c.timed(quick)
        times = []
        for i in range(warm + timed):
            if i == warm:
                self.barrier()
                if self.rank == 0:
                    mark(self.markdir, c.name, "start")
            t0 = time.perf_counter()
            one_round()
            times.append(time.perf_counter() - t0)
        self.barrier()
        if self.rank == 0:
            mark(self.markdir, c.name, "end")
        self.barrier()   # (nobody starts the next case's traffic before the end mark)
        report(system=system, case=c.name, rank=self.rank, bytes=2 * c.keys * c.nbytes, **summarize(times[warm:]))


def psnode_worker(cases_json: str, quick: bool, markdir: Path) -> None:
    import psnode
    from benchmarks.network import nbtrace
    nbtrace.install("worker", int(os.environ.get("PSNODE_RANK", "0")))   # (with NETBENCH_TRACE only)
    kv = psnode.kv.create("dist_sync")
    W, rank = kv.num_workers, kv.rank
    rounds = Rounds(rank, markdir, kv.barrier)
    pushpull = os.environ.get("CLUSTERBENCH_PUSHPULL", "1") == "1"
    for c in decode_cases(cases_json):
        keys = [f"{c.name}/{i}" for i in range(c.keys)]
        kv.init(keys, [np.zeros(c.elems, np.float32) for _ in keys])
        grads = [np.full(c.elems, rank + 1, np.float32) for _ in keys]
        outs = [np.empty(c.elems, np.float32) for _ in keys]
        kv.barrier()
        kv.push(keys, grads)
        kv.pull(keys, out=outs)
        expect = np.float32(sum(range(1, W + 1)) / W)   # dist_sync without an updater: the mean
        for k, o in zip(keys, outs, strict=True):
            if not (o == expect).all():
                fail(f"psnode {c.name} key {k}: pulled {o[:4]}..., expected {expect}")

        def one_round(keys: list[str] = keys, grads: list[np.ndarray] = grads,
                      outs: list[np.ndarray] = outs) -> None:
            if pushpull:
                kv.pushpull(keys, grads, out=outs)
            else:
                kv.push(keys, grads)
                kv.pull(keys, out=outs)
        rounds.run(c, quick, one_round, "psnode")
    kv.close()


def gloo_worker(cases_json: str, quick: bool, markdir: Path, master: str, port: int, rank: int, world: int) -> None:
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank, world_size=world)
    rounds = Rounds(rank, markdir, dist.barrier)
    for c in decode_cases(cases_json):
        grads = [torch.full((c.elems,), float(rank + 1)) for _ in range(c.keys)]

        def one_round(grads: list[Any] = grads) -> None:
            for w in [dist.all_reduce(g, async_op=True) for g in grads]:
                w.wait()
        dist.barrier()
        one_round()
        expect = float(sum(range(1, world + 1)))
        for g in grads:
            if not bool((g == expect).all()):
                fail(f"gloo {c.name}: all_reduce gave {g[:4].tolist()}..., expected {expect}")
        rounds.run(c, quick, one_round, "gloo")
    leave_gloo(dist)


CONNECT_S = 60.0


def mesh_server(addr: str, port: int, workers: int) -> None:
    """Echo every byte each of ``workers`` connections sends, as it arrives (until they close)."""
    import socket
    import threading
    lsock = socket.create_server((addr, port), backlog=workers)
    lsock.settimeout(CONNECT_S)

    def echo(conn: socket.socket) -> None:
        buf = memoryview(bytearray(1 << 20))
        while (n := conn.recv_into(buf)) > 0:
            conn.sendall(buf[:n])
        conn.close()
    threads = []
    for _ in range(workers):
        conn, _ = lsock.accept()
        conn.settimeout(None)
        threads.append(threading.Thread(target=echo, args=(conn,), daemon=True))
        threads[-1].start()
    for t in threads:
        t.join()


def mesh_worker(cases_json: str, quick: bool, markdir: Path, servers: list[str], port: int, rank: int) -> None:
    """A parameter server's traffic in raw TCP: each round sends B/S to each of the S servers
    while receiving their echoes (full duplex), no aggregation, no synchronisation between workers
    but the marks' barrier (a file per worker and case)."""
    import socket
    import threading
    conns = []
    for a in servers:
        end = time.monotonic() + CONNECT_S
        while True:
            try:
                conns.append(socket.create_connection((a, port), timeout=CONNECT_S))
                break
            except OSError:
                if time.monotonic() > end:
                    raise
                time.sleep(0.05)
    S = len(conns)

    def barrier(tag: str) -> None:
        (markdir / f"mesh.{tag}.{rank}").touch()
        end = time.monotonic() + CONNECT_S * 5
        while not all((markdir / f"mesh.{tag}.{r}").exists() for r in range(S)):
            if time.monotonic() > end:
                fail(f"mesh barrier {tag}: the other workers did not come")
            time.sleep(0.002)

    for c in decode_cases(cases_json):
        share = c.keys * c.nbytes // S
        out = memoryview(bytearray(share))
        back = [memoryview(bytearray(share)) for _ in range(S)]
        stamp = iter(range(1_000_000))

        def one_round(share: int = share, back: list[memoryview] = back, out: memoryview = out) -> None:
            def recv(i: int) -> None:
                got = 0
                while got < share:
                    n = conns[i].recv_into(back[i][got:])
                    if not n:
                        fail("a mesh server closed the connection")
                    got += n
            rs = [threading.Thread(target=recv, args=(i,)) for i in range(S)]
            ss = [threading.Thread(target=conns[i].sendall, args=(out,)) for i in range(S)]
            for t in rs + ss:
                t.start()
            for t in rs + ss:
                t.join()

        def sync(name: str = c.name, stamp: Any = stamp) -> None:
            barrier(f"{name}.{next(stamp)}")
        Rounds(rank, markdir, sync).run(c, quick, one_round, "tcp-mesh")
    for conn in conns:
        conn.close()


def meter(markdir: Path, host: int) -> None:
    """Until killed (or an hour): the link counters at every mark, one file per case."""
    seen: dict[str, dict[str, int]] = {}
    end = time.monotonic() + METER_LIMIT_S
    while time.monotonic() < end:
        for f in markdir.iterdir():
            case, _, what = f.name.rpartition(".")
            if what not in ("start", "end") or f"{case}.{what}" in seen.get(case, {}):
                continue
            tx, rx = link_bytes()
            got = seen.setdefault(case, {})
            got.update({f"{case}.{what}": 1, f"{what}_tx": tx, f"{what}_rx": rx})
            if "end_tx" in got and "start_tx" in got:
                out = {"host": host, "case": case, "tx": got["end_tx"] - got["start_tx"],
                       "rx": got["end_rx"] - got["start_rx"]}
                tmp = markdir / f"{case}.h{host}.tmp"
                tmp.write_text(json.dumps(out))
                tmp.rename(markdir / f"{case}.h{host}.json")
        time.sleep(0.005)


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "psnode":
        psnode_worker(sys.argv[2], sys.argv[3] == "1", Path(sys.argv[4]))
    elif what == "gloo":
        gloo_worker(sys.argv[2], sys.argv[3] == "1", Path(sys.argv[4]), sys.argv[5], int(sys.argv[6]),
                    int(sys.argv[7]), int(sys.argv[8]))
    elif what == "meshserver":
        mesh_server(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif what == "meshworker":
        mesh_worker(sys.argv[2], sys.argv[3] == "1", Path(sys.argv[4]), sys.argv[5].split(","), int(sys.argv[6]),
                    int(sys.argv[7]))
    elif what == "meter":
        meter(Path(sys.argv[2]), int(sys.argv[3]))
    else:
        sys.exit(f"usage: {sys.argv[0]} psnode|gloo|meter ...")
