"""What the launcher's door loads: for each command, the modules in ``sys.modules`` at its exit (all,
and psnode's), whether numpy and pyzmq are among them, and its wall time as a whole process
(interpreter start included), each a fresh interpreter; medians of ``--runs`` interleaved runs.

    python benchmarks/control/door.py                                   # this checkout
    python benchmarks/control/door.py --tree /tmp/other --tree .         # another checkout beside this one

``--tree DIR`` (repeatable; ``.``: this checkout) runs the commands against that checkout: a
temporary folder with ``mxdist`` (DIR/cli) and ``psnode`` (DIR/psnode) as links comes first on
``PYTHONPATH``, in this venv.  The trees take turns, case by case, so that a drift of the
machine's speed falls on all of them alike.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = ("import atexit, json, sys\n"
         "atexit.register(lambda: print('LOADED ' + json.dumps(sorted(sys.modules)), file=sys.stderr, flush=True))\n")
RUN = "import runpy, sys\nsys.argv = ['mxdist', *{argv!r}]\nrunpy.run_module('mxdist', run_name='__main__')\n"
CASES = {
    "import mxdist.main": "import mxdist.main\n",
    "import mxdist.planning.options": "import mxdist.planning.options\n",
    "mxdist --help": RUN.format(argv=["--help"]),
    "mxdist launch --dry-run -n 2 -s 2 t.py": RUN.format(argv=["launch", "--dry-run", "-n", "2", "-s", "2", "t.py"]),
}


def once(code: str, env: dict[str, str], cwd: str) -> tuple[float, list[str]]:
    """Wall seconds of a fresh Python running ``code``, and the modules it had loaded at its exit."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", PROBE + code], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=120)
    wall = time.perf_counter() - start
    line = [x for x in done.stderr.splitlines() if x.startswith("LOADED ")]
    if not line:
        raise SystemExit(f"no module list from {code!r}: {done.stderr[-2000:]}")
    return wall, json.loads(line[-1].split(" ", 1)[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tree", action="append", help="a checkout to measure (its cli/ and psnode/); repeatable")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    trees = [str(Path(t).resolve()) for t in (args.tree or ["."])]
    figures = {}
    with tempfile.TemporaryDirectory() as tmp:
        envs = {}
        for i, tree in enumerate(trees):
            links = Path(tmp, f"tree{i}")
            links.mkdir()
            (links / "mxdist").symlink_to(Path(tree, "cli"))
            (links / "psnode").symlink_to(Path(tree, "psnode"))
            envs[tree] = {**os.environ, "MXDIST_HOME": os.path.join(tmp, "home"), "COLUMNS": "200", "NO_COLOR": "1",
                          "PYTHONPATH": str(links)}
        Path(tmp, "t.py").write_text("print('hi')\n")
        walls = {(t, name): [] for t in trees for name in CASES}
        loaded: dict[tuple[str, str], list[str]] = {}
        for _ in range(args.runs):                       # interleaved: each round runs every case of every tree
            for name, code in CASES.items():
                for tree in trees:
                    wall, modules = once(code, envs[tree], tmp)
                    walls[tree, name].append(wall)
                    loaded[tree, name] = modules
    for tree in trees:
        print(f"{tree}: medians of {args.runs} runs (wall ms, whole process)")
        rows = figures[tree] = {}
        for name in CASES:
            mods, ms = loaded[tree, name], [round(1000 * w) for w in walls[tree, name]]
            psnode = sum(m == "psnode" or m.startswith("psnode.") for m in mods)
            r = rows[name] = {"modules": len(mods), "psnode": psnode,
                              "heavy": [m for m in ("numpy", "zmq") if m in mods],
                              "wall_ms": statistics.median(ms), "wall_ms_range": [min(ms), max(ms)]}
            print(f"  {name:42s} {r['modules']:4d} modules, psnode {r['psnode']:3d}, numpy/zmq {r['heavy'] or 'none'}, "
                  f"{r['wall_ms']:.0f} ms ({min(ms)}-{max(ms)})")
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": args.runs, "trees": figures}, indent=1))


if __name__ == "__main__":
    main()
