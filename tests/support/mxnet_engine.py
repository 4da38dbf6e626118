"""Helpers for the ``mxdist launch --engine mxnet`` tests (local, SSH, Slurm): the scripts the
jobs run, and the check that no MXNet process of a job is left anywhere on this machine."""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np

from tests.support.cli import ROOT, cli_env

#: The Gluon example both engines train (``kvstore='psnode'``, or MXNet's own dist_sync).
GLUON_EXAMPLE = str(ROOT / "examples" / "gluon_mlp.py")

#: A worker that takes part in a dist_sync job: rank r pushes r + 1 to key 3, pulls the sum
#: (MXNet's servers store the sum of the pushes without an optimizer), prints what it got and its
#: ps-lite variables, then waits to be stopped.
WAITER = textwrap.dedent("""
    import json, os, time
    import mxnet as mx
    kv = mx.kv.create("dist_sync")
    kv.init(3, mx.nd.zeros((4,)))
    kv.push(3, mx.nd.full((4,), kv.rank + 1))
    out = mx.nd.zeros((4,))
    kv.pull(3, out=out)
    env = {k: os.environ.get(k) for k in ("DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_NODE_HOST", "DMLC_NUM_WORKER",
                                          "DMLC_NUM_SERVER", "RANK", "WORLD_SIZE", "MASTER_ADDR")}
    print("ENV", json.dumps(env), "pulled", out.asnumpy().tolist(), "type", kv.type, flush=True)
    kv._barrier()
    print("ready rank", os.environ["RANK"], flush=True)
    time.sleep(300)
""")

#: Worker 1 raises after the job's first barrier; worker 0 waits to be stopped.
FAILING = textwrap.dedent("""
    import os, time
    import mxnet as mx
    kv = mx.kv.create("dist_sync")
    kv.init(3, mx.nd.zeros((2,)))
    kv._barrier()
    if os.environ["RANK"] == "1":
        raise ValueError("bad batch")
    print("rank 0 waits", flush=True)
    time.sleep(300)
""")


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def port_of(record: dict[str, Any]) -> str:
    """The job's scheduler port (``DMLC_PS_ROOT_PORT`` of every process of the job)."""
    return record["scheduler"].rsplit(":", 1)[1]


def mxnet_processes(port: str) -> list[tuple[int, str]]:
    """Live (non-zombie) processes whose environment has ``DMLC_PS_ROOT_PORT=port``: every
    process of that MXNet job (scheduler and servers ``python -c "import mxnet"``, workers),
    whoever started them; (pid, command line)."""
    marker = f"DMLC_PS_ROOT_PORT={port}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if marker not in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                continue
            if Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        found.append((int(entry), cmd[:120]))
    return found


def assert_no_mxnet_left(port: str, timeout: float = 15.0) -> None:
    """No process of the MXNet job on ``port`` runs (waits up to ``timeout``; kills and fails
    if some still do)."""
    deadline = time.monotonic() + timeout
    while (left := mxnet_processes(port)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if left:
        for pid, _ in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        raise AssertionError(f"MXNet processes of the job left: {left}")


def metric(out: str, name: str) -> float:
    found = re.findall(rf"{name}=([0-9.]+)", out)
    assert found, f"no {name}= in:\n{out}"
    return float(found[-1])


def assert_matches_one_process(dist_out: str, tmp_path: Path, home: Path, args: list[str],
                               timeout: float) -> tuple[float, float]:
    """The Gluon example run as one process with twice the batch (``args`` as the job's, the job
    having saved ``tmp_path/w{rank}.npz`` with batch 32 on each of 2 workers): both ranks end
    equal, the weights match one process to 1e-3 and the accuracy to 0.01 (and is above 0.9).
    Returns (the job's accuracy, one process's)."""
    single = subprocess.run([sys.executable, GLUON_EXAMPLE, *args, "--batch-size", "64", "--save",
                             str(tmp_path / "one.npz")], capture_output=True, text=True, timeout=timeout,
                            env=cli_env(home, PYTHONPATH=str(ROOT)), cwd=ROOT)
    assert single.returncode == 0, single.stdout + single.stderr
    assert "kvstore=local workers=1" in single.stdout
    acc_dist, acc_one = metric(dist_out, "accuracy"), metric(single.stdout, "accuracy")
    assert acc_one > 0.9 and abs(acc_dist - acc_one) <= 0.01, (acc_dist, acc_one)
    with np.load(tmp_path / "w0.npz") as a, np.load(tmp_path / "w1.npz") as b, \
            np.load(tmp_path / "one.npz") as one:
        assert sorted(a.files) == sorted(one.files) and len(a.files) == 4
        for k in a.files:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)             # both ranks end equal
            np.testing.assert_allclose(a[k], one[k], atol=1e-3, err_msg=k)   # and as one process
    return acc_dist, acc_one


def logs_say(record: dict[str, Any], text: str, names: tuple[str, ...]) -> bool:
    """Every named process's local log contains ``text``."""
    logs = {p["name"]: p["log"] for p in record["procs"]}
    try:
        return all(text in Path(logs[n]).read_text() for n in names)
    except OSError:
        return False
