"""The launcher's door is lazy: importing the CLI, planning a job (``mxdist launch --dry-run``)
and ``mxdist --help`` load neither pyzmq nor numpy; each name of ``psnode.launcher`` loads its
module on first use and is the object its home defines.  Checked in fresh interpreters (a
module once imported stays in ``sys.modules``)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.cli import ROOT, cli_env

HEAVY = ("numpy", "zmq")

LOADED = textwrap.dedent("""
    import atexit, json, sys
    atexit.register(lambda: print("LOADED " + json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)),
                                  file=sys.stderr, flush=True))
""")


def loaded(code: str, env: dict[str, str] | None = None) -> list[str]:
    """The heavy modules loaded by a fresh Python running ``code`` (to its exit)."""
    res = subprocess.run([sys.executable, "-c", LOADED.format(heavy=HEAVY) + code], capture_output=True, text=True,
                         timeout=60, cwd=ROOT, env=env)
    line = [x for x in res.stderr.splitlines() if x.startswith("LOADED ")]
    assert line, res.stdout + res.stderr
    return json.loads(line[-1].split(" ", 1)[1])


@pytest.mark.parametrize("module", ["psnode.launcher", "mxdist.planning.options", "mxdist.planning.plan",
                                    "mxdist.main"])
def test_importing_the_door_and_the_cli_loads_no_zmq_and_no_numpy(module):
    assert loaded(f"import {module}") == []


@pytest.mark.parametrize("argv", [["--help"], ["launch", "--help"], ["launch", "--dry-run", "-n", "2", "-s", "2"]])
def test_help_and_a_dry_run_load_no_zmq_and_no_numpy(argv, tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    args = [*argv, str(script)] if "--dry-run" in argv else argv
    code = f"import runpy, sys\nsys.argv = ['mxdist', *{args!r}]\nrunpy.run_module('mxdist', run_name='__main__')"
    assert loaded(code, cli_env(tmp_path / "home")) == []


def test_each_name_of_the_door_is_its_homes_object_loaded_on_first_use():
    code = textwrap.dedent("""
        import importlib, sys
        import psnode.launcher as door
        assert "psnode.scheduler.client" not in sys.modules
        for name in door.__all__:
            module, attr = door._HOMES[name]
            assert getattr(door, name) is getattr(importlib.import_module(module), attr), name
        from psnode.launcher import status
        assert status.__module__ == "psnode.scheduler.client"
    """)
    assert loaded(code) == ["numpy", "zmq"]
