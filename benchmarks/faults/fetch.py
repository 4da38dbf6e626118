"""How long a replacement server takes to get its state from a holder: ``fetch.py`` times
psnode.server.replicas.fetch of a row_sparse table with an Adagrad-like per-row state (the
values and the state each ``--rows`` x 16 float32) from a real Keeper on loopback, the channel
authenticated as in a job, ``--runs`` times (the first includes the pages the copy touches for
the first time).  The state is given whole (not computed from a fill spec), so the whole of it
crosses.

    python benchmarks/faults/fetch.py                  # 10M rows: 1.28 GB, 3 fetches
    python benchmarks/faults/fetch.py --rows 2e6 --runs 5
    python benchmarks/faults/fetch.py --rate 200mbit --rows 375000 --runs 1 --timeout 1

With ``--rate`` (needs root and iproute2) the keeper and the replacement are on two hosts of a
network-namespace testbed (benchmarks/network/netns.py) whose ports are limited to that rate
both ways: the keeper runs in host 0 (this script, ``--serve-keeper``, bound to host 0's
address), the primary and the replacement in host 1 (``--fetch-from``).  The primary copies its
state whole to the keeper across the link (``Replicator.copy``), then the replacement fetches
it ``--runs`` times with ``--timeout``; every copy and fetch is checked exact and reported with
its time and rate.  The three processes share one job secret (authenticated mode) through
``PSNODE_KEY_FILE``, as a job's processes do.  A fetch that gives up (ConfigError) or a state
that is not exact ends the run with one line and exit code 1.  The namespaces and every process
in them are removed on every exit (``testbed <tag> removed`` says so); 2 bad usage, 3 no
testbed possible, 128+N on signal N.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.network import netns  # noqa: E402
from benchmarks.network.netbench import FRAME_EFFICIENCY, parse_rate  # noqa: E402
from psnode.config import NodeConfig, Role  # noqa: E402
from psnode.errors import ConfigError  # noqa: E402
from psnode.net.security import Mode, Security  # noqa: E402
from psnode.net.transport import Transport, new_security  # noqa: E402
from psnode.protocol.control import ServerAddress  # noqa: E402
from psnode.server.replicas import Keeper, Replicator, fetch  # noqa: E402

JOB = "fetch-bench"
KEEPER_RE = re.compile(r"^keeper listening on (\S+):(\d+)$", re.M)
RESEND_AFTER_S = 60.0   # the primary's resend_after: no resend in a run that goes well
START_S = 30.0          # the longest the keeper process may take to bind


def table(rows: int) -> tuple[dict, dict]:
    """A whole server state of one row_sparse key part ``emb`` (psnode.server.checkpoint.snapshot's form)."""
    rng = np.random.default_rng(0)
    item = {"key": "emb", "part": 0, "sparse": True, "sync": True, "average": False, "round": 1,
            "state": ["t", "h"], "pushed": {"0": 1}}
    arrays = {"v0": rng.random((rows, 16), np.float32), "s0_h": rng.random((rows, 16), np.float32),
              "s0_t": np.array(1, np.int64)}
    return {"index": [item], "optimizer": None}, arrays


def state_bytes(rows: int) -> int:
    """The bytes of :func:`table`'s arrays for ``rows`` rows."""
    return rows * 16 * 4 * 2 + 8


def config(host: str, key_file: str | None = None) -> NodeConfig:
    """The servers' config of the benchmark's job (2 servers, each kept by the other), on ``host``."""
    return NodeConfig(role=Role.SERVER, scheduler_host="127.0.0.1", scheduler_port=1, num_workers=1,
                      num_servers=2, job_id=JOB, host=host, key_file=key_file)


def exact(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> bool:
    """Every array of ``want`` is in ``got``, equal in shape and values."""
    return all(n in got and np.array_equal(got[n], a) for n, a in want.items())


def fetches(cfg: NodeConfig, security: Security, book: list[ServerAddress], state: tuple[dict, dict], runs: int,
            timeout: float, report: Callable[[int, float, bool], None],
            pump: Callable[[], None] = lambda: None) -> str | None:
    """Fetch server 1's state from ``book`` ``runs`` times, each through a fresh transport and
    with ``timeout`` (``pump``: fetch's), calling ``report(run, seconds, exact)`` after each; None
    when every one arrived exact, else the one-line reason the runs stopped."""
    for i in range(1, runs + 1):
        t = Transport(cfg.job_id, f"server:1/{i}", cfg.max_message_bytes, security)
        t0 = time.perf_counter()
        try:
            try:
                got = fetch(t, 1, book, 2, 2, pump, timeout=timeout)
            except ConfigError as exc:
                return f"fetch {i} gave up after {time.perf_counter() - t0:.2f} s (timeout {timeout:g} s): {exc}"
            took = time.perf_counter() - t0
            same = exact(got.arrays, state[1])   # (before the transport closes: the arrays are its frames)
            del got
        finally:
            t.close()
        report(i, took, same)
        if not same:
            return f"fetch {i}: the state fetched is not the state copied"
    return None


# ---------------------------------------------------------------- loopback

def loopback(args: argparse.Namespace) -> int:
    """Keeper, primary and replacement in this process, on 127.0.0.1."""
    security = new_security(Mode.AUTHENTICATED)
    cfg = config("127.0.0.1")
    keeper = Keeper(cfg, security)
    keeper.start()
    t: Transport | None = None
    try:
        book = [ServerAddress(0, "127.0.0.1", 1, keeper.port), ServerAddress(1, "127.0.0.1", 2)]
        t = Transport(JOB, "server:1", cfg.max_message_bytes, security)
        primary = Replicator(t, 1, 2, 2)
        primary.repoint(book)
        state = table(int(args.rows))
        size = sum(a.nbytes for a in state[1].values())
        primary.copy(state, lambda: state, lambda: None, resend_after=RESEND_AFTER_S)

        def report(i: int, took: float, same: bool) -> None:
            print(f"fetch {i}: {size / 1e9:.2f} GB in {took:.2f} s ({size / took / 1e9:.2f} GB/s)"
                  f"{'' if same else '  NOT EXACT'}", flush=True)

        why = fetches(cfg, security, book, state, args.runs, args.timeout, report)
    finally:
        if t is not None:
            t.close()
        keeper.close()
    if why:
        print(f"fetch.py: {why}", file=sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------- the testbed's processes

def orphan_exit() -> Callable[[], None]:
    """A pump that ends this process (SystemExit 1) once its parent, the driver, is gone."""
    parent = os.getppid()

    def pump() -> None:
        if os.getppid() != parent:
            raise SystemExit(1)

    return pump


def serve_keeper(addr: str) -> int:
    """Host 0's process: a Keeper bound to ``addr`` (the job's secret from ``PSNODE_KEY_FILE``);
    prints ``keeper listening on ADDR:PORT``, then keeps copies until TERM or its parent is gone."""
    cfg = replace(NodeConfig.from_env(), host=addr)
    keeper = Keeper(cfg, Security.load(cfg.key_file))
    keeper.start()
    parent = os.getppid()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    print(f"keeper listening on {cfg.host}:{keeper.port}", flush=True)
    try:
        while os.getppid() == parent and keeper.is_alive():
            time.sleep(0.2)
    finally:
        keeper.close()
    return 0 if os.getppid() != parent else 1


def fetch_from(where: str, args: argparse.Namespace) -> int:
    """Host 1's process: the primary copies the state whole to the keeper at ``where``
    (HOST:PORT), then the replacement fetches it ``--runs`` times; each reported (MB, s, MB/s).
    Ends (exit 1) once its parent, the driver, is gone."""
    pump = orphan_exit()
    cfg = NodeConfig.from_env()
    security = Security.load(cfg.key_file)
    host, port = where.rsplit(":", 1)
    book = [ServerAddress(0, host, 1, int(port)), ServerAddress(1, cfg.host, 2)]
    state = table(int(args.rows))
    size = sum(a.nbytes for a in state[1].values())
    t = Transport(cfg.job_id, "server:1", cfg.max_message_bytes, security)
    try:
        primary = Replicator(t, 1, 2, 2)
        primary.repoint(book)
        t0 = time.perf_counter()
        primary.copy(state, lambda: state, pump, resend_after=RESEND_AFTER_S)
        took = time.perf_counter() - t0
        print(f"copy: {size / 1e6:.1f} MB to the keeper in {took:.2f} s ({size / took / 1e6:.1f} MB/s), "
              f"acknowledged ({primary.copied / 1e6:.1f} MB sent)", flush=True)
    finally:
        t.close()

    def report(i: int, took: float, same: bool) -> None:
        print(f"fetch {i}: {size / 1e6:.1f} MB in {took:.2f} s ({size / took / 1e6:.1f} MB/s), "
              f"{'exact' if same else 'NOT EXACT'}", flush=True)

    why = fetches(cfg, security, book, state, args.runs, args.timeout, report, pump)
    if why:
        print(f"fetch.py: {why}", flush=True)
        return 1
    return 0


# ---------------------------------------------------------------- the testbed's driver

def preflight() -> str | None:
    """Why this machine cannot build a testbed (None: it can)."""
    if os.geteuid() != 0:
        return "--rate needs root (network namespaces and tc)"
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    return f"--rate needs iproute2: {', '.join(missing)} not found (apt-get install iproute2)" if missing else None


def child_env(cfg: NodeConfig) -> dict[str, str]:
    """This environment without psnode's variables, plus ``cfg``'s and the repository on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PSNODE_", "MXDIST_"))}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", **cfg.to_env())
    return env


def follow(p: subprocess.Popen, log: Path, deadline: float) -> bool:
    """Copy ``log`` to stdout as it grows until ``p`` exits (True) or ``deadline`` passes (False)."""
    pos = 0
    while True:
        done = p.poll() is not None
        with open(log, "rb") as fh:
            fh.seek(pos)
            chunk = fh.read()
        pos += len(chunk)
        if chunk:
            sys.stdout.write(chunk.decode(errors="replace"))
            sys.stdout.flush()
        if done:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def keeper_port(p: subprocess.Popen, log: Path) -> int:
    """The port the keeper process printed; TestbedError when it exits or is silent for START_S."""
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        m = KEEPER_RE.search(log.read_text(errors="replace"))
        if m:
            return int(m.group(2))
        if p.poll() is not None:
            break
        time.sleep(0.05)
    raise netns.TestbedError(f"the keeper did not start (exit {p.poll()}): "
                             f"{log.read_text(errors='replace')[-2000:].strip() or 'no output'}")


def over_testbed(bed: netns.Testbed, args: argparse.Namespace, workdir: Path) -> int:
    """Keeper in host 0, primary and replacement in host 1 (the module docstring); the exit code."""
    keeper_host, fetch_host = bed.hosts
    key = workdir / "job.key"
    new_security(Mode.AUTHENTICATED).save(str(key))
    size = state_bytes(int(args.rows))
    link_s = size / (parse_rate(args.rate) * FRAME_EFFICIENCY)
    print(f"fetch.py: testbed {bed.tag}: keeper on host 0 ({keeper_host.addr}), primary and replacement on "
          f"host 1 ({fetch_host.addr}), every port {args.rate} both ways; {size / 1e6:.1f} MB state "
          f"({link_s:.2f} s at the link's payload rate), fetch timeout {args.timeout:g} s\n"
          f"  host 0: {bed.qdisc(keeper_host)}", flush=True)
    me = [sys.executable, str(Path(__file__).resolve())]
    klog = workdir / "keeper.log"
    keeper = bed.spawn(keeper_host, [*me, "--serve-keeper", keeper_host.addr],
                       child_env(config(keeper_host.addr, str(key))), klog, cwd=ROOT)
    port = keeper_port(keeper, klog)
    flog = workdir / "fetcher.log"
    side = bed.spawn(fetch_host, [*me, "--fetch-from", f"{keeper_host.addr}:{port}", "--rows", str(int(args.rows)),
                                  "--runs", str(args.runs), "--timeout", str(args.timeout)],
                     child_env(config(fetch_host.addr, str(key))), flog, cwd=ROOT)
    bound = 60 + (1 + args.runs) * 4 * link_s + args.runs * args.timeout
    if not follow(side, flog, time.monotonic() + bound):
        print(f"fetch.py: the primary and replacement did not finish within {bound:.0f} s", flush=True)
        return 1
    if side.returncode != 0:
        text = klog.read_text(errors="replace").strip()
        if "\n" in text:   # (more than its port line)
            print(f"fetch.py: the keeper's output:\n{text[-2000:]}", flush=True)
        return 1
    return 0


def on_testbed(args: argparse.Namespace) -> int:
    """Build the testbed, run :func:`over_testbed`, remove the testbed whatever happened."""
    code = netns.begin("fetch.py", preflight(), False)
    if code is not None:
        return code
    workdir = Path(tempfile.mkdtemp(prefix="fetchbench-"))
    bed = netns.Testbed(2, args.rate)
    code = 1
    try:
        try:
            bed.up()
        except netns.TestbedError as exc:
            print(f"fetch.py: cannot build the testbed: {exc}", file=sys.stderr)
            return 3
        code = over_testbed(bed, args, workdir)
    except netns.TestbedError as exc:
        print(f"fetch.py: {exc}", flush=True)
    except KeyboardInterrupt:
        print("fetch.py: interrupted", file=sys.stderr)
        code = 130
    finally:
        if not netns.end("fetch.py", bed):
            code = 1
        shutil.rmtree(workdir, ignore_errors=True)
    return code


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=float, default=10e6, help="rows of the table (default 10M: 1.28 GB with its state)")
    ap.add_argument("--runs", type=int, default=3, help="fetches to time (default 3)")
    ap.add_argument("--timeout", type=float, default=120.0, help="fetch's timeout, seconds (default 120)")
    ap.add_argument("--rate", default=None,
                    help="keeper and replacement on two namespace hosts whose ports are limited to this rate "
                         "(tc units, e.g. 200mbit, 1gbit; needs root); default: both on loopback, unlimited")
    ap.add_argument("--serve-keeper", metavar="ADDR", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--fetch-from", metavar="HOST:PORT", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rows < 1 or args.runs < 1 or args.timeout <= 0:
        ap.error("--rows, --runs and --timeout must be positive")
    if args.rate is not None:
        try:
            parse_rate(args.rate)
        except argparse.ArgumentTypeError as exc:
            ap.error(str(exc))
    if args.serve_keeper:
        return serve_keeper(args.serve_keeper)
    if args.fetch_from:
        return fetch_from(args.fetch_from, args)
    return on_testbed(args) if args.rate else loopback(args)


if __name__ == "__main__":
    sys.exit(main())
