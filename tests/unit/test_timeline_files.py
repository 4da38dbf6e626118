"""psnode.timeline's event files and merge, and the host agent's ``read_files`` (what the
launcher fetches a remote host's timeline with): real files in a temp directory."""
from __future__ import annotations

import itertools
import json
from pathlib import Path

from mxdist.backends import agent
from psnode import timeline


def test_events_are_json_lines_and_the_merge_adds_compute_between_calls(tmp_path: Path) -> None:
    rec = timeline.Timeline(str(tmp_path), "worker", 1)
    rec.call("push", 1_000_000)                 # ns: ends now
    t = rec.now()
    rec.wait("pull-wait", t - 2_000_000, (0, 2))
    rec.span("pull", t - 3_000_000, t, tid=0)
    rec.call("pull", t - 3_000_000)
    rec.instant("membership", generation=2, workers=[0, 1], note='a "quoted" word')
    rec.flush()
    lines = Path(rec.path).read_text().splitlines()
    events = [json.loads(line) for line in lines]          # every line is JSON
    assert events[0] == {"ph": "meta", "args": {"role": "worker", "rank": 1, "pid": rec.pid}}
    wait = next(e for e in events if e.get("name") == "pull-wait")
    assert wait["args"] == {"on": [0, 2]} and wait["dur"] >= 2000
    assert next(e for e in events if e.get("name") == "membership")["args"] == \
        {"generation": 2, "workers": [0, 1], "note": 'a "quoted" word'}
    merged = timeline.merge([rec.path])["traceEvents"]
    calls = sorted((e for e in merged if e["name"] in ("push", "pull") and e["ph"] == "X"), key=lambda e: e["ts"])
    compute = [e for e in merged if e["name"] == "compute"]
    gaps = [b["ts"] - (a["ts"] + a["dur"]) for a, b in itertools.pairwise(calls)]
    assert sorted(round(c["dur"], 1) for c in compute) == sorted(round(g, 1) for g in gaps if g > 0)
    assert [e["args"]["name"] for e in merged if e["name"] == "process_name"] == ["worker 1"]


def test_read_files_reads_the_suffix_only_within_the_limit(tmp_path: Path) -> None:
    (tmp_path / "worker-0-11.jsonl").write_text("a" * 10)
    (tmp_path / "worker-1-12.jsonl").write_text("b" * 30)
    (tmp_path / "job.key").write_text("secret")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "x.jsonl").write_text("nested")
    got = agent.read_files(str(tmp_path), ".jsonl", 35)
    assert got == agent.FilesReply({"worker-0-11.jsonl": "a" * 10}, ["worker-1-12.jsonl"])
    assert agent.read_files(str(tmp_path / "missing"), ".jsonl", 100) == agent.FilesReply({}, [])
