"""``mxdist launch --timeline``: a real job's trace is valid Chrome trace-event JSON with a
track per process and the expected spans; ``mxdist logs --timeline`` prints where it is."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

from tests.support.cli import assert_nothing_left, cli_env, latest, run_cli

JOB = textwrap.dedent("""
    import time, numpy as np, psnode
    kv = psnode.kv.create('dist_sync')
    kv.init('w', np.zeros(4, np.float32))
    for step in range(4):
        time.sleep(0.8 if kv.rank == 1 else 0.01)
        kv.push('w', np.ones(4, np.float32)); kv.pull('w')
    kv.barrier()
    kv.close()
""")


def test_the_timeline_of_a_job_has_a_track_per_process_and_its_spans(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = cli_env(home)
    (tmp_path / "job.py").write_text(JOB)
    done = run_cli(["launch", "-n", "2", "-s", "1", "--timeline", str(tmp_path / "job.py")], env, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    rec = latest(home)
    where = run_cli(["logs", "--timeline", rec["id"]], env)
    assert where.returncode == 0, where.stderr
    path = Path(where.stdout.strip())
    assert path == home / "jobs" / rec["id"] / "timeline.json" and f"timeline: {path}" in done.stderr
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(names.values()) == ["scheduler", "server 0", "worker 0", "worker 1"]
    spans: dict[str, set[str]] = {}
    for e in events:
        assert e["ph"] in ("M", "X", "i") and isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "X":
            assert e["ts"] >= 0 and e["dur"] >= 0
            spans.setdefault(names[e["pid"]], set()).add(e["name"])
    for w in ("worker 0", "worker 1"):
        assert {"compute", "push", "pull", "pull-wait", "barrier", "barrier-wait"} <= spans[w], spans
    assert "apply" in spans["server 0"], spans
    waits = [e for e in events if e["ph"] == "X" and e["name"] == "pull-wait" and names[e["pid"]] == "worker 0"]
    assert any(e["args"].get("on") == [1] and e["dur"] > 500_000 for e in waits), waits  # (waited for worker 1)
    assert not list((home / "jobs" / rec["id"]).glob("timeline/*.jsonl"))
    assert_nothing_left(home)


def test_logs_timeline_of_a_job_without_one_says_how(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = cli_env(home)
    (tmp_path / "job.py").write_text("print('hi')\n")
    assert run_cli(["launch", "-n", "1", "-s", "0", str(tmp_path / "job.py")], env).returncode == 0
    out = run_cli(["logs", "--timeline"], env)
    assert out.returncode == 2 and "was launched without --timeline" in out.stderr and "Traceback" not in out.stderr
