"""The modules a same-host ``dist_sync`` push crosses on the user's thread, measured by
benchmarks/control/paths.py (``sys.setprofile`` in a real one-worker, one-server job on
127.0.0.1): exactly the modules docs/architecture.md names, one datagram and nothing over ZeroMQ.
The push goes down once: every module is entered once, but the operation's module (built by the
data path, written out by the codec through the operation's own ``wire``); the API asks the
engine nothing before the data path (it reads the engine's notice); from the data path on, the
data path, the push slots, the engine, the tracker, the journal, the server's connection, the
link and the codec are each entered once, in that order; only the data path takes push slots,
and the link sends the places the data path wrote (it never looks an array up in the
segments); neither the I/O thread's module nor the links' reader is on the path."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: The push path, as docs/architecture.md states it ("How a kv.push travels").
PUSH_PATH = {
    "psnode.worker.kvstore", "psnode.worker.routes", "psnode.worker.items", "psnode.worker.bucketing",
    "psnode.worker.datapath",
    "psnode.worker.engine", "psnode.worker.futures", "psnode.worker.tracker", "psnode.worker.linkrate",
    "psnode.worker.journal",
    "psnode.worker.connection",
    "psnode.samehost.staging", "psnode.samehost.link",
    "psnode.protocol.ops", "psnode.protocol.codec", "psnode.protocol.samehost",
}
#: From the data path on, these are entered once each, in this order (one direction, down).
DOWN = ["psnode.worker.datapath", "psnode.samehost.staging", "psnode.worker.engine", "psnode.worker.tracker",
        "psnode.worker.journal", "psnode.worker.connection", "psnode.samehost.link", "psnode.protocol.codec"]


def test_same_host_push_crosses_the_documented_modules(tmp_path: Path) -> None:
    out = tmp_path / "paths.json"
    r = subprocess.run([sys.executable, "benchmarks/control/paths.py", "--path", "push", "--timeout", "90",
                        "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    push = json.loads(out.read_text())["push"]
    path = push["to_datagram"]
    assert path[0] == "psnode.worker.kvstore", path
    assert set(path) == PUSH_PATH and len(path) == len(PUSH_PATH), sorted(set(path) ^ PUSH_PATH)
    assert push["after_datagram"] == [] and push["generated_only"] == [], push
    assert push["seqpacket_sends"] == 1 and "zmq send" not in push["marks"], push["events"]
    for off in ("psnode.worker.ioloop", "psnode.worker.samehost", "psnode.net.transport",
                "psnode.samehost.segments"):
        assert off not in push["order"], (off, push["order"])
    entries = push["entries_to_datagram"]
    assert [entries[i] for i in push["reentries"]] == ["psnode.protocol.ops"], entries   # (codec -> op.wire)
    before = entries[:entries.index("psnode.worker.datapath")]
    assert before == ["psnode.worker.routes", "psnode.worker.bucketing", "psnode.worker.items"], before
    down = entries[entries.index("psnode.worker.datapath"):]
    assert [m for m in down if m in DOWN] == DOWN, down
    assert "psnode.worker.kvstore" not in down, down
    edges = {tuple(e) for e in push["edges"]}
    assert {a for a, b in edges if b == "psnode.samehost.link"} == {"psnode.worker.connection"}, edges
    assert {a for a, b in edges if b == "psnode.worker.connection"} == {"psnode.worker.engine"}, edges
    assert {a for a, b in edges if b == "psnode.samehost.staging"} == {"psnode.worker.datapath"}, edges
    assert ("psnode.worker.datapath", "psnode.worker.engine") in edges, edges
    assert {a for a, b in edges if b == "psnode.worker.journal"} == {"psnode.worker.tracker"}, edges
    assert {a for a, b in edges if b == "psnode.worker.engine"} == {"psnode.worker.datapath"}, edges
    assert r.stdout.startswith(f"push: KVStore.push to the same-host datagram (the user's thread): {len(path)} modules")
    doc = (ROOT / "docs" / "architecture.md").read_text()
    stated = re.search(r"A same-host `dist_sync` push of one small key crosses (\d+) psnode modules", doc)
    assert stated is not None and int(stated.group(1)) == len(path), "docs/architecture.md states another count"
