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
import time
from pathlib import Path

import pytest

from tests.support import wait_for
from tests.support.cli import assert_nothing_left, latest, run_cli, start_cli
from tests.support.hosts import HOST_LOSS, HOST_LOSS_FINAL, SSHD, descendants, keygen, settled, sshd_config

CRASH_ADDR = "127.0.0.6"

@pytest.fixture
def crashable(ssh_cluster, tmp_path: Path):
    """A fourth host, ``node4`` at 127.0.0.6, with its own sshd: (ssh config, known_hosts, sshd)."""
    root = tmp_path / "node4"
    root.mkdir()
    pub = keygen(root / "host_key")
    conf = root / "sshd.conf"
    conf.write_text(sshd_config(ssh_cluster.port, CRASH_ADDR, root / "host_key", root / "sshd.pid",
                                ssh_cluster.root / "authorized_keys"))
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
    train.write_text(HOST_LOSS)
    cli = start_cli(["launch", "-H", str(hosts), "-n", "2", "-s", "1", "--max-restarts", "1",
                     str(train), str(flags)], env)
    try:
        wait_for(lambda: (flags / "ready").exists() or cli.poll() is not None, 120, "worker 1 to reach step 3")
        assert cli.poll() is None, cli.communicate(timeout=10)[0]
        rec = latest(home)
        placed = {p["name"]: p["host"] for p in rec["procs"]}
        assert placed == {"scheduler": "node1", "server-0": "node1", "worker-0": "node1", "worker-1": "node4"}
        wait_for(lambda: settled(descendants(sshd.pid)), 30, "node4's shells to finish starting")
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
    assert out.count(HOST_LOSS_FINAL) == 2, out                  # the uninterrupted run's closed form
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
