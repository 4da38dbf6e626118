"""The restart storm: a training job that must end exact while its workers and servers are
killed with SIGKILL (tests/faults/test_storm.py runs it bounded; benchmarks/faults/soak.py runs it N
times and prints N/N).

One storm (:func:`run_storm`): ``mxdist launch -n 3 -s 2 --max-restarts 50 --checkpoint-dir D
--checkpoint-rounds 1 train.py`` of :data:`TRAIN` (two keys: ``'w'``, 1000 elements, a bucket
of small keys of its own, and ``'big'``, 1.5 M elements split over both servers; plain SGD,
learning rate 1, so a push applied twice or never changes every later value), while a seeded
schedule kills a random live worker or server (the psnode process under its reaper) every
``interval`` seconds, from the moment every worker has initialised its keys.  Each worker
resumes from ``kv.num_pushes``, checks the exact closed-form
value after every round (a mismatch is written to ``D/mismatch.<rank>`` and fails the storm,
whatever the launcher does next) and prints ``FINAL OK`` after the last round.  A storm passes
when the launcher exits 0, every rank printed ``FINAL OK``, no mismatch was written, and no
process or shared memory of the job is left on the host.

Workers are not killed once they have started to finish (``kv.close``): a worker killed after
the scheduler recorded it finished cannot rejoin (README, ``--max-restarts``).
"""
from __future__ import annotations

import contextlib
import glob
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

TRAIN = r"""
import os, sys, time
from pathlib import Path
import numpy as np, psnode

rounds, marks, pace = int(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
SIZES = {'w': 1000, 'big': 1_500_000}
kv = psnode.kv.create('dist_sync')
kv.set_optimizer(psnode.optimizer.create('sgd', learning_rate=1.0))
r, W = kv.rank, kv.num_workers
pattern = {k: (np.arange(n) % 7).astype(np.float32) for k, n in SIZES.items()}
vals = {k: np.zeros(n, np.float32) for k, n in SIZES.items()}
for k in SIZES:
    kv.init(k, vals[k])
done = {k: kv.num_pushes(k) for k in SIZES}      # (resumes: pushes its rank already made)
mean = (W + 1) / 2                                  # mean over ranks of (r + 1)


def want(k, step):
    # SGD with learning rate 1 on the mean gradient mean * t + pattern, t = 1..step
    return -(np.float32(mean * step * (step + 1) / 2) + np.float32(step) * pattern[k])


def check(k, step):
    if not np.array_equal(vals[k], want(k, step)):
        bad = int(np.flatnonzero(vals[k] != want(k, step))[0])
        text = (f"rank {r} restart {kv.restarts} step {step} key {k!r}: element {bad} is {vals[k][bad]}, "
                f"want {want(k, step)[bad]} (pushes resumed at {done})")
        (marks / f"mismatch.{r}").write_text(text)
        print("MISMATCH", text, flush=True)
        os._exit(3)


if kv.restarts == 0:
    (marks / f"ready.{r}").touch()
for step in range(min(done.values()) + 1, rounds + 1):
    for k in SIZES:
        if step > done[k]:
            kv.push(k, np.float32((r + 1) * step) + pattern[k])
    for k in SIZES:              # (a key pushed further before the restart: its later value)
        kv.pull(k, out=vals[k])
        check(k, max(step, done[k]))
    if pace:
        time.sleep(pace)
for k in SIZES:
    kv.pull(k, out=vals[k])
    check(k, max(rounds, done[k]))
links = sorted(kv._engine.links.local)          # (the same-host links, back after every restart)
(marks / f"finishing.{r}").touch()
print("FINAL OK", r, "restarts", kv.restarts, "links", links, flush=True)
kv.close()
"""


@dataclass
class Storm:
    """One storm's settings."""

    rounds: int = 900
    kills: int = 100                 # at most this many kills (the job's end stops them earlier)
    interval: float = 3.0            # seconds between kills
    seed: int = 0
    shm: bool = True
    workers: int = 3
    servers: int = 2
    max_restarts: int = 50
    timeout: float = 600.0           # the whole storm, launch included
    first_kill: float = 3.0          # seconds after every worker initialised its keys
    pace: float = 0.0                # seconds each worker sleeps after a round
    extra: list[str] = field(default_factory=list)   # more launch flags


@dataclass
class Outcome:
    """What one storm did: ``ok`` and, when not, ``why``."""

    ok: bool
    why: str
    seconds: float
    kills: list[str]
    code: int | None
    workdir: str
    job: str = ""

    def line(self) -> str:
        state = "ok" if self.ok else f"FAILED: {self.why}"
        return f"{self.seconds:6.1f} s, {len(self.kills):2d} kills, exit {self.code}: {state}"


def _env(home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env["MXDIST_HOME"] = str(home)
    for name in list(env):
        if name.startswith("PSNODE_"):
            del env[name]
    return env


def _record(home: Path) -> dict | None:
    for path in sorted(glob.glob(str(home / "jobs" / "*.json"))):
        with contextlib.suppress(OSError, ValueError):
            return json.loads(Path(path).read_text())
    return None


def _child(reaper: int) -> int | None:
    """The process the reaper runs (the psnode node itself)."""
    try:
        kids = Path(f"/proc/{reaper}/task/{reaper}/children").read_text().split()
    except OSError:
        return None
    return int(kids[0]) if kids else None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def job_processes(job: str) -> list[int]:
    """Live processes whose environment names job ``job`` (PSNODE_JOB_ID)."""
    mark = f"PSNODE_JOB_ID={job}".encode()
    found = []
    for env in glob.glob("/proc/[0-9]*/environ"):
        pid = int(env.split("/")[2])
        if pid == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if mark in Path(env).read_bytes().split(b"\0") and _alive(pid):
                found.append(pid)
    return sorted(found)


def run_storm(storm: Storm, workdir: Path) -> Outcome:
    """Run one storm in ``workdir`` (made if needed; kept for the caller to inspect or remove)."""
    workdir.mkdir(parents=True, exist_ok=True)
    home, marks, ckpt = workdir / "home", workdir / "marks", workdir / "ckpt"
    for d in (home, marks):
        d.mkdir(exist_ok=True)
    script = workdir / "train.py"
    script.write_text(TRAIN)
    argv = [sys.executable, "-m", "mxdist", "launch", "-n", str(storm.workers), "-s", str(storm.servers),
            "--max-restarts", str(storm.max_restarts), "--checkpoint-dir", str(ckpt), "--checkpoint-rounds", "1",
            *([] if storm.shm else ["--no-shm"]), *storm.extra, str(script), str(storm.rounds), str(marks),
            str(storm.pace)]
    rng = random.Random(storm.seed)
    kills: list[str] = []
    t0 = time.monotonic()
    with open(workdir / "launch.log", "wb") as log:
        launch = subprocess.Popen(argv, cwd=ROOT, env=_env(home), stdout=log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, start_new_session=True)
    job = ""
    try:
        next_kill = None
        while launch.poll() is None:
            now = time.monotonic()
            if now - t0 > storm.timeout:
                raise TimeoutError(f"the job did not end within {storm.timeout:g} s")
            rec = _record(home)
            if rec is not None:
                job = rec.get("id", job)
            if rec is None or rec.get("state") != "running" or \
                    len(glob.glob(str(marks / "ready.*"))) < storm.workers:   # (the job has started)
                time.sleep(0.1)
                continue
            if next_kill is None:
                next_kill = now + storm.first_kill
            if now >= next_kill and len(kills) < storm.kills:
                next_kill = now + storm.interval
                victim = _pick(rec, marks, rng)
                if victim is not None:
                    name, pid = victim
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                        kills.append(f"{now - t0:.1f}s {name} pid {pid}")
            time.sleep(0.05)
        code = launch.returncode
    except TimeoutError as exc:
        _stop(launch)
        return _outcome(False, str(exc), t0, kills, None, workdir, job)
    ranks_ok = sorted(int(p.split(".")[-1]) for p in glob.glob(str(marks / "finishing.*")))
    finals, links = _finals(home, job)
    mismatches = [Path(p).read_text() for p in sorted(glob.glob(str(marks / "mismatch.*")))]
    why = ""
    if mismatches:
        why = "; ".join(mismatches)
    elif code != 0:
        why = f"launch exited {code}: {_closing(workdir / 'launch.log')}"
    elif finals != list(range(storm.workers)) or ranks_ok != list(range(storm.workers)):
        why = f"ranks that printed FINAL OK: {finals}"
    elif storm.shm and links != {str(list(range(storm.servers)))}:
        why = f"the same-host links at the end: {sorted(links)} (not every server's)"
    left = _left(job)
    if left and not why:
        why = left
    return _outcome(not why, why, t0, kills, code, workdir, job)


def _pick(rec: dict, marks: Path, rng: random.Random) -> tuple[str, int] | None:
    """A random live worker (not finishing) or server: (name, pid of the psnode process)."""
    names = []
    for p in rec.get("procs", []):
        if p.get("role") not in ("worker", "server") or p.get("state") != "running" or not p.get("pid"):
            continue
        if p["role"] == "worker" and (marks / f"finishing.{p['rank']}").exists():
            continue
        names.append((p["name"], int(p["pid"])))
    names.sort()
    rng.shuffle(names)
    for name, reaper in names:
        child = _child(reaper)
        if child is not None and _alive(child):
            return name, child
    return None


def _finals(home: Path, job: str) -> tuple[list[int], set[str]]:
    """The ranks that printed FINAL OK, and the same-host links they reported."""
    ranks, links = set(), set()
    for path in glob.glob(str(home / "jobs" / job / "worker-*.log")):
        with contextlib.suppress(OSError):
            for line in Path(path).read_text(errors="replace").splitlines():
                if line.startswith("FINAL OK "):
                    ranks.add(int(line.split()[2]))
                    links.add(line.split(" links ", 1)[1])
    return sorted(ranks), links


def _closing(log: Path) -> str:
    lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
    return " | ".join(lines[-3:])[-600:]


def _left(job: str) -> str:
    """'' when nothing of ``job`` is left on this host (waits a few seconds for reaping)."""
    if not job:
        return ""
    from psnode.samehost import segments as shm

    deadline = time.monotonic() + 5
    while True:
        procs, segs, maps = job_processes(job), shm.leftovers(job), shm.holders(job)
        if not (procs or segs or maps) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    parts = []
    if procs:
        parts.append(f"processes left: {procs}")
    if segs:
        parts.append(f"shared memory left: {segs}")
    if maps:
        parts.append(f"processes mapping the job's segments: {maps}")
    return "; ".join(parts)


def _stop(launch: subprocess.Popen) -> None:
    """End a storm that overran: TERM the launcher (it stops its job), KILL after 30 s."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(launch.pid, signal.SIGTERM)
    try:
        launch.wait(30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launch.pid, signal.SIGKILL)
        launch.wait(10)


def _outcome(ok: bool, why: str, t0: float, kills: list[str], code: int | None, workdir: Path, job: str) -> Outcome:
    return Outcome(ok, why, time.monotonic() - t0, kills, code, str(workdir), job)
