"""README.md's walk-through for real hosts, as typed, in a real terminal, by a user whose home
has only a key and an ssh config (``host1``, ``host2``: two sshd hosts of conftest.py).

Step 2 as the README says: each host's ``ssh-keyscan -p PORT ADDRESS`` with the HostName and
Port that ``ssh -G`` reads from the user's ssh config (the fixture's port, not 22).
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys

from tests.support.cli import ROOT, assert_nothing_left, latest
from tests.support.terminal import Terminal, terminal_env

MXDIST = [sys.executable, "-m", "mxdist"]


def readme_lines(prefix: str) -> list[str]:
    """The README's command lines starting with ``prefix`` (a trailing ``# comment`` dropped)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### On real hosts over SSH"):text.index("### Placement and commands")]
    return [re.sub(r"\s+#.*$", "", line.strip()) for line in section.splitlines() if line.strip().startswith(prefix)]


def test_the_readme_walkthrough_for_real_hosts(ssh_cluster, tmp_path):
    user = tmp_path / "user"
    (user / ".ssh").mkdir(parents=True)      # step 1 done: a key of one's own, the hosts named
    shutil.copy(ssh_cluster.client_key, user / ".ssh" / "id_ed25519")
    (user / ".ssh" / "id_ed25519").chmod(0o600)
    (user / ".ssh" / "config").write_text(
        f"Host host1\n  HostName {ssh_cluster.addresses[0]}\nHost host2\n  HostName {ssh_cluster.addresses[1]}\n"
        f"Host *\n  Port {ssh_cluster.port}\n  User root\n")
    project = tmp_path / "project"                     # a checkout with the examples
    shutil.copytree(ROOT / "examples", project / "examples")
    home = tmp_path / "mxdist-home"
    env = ssh_cluster.env(home, HOME=str(user))
    for name in ("MXDIST_SSH_CONFIG", "MXDIST_KNOWN_HOSTS"):   # the defaults: ~/.ssh/config, known_hosts
        del env[name]
    env.pop("SSH_AUTH_SOCK", None)

    (keyscan,) = readme_lines("mkdir -p -m 700 ~/.ssh && ssh-keyscan -p PORT ADDRESS")      # step 2
    for host in ("host1", "host2"):
        # (-F: ssh finds ~/.ssh/config through the password database, not $HOME)
        shown = subprocess.run(["ssh", "-F", str(user / ".ssh" / "config"), "-G", host], env=env, check=True,
                               capture_output=True, text=True, timeout=30).stdout
        said = dict(line.split(" ", 1) for line in shown.splitlines()
                    if line.startswith(("hostname ", "port ")))
        line = keyscan.replace("PORT", said["port"]).replace("ADDRESS", said["hostname"])
        subprocess.run(["bash", "-c", line], env=env, check=True, capture_output=True, timeout=30)

    launches = readme_lines("mxdist launch -H host1,host2")                  # steps 4 and 5
    assert len(launches) == 2 and "--sync ." in launches[0], launches
    for line in launches:
        argv = [*MXDIST, *line.split()[1:]]
        with Terminal(argv, terminal_env(env), cwd=project) as term:
            code = term.wait(180)
            screen = term.screen().flat()
        assert code == 0, screen
        rec = latest(home)
        assert "[worker 0 @ host1] accuracy=0.9" in screen and f"job {rec['id']} succeeded in" in screen, screen
        assert {p["host"] for p in rec["procs"] if p["role"] == "worker"} == {"host1", "host2"}
    assert_nothing_left(home)
