"""Which known_hosts files an SSH host's key is checked against, as OpenSSH reads the ssh config
(``UserKnownHostsFile``, ``GlobalKnownHostsFile``: several files, quotes, ``~`` and ``%`` tokens,
``none``); ``--known-hosts`` in place of the user's files.  No connection is made."""
from __future__ import annotations

import getpass
import os

from mxdist.backends.ssh import GLOBAL_KNOWN_HOSTS, KnownHosts, SshBackend
from mxdist.planning.hosts import Host


def backend(tmp_path, config: str, known_hosts: str | None = None) -> SshBackend:
    path = tmp_path / "config"
    path.write_text(config)
    return SshBackend(workdir="/w", python="python3", ssh_config=str(path), known_hosts=known_hosts)


def test_the_ssh_configs_files_with_their_tokens(tmp_path):
    home = os.path.expanduser("~")
    ssh = backend(tmp_path, ("Host n1\n  HostName 10.1.0.1\n  Port 2200\n  User alice\n"
                             '  UserKnownHostsFile %d/k1 "~/k 2" /k/%h-%p-%r-%n-%u\n'
                             "  GlobalKnownHostsFile /etc/g1 /etc/g2\n"
                             "Host n2\n  UserKnownHostsFile none\n  GlobalKnownHostsFile none\n"))
    assert ssh.known(Host("n1")) == KnownHosts(
        (f"{home}/k1", f"{home}/k 2", f"/k/10.1.0.1-2200-alice-n1-{getpass.getuser()}"), ("/etc/g1", "/etc/g2"))
    assert ssh.known(Host("n2")) == KnownHosts((), ())
    assert ssh.known(Host("n3")) == KnownHosts((f"{home}/.ssh/known_hosts", f"{home}/.ssh/known_hosts2"),
                                               GLOBAL_KNOWN_HOSTS)


def test_known_hosts_given_replaces_the_users_files_only(tmp_path):
    ssh = backend(tmp_path, "Host *\n  UserKnownHostsFile /u1\n  GlobalKnownHostsFile /g1\n",
                  known_hosts=str(tmp_path / "mine"))
    assert ssh.known(Host("n1")) == KnownHosts((str(tmp_path / "mine"),), ("/g1",))
    assert ssh.options()["known_hosts"] == str(tmp_path / "mine")
    assert backend(tmp_path, "").options()["known_hosts"] is None     # a job's record: found again, as here
