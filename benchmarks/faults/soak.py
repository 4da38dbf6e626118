"""The restart storm again and again: ``soak.py`` runs N storms and prints N/N.

One storm (tests/support/storm.py, which tests/faults/test_storm.py runs bounded) is a training
job that must end exact while its workers and servers are killed with SIGKILL.

    python benchmarks/faults/soak.py                     # 20 storms of 900 rounds, same-host shared memory
    python benchmarks/faults/soak.py --no-shm --runs 5   # the same over TCP
    python benchmarks/faults/soak.py --rounds 300 --kills 8 --seed 7 --runs 1 --keep /tmp/storm
"""
from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support.storm import Storm, run_storm  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=900)
    ap.add_argument("--kills", type=int, default=100, help="at most this many kills per storm")
    ap.add_argument("--interval", type=float, default=3.0, help="seconds between kills")
    ap.add_argument("--seed", type=int, default=None, help="first storm's seed (default: random)")
    ap.add_argument("--no-shm", action="store_true", help="workers and servers over TCP only")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per storm")
    ap.add_argument("--keep", default=None, help="keep every storm's directory under this one")
    args = ap.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(2**31)
    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="psnode-soak."))
    passed = 0
    t0 = time.monotonic()
    path = "tcp (--no-shm)" if args.no_shm else "same-host shared memory"
    print(f"soak: {args.runs} storm(s) of {args.rounds} rounds, a kill every {args.interval:g} s, "
          f"{path}, seeds {seed}..{seed + args.runs - 1}", flush=True)
    for i in range(args.runs):
        storm = Storm(rounds=args.rounds, kills=args.kills, interval=args.interval, seed=seed + i,
                      shm=not args.no_shm, timeout=args.timeout)
        where = base / f"storm-{i}"
        out = run_storm(storm, where)
        passed += out.ok
        print(f"storm {i + 1}/{args.runs} (seed {seed + i}): {out.line()}", flush=True)
        if not out.ok:
            print(f"  kept in {where}; kills: {', '.join(out.kills)}", flush=True)
        elif not args.keep:
            shutil.rmtree(where, ignore_errors=True)
    print(f"soak: {passed}/{args.runs} storms exact ({path}) in {time.monotonic() - t0:.0f} s", flush=True)
    if not args.keep and passed == args.runs:
        shutil.rmtree(base, ignore_errors=True)
    return 0 if passed == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
