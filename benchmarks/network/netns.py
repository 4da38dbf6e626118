"""A rate-limited network of network namespaces: hosts on one switch, each port 1 Gbit/s.

Everything lives in namespaces this module creates; the machine's own interfaces, routes and
addresses are never touched, and the private subnet exists only inside them::

    <tag>-sw    the switch: bridge ``sw``, one port ``p<i>`` per host
    <tag>-h<i>  host i: ``eth0`` = SUBNET.<i+1>/24, the veth peer of ``p<i>``

``<tag>`` is ``psnb-<pid of the creating process>``.  A link's rate is enforced with a token
bucket on both ends (``tc qdisc add dev IF root tbf rate R burst 256kb latency 50ms``): on the
host's ``eth0`` (what the host sends) and on the switch's ``p<i>`` (what it receives), so each
host has a full-duplex port of rate R, as on a real switch.  (This kernel has tbf, not netem.)

Clean-up (:meth:`Testbed.down`, also on ``with`` exit): every process in each namespace is
killed (they are all started through :meth:`Testbed.spawn`), waited for (bounded), then the
namespace is deleted, the switch last.  A testbed whose creator died without cleaning up (SIGKILL)
is found by :func:`stale_namespaces` (its pid no longer runs) and removed by :func:`remove_stale`.
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "psnb"
SUBNET = "10.214.0"
TBF = ("burst", "256kb", "latency", "50ms")
_NAME_RE = re.compile(rf"^{PREFIX}-(\d+)-(sw|h\d+)$")


class TestbedError(RuntimeError):
    """A command that builds or inspects the testbed failed (the message has its stderr)."""

    __test__ = False   # not a pytest test class


def run(*argv: str, timeout: float = 10) -> str:
    """Run one iproute2 command; its stdout, or TestbedError with its stderr."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise TestbedError(f"{' '.join(argv)}: no answer within {timeout:g} s") from None
    if done.returncode != 0:
        raise TestbedError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as dead)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def ns_pids(ns: str) -> list[int]:
    """Processes in namespace ``ns`` ([] when it does not exist)."""
    done = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=10)
    return [int(x) for x in done.stdout.split()] if done.returncode == 0 else []


def namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def remove_namespace(ns: str, deadline_s: float = 10.0) -> list[int]:
    """Kill every process in ``ns`` (SIGKILL), wait until they are gone, delete ``ns``.

    Returns the pids that were still there.  Raises TestbedError if a process outlives the
    deadline or the namespace cannot be deleted.
    """
    left = ns_pids(ns)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    end = time.monotonic() + deadline_s
    while any(alive(p) for p in ns_pids(ns)):
        if time.monotonic() > end:
            raise TestbedError(f"processes {ns_pids(ns)} in {ns} survived SIGKILL for {deadline_s:g} s")
        time.sleep(0.02)
    if ns in namespaces():
        run("ip", "netns", "del", ns)
    return left


def stale_namespaces() -> list[str]:
    """Namespaces of testbeds whose creating process no longer runs."""
    out = []
    for ns in namespaces():
        m = _NAME_RE.match(ns)
        if m and not alive(int(m.group(1))):
            out.append(ns)
    return out


def remove_stale() -> list[str]:
    """Remove the namespaces (and their processes) that :func:`stale_namespaces` lists."""
    stale = stale_namespaces()
    for ns in sorted(stale, key=lambda n: n.endswith("-sw")):   # hosts first, the switch last
        remove_namespace(ns)
    return stale


@dataclass
class Host:
    index: int
    ns: str
    addr: str
    iface: str = "eth0"


@dataclass
class Testbed:
    """``hosts`` namespaces on one switch, every port limited to ``rate`` (None: unlimited)."""

    __test__ = False

    hosts_wanted: int
    rate: str | None = "1gbit"
    tag: str = field(default_factory=lambda: f"{PREFIX}-{os.getpid()}")
    hosts: list[Host] = field(default_factory=list)
    procs: list[subprocess.Popen] = field(default_factory=list)
    _made: list[str] = field(default_factory=list)

    @property
    def switch(self) -> str:
        return f"{self.tag}-sw"

    def up(self) -> Testbed:
        """Create the switch, the hosts and their links; check each qdisc is in place."""
        run("ip", "netns", "add", self.switch)
        self._made.append(self.switch)
        sw = self.switch
        run("ip", "-n", sw, "link", "set", "lo", "up")
        run("ip", "-n", sw, "link", "add", "sw", "type", "bridge")
        run("ip", "-n", sw, "link", "set", "sw", "up")
        # a switch does not run the firewall: with br_netfilter loaded, bridged frames would go
        # through the switch namespace's iptables (per-namespace settings; the machine's stay)
        for proto in ("iptables", "ip6tables", "arptables"):
            key = Path(f"/proc/sys/net/bridge/bridge-nf-call-{proto}")
            if key.exists():
                run("ip", "netns", "exec", sw, "sysctl", "-q", "-w", f"net.bridge.bridge-nf-call-{proto}=0")
        for i in range(self.hosts_wanted):
            host = Host(i, f"{self.tag}-h{i}", f"{SUBNET}.{i + 1}")
            run("ip", "netns", "add", host.ns)
            self._made.append(host.ns)
            run("ip", "-n", host.ns, "link", "set", "lo", "up")
            # the veth pair is created inside the switch's namespace, its peer moved to the host
            run("ip", "-n", sw, "link", "add", f"p{i}", "type", "veth", "peer", "name", host.iface,
                "netns", host.ns)
            run("ip", "-n", sw, "link", "set", f"p{i}", "master", "sw")
            run("ip", "-n", sw, "link", "set", f"p{i}", "up")
            run("ip", "-n", host.ns, "addr", "add", f"{host.addr}/24", "dev", host.iface)
            run("ip", "-n", host.ns, "link", "set", host.iface, "up")
            if self.rate:
                for ns, dev in ((host.ns, host.iface), (sw, f"p{i}")):
                    run("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", self.rate, *TBF)
                    shown = run("tc", "-n", ns, "qdisc", "show", "dev", dev)
                    if "tbf" not in shown:
                        raise TestbedError(f"no tbf qdisc on {dev} in {ns}: {shown.strip()}")
            self.hosts.append(host)
        return self

    def qdisc(self, host: Host) -> str:
        """``tc qdisc show`` of the host's link (both ends), for the record."""
        return (run("tc", "-n", host.ns, "qdisc", "show", "dev", host.iface).strip() + " | "
                + run("tc", "-n", self.switch, "qdisc", "show", "dev", f"p{host.index}").strip())

    def spawn(self, host: Host, argv: list[str], env: dict[str, str], log: Path,
              cwd: Path | None = None) -> subprocess.Popen:
        """Start ``argv`` inside ``host`` (its own session; stdout and stderr to ``log``)."""
        with open(log, "wb") as out:
            p = subprocess.Popen(["ip", "netns", "exec", host.ns, *argv], env=env, cwd=cwd, stdout=out,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(p)
        return p

    def kill_all(self) -> list[int]:
        """SIGKILL every process in the hosts (all spawned here), wait until gone; the pids."""
        killed: list[int] = []
        for host in self.hosts:
            for pid in ns_pids(host.ns):
                try:
                    os.kill(pid, 9)
                    killed.append(pid)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                raise TestbedError(f"pid {p.pid} survived SIGKILL for 10 s") from None
        self.procs.clear()
        return killed

    def down(self) -> list[int]:
        """Kill every process of the testbed and delete its namespaces; the pids still running."""
        killed = self.kill_all()
        errors = []
        for ns in sorted(self._made, key=lambda n: n == self.switch):   # the switch last
            try:
                killed += remove_namespace(ns)
            except TestbedError as exc:
                errors.append(str(exc))
        self._made = [ns for ns in self._made if ns in namespaces()]
        if errors or self._made:
            raise TestbedError(f"clean-up incomplete: {'; '.join(errors) or self._made}")
        return killed

    def __enter__(self) -> Testbed:
        try:
            return self.up()
        except BaseException:
            self.down()
            raise

    def __exit__(self, *exc: object) -> None:
        self.down()


@dataclass
class LocalBed:
    """The same interface on this host alone (``netbench.py --loopback``): every "host" is
    127.0.0.1, nothing is created or rate-limited, processes run as they are (each in its own
    session).  Clean-up kills the process groups this object started, nothing else."""

    __test__ = False

    hosts_wanted: int
    rate: str | None = None
    tag: str = field(default_factory=lambda: f"{PREFIX}-{os.getpid()}-loopback")
    hosts: list[Host] = field(default_factory=list)
    procs: list[subprocess.Popen] = field(default_factory=list)

    def up(self) -> LocalBed:
        self.hosts = [Host(i, "", "127.0.0.1", "lo") for i in range(self.hosts_wanted)]
        return self

    def qdisc(self, host: Host) -> str:
        return "loopback: no namespace, no rate limit (same-host data plane between workers and servers)"

    def spawn(self, host: Host, argv: list[str], env: dict[str, str], log: Path,
              cwd: Path | None = None) -> subprocess.Popen:
        with open(log, "wb") as out:
            p = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(p)
        return p

    def kill_all(self) -> list[int]:
        killed: list[int] = []
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, 9)   # its own session: the process and anything it started
                killed.append(p.pid)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                raise TestbedError(f"pid {p.pid} survived SIGKILL for 10 s") from None
        self.procs.clear()
        return killed

    def down(self) -> list[int]:
        return self.kill_all()


def _interrupted(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def end(driver: str, bed: Testbed | LocalBed, check: bool = True) -> bool:
    """A testbed driver's clean-up, not to be interrupted (INT, TERM and HUP ignored from here
    on): the testbed down, and (``check``) none of its namespaces left; says which, and True
    when the clean-up is complete."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    try:
        bed.down()
    except TestbedError as exc:
        print(f"{driver}: {exc}", file=sys.stderr)
    left = [ns for ns in namespaces() if ns.startswith(bed.tag + "-")] if check else []
    if left:
        print(f"{driver}: namespaces left: {left}", file=sys.stderr)
        return False
    print(f"{driver}: testbed {bed.tag} removed (namespaces and processes)", flush=True)
    return True


def begin(driver: str, problem: str | None, cleanup: bool) -> int | None:
    """A testbed driver's start: its exit code when it ends here (``problem``: why this machine
    cannot build a testbed, 3; ``cleanup``: only the namespaces a killed run left are removed,
    0), else None.  TERM and HUP become SystemExit from here on, so the driver's clean-up runs."""
    if problem:
        print(f"{driver}: {problem}", file=sys.stderr)
        return 3
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupted)
    stale = remove_stale()
    if stale:
        print(f"{driver}: removed namespaces left by a killed run: {' '.join(stale)}", flush=True)
    return 0 if cleanup else None
