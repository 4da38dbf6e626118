"""Profile psnode on one benchmark case with py-spy (sampling every process of a W,S job).

    python benchmarks/kvstore/profile_case.py --case 1x1MiB --config 2,2 --seconds 8
    python benchmarks/kvstore/profile_case.py --case 1x4KiB --config 2,2 --top 25 --out /tmp/prof

Starts a harness job running the case for many rounds, attaches ``py-spy record`` (pip install
py-spy) to the servers and the workers, and prints, per role, the functions with the most
samples: self time (the frame on top of the stack) and inclusive time (anywhere on the stack).
Only samples where a thread was running are counted (py-spy's default, no --idle); "busy" is
samples / (seconds * rate), summed over the role's threads.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.cases import ALL, encode_cases  # noqa: E402
from benchmarks.common import harness  # noqa: E402
from benchmarks.kvstore.psnode_job import PSNODE_ENV, WORKER  # noqa: E402
from benchmarks.kvstore.run import parse_configs  # noqa: E402


def frame_name(fr: str) -> str:
    # py-spy raw frames look like "func (path/file.py:line)"; keep file:func (drop the line)
    name, _, where = fr.partition(" (")
    where = where.rstrip(")")
    path = where.rsplit(":", 1)[0]
    parts = Path(path).parts
    short = "/".join(parts[-2:]) if "psnode" not in parts else "psnode/" + Path(path).name
    return f"{short}:{name}"


def summarize(raw: Path, seconds: float, rate: int, top: int) -> list[str]:
    self_c: collections.Counter = collections.Counter()
    incl_c: collections.Counter = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        n = int(n)
        frames = [frame_name(f) for f in stack.split(";")]
        if (frames and frames[0].startswith("process ")) or (frames and frames[0].startswith("thread ")):
            frames = [f for f in frames if not (f.startswith(("process ", "thread ")))]
        if not frames:
            continue
        total += n
        self_c[frames[-1]] += n
        for f in set(frames):
            incl_c[f] += n
    out = [f"  {total} busy samples = {total / (seconds * rate):.2f} cores busy on average"]
    out.append("  self:")
    out += [f"    {100 * n / max(total, 1):5.1f}%  {f}" for f, n in self_c.most_common(top)]
    out.append("  inclusive:")
    out += [f"    {100 * n / max(total, 1):5.1f}%  {f}" for f, n in incl_c.most_common(top)]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", default="1x1MiB", choices=list(ALL))
    ap.add_argument("--config", default="2,2")
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--rate", type=int, default=250)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--out", default="/tmp/psnode-profile")
    a = ap.parse_args()
    spy = shutil.which("py-spy")
    if spy is None:
        raise SystemExit("py-spy not found: pip install py-spy")
    (W, S), = parse_configs([a.config])
    c = ALL[a.case]
    c = dataclasses.replace(c, warmup=3, rounds=10**6, quick_rounds=10**6)  # runs until killed
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    h = harness()
    job = h.start_job(WORKER.read_text(), W, S, env=PSNODE_ENV, args=["bench", encode_cases([c]), "0"])
    try:
        time.sleep(2.5)  # registration, init, warm-up
        spies = []
        for p in job.procs:
            if p.role == "scheduler":
                continue
            raw = out / f"{a.case}-W{W}S{S}-{p.role}{p.rank}.txt"
            spies.append((p, raw, subprocess.Popen(
                [spy, "record", "--pid", str(p.popen.pid), "--duration", str(int(a.seconds)), "--rate",
                 str(a.rate), "--format", "raw", "--threads", "--nonblocking", "--output", str(raw)],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)))
        for p, raw, sp in spies:
            _, err = sp.communicate(timeout=a.seconds + 60)
            if sp.returncode != 0 or not raw.exists():
                print(f"py-spy on {p.role} {p.rank} failed: {err.strip()[-400:]}")
    finally:
        h.kill_job(job)
    print(f"profile of psnode {a.case} at W{W}S{S}, {a.seconds:g} s at {a.rate} Hz (raw stacks in {out})")
    for p, raw, _ in spies:
        if raw.exists():
            print(f"\n{p.role} {p.rank}:")
            print("\n".join(summarize(raw, a.seconds, a.rate, a.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
