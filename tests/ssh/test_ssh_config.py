"""Logging in as users do, against the real sshd hosts of conftest.py: a key given with ``-i``,
no key at all, a first connection to hosts whose keys are not known yet (and no ``~/.ssh``),
bastions (ProxyJump, ProxyCommand) and keepalives from the ssh config.  Each problem's fix is
run as printed, then the launch works.
"""
from __future__ import annotations

import os
import re
import subprocess
import textwrap
from pathlib import Path

from tests.support.cli import assert_nothing_left, latest, run_cli, wait_for

SHOW = textwrap.dedent("""
    import os
    print("on", os.environ["PSNODE_HOST"], "rank", os.environ["RANK"], flush=True)
""")

SLEEPER = textwrap.dedent("""
    import os, time
    print("started on", os.environ["PSNODE_HOST"], flush=True)
    time.sleep(300)
""")


def flat(text: str) -> str:
    return " ".join(text.replace("│", " ").split())


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def bare_env(ssh_cluster, home: Path, user_home: Path, config: str, **extra: str) -> dict[str, str]:
    """A user with an empty home directory (no ~/.ssh, no default keys) and no ssh-agent."""
    user_home.mkdir(exist_ok=True)
    env = ssh_cluster.env(home, HOME=str(user_home), MXDIST_SSH_CONFIG=config, **extra)
    env.pop("SSH_AUTH_SOCK", None)
    return env


def test_no_key_says_how_to_give_one_and_dash_i_logs_in(ssh_cluster, home, tmp_path):
    config = write(tmp_path / "config", f"Host *\n  Port {ssh_cluster.port}\n  User root\n")
    hosts = ",".join(ssh_cluster.addresses[:2])
    env = bare_env(ssh_cluster, home, tmp_path / "user", config)
    show = write(tmp_path / "show.py", SHOW)
    res = run_cli(["launch", "-H", hosts, "-s", "0", show], env)
    assert res.returncode == 3, res.stdout + res.stderr
    text = flat(res.stderr)
    for address in ssh_cluster.addresses[:2]:
        assert f"{address}: no SSH key to log in to root@{address}:{ssh_cluster.port} with" in text, text
    assert "fix: pass -i ~/.ssh/KEY (--identity-file)" in text and "see the message" not in text

    res = run_cli(["launch", "-H", hosts, "-s", "0", "-i", str(ssh_cluster.client_key), show], env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"on {ssh_cluster.addresses[1]} rank 1" in flat(res.stdout)
    # a detached job: status and stop log in with the job's key too
    sleeper = write(tmp_path / "sleeper.py", SLEEPER)
    res = run_cli(["launch", "-d", "-H", hosts, "-s", "0", "-i", str(ssh_cluster.client_key), sleeper], env)
    assert res.returncode == 0, res.stdout + res.stderr
    job = res.stdout.split()[-1]
    wait_for(lambda: "started on" in run_cli(["logs", job, "--role", "worker", "--rank", "1"], env).stdout, 30,
             "worker 1's first line")
    status = run_cli(["status", job], env)
    assert status.returncode == 0 and "running" in status.stdout, status.stdout + status.stderr
    stop = run_cli(["stop", job], env)
    assert stop.returncode == 0 and f"{ssh_cluster.addresses[1]}: nothing of the job left" in stop.stderr
    missing = run_cli(["launch", "-H", hosts, "-i", str(tmp_path / "nokey"), show], env)
    assert missing.returncode == 2 and f"-i {tmp_path / 'nokey'}: no such file" in flat(missing.stderr)
    assert_nothing_left(home)


def test_unknown_host_keys_fix_as_printed_without_a_dot_ssh(ssh_cluster, home, tmp_path):
    """A new user's first launch: no ~/.ssh at all.  The printed fix, run as printed, works."""
    user = tmp_path / "user"
    config = write(tmp_path / "config", ssh_cluster.ssh_config.read_text())
    env = bare_env(ssh_cluster, home, user, config)
    del env["MXDIST_KNOWN_HOSTS"]                       # the default: ~/.ssh/known_hosts
    show = write(tmp_path / "show.py", SHOW)
    res = run_cli(["launch", "-H", "node1,node2", "-s", "0", show], env)
    assert res.returncode == 3, res.stdout + res.stderr
    text = flat(res.stderr)
    fixes = re.findall(r"verify it, then add it: (.*?); or pass --accept-new-host-keys", text)
    port = ssh_cluster.port
    assert fixes == [f"mkdir -p -m 700 ~/.ssh && ssh-keyscan -p {port} {a} >> ~/.ssh/known_hosts"
                     for a in ssh_cluster.addresses[:2]], text
    assert "not in ~/.ssh/known_hosts" in text
    for fix in fixes:
        subprocess.run(["bash", "-c", fix], env=env, check=True, capture_output=True, timeout=30)
    assert (user / ".ssh").stat().st_mode & 0o777 == 0o700
    res = run_cli(["launch", "-H", "node1,node2", "-s", "0", show], env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "on 127.0.0.3 rank 1" in flat(res.stdout)
    assert_nothing_left(home)


def _tcp_peers(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP connection process ``pid`` holds (IPv4)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    peers = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[9] in inodes:
            host, port = fields[2].split(":")
            address = ".".join(str(int(host[i:i + 2], 16)) for i in (6, 4, 2, 0))
            peers.add((address, int(port, 16)))
    return peers


def test_proxyjump_and_proxycommand_and_keepalives_from_the_ssh_config(ssh_cluster, home, tmp_path):
    used = tmp_path / "proxy-used"
    known = ssh_cluster.known_hosts
    jump_cmd = (f"sh -c 'echo %h:%p >> {used}; exec ssh -F {ssh_cluster.ssh_config} -o BatchMode=yes "
                f"-o StrictHostKeyChecking=yes -o UserKnownHostsFile={known} -W %h:%p node1'")
    config = write(tmp_path / "config", (
        "Host behind\n  HostName 127.0.0.3\n  ProxyJump node1\n  ServerAliveInterval 7\n"
        f"Host viacmd\n  HostName 127.0.0.4\n  ProxyCommand {jump_cmd}\n"
        "Host broken\n  HostName 127.0.0.4\n  ProxyCommand false\n"
        + ssh_cluster.ssh_config.read_text()))
    env = ssh_cluster.env(home, MXDIST_SSH_CONFIG=config)
    port = ssh_cluster.port

    # ProxyJump: the launcher talks to node1 only; the job runs on 127.0.0.3 behind it
    res = run_cli(["launch", "-d", "-H", "behind", "-s", "0", write(tmp_path / "sleeper.py", SLEEPER)], env)
    assert res.returncode == 0, res.stdout + res.stderr
    job = res.stdout.split()[-1]
    wait_for(lambda: "started on 127.0.0.3" in run_cli(["logs", job], env).stdout, 30, "the job behind node1")
    peers = _tcp_peers(latest(home)["supervisor"]["pid"])
    assert ("127.0.0.2", port) in peers and ("127.0.0.3", port) not in peers, peers
    status = run_cli(["status", job], env)
    assert status.returncode == 0 and "running" in status.stdout and "behind" in status.stdout, status.stderr
    stop = run_cli(["stop", job], env)
    assert stop.returncode == 0 and "behind: nothing of the job left" in stop.stderr, stop.stderr

    # ProxyCommand (here: ssh -W through node1), with the config's %h and %p
    res = run_cli(["launch", "-H", "viacmd", "-s", "0", write(tmp_path / "show.py", SHOW)], env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "on 127.0.0.4 rank 0" in flat(res.stdout)
    assert set(used.read_text().split()) == {f"127.0.0.4:{port}"}
    res = run_cli(["launch", "-H", "broken", "-s", "0", str(tmp_path / "show.py")], env)
    assert res.returncode == 3 and "the ssh config's ProxyCommand for broken failed" in flat(res.stderr), res.stderr

    # ServerAliveInterval: the connection sends keepalives at that interval (paramiko keeps it here)
    from mxdist.backends.ssh import SshBackend
    from mxdist.planning.hosts import Host

    backend = SshBackend(workdir=str(tmp_path), python="python3", ssh_config=config, known_hosts=str(known))
    try:
        transport = backend._client(backend.resolve(Host("behind"))).get_transport()
        assert transport is not None and transport.packetizer._Packetizer__keepalive_interval == 7
    finally:
        backend.close()
    assert_nothing_left(home)


def test_known_hosts_files_from_the_ssh_config_as_openssh_reads_them(ssh_cluster, home, tmp_path):
    """``UserKnownHostsFile`` (several files, ``%d``/``~`` expanded) and ``GlobalKnownHostsFile``
    from the ssh config, as ``ssh -F`` reads them; strict checking kept: a key in neither is
    refused, naming the config's file, and ``--accept-new-host-keys`` adds it there."""
    user = tmp_path / "user"
    user.mkdir()
    (user / "cluster_known").write_text(ssh_cluster.known_hosts_line("127.0.0.2"))
    (tmp_path / "global_known").write_text(ssh_cluster.known_hosts_line("127.0.0.3"))
    config = write(tmp_path / "config", (
        f"Host *\n  UserKnownHostsFile %d/cluster_known ~/more_known\n"
        f"  GlobalKnownHostsFile {tmp_path / 'global_known'}\n" + ssh_cluster.ssh_config.read_text()))
    env = bare_env(ssh_cluster, home, user, config)
    del env["MXDIST_KNOWN_HOSTS"]
    assert subprocess.run(["ssh", "-F", config, "-o", "BatchMode=yes", "node2", "true"], env=env,
                          capture_output=True, timeout=30).returncode == 0       # OpenSSH takes node2's key
    show = write(tmp_path / "show.py", SHOW)
    res = run_cli(["launch", "-H", "node1,node2", "-s", "0", show], env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "on 127.0.0.3 rank 1" in flat(res.stdout)

    res = run_cli(["launch", "-H", "node1,node3", "-s", "0", show], env)
    assert res.returncode == 3, res.stdout + res.stderr
    text = flat(res.stderr)
    assert f"for [127.0.0.4]:{ssh_cluster.port}, not in ~/cluster_known" in text, text
    assert f"ssh-keyscan -p {ssh_cluster.port} 127.0.0.4 >> ~/cluster_known" in text, text
    res = run_cli(["launch", "-H", "node1,node3", "-s", "0", "--accept-new-host-keys", show], env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert ssh_cluster.host_pubkeys["127.0.0.4"] in (user / "cluster_known").read_text()

    # a changed key in the global file is refused, as OpenSSH refuses it
    (tmp_path / "global_known").write_text(
        ssh_cluster.known_hosts_line("127.0.0.3").replace(ssh_cluster.host_pubkeys["127.0.0.3"],
                                                         ssh_cluster.host_pubkeys["127.0.0.4"]))
    res = run_cli(["launch", "-H", "node2", "-s", "0", show], env)
    assert res.returncode == 3 and "host key of 127.0.0.3" in flat(res.stderr) and "CHANGED" in res.stderr, \
        res.stderr
    assert_nothing_left(home)
