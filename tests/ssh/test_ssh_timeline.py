"""``mxdist launch --timeline`` over real SSH (two sshd "hosts", see conftest.py): the processes'
event files stay on their hosts; the launcher fetches them through the host agent and merges
them, one track per process of both hosts; nothing of the job is left on either host."""
from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

from tests.support.cli import assert_nothing_left, latest, run_cli

JOB = textwrap.dedent("""
    import time, numpy as np, psnode
    kv = psnode.kv.create('dist_sync')
    kv.init('w', np.zeros(4, np.float32))
    for step in range(3):
        time.sleep(0.3 if kv.rank == 1 else 0.01)
        kv.push('w', np.ones(4, np.float32)); kv.pull('w')
    kv.barrier()
    kv.close()
""")


def test_timeline_over_ssh_has_a_track_per_process_of_both_hosts(ssh_cluster, home: Path, tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("node1 slots=1\nnode2 slots=1\n")
    (tmp_path / "job.py").write_text(JOB)
    env = ssh_cluster.env(home)
    done = run_cli(["launch", "-H", str(hosts), "-n", "2", "-s", "2", "--timeline", str(tmp_path / "job.py")],
                   env, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    rec = latest(home)
    assert rec["backend"] == "ssh"
    procs = {p["name"]: p["host"] for p in rec["procs"]}
    assert set(procs.values()) == {"node1", "node2"}, procs
    path = home / "jobs" / rec["id"] / "timeline.json"
    assert f"timeline: {path}" in done.stderr and "stay on their hosts" not in done.stderr, done.stderr
    events = json.loads(path.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(names.values()) == ["scheduler", "server 0", "server 1", "worker 0", "worker 1"], names
    assert len(names) == len(procs)
    spans: dict[str, set[str]] = {}
    for e in events:
        if e["ph"] == "X":
            spans.setdefault(names[e["pid"]], set()).add(e["name"])
    for w in ("worker 0", "worker 1"):
        assert {"compute", "push", "pull", "barrier"} <= spans[w], spans
    assert any("apply" in spans.get(s, set()) for s in ("server 0", "server 1")), spans
    run_dir = Path(os.path.expanduser(rec["run_dir"]))
    assert run_dir.name == rec["id"] and not run_dir.exists(), run_dir   # (events read before the clean-up)
    assert_nothing_left(home)
