"""Start the peers of benchmarks/kvstore/peers.py (raw pyzmq, torch gloo, the bare PS) as processes.

Every wait is bounded by ``timeout``; on timeout (or a failed bare worker) only the processes
started here are killed.
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import time

from benchmarks.cases import Case, encode_cases
from benchmarks.common import ROOT, child_env, free_port, parse_results, tail


def run_zmq(cases: list[Case], quick: bool, timeout: float) -> list[dict]:
    port = free_port()
    py = [sys.executable, "-m", "benchmarks.kvstore.peers"]
    srv = subprocess.Popen([*py, "zmq-server", str(port)], cwd=ROOT, env=child_env(),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        r = subprocess.run([*py, "zmq-client", str(port), encode_cases(cases), "1" if quick else "0"],
                           cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            print(f"  zmq client exited {r.returncode}:\n{tail(r.stderr)}", file=sys.stderr)
        return parse_results(r.stdout)
    except subprocess.TimeoutExpired:
        print("  zmq client timed out", file=sys.stderr)
        return []
    finally:
        try:
            srv.wait(5)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()


def run_bare(W: int, S: int, cases: list[Case], quick: bool, timeout: float) -> list[dict]:
    """The bare PS (benchmarks/kvstore/peers.py) with S servers and W workers on free ports; its records.

    Waits for every process within ``timeout`` seconds in all; on timeout, or when a worker
    fails, kills the processes it started (and only those)."""
    ports: list[int] = []
    while len(ports) < S:
        port = free_port()
        if port not in ports:
            ports.append(port)
    py = [sys.executable, "-m", "benchmarks.kvstore.peers"]

    def spawn(argv: list[str]) -> subprocess.Popen:
        return subprocess.Popen(py + argv, cwd=ROOT, env=child_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    servers = [spawn(["bare-server", str(port), str(W)]) for port in ports]
    workers = [spawn(["bare-worker", str(r), str(W), ",".join(map(str, ports)), encode_cases(cases),
                      "1" if quick else "0"]) for r in range(W)]
    deadline = time.monotonic() + timeout
    out: list[dict] = []
    try:
        for name, procs in (("worker", workers), ("server", servers)):
            for i, p in enumerate(procs):
                so, se = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
                if p.returncode != 0:
                    print(f"  bare W{W}S{S} {name} {i} exited {p.returncode}:\n{tail(se)}", file=sys.stderr)
                out.extend(parse_results(so))
            if any(p.returncode != 0 for p in workers):
                break            # the servers would wait for QUITs that do not come
    except subprocess.TimeoutExpired:
        print(f"  bare W{W}S{S} timed out after {timeout} s", file=sys.stderr)
        out = []
    finally:
        for p in servers + workers:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return [dict(r, config=f"{W},{S}") for r in out]


def run_membw(W: int, S: int, cases: list[Case], quick: bool, timeout: float) -> list[dict]:
    """The memory bound of a W-worker round (benchmarks/kvstore/peers.py ``membw``): one process
    per core, each doing its share of the round's copies, every case started on all of them at
    once (each says READY, then all are told to go); their records."""
    import os
    import threading
    cores = sorted(os.sched_getaffinity(0))
    procs = [subprocess.Popen([sys.executable, "-m", "benchmarks.kvstore.peers", "membw", str(cpu), str(W),
                               str(len(cores)), encode_cases(cases), "1" if quick else "0"],
                              cwd=ROOT, env=child_env(OMP_NUM_THREADS="1"), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for cpu in cores]
    lines: list[str] = []
    timer = threading.Timer(timeout, lambda: [p.kill() for p in procs])   # (ends every wait below)
    timer.start()

    def until_ready(p: subprocess.Popen) -> bool:
        assert p.stdout is not None
        while line := p.stdout.readline():
            if line.strip() == "READY":
                return True
            lines.append(line)
        return False
    try:
        for _ in (c for c in cases if c.kind == "dense"):
            ready = [until_ready(p) for p in procs]   # (every one, none skipped)
            if not all(ready):
                break
            for p in procs:
                assert p.stdin is not None
                p.stdin.write("go\n")
                p.stdin.flush()
        for p in procs:
            so, se = p.communicate()
            if p.returncode != 0:
                why = "timed out" if not timer.is_alive() else f"exited {p.returncode}"
                print(f"  memory bound process {why}:\n{tail(se)}", file=sys.stderr)
                return []
            lines.append(so)
    finally:
        timer.cancel()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return [dict(r, config=f"{W},{S}") for r in parse_results("".join(lines))]


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


def run_gloo(cases: list[Case], quick: bool, timeout: float, world: int = 2) -> list[dict]:
    port = free_port()
    t0 = time.time()
    procs = [subprocess.Popen([sys.executable, "-m", "benchmarks.kvstore.peers", "gloo", str(r), str(world), str(port),
                               encode_cases(cases), "1" if quick else "0", repr(t0)],
                              cwd=ROOT, env=child_env(OMP_NUM_THREADS="1"), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(world)]
    out = []
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            so, se = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print("  gloo timed out", file=sys.stderr)
            for q in procs:
                if q.poll() is None:
                    q.kill()
                    q.communicate()
            return []
        if p.returncode != 0:
            print(f"  gloo rank exited {p.returncode}:\n{tail(se)}", file=sys.stderr)
        out.extend(parse_results(so))
    return out
