"""A host crashes: its link goes down without a word, then every process on it is killed.

Hosts in two network namespaces created by the test (never the host's interfaces), each host a
real OpenSSH sshd on its own address (``node1``..``node4`` at 10.213.9.1-4): CUT holds the host
that crashes, MAIN the others and the launcher; a veth pair links them.  ``ip link set DOWN`` on
CUT's end loses every packet both ways, silently, as a power loss does: the launcher learns it
only by its SSH keepalives going unanswered, the nodes by their heartbeats.  With
``--max-restarts 1`` the crashed host's worker restarts with its rank in a spare slot of a live
host and resumes from ``kv.num_pushes``; with ``--standby-scheduler`` the standby takes the job
over when the crashed host ran the scheduler.  Each job ends exit 0 with the values of an
uninterrupted run.  Clean-up (always): kill every pid in each namespace, then delete it.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.support import require, wait_for
from tests.support.cli import ROOT, assert_nothing_left, cli_env, latest
from tests.support.hosts import (
    HOST_LOSS,
    HOST_LOSS_FINAL,
    HOST_LOSS_KEYS,
    SSHD,
    host_loss_keys_final,
    ip,
    keygen,
    kill_namespace,
    ns_pids,
    settled,
    sshd_config,
)

PORT = 2222                                  # each namespace has its own ports
NODES = {"node1": "10.213.9.1", "node2": "10.213.9.2", "node3": "10.213.9.3", "node4": "10.213.9.4"}


@pytest.fixture(autouse=True)
def _possible() -> None:
    """Namespaces need root and iproute2, the hosts OpenSSH's sshd: a failure under CI."""
    require("network namespaces need root" if os.geteuid() != 0 else
            "iproute2 (ip) is not installed" if shutil.which("ip") is None else
            f"{SSHD} is not installed" if not os.path.exists(SSHD) else None,
            "run as root with iproute2 and openssh-server (apt-get install iproute2 openssh-server)")


def hosts_in_namespaces(root: Path, main: str, cut: str, crashing: str) -> tuple[Path, Path]:
    """The namespaces, their link and one sshd per host (``crashing`` in CUT); (ssh config, known_hosts)."""
    ip("netns", "add", main)
    ip("netns", "add", cut)
    for ns in (main, cut):
        ip("-n", ns, "link", "set", "lo", "up")
    ip("-n", main, "link", "add", "vm", "type", "veth", "peer", "name", "vc", "netns", cut)
    for name, addr in NODES.items():
        ns, dev = (cut, "vc") if name == crashing else (main, "vm")
        ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
    ip("-n", main, "link", "set", "vm", "up")
    ip("-n", cut, "link", "set", "vc", "up")
    subprocess.run(["install", "-d", "-m", "0755", "/run/sshd"], check=True)
    (root / "authorized_keys").write_text(keygen(root / "client_key") + "\n")
    known, config = [], []
    for name, addr in NODES.items():
        pub = keygen(root / f"{name}_key")
        known.append(f"[{addr}]:{PORT} {pub}\n")
        conf = root / f"{name}.conf"
        conf.write_text(sshd_config(PORT, addr, root / f"{name}_key", root / f"{name}.pid", root / "authorized_keys"))
        ns = cut if name == crashing else main
        subprocess.Popen(["ip", "netns", "exec", ns, SSHD, "-D", "-f", str(conf), "-E", str(root / f"{name}.log")],
                         start_new_session=True)
        config.append(f"Host {name}\n  HostName {addr}\n")
    for name in NODES:
        wait_for(lambda n=name: (root / f"{n}.pid").exists(), 10, f"{name}'s sshd to start")
    config.append(f"Host *\n  Port {PORT}\n  User root\n  IdentityFile {root}/client_key\n  IdentitiesOnly yes\n")
    (root / "ssh_config").write_text("\n".join(config))
    (root / "known_hosts").write_text("".join(known))
    return root / "ssh_config", root / "known_hosts"


def crash_during_job(tmp_path: Path, hosts_file: str, crashing: str, rank: int, args: list[str],
                     placed: dict[str, str], script: str = HOST_LOSS) -> tuple[str, int, float]:
    """Launch ``script`` (HOST_LOSS) from MAIN; once worker ``rank`` (on ``crashing``) is at step 3,
    crash its host; (the launcher's output, its exit code, seconds from the crash to its end).
    Asserts ``placed`` (process -> host) at the crash, and that nothing of the job is left.  The
    output's last line is followed by ``CRASHED <time.time()>``."""
    tag = uuid.uuid4().hex[:6]
    main, cut = f"psnh-{tag}-m", f"psnh-{tag}-c"
    home = tmp_path / "home"
    home.mkdir()
    flags = tmp_path / "flags"
    flags.mkdir()
    train = tmp_path / "train.py"
    train.write_text(script)
    hosts = tmp_path / "hosts"
    hosts.write_text(hosts_file)
    cli = None
    try:
        ssh_config, known = hosts_in_namespaces(tmp_path, main, cut, crashing)
        env = cli_env(home, MXDIST_SSH_CONFIG=str(ssh_config), MXDIST_KNOWN_HOSTS=str(known),
                      MXDIST_REMOTE_DIR=str(home / "remote"))
        cli = subprocess.Popen(["ip", "netns", "exec", main, sys.executable, "-m", "mxdist", "launch", "-H", str(hosts),
                                *args, str(train), str(flags), str(rank)],
                               env=env, cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        wait_for(lambda: (flags / "ready").exists() or cli.poll() is not None, 120, f"worker {rank} to reach step 3")
        assert cli.poll() is None, cli.communicate(timeout=10)[0]
        assert {p["name"]: p["host"] for p in latest(home)["procs"]} == placed
        wait_for(lambda: settled(ns_pids(cut)), 30, f"{crashing}'s shells to finish starting")
        crashed, crashed_at = time.monotonic(), time.time()
        ip("-n", cut, "link", "set", "vc", "down")        # silence first: no reset ever reaches MAIN
        kill_namespace(cut)                               # then every process of the host
        out, _ = cli.communicate(timeout=240)
        took = time.monotonic() - crashed
    finally:
        if cli is not None and cli.poll() is None:
            cli.kill()
            cli.wait(10)
        for ns in (main, cut):
            kill_namespace(ns)
        for ns in (main, cut):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"psnh-{tag}" not in listed, listed
    assert_nothing_left(home)
    return f"{out}CRASHED {crashed_at!r}\n", cli.returncode, took


def test_a_silently_crashed_hosts_worker_restarts_elsewhere_with_exact_values(tmp_path: Path) -> None:
    out, code, took = crash_during_job(
        tmp_path, "node1 slots=1\nnode4 slots=1\nnode3 slots=1   # spare\n", "node4", 1,
        ["-n", "2", "-s", "1", "--max-restarts", "1"],
        {"scheduler": "node1", "server-0": "node1", "worker-0": "node1", "worker-1": "node4"})
    assert code == 0, out
    assert "host node4 does not answer" in out, out
    assert "worker-1 restarts with rank 1 on node3 (local rank 0): its host node4 does not answer" in out, out
    assert "[worker 1 @ node3] START 3 RESTARTS 1" in out, out
    assert out.count(HOST_LOSS_FINAL) == 2, out                  # the uninterrupted run's closed form
    assert re.search(r"succeeded in .*worker 1 moved to node3 \(node4 did not answer\)", out.splitlines()[-2]), out
    assert took < 90, f"the job ended {took:.0f} s after the crash\n{out}"


def test_the_scheduler_hosts_crash_hands_the_job_to_the_standby_with_exact_values(tmp_path: Path) -> None:
    """node1 runs the scheduler and worker 0; node2 the server; node3 worker 1, a spare slot and
    the standby scheduler.  node1 crashes: the standby takes the job over and worker 0 restarts
    on node3."""
    out, code, took = crash_during_job(
        tmp_path, "node1 slots=1\nnode3 slots=2   # one spare\n", "node1", 0,
        ["-n", "2", "-s", "1", "--server-hosts", "node2", "--max-restarts", "1", "--standby-scheduler"],
        {"scheduler": "node1", "scheduler-1": "node3", "server-0": "node2", "worker-0": "node1", "worker-1": "node3"})
    assert code == 0, out
    assert "the standby scheduler on node3 takes the job over at 10.213.9.3:" in out, out
    assert "worker-0 restarts with rank 0 on node3 (local rank 1): its host node1 does not answer" in out, out
    assert "[worker 0 @ node3] START 3 RESTARTS 1" in out, out
    assert out.count(HOST_LOSS_FINAL) == 2, out                  # the uninterrupted run's closed form
    last = out.splitlines()[-2]
    assert "succeeded in" in last and "the standby scheduler on node3 took the job over" in last, out
    assert took < 90, f"the job ended {took:.0f} s after the crash\n{out}"


def first_round_after(out: str) -> float:
    """Seconds from the crash to the first completion of step 3, the first step that needs the
    crashed host's worker (it was blocked there)."""
    crashed = float(out.rsplit("CRASHED ", 1)[1])
    return min(float(t) for t in re.findall(r"\] STEP 3 ([0-9.]+)", out)) - crashed


def test_a_server_and_worker_hosts_crash_is_survived_with_replicas_and_no_checkpoints(tmp_path: Path) -> None:
    """Four hosts, three servers (one each on node1-3, their state copied to the next server),
    three workers and a spare slot on node4; no --checkpoint-dir.  node2 (server 1, worker 1 and
    the idle standby scheduler) crashes: server 1 restarts on node4 with its state copied back from server 2's replica,
    worker 1 restarts in node4's spare slot, and every rank ends with the uninterrupted values."""
    out, code, took = crash_during_job(
        tmp_path, "node1 slots=1\nnode2 slots=1\nnode3 slots=1\nnode4 slots=1   # spare\n", "node2", 1,
        ["-n", "3", "-s", "3", "--replicas", "2", "--max-restarts", "3"],
        {"scheduler": "node1", "scheduler-1": "node2", "server-0": "node1", "server-1": "node2",
         "server-2": "node3", "worker-0": "node1", "worker-1": "node2", "worker-2": "node3"}, script=HOST_LOSS_KEYS)
    assert code == 0, out
    assert "host node2 does not answer" in out, out
    assert re.search(r"server-1 restarts with rank 1 on node4", out), out
    assert "worker-1 restarts with rank 1 on node4 (local rank 0): its host node2 does not answer" in out, out
    assert "server 1 restored" in out and "from its replica on server 2" in out, out
    assert "[worker 1 @ node4] START 3 RESTARTS 1" in out, out
    assert out.count(host_loss_keys_final(3)) == 3, out          # the uninterrupted run's closed form
    last = out.splitlines()[-2]
    assert "succeeded in" in last and "server 1 moved to node4" in last and "worker 1 moved to node4" in last, out
    first = first_round_after(out)
    print(f"first round {first:.1f} s after the crash; job ended {took:.0f} s after it")
    assert first < 30, f"the first round after the crash completed {first:.1f} s after it\n{out}"   # (soak: < 10)


def test_the_scheduler_hosts_crash_is_survived_with_replicas_and_no_checkpoints(tmp_path: Path) -> None:
    """The same four hosts; node1 runs the scheduler, server 0 and worker 0, and crashes.  The
    standby scheduler (on by default with --replicas 2 on several hosts: node2) takes the job
    over; server 0 restarts on node4 with its state copied back from server 1's replica, worker 0
    in node4's spare slot; every rank ends with the uninterrupted values."""
    out, code, took = crash_during_job(
        tmp_path, "node1 slots=1\nnode2 slots=1\nnode3 slots=1\nnode4 slots=1   # spare\n", "node1", 0,
        ["-n", "3", "-s", "3", "--replicas", "2", "--max-restarts", "3"],
        {"scheduler": "node1", "scheduler-1": "node2", "server-0": "node1", "server-1": "node2",
         "server-2": "node3", "worker-0": "node1", "worker-1": "node2", "worker-2": "node3"}, script=HOST_LOSS_KEYS)
    assert code == 0, out
    assert "the standby scheduler on node2 takes the job over at 10.213.9.2:" in out, out
    assert re.search(r"server-0 restarts with rank 0 on node4", out), out
    assert "worker-0 restarts with rank 0 on node4 (local rank 0): its host node1 does not answer" in out, out
    assert "server 0 restored" in out and "from its replica on server 1" in out, out
    assert "[worker 0 @ node4] START 3 RESTARTS 1" in out, out
    assert out.count(host_loss_keys_final(3)) == 3, out
    last = out.splitlines()[-2]
    assert "succeeded in" in last and "the standby scheduler on node2 took the job over" in last, out
    assert "server 0 moved to node4" in last and "worker 0 moved to node4" in last, out
    first = first_round_after(out)
    print(f"first round {first:.1f} s after the crash; job ended {took:.0f} s after it")
    assert first < 30, f"the first round after the crash completed {first:.1f} s after it\n{out}"   # (soak: < 10)
