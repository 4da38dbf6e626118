"""A host crashes mid-training: every process on it killed and its sshd gone, so it no longer
answers.  The worker it ran restarts with its rank on a host that answers, in a free slot of
the hosts file, and the job ends with the values of an uninterrupted run.

The crashing host is this module's own sshd on 127.0.0.6 (``node4``), so the session's three
hosts stay up for the other tests; it is started by the test and killed, with every session it
serves, as a power loss would end it (its peers see their connections reset, not time out:
loopback has no link to cut).
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from tests.ssh.conftest import SSHD, SshCluster
from tests.ssh.mxdist_testing import assert_nothing_left, latest, run_cli, start_cli
from tests.support import wait_for

CRASH_ADDR = "127.0.0.6"

TRAIN = textwrap.dedent("""
    import os, sys, time, pathlib, numpy as np, psnode
    flags = pathlib.Path(sys.argv[1])
    kv = psnode.kv.create('dist_sync')
    kv.set_optimizer(psnode.optimizer.create('sgd', learning_rate=0.125))
    kv.init('w', np.zeros(3, np.float32))
    start = kv.num_pushes('w')
    print("START", start, "RESTARTS", kv.restarts, flush=True)
    for step in range(start, 6):
        if kv.rank == 1 and step == 3 and kv.restarts == 0:
            (flags / 'ready').touch()
            time.sleep(300)                       # its host crashes here
        kv.push('w', np.full(3, (kv.rank + 1) * (step + 1), np.float32))
        kv.pull('w')
    print("FINAL", kv.pull('w').tolist(), flush=True)
    kv.close()
""")


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


@pytest.fixture
def crashable(ssh_cluster: SshCluster, tmp_path: Path):
    """A fourth host, ``node4`` at 127.0.0.6, with its own sshd: (ssh config, known_hosts, sshd)."""
    root = tmp_path / "node4"
    root.mkdir()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(root / "host_key")],
                   check=True, timeout=30)
    pub = " ".join((root / "host_key.pub").read_text().split()[:2])
    conf = root / "sshd.conf"
    conf.write_text(
        f"Port {ssh_cluster.port}\nListenAddress {CRASH_ADDR}\nHostKey {root}/host_key\n"
        f"PidFile {root}/sshd.pid\nAuthorizedKeysFile {ssh_cluster.root}/authorized_keys\n"
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "UsePAM no\nStrictModes no\nMaxSessions 100\nMaxStartups 100:30:200\nLogLevel ERROR\n")
    sshd = subprocess.Popen([SSHD, "-D", "-f", str(conf), "-E", str(root / "sshd.log")])
    try:
        wait_for(lambda: (root / "sshd.pid").exists(), 10, "node4's sshd to start")
        config = root / "ssh_config"
        config.write_text(f"Host node4\n  HostName {CRASH_ADDR}\n\n" + ssh_cluster.ssh_config.read_text())
        known = root / "known_hosts"
        known.write_text(ssh_cluster.known_hosts.read_text() + f"[{CRASH_ADDR}]:{ssh_cluster.port} {pub}\n")
        yield config, known, sshd
    finally:
        for pid in [sshd.pid, *descendants(sshd.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        sshd.wait(10)
        shutil.rmtree(root, ignore_errors=True)


def crash(sshd: subprocess.Popen, procs: list[int]) -> None:
    """Power loss: the host's sshd, every session it serves and the job's process groups there,
    killed at once."""
    for pid in [sshd.pid, *descendants(sshd.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for pgid in procs:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
    sshd.wait(10)


def test_a_crashed_hosts_worker_restarts_on_a_spare_slot_with_exact_values(ssh_cluster, crashable, home,
                                                                            tmp_path):
    config, known, sshd = crashable
    env = ssh_cluster.env(home, MXDIST_SSH_CONFIG=str(config), MXDIST_KNOWN_HOSTS=str(known))
    hosts = tmp_path / "hosts"
    hosts.write_text("node1 slots=1\nnode4 slots=1\nnode3 slots=1   # spare: nothing runs here at launch\n")
    flags = tmp_path / "flags"
    flags.mkdir()
    train = tmp_path / "train.py"
    train.write_text(TRAIN)
    cli = start_cli(["launch", "-H", str(hosts), "-n", "2", "-s", "1", "--max-restarts", "1",
                     str(train), str(flags)], env)
    try:
        wait_for(lambda: (flags / "ready").exists() or cli.poll() is not None, 120, "worker 1 to reach step 3")
        assert cli.poll() is None, cli.communicate(timeout=10)[0]
        rec = latest(home)
        placed = {p["name"]: p["host"] for p in rec["procs"]}
        assert placed == {"scheduler": "node1", "server-0": "node1", "worker-0": "node1", "worker-1": "node4"}
        crashed_at = time.monotonic()
        crash(sshd, [p["pid"] for p in rec["procs"] if p["host"] == "node4"])
        out, _ = cli.communicate(timeout=180)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait(10)
    took = time.monotonic() - crashed_at
    assert cli.returncode == 0, out
    assert "host node4 does not answer" in out and "nothing of the job starts there again" in out, out
    assert "worker-1 restarts with rank 1 on node3 (local rank 0): its host node4 does not answer" in out, out
    assert "[worker 1 @ node3] START 3 RESTARTS 1" in out, out
    assert "succeeded in" in out and "worker 1 moved to node3 (node4 did not answer)" in out.splitlines()[-1], out
    want = [-0.125 * 1.5 * sum(range(1, 7))] * 3                 # the uninterrupted run's closed form
    assert out.count(f"FINAL {want}") == 2, out
    assert "[worker 0 @ node1] FINAL" in out and "[worker 1 @ node3] FINAL" in out, out
    rec = latest(home)
    assert rec["state"] == "succeeded"
    worker1 = next(p for p in rec["procs"] if p["name"] == "worker-1")
    assert (worker1["host"], worker1["restarts"]) == ("node3", 1)
    assert [(c["change"], c["rank"], c["host"]) for c in rec.get("changes", [])] == [("moved", 1, "node3")]
    assert took < 120, f"the job took {took:.0f} s after the crash"
    st = run_cli(["status", rec["id"]], env)
    assert st.returncode == 0, st.stdout + st.stderr
    assert re.search(r"worker 1 moved to node3 at \d\d:\d\d:\d\d: node4 did not answer", st.stdout), st.stdout
    assert re.search(r"worker +1 +node3 .* exited", st.stdout) and "node4: not verified" in st.stdout, st.stdout
    assert_nothing_left(home)
