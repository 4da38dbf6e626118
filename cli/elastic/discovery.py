"""``--host-discovery-script``: run the script, read its hosts, poll it while the job runs.

The contract is Horovod's: an executable that prints the hosts available now, one
``host[:slots]`` per line (:func:`mxdist.elastic.rules.parse_discovery`), and exits 0.  ``mxdist
launch`` runs it once before anything starts (its hosts are the job's first hosts; a failure
there is a launch error) and then every :data:`INTERVAL` seconds while the job runs
(:class:`DiscoveryPoller`), each run bounded by :data:`TIMEOUT` seconds.  A run that fails (exit status,
timeout, unreadable output) is a warning and the hosts stay as they were; the job goes on.
"""
from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable

from ..planning.hosts import Host, HostsError
from .rules import parse_discovery

INTERVAL = 3.0      # seconds between runs of the script while the job runs
TIMEOUT = 10.0      # seconds one run may take


class DiscoveryError(RuntimeError):
    """The script could not be run, failed, timed out or printed something unreadable."""


def discover(path: str, timeout: float = TIMEOUT, cwd: str | None = None) -> list[Host]:
    """Run the script at ``path`` once: the hosts it printed (DiscoveryError when it failed)."""
    try:
        done = subprocess.run([path], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                              stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        raise DiscoveryError(f"{path} did not finish within {timeout:g} s") from None
    except OSError as exc:
        raise DiscoveryError(f"cannot run {path}: {exc.strerror or exc} (an executable file: chmod +x)") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [""])[-1][:200]
        raise DiscoveryError(f"{path} exited with code {done.returncode}" + (f": {last}" if last else ""))
    try:
        return parse_discovery(done.stdout, os.path.basename(path))
    except HostsError as exc:
        raise DiscoveryError(str(exc)) from None


class DiscoveryPoller:
    """Runs the script every ``interval`` seconds in a thread of its own and hands each outcome
    (the hosts, or the DiscoveryError) to ``report``; :meth:`stop` ends it."""

    def __init__(self, path: str, report: Callable[[list[Host] | DiscoveryError], None],
                 interval: float = INTERVAL, timeout: float = TIMEOUT, cwd: str | None = None) -> None:
        self.path, self.report, self.interval, self.timeout, self.cwd = path, report, interval, timeout, cwd
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="host-discovery", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                outcome: list[Host] | DiscoveryError = discover(self.path, self.timeout, self.cwd)
            except DiscoveryError as exc:
                outcome = exc
            if not self._stop.is_set():
                self.report(outcome)
