"""Three real OpenSSH servers on 127.0.0.2, .3 and .4 (one per fake host, same port).

Session-scoped: started once (about 0.1 s), stopped at the end.  Everything lives in a temp
dir: host keys (ed25519, one per host), a client key, authorized_keys, a known_hosts with the
three host keys, and an ssh config naming the hosts ``node1..node3``.  The CLI is pointed at
them with MXDIST_SSH_CONFIG / MXDIST_KNOWN_HOSTS; root's real ~/.ssh is never touched.

Without /usr/sbin/sshd the tests skip, except under CI (env CI set) where they fail: CI
installs openssh-server.
"""
from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.cli import cli_env

SSHD = "/usr/sbin/sshd"
ADDRESSES = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
UNREACHABLE = "127.0.0.5"


@dataclass
class SshCluster:
    root: Path
    port: int
    names: tuple[str, ...]           # node1, node2, node3 (ssh config aliases)
    addresses: tuple[str, ...]
    ssh_config: Path
    known_hosts: Path
    client_key: Path
    host_pubkeys: dict[str, str]     # address -> "ssh-ed25519 AAAA..."
    sshd_pids: dict[str, int] = field(default_factory=dict)   # address -> its sshd listener

    def env(self, home: Path, **extra: str) -> dict[str, str]:
        base = {"MXDIST_SSH_CONFIG": str(self.ssh_config), "MXDIST_KNOWN_HOSTS": str(self.known_hosts),
                "MXDIST_REMOTE_DIR": str(home / "remote")}
        return cli_env(home, **{**base, **extra})

    def known_hosts_line(self, address: str) -> str:
        return f"[{address}]:{self.port} {self.host_pubkeys[address]}\n"


def _free_port() -> int:
    """A port free on every test address, outside the kernel's range for outgoing connections
    (as the launcher picks its own: no connection can take it before the sshds bind it)."""
    from mxdist.planning.options import listen_range
    from mxdist.supervisor.setup import ephemeral_range

    low, high = listen_range(ephemeral_range())
    for _ in range(200):
        port = random.randint(low, high)
        ok = True
        for addr in ADDRESSES:
            with socket.socket() as s:
                try:
                    s.bind((addr, port))
                except OSError:
                    ok = False
        if ok:
            return port
    raise RuntimeError("no port free on all test addresses")


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(path)],
                   check=True, timeout=30)
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


@pytest.fixture(scope="session")
def ssh_cluster(tmp_path_factory: pytest.TempPathFactory):
    if not os.path.exists(SSHD):
        if os.environ.get("CI"):
            pytest.fail(f"{SSHD} is missing: CI must install openssh-server (.ci/run does)")
        pytest.skip(f"{SSHD} not installed (apt-get install openssh-server)")
    root = tmp_path_factory.mktemp("sshd")
    subprocess.run(["install", "-d", "-m", "0755", "/run/sshd"], check=True)
    client_key = root / "client_key"
    client_pub = _keygen(client_key)
    (root / "authorized_keys").write_text(client_pub + "\n")
    port = _free_port()
    procs: list[subprocess.Popen[bytes]] = []
    pubkeys: dict[str, str] = {}
    try:
        for i, addr in enumerate(ADDRESSES, start=1):
            pubkeys[addr] = _keygen(root / f"host{i}_key")
            config = root / f"sshd{i}.conf"
            config.write_text(
                f"Port {port}\nListenAddress {addr}\nHostKey {root}/host{i}_key\n"
                f"PidFile {root}/sshd{i}.pid\nAuthorizedKeysFile {root}/authorized_keys\n"
                "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                "Subsystem sftp internal-sftp\nMaxSessions 100\nMaxStartups 100:30:200\n"
                "LogLevel ERROR\n"
            )
            subprocess.run([SSHD, "-t", "-f", str(config)], check=True, timeout=30)
            procs.append(subprocess.Popen([SSHD, "-D", "-f", str(config), "-E", str(root / f"sshd{i}.log")]))
        deadline = time.monotonic() + 10
        for i in range(1, len(ADDRESSES) + 1):
            while not (root / f"sshd{i}.pid").exists():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"sshd {i} did not start: {(root / f'sshd{i}.log').read_text()}")
                time.sleep(0.02)
        names = tuple(f"node{i}" for i in range(1, len(ADDRESSES) + 1))
        ssh_config = root / "ssh_config"
        blocks = [f"Host {n}\n  HostName {a}\n" for n, a in zip(names, ADDRESSES)]
        blocks.append(
            f"Host *\n  Port {port}\n  User root\n  IdentityFile {client_key}\n  IdentitiesOnly yes\n"
        )
        ssh_config.write_text("\n".join(blocks))
        known_hosts = root / "known_hosts"
        cluster = SshCluster(root, port, names, ADDRESSES, ssh_config, known_hosts, client_key, pubkeys,
                             {a: p.pid for a, p in zip(ADDRESSES, procs)})
        known_hosts.write_text("".join(cluster.known_hosts_line(a) for a in ADDRESSES))
        yield cluster
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A private MXDIST_HOME for one test."""
    path = tmp_path / "mxdist-home"
    path.mkdir()
    return path
