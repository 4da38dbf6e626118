"""No death by slowness: big requests and big states over 200 Mbit/s links never pass for a dead server.

Four workers and four servers, server i on worker i's host (mxdist's default placement), hosts
in network namespaces whose ports are limited to 200 Mbit/s both ways
(benchmarks/network/clusterbench.py's testbed).  Rank 0 inits a 64 MiB key in one 16 MiB part
per server (no slicing: each part one message that takes longer than the default 2 s retry
timeout on a shared link), then every worker pushes and pulls it (``kv.pushpull``) three
times; the first round's sum is checked exactly by the benchmark's workers.  The worker's
default retry settings: a request resent meanwhile is fine, a server given up (``PeerLost``) or
about to be (its last resend) is the failure.  Ends by checking that the testbed's namespaces and
every process in them are gone.

A replacement server's fetch of its state (psnode.server.replicas.fetch) from a keeper on
another host across a 200 Mbit/s link (benchmarks/faults/fetch.py --rate): a 48 MB state takes
about 2 s there, twice the fetch's 1 s timeout, while the keeper is alive and its bytes flow;
the state arrives, exact, and so does the primary's whole copy to the keeper before it.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.network import netns
from tests.support import require

ROOT = Path(__file__).resolve().parents[2]
BENCH = [sys.executable, str(ROOT / "benchmarks" / "network" / "clusterbench.py")]
FETCH = [sys.executable, str(ROOT / "benchmarks" / "faults" / "fetch.py")]
FETCH_ROWS = 375_000   # values and per-row state: 48 MB, about 2 s at 200 Mbit/s


@pytest.fixture(autouse=True)
def _testbed_possible() -> None:
    """Namespaces and tbf need root and iproute2: skipped without them, a failure under CI."""
    require("network namespaces need root" if os.geteuid() != 0 else
            "iproute2 (ip, tc) is not installed" if shutil.which("ip") is None or shutil.which("tc") is None
            else None, "run as root with iproute2 (apt-get install iproute2)")


@contextlib.contextmanager
def _driven(argv: list[str], env: dict[str, str], timeout: float) -> Iterator[tuple[subprocess.Popen, str, str]]:
    """Run a testbed driver to its end (still running after ``timeout`` s: a failure, killed);
    yields it, its testbed's tag and its output.  Afterwards no process of it and no namespace
    of its testbed is left."""
    p = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    tag = f"{netns.PREFIX}-{p.pid}"
    try:
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate(timeout=30)
            raise AssertionError(f"{Path(argv[1]).name} still running after {timeout:g} s:\n{out[-3000:]}") from None
        yield p, tag, out
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(30)
        for ns in [n for n in netns.namespaces() if n.startswith(tag + "-")]:
            netns.remove_namespace(ns)
    assert not [ns for ns in netns.namespaces() if ns.startswith(tag + "-")]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_64mib_keys_from_four_workers_over_200mbit_links_lose_no_server() -> None:
    env = _env()
    env.pop("PSNODE_RETRY_TIMEOUT", None)
    env.pop("PSNODE_MAX_RETRIES", None)
    argv = [*BENCH, "--runs", "1", "--designs", "psnode-colocated", "--cases", "1x64MiB", "--rounds", "1",
            "--slice-bytes", "0", "--rate", "200mbit", "--timeout", "120", "--keep-logs"]
    logdir: Path | None = None
    try:
        with _driven(argv, env, 170) as (p, tag, out):
            m = re.search(r"logs in (\S+)", out)
            logdir = Path(m.group(1)) if m else None
            logs = {f.name: f.read_text(errors="replace") for f in sorted(logdir.glob("*.log"))} if logdir else {}
            workers = {name: text for name, text in logs.items() if ".worker" in name}
            assert p.returncode == 0, out[-3000:] + "".join(f"\n--- {n}\n{t[-1500:]}" for n, t in logs.items())
            assert len(workers) == 4 and re.search(r"1x64MiB\s+psnode-colocated\s+\d+", out), out[-3000:]
            for name, text in workers.items():
                assert "PeerLost" not in text and "sending a last time" not in text, f"{name}:\n{text[-3000:]}"
            assert f"testbed {tag} removed" in out, out[-3000:]
    finally:
        if logdir is not None:
            shutil.rmtree(logdir, ignore_errors=True)


def test_a_state_slower_to_fetch_than_the_timeout_arrives_while_its_bytes_flow() -> None:
    """fetch(timeout=1) of a 48 MB state over a 200 Mbit/s link (about 2 s): the timeout bounds a
    holder's silence, not the transfer, so the state arrives exact; the primary's whole copy to
    the keeper across the same link arrives too; the testbed is removed."""
    argv = [*FETCH, "--rate", "200mbit", "--rows", str(FETCH_ROWS), "--runs", "1", "--timeout", "1"]
    with _driven(argv, _env(), 120) as (p, tag, out):
        assert p.returncode == 0, out[-3000:]
        assert re.search(r"^copy: 48\.0 MB to the keeper in [\d.]+ s \([\d.]+ MB/s\), acknowledged", out, re.M), out
        fetched = re.search(r"^fetch 1: 48\.0 MB in ([\d.]+) s \([\d.]+ MB/s\), exact$", out, re.M)
        assert fetched, out[-3000:]
        assert float(fetched.group(1)) > 1.0, f"the fetch took no longer than its timeout: it proves nothing\n{out}"
        assert f"testbed {tag} removed" in out, out[-3000:]
