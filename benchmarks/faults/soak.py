"""The restart storm again and again: ``soak.py`` runs N storms and prints N/N.

One storm (tests/support/storm.py, which tests/faults/test_storm.py runs bounded) is a training
job that must end exact while its workers and servers are killed with SIGKILL.  With
``--host-crash KIND`` each run is instead a job with replicated servers and no checkpoints whose
host crashes (tests/support/hostcrash.py: network namespaces, real sshd; root only): KIND is
``server`` (a host with a server and a worker), ``scheduler`` (the scheduler's host),
``worker`` (a worker-only host), ``big`` (the server case while a 20M x 16 embedding table
computed on the servers trains, every host on a 1 Gbit/s link of its own), ``big-given`` (the
same table given whole by rank 0: a pretrained one, its values copied and fetched whole) or
``all``.  A run
passes when the job ends exit 0 with the uninterrupted values on every rank and its first round
after the crash completed within :data:`FIRST_ROUND_S` s of it.

    python benchmarks/faults/soak.py                     # 20 storms of 900 rounds, same-host shared memory
    python benchmarks/faults/soak.py --no-shm --runs 5   # the same over TCP
    python benchmarks/faults/soak.py --rounds 300 --kills 8 --seed 7 --runs 1 --keep /tmp/storm
    python benchmarks/faults/soak.py --host-crash all --runs 10   # 10 crashes of each kind of host
    python benchmarks/faults/soak.py --host-crash big --runs 10   # the big table on 1 Gbit/s links
    python benchmarks/faults/soak.py --host-crash big-given --runs 3   # the same table given whole
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

from tests.support.hostcrash import CASES, first_round_after, run_case  # noqa: E402
from tests.support.storm import Storm, run_storm  # noqa: E402

FIRST_ROUND_S = 10.0   # a crash costs at most this long: the first round after it completes within


def host_crashes(kinds: list[str], runs: int, keep: Path | None) -> int:
    """``runs`` crashes of each kind; prints each and the tally; 0 when every one passed."""
    failed = 0
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
    for kind in kinds:
        passed, firsts = 0, []
        for i in range(runs):
            where = Path(tempfile.mkdtemp(prefix=f"psnode-crash-{kind}-", dir=keep))
            case = CASES[kind]
            try:
                out, code, took = run_case(case, where)
                first = first_round_after(out)
                exact = case.finals(out)
                ok = code == 0 and exact and first < FIRST_ROUND_S
                firsts.append(first)
                line = (f"exit {code}, {'exact' if exact else 'NOT EXACT'}, first round {first:.1f} s after the "
                        f"crash, job ended {took:.0f} s after it")
            except Exception as exc:  # noqa: BLE001 - a run that could not even finish is a failed run
                ok, line, out = False, f"{type(exc).__name__}: {str(exc)[:300]}", ""
            passed += ok
            print(f"{kind} host crash {i + 1}/{runs}: {line}{'' if ok else '  FAILED'}", flush=True)
            if ok and keep is None:
                shutil.rmtree(where, ignore_errors=True)
            elif not ok:
                (where / "launcher.out").write_text(out)
                print(f"  kept in {where}", flush=True)
        spread = f"; first round {min(firsts):.1f}-{max(firsts):.1f} s after the crash" if firsts else ""
        print(f"soak: {passed}/{runs} {kind} host crashes passed (exit 0, exact on every rank, first round "
              f"within {FIRST_ROUND_S:g} s){spread}", flush=True)
        failed += runs - passed
    return 0 if not failed else 1


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
    ap.add_argument("--host-crash", choices=[*CASES, "all"], default=None,
                    help="crash a host of a job with --replicas 2 instead (root: network namespaces)")
    args = ap.parse_args(argv)
    if args.host_crash:
        kinds = list(CASES) if args.host_crash == "all" else [args.host_crash]
        return host_crashes(kinds, args.runs, Path(args.keep) if args.keep else None)
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
