"""benchmarks/network/netbench.py, the rate-limited testbed: it runs, and it leaves nothing behind.

A quick run passes its check round (the exact average) over the namespaces; then every exit path
is taken for real: SIGTERM, SIGINT and SIGHUP mid-run, a psnode process killed -9 mid-run, a job
over its deadline, and a testbed left by a run that was itself killed -9 (removed by the next
run's ``--cleanup``).  Each test ends by checking that the run's namespaces are gone and that
every process that was in them is dead.  No speed is asserted here (netbench measures it).
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from benchmarks.network import netns
from tests.support import require, wait_for

ROOT = Path(__file__).resolve().parents[2]
NETBENCH = [sys.executable, str(ROOT / "benchmarks" / "network" / "netbench.py")]


@pytest.fixture(autouse=True)
def _testbed_possible() -> None:
    """Namespaces and tbf need root and iproute2: skipped without them, a failure under CI."""
    require("network namespaces need root" if os.geteuid() != 0 else
            "iproute2 (ip, tc) is not installed" if shutil.which("ip") is None or shutil.which("tc") is None
            else None, "run as root with iproute2 (apt-get install iproute2)")


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    return e


class Run:
    """A netbench process with its output read in a thread (no pipe ever fills up)."""

    def __init__(self, *args: str) -> None:
        self.p = subprocess.Popen([*NETBENCH, *args], cwd=ROOT, env=env(), stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.tag = f"{netns.PREFIX}-{self.p.pid}"
        self.lines: list[str] = []
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()
        self.seen: set[int] = set()   # every pid seen in the run's namespaces

    def _read(self) -> None:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            self.lines.append(line)

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def hosts(self) -> list[str]:
        return [f"{self.tag}-h{i}" for i in range(3)]

    def pids(self) -> list[int]:
        got = [pid for ns in self.hosts() for pid in netns.ns_pids(ns)]
        self.seen.update(got)
        return got

    def wait_running(self, timeout: float = 60) -> None:
        """Until the job's five processes run (scheduler, 2 servers, 2 workers)."""
        wait_for(lambda: len(self.pids()) >= 5 or self.p.poll() is not None, timeout, "the job's processes")
        assert self.p.poll() is None, self.text

    def wait(self, timeout: float = 120) -> int:
        try:
            rc = self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"netbench still running after {timeout:g} s:\n{self.text[-3000:]}") from None
        self.t.join(10)
        return rc

    def assert_clean(self) -> None:
        left = [ns for ns in netns.namespaces() if ns.startswith(self.tag + "-")]
        assert not left, f"namespaces left: {left}\n{self.text[-3000:]}"
        alive = [pid for pid in self.seen if netns.alive(pid)]
        assert not alive, f"processes left: {alive}"

    def cleanup(self) -> None:
        """Whatever the test did: the run and everything of its testbed ends (all started here)."""
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(10)
        for ns in [n for n in netns.namespaces() if n.startswith(self.tag + "-")]:
            netns.remove_namespace(ns)


def test_quick_run_checks_values_and_leaves_nothing() -> None:
    """Every compression setting side by side: each job's check round pulls exactly the mean
    of what the servers decode (netbench_worker.py), over the rate-limited links."""
    run = Run("--quick", "--no-mlp", "--cases", "1x1MiB", "--compression", "none,fp16,2bit,1bit",
              "--timeout", "60")
    try:
        assert run.wait(180) == 0, run.text[-3000:]   # (1x1MiB has no speed check)
        assert "rate 1Gbit" in run.text            # tbf on both ends of every host's link
        for name in ("none", "fp16", "2bit", "1bit"):
            assert f"1x1MiB    {name}" in run.text, run.text[-3000:]
        assert f"testbed {run.tag} removed" in run.text
        run.assert_clean()
    finally:
        run.cleanup()


def test_loopback_run_needs_no_namespace() -> None:
    """--loopback: the same jobs on 127.0.0.1 (same-host data plane), 2bit and the MLP example."""
    run = Run("--loopback", "--quick", "--cases", "1x1MiB", "--compression", "none,2bit", "--mlp-epochs", "1",
              "--timeout", "60")
    try:
        assert run.wait(180) == 0, run.text[-3000:]
        assert "one host (loopback)" in run.text and "1x1MiB    2bit" in run.text, run.text[-3000:]
        assert "  2bit        epoch" in run.text, run.text[-3000:]
        assert not [ns for ns in netns.namespaces() if ns.startswith(f"{netns.PREFIX}-{run.p.pid}")]
    finally:
        run.cleanup()


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)])
def test_signal_mid_run_removes_namespaces_and_processes(sig: signal.Signals, code: int) -> None:
    run = Run("--no-mlp", "--cases", "1x16MiB", "--runs", "3", "--timeout", "120")
    try:
        run.wait_running()
        os.kill(run.p.pid, sig)
        assert run.wait(60) == code, run.text[-3000:]
        run.assert_clean()
        assert f"testbed {run.tag} removed" in run.text
    finally:
        run.cleanup()


def test_killed_node_fails_the_run_and_cleans_up() -> None:
    run = Run("--no-mlp", "--cases", "1x16MiB", "--runs", "3", "--timeout", "120")
    try:
        run.wait_running()
        h1 = f"{run.tag}-h1"
        server = [pid for pid in netns.ns_pids(h1)
                  if b"-m\x00psnode" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        assert len(server) == 1, server
        os.kill(server[0], signal.SIGKILL)
        assert run.wait(60) == 1, run.text[-3000:]
        assert "job failed: server 1 on host 1 exited -9" in run.text, run.text[-3000:]
        run.assert_clean()
    finally:
        run.cleanup()


def test_job_over_its_deadline_is_stopped_and_cleaned_up() -> None:
    run = Run("--no-mlp", "--cases", "1x16MiB", "--runs", "3", "--timeout", "2")
    try:
        run.wait_running()
        assert run.wait(60) == 1, run.text[-3000:]
        assert "job not done within 2 s" in run.text, run.text[-3000:]
        run.assert_clean()
    finally:
        run.cleanup()


def test_testbed_of_a_killed_run_is_removed_by_cleanup() -> None:
    """A run killed -9 cannot clean up; its namespaces (its pid is gone) go at the next run."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    ns = f"{netns.PREFIX}-{gone.pid}-h0"
    assert ns not in netns.namespaces()
    netns.run("ip", "netns", "add", ns)
    sleeper = None
    try:
        sleeper = subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "600"], start_new_session=True)
        wait_for(lambda: netns.ns_pids(ns) == [sleeper.pid], 10, "the process in the stale namespace")
        r = subprocess.run([*NETBENCH, "--cleanup"], cwd=ROOT, env=env(), capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"removed namespaces left by a killed run: {ns}" in r.stdout
        assert ns not in netns.namespaces()
        assert sleeper.wait(10) == -9
    finally:
        if sleeper is not None and sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait(10)
        if ns in netns.namespaces():
            netns.remove_namespace(ns)


def test_bad_options_are_refused_before_any_namespace() -> None:
    for args, message in ((["--compression", "3bit"], "'type' is '3bit'; accepted"),
                          (["--rate", "fast"], "use tc units"),
                          (["--cases", "1x4GiB"], "unknown case(s) ['1x4GiB']")):
        r = subprocess.run([*NETBENCH, *args], cwd=ROOT, env=env(), capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and message in r.stderr, (args, r.stderr)


CLUSTERBENCH = [sys.executable, str(ROOT / "benchmarks" / "network" / "clusterbench.py")]


def test_clusterbench_quick_run_every_design_and_leaves_nothing() -> None:
    """benchmarks/network/clusterbench.py --quick: nine namespaces, each design's check round exact
    (psnode dedicated and co-located, gloo, the raw TCP mesh), every host's link metered, then
    no namespace and no process of the run left."""
    p = subprocess.Popen([*CLUSTERBENCH, "--quick", "--timeout", "120"], cwd=ROOT, env=env(), text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    tag = f"{netns.PREFIX}-{p.pid}"
    try:
        out, _ = p.communicate(timeout=400)
        assert p.returncode == 0, out[-3000:]
        assert "rate 200Mbit" in out and "9 hosts" in out, out[-3000:]
        for design in ("psnode-dedicated", "psnode-colocated", "gloo", "tcp-mesh"):
            line = next((ln for ln in out.splitlines() if ln.startswith(f"1x1MiB   {design} ")), None)
            assert line is not None, out[-3000:]
            # the busiest worker host's link carried at least 3/4 of the 1 MiB gradient each way
            up, down = (float(x) for x in re.search(r"(\d+\.\d),(\d+\.\d)", line).groups())  # type: ignore[union-attr]
            assert up >= 0.7 and down >= 0.7, line
        assert f"testbed {tag} removed" in out
        assert not [ns for ns in netns.namespaces() if ns.startswith(tag + "-")]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
        for ns in [n for n in netns.namespaces() if n.startswith(tag + "-")]:
            netns.remove_namespace(ns)
