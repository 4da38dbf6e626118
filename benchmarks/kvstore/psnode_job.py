"""Start psnode benchmark jobs: through the test harness (the env contract, no launcher) or
through ``mxdist launch`` (this machine or the SSH testbed, with any extra launch flags).

Workers run benchmarks/kvstore/psnode_worker.py.  Through mxdist they write their result lines to
files in a private temp dir named on their command line (the launcher's streamed output is
prefixed and may be wrapped; files are exact), which the driver reads when the job has ended.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.cases import Case, encode_cases
from benchmarks.common import ROOT, child_env, parse_results, tail

HERE = Path(__file__).resolve().parent
WORKER = HERE / "psnode_worker.py"
PSNODE_ENV = {"PSNODE_HEARTBEAT_INTERVAL": "1.0", "PSNODE_REGISTER_TIMEOUT": "30"}


# ---------------------------------------------------------------- through the test harness
NO_SHM_ENV = {"PSNODE_SHM": "0"}    # workers on the servers' host use TCP like the others


def run_psnode(h, W: int, S: int, cases: list[Case], quick: bool, timeout: float, shm: bool = True,
               cpu_policy: str = "batch") -> list[dict]:
    """psnode through the harness; ``shm=False``: every data message over TCP (no same-host
    link), as between hosts; ``cpu_policy``: PSNODE_CPU_POLICY of every process."""
    env = {**PSNODE_ENV, "PSNODE_CPU_POLICY": cpu_policy, **({} if shm else NO_SHM_ENV)}
    job = h.start_job(WORKER.read_text(), W, S, env=env,
                      args=["bench", encode_cases(cases), "1" if quick else "0"])
    try:
        h.wait_job(job, timeout)
    except AssertionError as exc:
        print(f"  psnode W{W}S{S}: {exc}\n{tail(job.describe(), 40)}", file=sys.stderr)
        return []
    if any(p.code != 0 for p in job.procs):
        print(f"  psnode W{W}S{S}: exit codes {[(p.role, p.rank, p.code) for p in job.procs]}\n"
              f"{tail(job.describe(), 40)}", file=sys.stderr)
    return [r for p in job.workers for r in parse_results(p.out)]


def run_psnode_launch(h, W: int, S: int, timeout: float) -> list[dict]:
    t0 = time.time()
    job = h.start_job(WORKER.read_text(), W, S, env=PSNODE_ENV, args=["launch", repr(t0)])
    try:
        h.wait_job(job, timeout)
    except AssertionError as exc:
        print(f"  psnode launch: {exc}\n{tail(job.describe(), 30)}", file=sys.stderr)
        return []
    return [dict(r, system="psnode-harness") for p in job.workers for r in parse_results(p.out)]


# ---------------------------------------------------------------- through mxdist launch
def cli_ready() -> tuple[bool, str]:
    """``mxdist`` usable: ``import mxdist.main`` works and ``mxdist --help`` runs; (ok, exe or why)."""
    exe = shutil.which("mxdist")
    r = subprocess.run([sys.executable, "-c", "import mxdist.main"], cwd=ROOT, env=child_env(),
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        return False, f"import mxdist.main failed: {tail(r.stderr, 1)}"
    if exe is None:
        return False, "no mxdist on PATH"
    r = subprocess.run([exe, "--help"], cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        return False, f"mxdist --help exited {r.returncode}: {tail(r.stderr, 1)}"
    return True, exe


@dataclass
class Launcher:
    """How psnode jobs start through ``mxdist launch``: extra flags, hosts (None: this machine;
    else the ``-H`` value, e.g. the SSH testbed's ``node1,node2``), extra environment (a
    private MXDIST_HOME, the testbed's ssh config)."""
    exe: str
    flags: list[str] = field(default_factory=list)
    hosts: str | None = None
    env: dict[str, str] = field(default_factory=dict)

    def argv(self, W: int, S: int) -> list[str]:
        where = ["-H", self.hosts] if self.hosts else []
        return [self.exe, "launch", "-q", "-n", str(W), "-s", str(S), *where, *self.flags]

    def flags_refused(self) -> str | None:
        """None when ``mxdist launch`` knows every option in ``flags``, else why not.

        The options are looked up in ``mxdist launch --help`` (an unknown one would otherwise be
        taken for the command to run), then the whole line is checked with ``--dry-run``."""
        env = child_env(COLUMNS="200", NO_COLOR="1", **self.env)
        r = subprocess.run([self.exe, "launch", "--help"], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=60)
        names = [f.split("=", 1)[0] for f in self.flags if f.startswith("-")]
        unknown = [n for n in names if not re.search(r"(?<![\w-])" + re.escape(n) + r"(?![\w-])", r.stdout)]
        if unknown:
            return f"mxdist launch has no option {', '.join(unknown)}"
        r = subprocess.run([*self.argv(2, 2), "--dry-run", str(WORKER)], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=60)
        if r.returncode == 0:
            return None
        return tail(r.stderr or r.stdout, 3).replace("\n", " ") or f"exit {r.returncode}"


def _mxdist(launcher: Launcher, W: int, S: int, worker_args: list[str], timeout: float,
            who: str) -> list[dict]:
    out_dir = Path(tempfile.mkdtemp(prefix="psnode-bench-"))
    try:
        argv = [*launcher.argv(W, S), str(WORKER), *worker_args, str(out_dir)]
        try:
            r = subprocess.run(argv, cwd=ROOT, env=child_env(COLUMNS="200", NO_COLOR="1", **launcher.env),
                               capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            print(f"  {who}: mxdist launch timed out after {timeout:.0f} s", file=sys.stderr)
            return []
        res = [x for f in sorted(out_dir.glob("*.jsonl")) for x in parse_results(f.read_text())]
        if r.returncode != 0:
            print(f"  {who}: mxdist launch exited {r.returncode}:\n{tail(r.stdout + r.stderr, 20)}",
                  file=sys.stderr)
        return res
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def run_psnode_mxdist(launcher: Launcher, W: int, S: int, cases: list[Case], quick: bool,
                      timeout: float, who: str = "psnode") -> list[dict]:
    """The cases on a job started by ``mxdist launch``; the workers' records."""
    return _mxdist(launcher, W, S, ["bench", encode_cases(cases), "1" if quick else "0"], timeout,
                   f"{who} W{W}S{S}")


def run_mxdist_launch(launcher: Launcher, W: int, S: int, timeout: float) -> list[dict]:
    """Launch to first completed pull through ``mxdist launch`` (from just before it starts)."""
    t0 = time.time()
    res = _mxdist(launcher, W, S, ["launch", repr(t0)], timeout, "psnode launch")
    if len(res) != W:
        print(f"  mxdist launch: {len(res)} of {W} results", file=sys.stderr)
    return [dict(x, system="psnode-mxdist") for x in res]
