"""Fixtures shared by every test tier.

``other_user``: a real second Unix user, created for the test module (``useradd``) and removed
at its end (``userdel``), to check what another user of the machine can and cannot do to a
job.  Needs root, ``useradd`` and ``setpriv``: skipped without them, failed under CI
(``tests.support.require``).
"""
from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.support import interruptible, require


def pytest_configure(config: pytest.Config) -> None:
    # every tier starts mxdist with SIGINT as a terminal would (tests.support.interruptible)
    interruptible()


@dataclass(frozen=True)
class OtherUser:
    """A Unix user with no home, no groups of ours and no login shell."""

    name: str
    uid: int
    gid: int
    python: str   # an interpreter this user may run (the standard library only is assumed)

    def argv(self, argv: list[str]) -> list[str]:
        """``argv`` run as this user (real and effective ids, no supplementary groups)."""
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", "--", *argv]

    def run(self, argv: list[str], input: str | None = None, timeout: float = 60,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """Run ``argv`` as this user from ``/``, with a minimal environment; bounded in time."""
        base = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/"}
        return subprocess.run(self.argv(argv), input=input, capture_output=True, text=True, cwd="/",
                              env={**base, **(env or {})}, timeout=timeout)


def _python_for(user: OtherUser) -> str | None:
    for py in (sys.executable, "/usr/bin/python3"):
        if os.path.exists(py) and user.run([py, "-c", "print('ok')"], timeout=30).stdout.strip() == "ok":
            return py
    return None


@pytest.fixture(scope="module")
def other_user() -> Iterator[OtherUser]:
    require(None if os.geteuid() == 0 else "creating a second Unix user needs root", "run the tests as root")
    for tool in ("useradd", "userdel", "setpriv"):
        require(None if shutil.which(tool) else f"{tool} is not installed", "apt-get install passwd util-linux")
    name = f"psn{secrets.token_hex(4)}"
    subprocess.run(["useradd", "--system", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin",
                    name], check=True, capture_output=True, timeout=60)
    try:
        import pwd
        entry = pwd.getpwnam(name)
        user = OtherUser(name, entry.pw_uid, entry.pw_gid, "")
        python = _python_for(user)
        require(None if python else f"no Python interpreter the user {name} may run",
                "install python3 (Debian: /usr/bin/python3)")
        yield OtherUser(name, entry.pw_uid, entry.pw_gid, python)
    finally:
        subprocess.run(["userdel", name], capture_output=True, timeout=60)
