"""A host that crashes during a job: hosts in network namespaces, each a real sshd.

Hosts in network namespaces created here (never the machine's interfaces), each host a real
OpenSSH sshd on its own address (``node1``..``node5`` at 10.213.9.1-5): each host that crashes
alone in a namespace of its own (CUT), MAIN the others and the launcher; a veth pair links each
CUT to a bridge in MAIN.  ``ip link set DOWN`` on CUT's end loses every packet both ways,
silently, as a power loss does; then every process of CUT is killed (:func:`crash`).
:func:`crash_during_job` runs one job through one crash (tests/faults/test_host_crash.py,
benchmarks/faults/soak.py ``--host-crash``); :data:`CASES` are the crashes of a job with
replicated servers and no checkpoints, by what the crashed host ran;
:func:`crash_one_after_another` crashes the scheduler's host, then the host of the scheduler
that took the job over.
"""
from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from tests.support import wait_for
from tests.support.cli import ROOT, assert_nothing_left, cli_env, latest
from tests.support.hosts import (
    HOST_LOSS,
    HOST_LOSS_BIG,
    HOST_LOSS_BIG_FINAL,
    HOST_LOSS_KEYS,
    HOST_LOSS_TWICE,
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
NODES = {"node1": "10.213.9.1", "node2": "10.213.9.2", "node3": "10.213.9.3", "node4": "10.213.9.4",
         "node5": "10.213.9.5"}


TBF = ("burst", "256kb", "latency", "50ms")   # (as benchmarks/network/netns.py)
LAUNCHER = "10.213.9.254"   # main's own address when every host has a namespace of its own


def hosts_in_namespaces(root: Path, main: str, cuts: Mapping[str, str], rate: str | None = None) -> tuple[Path, Path]:
    """The namespaces, their links and one sshd per host; (ssh config, known_hosts).  ``cuts``:
    each host that may crash -> its own namespace, linked to a bridge in ``main`` (where every
    other host is) by a veth pair whose end there is ``vc`` (down: the host is cut off).
    ``rate`` (tc units, e.g. ``1gbit``): each such link's rate, both directions (a token bucket
    on both ends of the veth pair)."""
    ip("netns", "add", main)
    for ns in cuts.values():
        ip("netns", "add", ns)
    for ns in (main, *cuts.values()):
        ip("-n", ns, "link", "set", "lo", "up")
    ip("-n", main, "link", "add", "name", "hub", "type", "bridge")
    for i, ns in enumerate(cuts.values()):
        ip("-n", main, "link", "add", f"vm{i}", "type", "veth", "peer", "name", "vc", "netns", ns)
        ip("-n", main, "link", "set", f"vm{i}", "master", "hub")
        ip("-n", main, "link", "set", f"vm{i}", "up")
        ip("-n", ns, "link", "set", "vc", "up")
        if rate is not None:
            for where, dev in ((main, f"vm{i}"), (ns, "vc")):
                subprocess.run(["tc", "-n", where, "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, *TBF],
                               check=True, capture_output=True, timeout=10)
    ip("-n", main, "link", "set", "hub", "up")
    if all(name in cuts for name in NODES):
        ip("-n", main, "addr", "add", f"{LAUNCHER}/24", "dev", "hub")
    for name, addr in NODES.items():
        ns, dev = (cuts[name], "vc") if name in cuts else (main, "hub")
        ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
    subprocess.run(["install", "-d", "-m", "0755", "/run/sshd"], check=True)
    (root / "authorized_keys").write_text(keygen(root / "client_key") + "\n")
    known, config = [], []
    for name, addr in NODES.items():
        pub = keygen(root / f"{name}_key")
        known.append(f"[{addr}]:{PORT} {pub}\n")
        conf = root / f"{name}.conf"
        conf.write_text(sshd_config(PORT, addr, root / f"{name}_key", root / f"{name}.pid", root / "authorized_keys"))
        subprocess.Popen(["ip", "netns", "exec", cuts.get(name, main), SSHD, "-D", "-f", str(conf),
                          "-E", str(root / f"{name}.log")], start_new_session=True)
        config.append(f"Host {name}\n  HostName {addr}\n")
    for name in NODES:
        wait_for(lambda n=name: (root / f"{n}.pid").exists(), 10, f"{name}'s sshd to start")
    config.append(f"Host *\n  Port {PORT}\n  User root\n  IdentityFile {root}/client_key\n  IdentitiesOnly yes\n")
    (root / "ssh_config").write_text("\n".join(config))
    (root / "known_hosts").write_text("".join(known))
    return root / "ssh_config", root / "known_hosts"


def crash(ns: str, what: str) -> tuple[float, float]:
    """Crash the host in namespace ``ns`` once its shells settled: its link down first (no reset
    ever reaches the others), then every process of it killed; (time.monotonic(), time.time())."""
    wait_for(lambda: settled(ns_pids(ns)), 30, f"{what}'s shells to finish starting")
    at = time.monotonic(), time.time()
    ip("-n", ns, "link", "set", "vc", "down")
    kill_namespace(ns)
    return at


def crash_during_job(tmp_path: Path, hosts_file: str, crashing: str, rank: int, args: list[str],
                     placed: dict[str, str], script: str = HOST_LOSS, script_args: tuple[str, ...] = (),
                     isolated: bool = False, rate: str | None = None) -> tuple[str, int, float]:
    """Launch ``script`` (HOST_LOSS) from MAIN; once worker ``rank`` (on ``crashing``) is at step 3,
    crash its host, then touch ``flags/crashed``; (the launcher's output, its exit code, seconds
    from the crash to its end).  ``isolated``: every host in a namespace of its own (else only
    the one that crashes), ``rate``: their links' rate (:func:`hosts_in_namespaces`).
    Asserts ``placed`` (process -> host) at the crash, and that nothing of the job is left.  The
    output's last line is followed by ``CRASHED <time.time()>``."""
    tag = uuid.uuid4().hex[:6]
    main, cut = f"psnh-{tag}-m", f"psnh-{tag}-c"
    cuts = {name: f"psnh-{tag}-{name}" for name in NODES} if isolated else {crashing: cut}
    cut = cuts[crashing]
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
        ssh_config, known = hosts_in_namespaces(tmp_path, main, cuts, rate)
        env = cli_env(home, MXDIST_SSH_CONFIG=str(ssh_config), MXDIST_KNOWN_HOSTS=str(known),
                      MXDIST_REMOTE_DIR=str(home / "remote"))
        cli = subprocess.Popen(["ip", "netns", "exec", main, sys.executable, "-m", "mxdist", "launch", "-H", str(hosts),
                                *args, str(train), str(flags), str(rank), *script_args],
                               env=env, cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        wait_for(lambda: (flags / "ready").exists() or cli.poll() is not None, 120, f"worker {rank} to reach step 3")
        assert cli.poll() is None, cli.communicate(timeout=10)[0]
        found = {p["name"]: p["host"] for p in latest(home)["procs"]}
        assert found == placed, found
        crashed, crashed_at = crash(cut, crashing)
        (flags / "crashed").touch()
        out, _ = cli.communicate(timeout=240)
        took = time.monotonic() - crashed
    finally:
        if cli is not None and cli.poll() is None:
            cli.kill()
            cli.wait(10)
        for ns in (main, *cuts.values()):
            kill_namespace(ns)
        for ns in (main, *cuts.values()):
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
    script: str = HOST_LOSS_KEYS
    script_args: tuple[str, ...] = ()
    isolated: bool = False     # every host in a namespace of its own
    rate: str | None = None    # their links' rate
    final: str = ""            # what each rank prints last (default: host_loss_keys_final)

    def finals(self, out: str) -> bool:
        """Every rank ended with the uninterrupted run's values."""
        return out.count(self.final or host_loss_keys_final(self.workers)) == self.workers


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
#: the server case's crash while a 20M x 16 table computed on the servers trains, every host on
#: a 1 Gbit/s link of its own
CASES["big"] = replace(CASES["server"], script=HOST_LOSS_BIG, script_args=(str(20_000_000),), isolated=True,
                       rate="1gbit", final=HOST_LOSS_BIG_FINAL)
#: the same with the table given whole by rank 0 (a pretrained one: every value sent, copied, fetched)
CASES["big-given"] = replace(CASES["big"], script_args=(str(20_000_000), "given"))


def run_case(case: CrashCase, tmp: Path) -> tuple[str, int, float]:
    """:func:`crash_during_job` of ``case`` with HOST_LOSS_KEYS."""
    return crash_during_job(tmp, case.hosts_file, case.crashing, case.rank, case.args, case.placed,
                            script=case.script, script_args=case.script_args, isolated=case.isolated,
                            rate=case.rate)


#: one host after another: node1 runs the scheduler and worker 0, node2 the standby and worker 1,
#: node3 the server; node4 and node5 have a spare slot each
TWICE_HOSTS = "node1 slots=1\nnode2 slots=1\nnode4 slots=1   # spare\nnode5 slots=1   # spare\n"
TWICE_ARGS = ["-n", "2", "-s", "1", "--server-hosts", "node3", "--standby-scheduler", "--max-restarts", "1"]


def crash_one_after_another(tmp_path: Path) -> tuple[str, int, dict[str, str], dict[str, str]]:
    """Launch :data:`HOST_LOSS_TWICE` on :data:`TWICE_HOSTS`; crash node1 (the scheduler's host)
    once worker 0 is at step 2, then, once worker 1 is at step 4 and the scheduler that took the
    job over told its nodes of a new standby, crash that scheduler's host; (the launcher's output,
    its exit code, process -> host at the first crash, then at the second).  Asserts that nothing
    of the job is left on the hosts that live (before they are torn down) and anywhere after."""
    tag = uuid.uuid4().hex[:6]
    main, cuts = f"psnh-{tag}-m", {"node1": f"psnh-{tag}-c1", "node2": f"psnh-{tag}-c2"}
    home = tmp_path / "home"
    home.mkdir()
    flags = tmp_path / "flags"
    flags.mkdir()
    train = tmp_path / "train.py"
    train.write_text(HOST_LOSS_TWICE)
    hosts = tmp_path / "hosts"
    hosts.write_text(TWICE_HOSTS)
    cli = None
    placed: list[dict[str, str]] = []
    try:
        ssh_config, known = hosts_in_namespaces(tmp_path, main, cuts)
        env = cli_env(home, MXDIST_SSH_CONFIG=str(ssh_config), MXDIST_KNOWN_HOSTS=str(known),
                      MXDIST_REMOTE_DIR=str(home / "remote"))
        cli = subprocess.Popen(["ip", "netns", "exec", main, sys.executable, "-m", "mxdist", "launch", "-H", str(hosts),
                                *TWICE_ARGS, str(train), str(flags)],
                               env=env, cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        running = lambda: {p["name"]: p["host"] for p in latest(home)["procs"] if p["state"] == "running"}  # noqa: E731
        wait_for(lambda: (flags / "ready2").exists() or cli.poll() is not None, 120, "worker 0 to reach step 2")
        assert cli.poll() is None, cli.communicate(timeout=10)[0]
        placed.append(running())
        crash(cuts["node1"], "node1")
        # the standby on node2 took the job over, a new standby runs elsewhere and announced itself
        # to it, which told the nodes (its log says so), and worker 1 is at step 4
        wait_for(lambda: (flags / "ready4").exists() or cli.poll() is not None, 120, "worker 1 to reach step 4")
        assert cli.poll() is None, cli.communicate(timeout=10)[0]
        told = Path(next(p["log"] for p in latest(home)["procs"] if p["name"] == "scheduler-1"))
        wait_for(lambda: "a standby scheduler waits at" in told.read_text(errors="replace") or cli.poll() is not None,
                 60, "the scheduler on node2 to tell its nodes of a new standby")
        assert cli.poll() is None, cli.communicate(timeout=10)[0]
        placed.append(running())
        crash(cuts["node2"], "node2")
        out, _ = cli.communicate(timeout=240)
        left = lambda: [pid for pid in ns_pids(main) if _of_the_job(pid, tmp_path)]  # noqa: E731
        wait_for(lambda: not left(), 10, "the job's processes on the live hosts to end")
    finally:
        if cli is not None and cli.poll() is None:
            cli.kill()
            cli.wait(10)
        for ns in (main, *cuts.values()):
            kill_namespace(ns)
        for ns in (main, *cuts.values()):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"psnh-{tag}" not in listed, listed
    assert_nothing_left(home)
    return out, cli.returncode, placed[0], placed[1]


def _of_the_job(pid: int, root: Path) -> bool:
    """Is ``pid`` a process of the job (a psnode node or the training script under ``root``)?"""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    return b"psnode" in cmd or str(root / "train.py").encode() in cmd
