"""One Gluon model trained with MXNet's own dist_sync and with ``kvstore='psnode'``, steps/s side by side.

    python benchmarks/training/gluon.py                     # 3 interleaved runs, W=2 S=2, the example's MLP
    python benchmarks/training/gluon.py --quick             # smoke run: 1 run, few steps
    python benchmarks/training/gluon.py --hidden 1024 --no-update-on-kvstore --runs 5 --json /tmp/gluon.json

The model, data and step are examples/gluon_mlp.py's (benchmarks/training/gluon_worker.py); both
systems train it with W workers and S servers on 127.0.0.1, in MXNet 1.9.1's venv (the
interpreter running this script when it has MXNet, else the repository's ``.venv-mxnet``,
else the one benchmarks/kvstore/mxnet_job.py makes).
Both jobs start through ``mxdist launch -q`` with a private MXDIST_HOME: MXNet's with
``--engine mxnet`` (its scheduler and S servers ``python -c "import mxnet"`` with the ``DMLC_*``
variables, as MXNet's own launcher starts them), psnode's with the default engine.
``OMP_NUM_THREADS=1`` everywhere (2 cores).  A run's value per system is the
median over ranks of each rank's steps/s; the table shows median [min-max] over runs and
psnode/MXNet per run (above 1: psnode faster).  Each system's ranks must end with equal
weights (checksum), or the run says so.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.common import tail  # noqa: E402
from benchmarks.kvstore.mxnet_job import mxnet_python  # noqa: E402
from benchmarks.report import fmt_range, print_table  # noqa: E402

WORKER = Path(__file__).resolve().parent / "gluon_worker.py"


def venv_python() -> tuple[str | None, str]:
    """An interpreter with MXNet: this one, the repository's .venv-mxnet, or benchmarks/kvstore/mxnet_job.py's."""
    if importlib.util.find_spec("mxnet") is not None:
        return sys.executable, sys.prefix
    local = ROOT / ".venv-mxnet" / "bin" / "python"
    if local.exists():
        return str(local), f"{local.parent.parent}"
    return mxnet_python()


def _collect(out_dir: Path, system: str, W: int) -> list[dict]:
    found = [json.loads(p.read_text()) for p in sorted(out_dir.glob(f"{system}-*.json"))]
    if len(found) != W:
        print(f"  {system}: {len(found)} of {W} workers reported", file=sys.stderr)
    return found


def run_job(system: str, py: str, W: int, S: int, cfg: dict, timeout: float) -> list[dict]:
    """One job of ``system`` (``mxnet``: ``--engine mxnet``; ``psnode``) through ``mxdist launch``;
    the workers' records."""
    out = Path(tempfile.mkdtemp(prefix=f"gluon-{system}-"))
    env = dict(os.environ, MXDIST_HOME=str(out / "home"), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    engine = ["--engine", "mxnet", "--insecure"] if system == "mxnet" else []
    argv = [py, "-m", "mxdist", "launch", "-q", *engine, "-n", str(W), "-s", str(S), str(WORKER), system,
            json.dumps(cfg), str(out)]
    try:
        r = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            print(f"  {system} W{W}S{S}: mxdist launch exited {r.returncode}:\n{tail(r.stdout + r.stderr)}",
                  file=sys.stderr)
        return _collect(out, system, W)
    except subprocess.TimeoutExpired:
        print(f"  {system} W{W}S{S}: timed out after {timeout:.0f} s (mxdist launch ends the job)", file=sys.stderr)
        return []
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64, help="hidden units of the MLP (the example's: 64)")
    p.add_argument("--batch", type=int, default=32, help="samples per step on each worker")
    p.add_argument("--steps", type=int, default=400, help="timed steps per worker")
    p.add_argument("--warmup", type=int, default=40)
    p.add_argument("--update-on-kvstore", action=argparse.BooleanOptionalAction, default=True,
                   help="the optimizer on the servers (MXNet's default for dist_sync) or on the workers")
    p.add_argument("--quick", action="store_true", help="1 run, 40 steps")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--json", default=None, metavar="FILE", help="write every record here")
    args = p.parse_args()
    if args.quick:
        args.runs, args.steps, args.warmup = 1, 40, 5
    py, where = venv_python()
    if py is None:
        sys.exit(f"no MXNet to compare with: {where}")
    cfg = {"hidden": args.hidden, "batch": args.batch, "steps": args.steps, "warmup": args.warmup, "lr": 0.1,
           "update_on_kvstore": args.update_on_kvstore}
    W, S = args.workers, args.servers
    print(f"gluon MLP (hidden {args.hidden}), W={W} S={S}, batch {args.batch}/worker, {args.steps} timed steps, "
          f"update_on_kvstore={args.update_on_kvstore}, {args.runs} interleaved runs; MXNet from {where}", flush=True)
    records: list[dict] = []
    per_run: dict[str, list[float]] = {"mxnet": [], "psnode": []}
    for run in range(args.runs):
        for system in ("mxnet", "psnode"):
            got = run_job(system, py, W, S, cfg, args.timeout)
            for r in got:
                r["run"] = run
            records.extend(got)
            if len(got) == W:
                per_run[system].append(statistics.median(r["steps_per_s"] for r in got))
                if len({r["checksum"] for r in got}) != 1:
                    print(f"  run {run + 1} {system}: the ranks' weights differ: {[r['checksum'] for r in got]}")
            print(f"  run {run + 1} {system}: "
                  + (f"{per_run[system][-1]:.1f} steps/s, accuracy {got[0]['accuracy']:.4f}" if len(got) == W
                     else "failed"), flush=True)
    pairs = [ps / mx for mx, ps in zip(per_run["mxnet"], per_run["psnode"], strict=False)]
    rows = [(s, fmt_range(v, ".1f") if v else "-") for s, v in per_run.items()]
    print_table(("system", "steps/s median [min-max]"), rows)
    if pairs:
        print(f"psnode / MXNet steps/s per run: {', '.join(f'{x:.2f}' for x in pairs)} "
              f"(median {statistics.median(pairs):.2f})")
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
