"""The launcher's modules on ``mxdist launch -H node1`` over a real sshd (127.0.0.2), measured by
benchmarks/control/paths.py in the launching process: from ``mxdist.main`` to the first of the
job's processes handed to the host, and to the job's end, as docs/architecture.md states them.
A job asking no GPUs of a host that has none enters no GPU module (mxdist.planning.gpus: a
host with nvidia-smi adds it, and the figures stated are those without it)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support import require
from tests.support.hosts import SSHD

ROOT = Path(__file__).resolve().parents[2]

#: To the first spawn request, as docs/architecture.md lists them ("The launcher").
TO_FIRST_START = {
    "mxdist.main", "mxdist.ui", "mxdist.job.records",
    "mxdist.planning.plan", "mxdist.planning.options", "mxdist.planning.engines", "mxdist.planning.hosts",
    "mxdist.planning.servers", "mxdist.planning.torchenv",
    "mxdist.supervisor.setup", "mxdist.supervisor.supervisor", "mxdist.supervisor.preflight",
    "mxdist.supervisor.membership", "mxdist.supervisor.conclusion",
    "mxdist.backends.base", "mxdist.backends.registry", "mxdist.backends.ssh", "mxdist.backends.agent",
    "mxdist.planning.bounds",
}
TO_THE_END = TO_FIRST_START | {"mxdist.job.lifecycle", "mxdist.control.teardown", "mxdist.control.history"}


def test_ssh_launch_crosses_the_documented_modules(tmp_path: Path) -> None:
    require(None if os.path.exists(SSHD) else f"{SSHD} missing", "apt-get install openssh-server")
    out = tmp_path / "paths.json"
    r = subprocess.run([sys.executable, "benchmarks/control/paths.py", "--path", "ssh", "--timeout", "120",
                        "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ssh = json.loads(out.read_text())["ssh"]
    first = ssh["to_first_spawn"]
    gpus = {"mxdist.planning.gpus"} if shutil.which("nvidia-smi") else set()
    assert first[0] == "mxdist.main", first
    want = TO_FIRST_START | gpus
    assert set(first) == want and len(first) == len(want), sorted(set(first) ^ want)
    assert set(ssh["order"]) == TO_THE_END | gpus, sorted(set(ssh["order"]) ^ (TO_THE_END | gpus))
    doc = (ROOT / "docs" / "architecture.md").read_text()
    stated = re.search(r"over SSH crosses (\d+) launcher modules.*?and (\d+) to\s+the job's end", doc, re.S)
    assert stated is not None, "docs/architecture.md states no SSH launch path"
    assert (int(stated.group(1)), int(stated.group(2))) == (len(TO_FIRST_START), len(TO_THE_END))
