"""Small helpers shared by the benchmark drivers (run.py, train.py, scaling.py, control_plane.py)."""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import socket
import sys
from pathlib import Path

from benchmarks.cases import MARK

ROOT = Path(__file__).resolve().parents[1]
MARK_RE = re.compile(re.escape(MARK) + r"(\{.*\})")


def harness():
    """tests/support/cluster.py (starts psnode jobs through the env contract, no launcher):
    imported as ``tests.support.cluster`` when ``tests`` is a package, else loaded by path."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    if (ROOT / "tests" / "__init__.py").exists():
        return importlib.import_module("tests.support.cluster")
    spec = importlib.util.spec_from_file_location("_psnode_harness", ROOT / "tests" / "support" / "cluster.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod   # dataclasses look their module up here
    spec.loader.exec_module(mod)
    return mod


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def parse_results(text: str) -> list[dict]:
    """Every ``BENCHRESULT {json}`` in ``text`` (anywhere in a line: launcher prefixes are fine)."""
    return [json.loads(m.group(1)) for m in MARK_RE.finditer(text)]


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def tail(text: str, n: int = 15) -> str:
    return "\n".join((text or "").strip().splitlines()[-n:])


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of ``pid`` in seconds (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
