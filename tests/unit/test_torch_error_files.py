"""torch elastic's error files as root-cause evidence: what torch's ``@record`` really writes, read
by the host agent (as the local and SSH backends do), turned into a failure record, and the
earliest failure chosen (psnode.protocol.failure.from_torch, mxdist.backends.agent.collect,
mxdist.backends.base.Evidence, mxdist.job.rootcause.decide)."""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import time

import pytest

from mxdist.backends import agent
from mxdist.backends.base import Evidence, run_files
from mxdist.job.rootcause import Outcome, decide
from psnode.protocol.failure import FailureKind, FailureRecord, from_torch
from tests.support import require


def record_with_torch(tmp_path, name: str, exc: Exception, monkeypatch) -> None:
    """Raise ``exc`` from a function decorated with torch's real ``@record``, its error file
    ``run_files(tmp_path, name).error_file`` (what a worker's TORCHELASTIC_ERROR_FILE names)."""
    require(None if importlib.util.find_spec("torch") else "torch is not installed", "pip install torch")
    from torch.distributed.elastic.multiprocessing.errors import record

    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", run_files(str(tmp_path), name).error_file)

    @record
    def main() -> None:
        raise exc

    with pytest.raises(type(exc)):
        main()


def collected(tmp_path, name: str) -> Evidence:
    files = run_files(str(tmp_path), name)
    [item] = agent.collect([agent.CollectItem(name, "", "", files.failure, files.error_file)])
    return Evidence.collected(item, 1, str(tmp_path), name)


def test_a_record_decorated_exception_is_read_from_its_error_file(tmp_path, monkeypatch):
    before = time.time()
    record_with_torch(tmp_path, "worker-1", ValueError("bad batch 7"), monkeypatch)
    ev = collected(tmp_path, "worker-1")
    path = run_files(str(tmp_path), "worker-1").error_file
    assert ev.failure is not None and ev.failure.kind is FailureKind.EXCEPTION
    assert (ev.failure.type, ev.failure.message, ev.failure.source) == ("ValueError", "bad batch 7", path)
    assert ev.failure.traceback is not None and "raise exc" in ev.failure.traceback
    assert ev.failure.time == os.stat(path).st_mtime and before - 1 < ev.failure.time < time.time()
    cause = decide([Outcome("worker-1", "worker", 1, "host-b", 1, time.time(), ev.failure),
                    Outcome("worker-0", "worker", 0, "host-a", 0, time.time())])
    assert cause is not None and cause.headline == "worker 1 on host-b: ValueError: bad batch 7"
    assert (cause.source, cause.time) == (path, ev.failure.time)


def test_the_earliest_error_file_is_the_root_cause_whatever_the_exit_order(tmp_path, monkeypatch):
    """worker-0's error file is written 0.3 s after worker-1's (within one of torch's whole
    seconds, or across one); worker-0's exit status is seen first: worker-1 is the root cause."""
    record_with_torch(tmp_path, "worker-1", KeyError("first"), monkeypatch)
    time.sleep(0.3)
    record_with_torch(tmp_path, "worker-0", RuntimeError("Connection closed by peer"), monkeypatch)
    first, then = collected(tmp_path, "worker-1"), collected(tmp_path, "worker-0")
    assert first.failure is not None and then.failure is not None and first.failure.time < then.failure.time
    cause = decide([Outcome("worker-0", "worker", 0, "a", 1, 1.0, then.failure),
                    Outcome("worker-1", "worker", 1, "b", 1, 2.0, first.failure)], first_seen="worker-0")
    assert cause is not None and cause.name == "worker-1" and cause.reason == "KeyError: 'first'"
    assert cause.consequences == ("worker 0 on a: failed too: RuntimeError: Connection closed by peer",)


def test_psnodes_own_record_wins_and_foreign_files_are_ignored(tmp_path, monkeypatch):
    files = run_files(str(tmp_path), "worker-2")
    record_with_torch(tmp_path, "worker-2", ValueError("x"), monkeypatch)
    FailureRecord(FailureKind.JOB_ENDED, 5.0, "worker", 2, "h", type="PeerLost", message="job ended").save(
        files.failure)
    ev = collected(tmp_path, "worker-2")
    assert ev.failure is not None and ev.failure.kind is FailureKind.JOB_ENDED and ev.failure.source is None
    assert from_torch({"message": "RuntimeError: plain"}, "f", 12.5) == FailureRecord(
        FailureKind.EXCEPTION, 12.5, type="RuntimeError", message="plain", source="f")
    stamped = {"message": {"message": "no type here", "extraInfo": {"timestamp": "100"}}}
    assert from_torch(stamped, "f", 100.25).time == 100.25        # the file's finer clock
    assert from_torch(stamped, "f", 500.0).time == 100.0          # a file touched later: torch's timestamp
    assert from_torch(stamped, "f").message == "no type here" and from_torch(stamped, "f").type is None
    for junk in (None, [], {"message": 3}, {"message": {"message": "x"}}, {"other": 1}):
        assert from_torch(junk, "f") is None
    (tmp_path / "worker-3.torch-error.json").write_text("{not json")
    assert collected(tmp_path, "worker-3").failure is None


def test_spawn_removes_a_stale_error_file_and_expands_home_in_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    run_dir = "~/run"
    files = run_files(run_dir, "worker-0")
    (tmp_path / "run").mkdir(mode=0o700)
    (tmp_path / "run" / "worker-0.torch-error.json").write_text(json.dumps({"message": "old"}))
    show = "import os; print(os.environ['TORCHELASTIC_ERROR_FILE'])"
    [started] = agent.spawn(str(tmp_path), run_dir, sys.executable,
                            [agent.SpawnItem("worker-0", [sys.executable, "-c", show],
                                             {"TORCHELASTIC_ERROR_FILE": files.error_file}, files.failure,
                                             files.error_file)])
    assert not (tmp_path / "run" / "worker-0.torch-error.json").exists()
    deadline = time.monotonic() + 60
    while agent.read_rc(started.rc) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert agent.read_rc(started.rc) == 0
    with open(started.log) as f:
        assert f.read().strip() == str(tmp_path / "run" / "worker-0.torch-error.json")
