"""README.md's first command, taken from README.md itself, pasted as a new user on a stock
Debian machine would: in a fresh ``git clone`` of this checkout's HEAD, by ``bash``, with Debian's
own ``/usr/bin/python3`` (externally managed, PEP 668) first on a stock ``PATH``, an empty
``HOME`` (no pip configuration, no pip cache, a fresh ``~/.mxdist``) and nothing else of this
environment but how the machine reaches the package registry (proxy and CA variables).

It must exit 0 and print the job's ``accuracy=`` line at the figure examples/README.md shows
(within the 1 point tests/cluster/test_examples.py allows), then nothing of the job may be left:
no process group of the job's record, no process running from the clone.  Every wait is
bounded; on a timeout the command gets Ctrl-C (the launcher stops its job), then SIGKILL.

It pip-installs from the package registry (minutes), once per run of the suite: marked
``first_command``, ``-m 'not first_command'`` leaves it out.  Without git or Debian's python3
with ``venv`` (the python3-venv package) it skips, and under CI it fails (``.ci/run`` installs them).
The clone is of HEAD: commit first, or the test fails naming the difference.
"""
from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support import require
from tests.support.cli import assert_nothing_left
from tests.support.cluster import ROOT

pytestmark = pytest.mark.first_command

STOCK_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SYSTEM_PYTHON = "/usr/bin/python3"
#: how this machine reaches the package registry; everything else of the test's environment stays out
NETWORK_VARS = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
                "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "PIP_CERT", "PIP_INDEX_URL",
                "PIP_DEFAULT_TIMEOUT")
#: the whole command: making the venv, pip installing from the registry, the 10-epoch job
TIMEOUT = 600.0
#: accuracy points the job may lose against examples/README.md's figure (tests/cluster/test_examples.py's)
TOLERANCE = 0.01


def first_command(readme: str) -> str:
    """The one line of the first ```bash block in README.md's section "## Two commands"."""
    section = re.search(r"^## Two commands\n(.*?)(?=^## )", readme, re.M | re.S)
    assert section, "README.md has no section '## Two commands'"
    block = re.search(r"^```bash\n(.*?)^```", section.group(1), re.M | re.S)
    assert block, "README.md's '## Two commands' has no ```bash block"
    lines = [line for line in block.group(1).splitlines() if line.strip()]
    assert len(lines) == 1, f"README.md's first command must be one line, not {lines}"
    return lines[0]


def documented_accuracy(examples_readme: str) -> float:
    """The ``accuracy=`` figure of examples/README.md's output of ``mlp_numpy.py`` ("What to expect")."""
    section = re.search(r"^## What to expect\n(.*?)(?=^## )", examples_readme, re.M | re.S)
    assert section, "examples/README.md has no section '## What to expect'"
    found = re.findall(r"^accuracy=([0-9.]+)$", section.group(1), re.M)
    assert found, "examples/README.md's 'What to expect' shows no accuracy= line"
    return float(found[0])


def stock_env(home: Path) -> dict[str, str]:
    """A login's environment on a stock Debian: PATH, HOME, the user, a UTF-8 locale."""
    user = pwd.getpwuid(os.getuid()).pw_name
    env = {"PATH": STOCK_PATH, "HOME": str(home), "USER": user, "LOGNAME": user, "SHELL": "/bin/bash",
           "LANG": "C.UTF-8"}
    env.update({k: os.environ[k] for k in NETWORK_VARS if k in os.environ})
    return env


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def processes_in(clone: Path) -> dict[int, str]:
    """Live processes that run from ``clone``: working directory in it, or its path on the command line."""
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue
        if (str(clone) in cmdline or cwd == str(clone) or cwd.startswith(f"{clone}/")) and _alive(int(entry)):
            found[int(entry)] = cmdline.strip()
    return found


def stop(proc: subprocess.Popen[str]) -> None:
    """Ctrl-C to the command's session (the launcher stops its job), then SIGKILL; reaped either way."""
    for sig, wait in ((signal.SIGINT, 60.0), (signal.SIGKILL, 10.0)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait)


def assert_none_left(clone: Path, home: Path) -> None:
    """Nothing of the job is left: its record's process groups (killed and failed otherwise, with
    its secret files checked: :func:`assert_nothing_left`), and no process running from the clone
    (killed by pid, and the test fails)."""
    failure: AssertionError | None = None
    try:
        assert_nothing_left(home / ".mxdist", timeout=30)
    except AssertionError as e:
        failure = e
    deadline = time.monotonic() + 10
    while (left := processes_in(clone)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if failure is not None:
        raise failure
    assert not left, f"processes running from the clone after the command ended: {left}"


def test_readme_first_command_in_a_fresh_clone_on_stock_debian(tmp_path: Path) -> None:
    git = shutil.which("git")
    require(None if git else "git is not installed", "apt-get install git")
    assert git is not None
    require(None if (ROOT / ".git").exists() else f"{ROOT} is not a git checkout", "run the tests in a git clone")
    venv_ok = os.access(SYSTEM_PYTHON, os.X_OK) and subprocess.run(
        [SYSTEM_PYTHON, "-c", "import ensurepip, venv"], capture_output=True, timeout=60).returncode == 0
    require(None if venv_ok else f"{SYSTEM_PYTHON} cannot make a venv (no ensurepip)",
            "apt-get install python3-venv")

    found = shutil.which("python3", path=STOCK_PATH)
    require(None if found and os.path.realpath(found) == os.path.realpath(SYSTEM_PYTHON)
            else f"python3 on the stock PATH is {found}, not Debian's {SYSTEM_PYTHON}",
            "run the tests where /usr/local/bin has no python3")

    trust = ["-c", "safe.directory=*"]   # the checkout may belong to another user than the tests
    head = subprocess.run([git, *trust, "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          timeout=60, check=True).stdout.strip()
    clone = tmp_path / "mxdist"
    home = tmp_path / "home"
    home.mkdir()
    subprocess.run([git, *trust, "clone", "-q", "--no-checkout", str(ROOT), str(clone)], capture_output=True,
                   timeout=300, check=True)
    subprocess.run([git, "-C", str(clone), "checkout", "-q", head], capture_output=True, timeout=300, check=True)
    try:
        command = first_command((clone / "README.md").read_text())
        here = first_command((ROOT / "README.md").read_text())
        assert command == here, (f"README.md's first command differs from HEAD's ({here!r} here, {command!r} at "
                                 f"{head}): commit it first")
        expected = documented_accuracy((clone / "examples" / "README.md").read_text())

        proc = subprocess.Popen(["/bin/bash", "-c", command], cwd=clone, env=stock_env(home), text=True,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            stop(proc)
            out, _ = proc.communicate()
            pytest.fail(f"README.md's first command ran past {TIMEOUT:g} s: {command}\n{out[-6000:]}")
        finally:
            stop(proc)
        assert proc.returncode == 0, f"README.md's first command exited {proc.returncode}: {command}\n{out[-6000:]}"
        found = re.findall(r"^\[worker 0 @ [^]]+\] accuracy=([0-9.]+)$", out, re.M)
        assert found, f"no accuracy= line from worker 0:\n{out[-6000:]}"
        assert float(found[-1]) >= expected - TOLERANCE, (f"accuracy={found[-1]}, examples/README.md shows "
                                                          f"{expected}:\n{out[-6000:]}")
        assert re.search(r"^job \S+ succeeded in ", out, re.M), out[-6000:]
        cfg = (clone / ".venv" / "pyvenv.cfg").read_text()
        assert re.search(r"^home = /usr/bin$", cfg, re.M), f"the clone's .venv is not Debian's python3's:\n{cfg}"
    finally:
        try:
            assert_none_left(clone, home)
        finally:
            shutil.rmtree(tmp_path, ignore_errors=True)
