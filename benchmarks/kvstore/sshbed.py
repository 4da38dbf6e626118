"""The SSH testbed for benchmarks: real OpenSSH servers on 127.0.0.2, .3, ... (one per fake host).

The same setup as tests/ssh/conftest.py, as a context
manager a benchmark can use outside pytest::

    with SshBed(hosts=2) as bed:
        env = bed.env(home)                 # MXDIST_SSH_CONFIG, MXDIST_KNOWN_HOSTS, MXDIST_REMOTE_DIR
        subprocess.run(["mxdist", "launch", "-H", bed.hostlist, ...], env=env)

Everything lives in a temp dir (host keys, a client key, authorized_keys, a known_hosts holding
exactly the testbed's host keys, an ssh config naming the hosts ``node1..nodeN``); root's own
~/.ssh is never read or written.  The sshd processes started here (and only those) are stopped
on exit, and the temp dir is removed.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"
START_TIMEOUT = 10.0


class SshBedError(RuntimeError):
    """The testbed cannot start (no sshd, no free port, sshd failed); the message says why."""


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(path)],
                   check=True, timeout=30, capture_output=True)
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


def _common_free_port(addresses: tuple[str, ...]) -> int:
    for _ in range(50):
        with socket.socket() as s:
            s.bind((addresses[0], 0))
            port = s.getsockname()[1]
        ok = True
        for addr in addresses[1:]:
            with socket.socket() as s:
                try:
                    s.bind((addr, port))
                except OSError:
                    ok = False
        if ok:
            return port
    raise SshBedError("no port free on every testbed address")


class SshBed:
    """``hosts`` sshd servers on 127.0.0.2 onwards, one port for all (module docstring)."""

    def __init__(self, hosts: int = 2) -> None:
        if not 1 <= hosts <= 8:
            raise SshBedError(f"hosts must be 1..8, not {hosts}")
        self.addresses = tuple(f"127.0.0.{i}" for i in range(2, 2 + hosts))
        self.names = tuple(f"node{i}" for i in range(1, hosts + 1))
        self.root: Path | None = None
        self.procs: list[subprocess.Popen[bytes]] = []
        self.port = 0

    @property
    def hostlist(self) -> str:
        """``node1,node2,...`` for ``mxdist launch -H``."""
        return ",".join(self.names)

    def env(self, home: Path, **extra: str) -> dict[str, str]:
        """The variables that point the CLI at the testbed (with a private MXDIST_HOME)."""
        assert self.root is not None
        out = {"MXDIST_SSH_CONFIG": str(self.root / "ssh_config"),
               "MXDIST_KNOWN_HOSTS": str(self.root / "known_hosts"),
               "MXDIST_REMOTE_DIR": str(home / "remote"), "MXDIST_HOME": str(home)}
        out.update(extra)
        return out

    def __enter__(self) -> SshBed:
        if not os.path.exists(SSHD):
            raise SshBedError(f"{SSHD} not installed (apt-get install openssh-server)")
        self.root = root = Path(tempfile.mkdtemp(prefix="mxdist-sshbed-"))
        try:
            self._start(root)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self, root: Path) -> None:
        subprocess.run(["install", "-d", "-m", "0755", "/run/sshd"], check=True, timeout=30)
        client_key = root / "client_key"
        (root / "authorized_keys").write_text(_keygen(client_key) + "\n")
        self.port = port = _common_free_port(self.addresses)
        pubkeys = {}
        for i, addr in enumerate(self.addresses, start=1):
            pubkeys[addr] = _keygen(root / f"host{i}_key")
            config = root / f"sshd{i}.conf"
            config.write_text(
                f"Port {port}\nListenAddress {addr}\nHostKey {root}/host{i}_key\n"
                f"PidFile {root}/sshd{i}.pid\nAuthorizedKeysFile {root}/authorized_keys\n"
                "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                "Subsystem sftp internal-sftp\nMaxSessions 100\nMaxStartups 100:30:200\nLogLevel ERROR\n")
            r = subprocess.run([SSHD, "-t", "-f", str(config)], capture_output=True, text=True, timeout=30)
            if r.returncode != 0:
                raise SshBedError(f"sshd -t refused {config}: {r.stderr.strip()}")
            self.procs.append(subprocess.Popen([SSHD, "-D", "-f", str(config), "-E", str(root / f"sshd{i}.log")]))
        deadline = time.monotonic() + START_TIMEOUT
        for i in range(1, len(self.addresses) + 1):
            while not (root / f"sshd{i}.pid").exists():
                if time.monotonic() > deadline:
                    log = root / f"sshd{i}.log"
                    raise SshBedError(f"sshd {i} did not start: {log.read_text() if log.exists() else ''}")
                time.sleep(0.02)
        blocks = [f"Host {n}\n  HostName {a}\n" for n, a in zip(self.names, self.addresses, strict=False)]
        blocks.append(f"Host *\n  Port {port}\n  User root\n  IdentityFile {client_key}\n  IdentitiesOnly yes\n")
        (root / "ssh_config").write_text("\n".join(blocks))
        (root / "known_hosts").write_text("".join(f"[{a}]:{port} {pubkeys[a]}\n" for a in self.addresses))

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        self.procs.clear()
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None
