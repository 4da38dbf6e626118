"""A host that crashes during a job: hosts in network namespaces, each a real sshd.

Hosts in two network namespaces created here (never the machine's interfaces), each host a real
OpenSSH sshd on its own address (``node1``..``node4`` at 10.213.9.1-4): CUT holds the host that
crashes, MAIN the others and the launcher; a veth pair links them.  ``ip link set DOWN`` on
CUT's end loses every packet both ways, silently, as a power loss does; then every process of
CUT is killed.  :func:`crash_during_job` runs one job through it (tests/faults/test_host_crash.py,
benchmarks/faults/soak.py ``--host-crash``); :data:`CASES` are the crashes of a job with
replicated servers and no checkpoints, by what the crashed host ran.
"""
from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tests.support import wait_for
from tests.support.cli import ROOT, assert_nothing_left, cli_env, latest
from tests.support.hosts import (
    HOST_LOSS,
    HOST_LOSS_KEYS,
    SSHD,
    ip,
    keygen,
    kill_namespace,
    ns_pids,
    settled,
    sshd_config,
)

PORT = 2222                                  # each namespace has its own ports
NODES = {"node1": "10.213.9.1", "node2": "10.213.9.2", "node3": "10.213.9.3", "node4": "10.213.9.4"}


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
    crash its host, then touch ``flags/crashed``; (the launcher's output, its exit code, seconds
    from the crash to its end).
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
        found = {p["name"]: p["host"] for p in latest(home)["procs"]}
        assert found == placed, found
        wait_for(lambda: settled(ns_pids(cut)), 30, f"{crashing}'s shells to finish starting")
        crashed, crashed_at = time.monotonic(), time.time()
        ip("-n", cut, "link", "set", "vc", "down")        # silence first: no reset ever reaches MAIN
        kill_namespace(cut)                               # then every process of the host
        (flags / "crashed").touch()
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


def first_round_after(out: str) -> float:
    """Seconds from the crash to the first completion of step 3, the first step that needs the
    crashed host's worker (it was blocked there)."""
    crashed = float(out.rsplit("CRASHED ", 1)[1])
    return min(float(t) for t in re.findall(r"\] STEP 3 ([0-9.]+)", out)) - crashed



@dataclass(frozen=True)
class CrashCase:
    """One kind of host crash: the hosts file, the host that crashes, the rank of the worker
    there that the crash waits for, mxdist launch's flags and where each process runs."""

    hosts_file: str
    crashing: str
    rank: int
    args: list[str] = field(default_factory=list)
    placed: dict[str, str] = field(default_factory=dict)
    workers: int = 3


FOUR = "node1 slots=1\nnode2 slots=1\nnode3 slots=1\nnode4 slots=1   # spare\n"
REPLICATED = ["-n", "3", "-s", "3", "--replicas", "2", "--max-restarts", "3"]

#: crashes of a job with replicated servers and no --checkpoint-dir, by what the crashed host ran
CASES = {
    "server": CrashCase(FOUR, "node2", 1, REPLICATED, {
        "scheduler": "node1", "scheduler-1": "node2", "server-0": "node1", "server-1": "node2",
        "server-2": "node3", "worker-0": "node1", "worker-1": "node2", "worker-2": "node3"}),
    "scheduler": CrashCase(FOUR, "node1", 0, REPLICATED, {
        "scheduler": "node1", "scheduler-1": "node2", "server-0": "node1", "server-1": "node2",
        "server-2": "node3", "worker-0": "node1", "worker-1": "node2", "worker-2": "node3"}),
    "worker": CrashCase(FOUR, "node3", 2, ["-n", "3", "-s", "2", "--replicas", "2", "--max-restarts", "3"], {
        "scheduler": "node1", "scheduler-1": "node2", "server-0": "node1", "server-1": "node2",
        "worker-0": "node1", "worker-1": "node2", "worker-2": "node3"}),
}


def run_case(case: CrashCase, tmp: Path) -> tuple[str, int, float]:
    """:func:`crash_during_job` of ``case`` with HOST_LOSS_KEYS."""
    return crash_during_job(tmp, case.hosts_file, case.crashing, case.rank, case.args, case.placed,
                            script=HOST_LOSS_KEYS)
