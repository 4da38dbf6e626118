"""``mxdist launch --engine mxnet`` over real SSH: the sshd "hosts" of tests/ssh (node1, node2 on
127.0.0.2 and .3), the mxnet venv's interpreter as ``--python``.

* examples/gluon_mlp.py on MXNet's dist_sync across two hosts, one worker and one server each,
  the scheduler on node1: the accuracy band of one process, both ranks with equal weights;
* a job past its first push/pull (the exact sum 1 + 2 from MXNet's servers, each process bound
  to its own host's address by ``DMLC_NODE_HOST``) stopped with Ctrl-C: no MXNet process left;
* preflight: a ``--python`` that cannot import mxnet stops the launch on every host, naming it.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import mxnet  # noqa: F401 - this tier runs in MXNet's venv
import numpy as np

from tests.support.cli import ROOT, assert_nothing_left, kill_cli, latest, records, run_cli, start_cli, wait_for
from tests.support.mxnet_engine import WAITER, assert_no_mxnet_left, logs_say, metric, port_of, write

EXAMPLE = str(ROOT / "examples" / "gluon_mlp.py")


def hosts_file(tmp_path: Path) -> str:
    path = tmp_path / "hosts"
    path.write_text("node1\nnode2\n")
    return str(path)


def test_gluon_example_over_two_hosts(ssh_cluster, tmp_path: Path) -> None:
    home = tmp_path / "home"
    r = run_cli(["launch", "--engine", "mxnet", "-H", hosts_file(tmp_path), "--python", sys.executable, "-n", "2",
                 "-s", "2", EXAMPLE, "--epochs", "3", "--save", str(tmp_path / "w{rank}.npz")],
                ssh_cluster.env(home), timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "kvstore=dist_sync workers=2 servers=2" in r.stdout, r.stdout
    assert metric(r.stdout, "accuracy") > 0.96, r.stdout     # one process with batch 64: 0.9777
    with np.load(tmp_path / "w0.npz") as a, np.load(tmp_path / "w1.npz") as b:
        for k in a.files:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    rec = latest(home)
    assert (rec["engine"], rec["backend"], rec["state"]) == ("mxnet", "ssh", "succeeded")
    assert [(p["name"], p["address"], p["state"]) for p in rec["procs"]] == [
        ("scheduler", "127.0.0.2", "exited"), ("server-0", "127.0.0.2", "exited"),
        ("server-1", "127.0.0.3", "exited"), ("worker-0", "127.0.0.2", "exited"),
        ("worker-1", "127.0.0.3", "exited")]
    assert_nothing_left(home)
    assert_no_mxnet_left(port_of(rec))


def test_ctrl_c_over_ssh_leaves_no_mxnet_process(ssh_cluster, tmp_path: Path) -> None:
    home = tmp_path / "home"
    proc = start_cli(["launch", "--engine", "mxnet", "--insecure", "-H", hosts_file(tmp_path), "--python",
                      sys.executable, "-n", "2", "-s", "2", "--grace", "3", write(tmp_path, "w.py", WAITER)],
                     ssh_cluster.env(home))
    try:
        wait_for(lambda: (home / "jobs").is_dir() and any((home / "jobs").glob("*.json")), 60, "the job record")
        wait_for(lambda: logs_say(latest(home), "ready rank", ("worker-0", "worker-1")), 240,
                 "both workers past their first barrier")
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=90)
        assert proc.returncode == 130, out
    finally:
        kill_cli(proc)
    envs = {line.split("] ENV ", 1)[0].split("[", 1)[1]: json.loads(line.split("] ENV ", 1)[1].split(" pulled")[0])
            for line in out.splitlines() if "] ENV " in line}
    assert envs == {
        f"worker {rank} @ {host}": {"DMLC_ROLE": "worker", "DMLC_PS_ROOT_URI": "127.0.0.2", "DMLC_NODE_HOST": address,
                                    "DMLC_NUM_WORKER": "2", "DMLC_NUM_SERVER": "2", "RANK": str(rank),
                                    "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.2"}
        for rank, host, address in ((0, "node1", "127.0.0.2"), (1, "node2", "127.0.0.3"))}, out
    assert out.count("pulled [3.0, 3.0, 3.0, 3.0] type dist_sync") == 2, out    # 1 + 2, summed by MXNet
    rec = latest(home)
    assert (rec["state"], rec["stopped_by"]) == ("stopped", "Ctrl-C")
    assert_nothing_left(home)
    assert_no_mxnet_left(port_of(rec))


def test_preflight_names_the_hosts_where_mxnet_cannot_be_imported(ssh_cluster, tmp_path: Path) -> None:
    """``--python`` is a fresh venv's interpreter, without site-packages: the agent runs there,
    ``import mxnet`` does not."""
    home = tmp_path / "home"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True, timeout=120)
    python = str(tmp_path / "bare" / "bin" / "python")
    r = run_cli(["launch", "--engine", "mxnet", "-H", hosts_file(tmp_path), "--python", python, "-n", "2",
                 EXAMPLE], ssh_cluster.env(home), timeout=120)
    assert r.returncode == 3, r.stdout + r.stderr
    text = " ".join(r.stderr.split())
    assert "node1" in text and "node2" in text and text.count("cannot import mxnet") == 2, r.stderr
    assert f"node1: {python} cannot import mxnet" in text and not records(home)     # nothing started, nothing kept
