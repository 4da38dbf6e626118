"""A network partition: server 1 alone in its own network namespace, cut off mid-training.

Two namespaces created by the test (never the host's interfaces): MAIN holds the scheduler,
server 0 and the workers at 10.213.7.1; CUT holds server 1 at 10.213.7.2; a veth pair links
them.  ``ip link set DOWN`` on CUT's end loses every packet both ways, silently: sockets stay
open, so only heartbeats can tell.  Clean-up (always): kill every pid in each namespace, then
delete it.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from psnode.config import NodeConfig, Role
from tests.support import require, wait_for
from tests.support.cluster import ROOT, Job, Proc, alive
from tests.support.faults import DEAD_AFTER, FAST_ENV, TRAIN, assert_none_left, markers
from tests.support.hosts import ip, ns_pids

BOUND = DEAD_AFTER + 5
MAIN_IP, CUT_IP = "10.213.7.1", "10.213.7.2"



@pytest.fixture(autouse=True)
def _namespaces_possible() -> None:
    """Network namespaces need root and iproute2: skipped without them, a failure under CI."""
    require("network namespaces need root" if os.geteuid() != 0 else
            "iproute2 (ip) is not installed" if shutil.which("ip") is None else None,
            "run as root with iproute2 (apt-get install iproute2)")






def make_namespaces(tag: str) -> tuple[str, str]:
    main, cut = f"psnf-{tag}-m", f"psnf-{tag}-c"
    ip("netns", "add", main)
    ip("netns", "add", cut)
    for ns in (main, cut):
        ip("-n", ns, "link", "set", "lo", "up")
    # the veth pair is created inside MAIN with its peer moved to CUT: never in the host
    ip("-n", main, "link", "add", "vm", "type", "veth", "peer", "name", "vc", "netns", cut)
    ip("-n", main, "addr", "add", f"{MAIN_IP}/24", "dev", "vm")
    ip("-n", cut, "addr", "add", f"{CUT_IP}/24", "dev", "vc")
    ip("-n", main, "link", "set", "vm", "up")
    ip("-n", cut, "link", "set", "vc", "up")
    return main, cut


def remove_namespace(ns: str) -> list[int]:
    """Kill every process in ``ns`` (all started by this test), then delete it."""
    left = ns_pids(ns)
    for pid in left:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5
    while any(alive(p) for p in ns_pids(ns)) and time.monotonic() < deadline:
        time.sleep(0.05)
    subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
    return left


def start_in_namespaces(tmp: Path, main: str, cut: str) -> Job:
    """Scheduler, server 0, workers 0 and 1 in MAIN; server 1 in CUT."""
    job = Job(job_id=f"p{uuid.uuid4().hex[:10]}")
    port = 9400 + os.getpid() % 500
    script = tmp / f"{job.job_id}.py"
    script.write_text(textwrap.dedent(TRAIN))
    base = dict(os.environ)
    base["PYTHONPATH"] = str(ROOT) + os.pathsep + base.get("PYTHONPATH", "")
    base.update(FAST_ENV)
    base["FAULT_DIR"] = str(tmp)

    def spawn(ns: str, role: Role, rank: int, host: str, argv: list[str]) -> None:
        cfg = NodeConfig(role=role, scheduler_host=MAIN_IP, scheduler_port=port, num_workers=2,
                         num_servers=2, job_id=job.job_id, host=host,
                         rank=None if role is Role.SCHEDULER else rank)
        env = dict(base)
        env.update({k: v for k, v in cfg.to_env().items() if k not in FAST_ENV})
        p = subprocess.Popen(["ip", "netns", "exec", ns, *argv], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
        job.add(Proc(role.value, rank, p))

    mod = [sys.executable, "-m", "psnode"]
    spawn(main, Role.SCHEDULER, 0, MAIN_IP, mod)
    spawn(main, Role.SERVER, 0, MAIN_IP, mod)
    spawn(cut, Role.SERVER, 1, CUT_IP, mod)
    for w in range(2):
        spawn(main, Role.WORKER, w, MAIN_IP, [sys.executable, str(script), "forever"])
    return job


def test_partition_server_cut_off(tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:6]
    main = cut = None
    job = dr = None
    try:
        main, cut = make_namespaces(tag)
        job = start_in_namespaces(tmp_path, main, cut)
        dr = job.drained
        wait_for(lambda: markers(tmp_path, "ready", 2), 40, "training across namespaces", describe=dr.describe, poll=dr.poll)
        dr.poll()
        assert not dr.exited, dr.describe()
        s1 = next(p for p in job.procs if p.role == "server" and p.rank == 1)
        t0 = time.monotonic()
        ip("-n", cut, "link", "set", "vc", "down")          # the partition
        assert dr.wait(job.procs, t0 + BOUND), f"not all exited within {BOUND:g} s\n" + dr.describe()
        name = f"server 1 on {CUT_IP} (pid {s1.popen.pid}) stopped responding"
        for p in job.procs:
            assert p.popen.returncode != 0, f"{p.role} {p.rank} exited 0\n" + dr.describe()
            if p is not s1:
                assert name in dr.err(p), f"{p.role} {p.rank} does not name server 1\n" + dr.describe()
        assert re.search(rf"the scheduler \(pid \d+\) at {re.escape(MAIN_IP)}:", dr.err(s1)), dr.describe()
        assert not ns_pids(main) and not ns_pids(cut), "processes left in the namespaces"
    finally:
        if dr is not None:
            dr.finish()
        left = [remove_namespace(ns) for ns in (main, cut) if ns]
        listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert f"psnf-{tag}" not in listed, listed
    assert not any(left), f"had to kill processes left in the namespaces: {left}"
    assert_none_left(job)
