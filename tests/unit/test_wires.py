"""Every typed wire's round trip: to_json gives the exact JSON fields, from_json reads them back."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mxdist.backends import agent
from mxdist.job.records import Cause, JobOutcome, JobRecord, JobState, ScaleRequest, StopRequest
from mxdist.job.rootcause import RootCause


def wire(message: dict) -> dict:
    """What the other end reads: the JSON text, parsed."""
    return json.loads(json.dumps(message))


REQUESTS = [
    (agent.CheckRequest("/w", ["psnode"], {"A": "1"}, ["script", "train.py"]),
     {"op": "check", "workdir": "/w", "modules": ["psnode"], "env": {"A": "1"}, "target": ["script", "train.py"]}),
    (agent.GpusRequest({"PATH": "/bin"}), {"op": "gpus", "env": {"PATH": "/bin"}}),
    (agent.SpawnRequest("/w", "~/run", "/usr/bin/python3", [
        agent.SpawnItem("worker-0", ["python", "t.py"], {"K": "v"}, "/r/worker-0.failure.json", None),
        agent.SpawnItem("scheduler", ["python", "-m", "psnode"], {}, "/r/s.failure.json", None, "/r/s.address")]),
     {"op": "spawn", "workdir": "/w", "run_dir": "~/run", "python": "/usr/bin/python3",
      "procs": [{"name": "worker-0", "argv": ["python", "t.py"], "env": {"K": "v"},
                 "failure": "/r/worker-0.failure.json", "error_file": None, "announce": None},
                {"name": "scheduler", "argv": ["python", "-m", "psnode"], "env": {},
                 "failure": "/r/s.failure.json", "error_file": None, "announce": "/r/s.address"}]}),
    (agent.FollowRequest("/r/w.log", "/r/w.rc", 4242, 17, True),
     {"op": "follow", "log": "/r/w.log", "rc_file": "/r/w.rc", "pid": 4242, "offset": 17, "wait": True}),
    (agent.StatusRequest([agent.ProcRef(12, "/r/a.rc"), agent.ProcRef(13, "/r/b.rc")]),
     {"op": "status", "procs": [{"pid": 12, "rc": "/r/a.rc"}, {"pid": 13, "rc": "/r/b.rc"}]}),
    (agent.StopGroupsRequest([12, 13], 2.5), {"op": "stop", "pgids": [12, 13], "grace": 2.5}),
    (agent.SignalRequest([12], 15), {"op": "signal", "pgids": [12], "signum": 15}),
    (agent.PutKeyRequest("/r", "s3cret"), {"op": "put_key", "run_dir": "/r", "key": "s3cret"}),
    (agent.RemoveFilesRequest(["/a", "/b"]), {"op": "remove_files", "paths": ["/a", "/b"]}),
    (agent.CollectRequest([agent.CollectItem("worker-1", "/r/w.rc", "/r/w.log", "/r/f.json", "/r/t.json")]),
     {"op": "collect", "procs": [{"name": "worker-1", "rc": "/r/w.rc", "log": "/r/w.log", "failure": "/r/f.json",
                                  "error_file": "/r/t.json"}]}),
    (agent.CleanupRequest("/r/j1", "j1", True),
     {"op": "cleanup", "run_dir": "/r/j1", "job_id": "j1", "remove_dir": True}),
    (agent.ReadFilesRequest("/r/tl", ".jsonl", 1000),
     {"op": "read_files", "directory": "/r/tl", "suffix": ".jsonl", "limit": 1000}),
]


@pytest.mark.parametrize(("request_", "expected"), REQUESTS, ids=[r.op for r, _ in REQUESTS])
def test_each_agent_request_round_trips_with_its_exact_fields(request_, expected) -> None:
    assert request_.to_json() == expected
    assert agent.request_from_json(wire(expected)) == request_


def test_every_operation_has_its_request_and_the_served_ones_are_named() -> None:
    assert sorted(agent.REQUESTS) == sorted(r.op for r, _ in REQUESTS)
    assert sorted(agent.SERVED) == ["check", "cleanup", "collect", "gpus", "put_key", "read_files", "remove_files",
                                    "signal", "spawn", "status", "stop"]
    with pytest.raises(agent.MessageError, match="unknown operation 'format_disk'"):
        agent.request_from_json({"op": "format_disk"})


def test_each_agent_reply_reads_its_exact_values() -> None:
    check = {"python": "3.11.7", "executable": "/usr/bin/python3", "errors": ["no script t.py in /w"],
             "gpus": {"visible": "0", "gpus": [], "error": None}, "missing": {"psnode": "ModuleNotFoundError: x"}}
    assert agent.CheckRequest("/w", []).reply(wire(check)) == agent.CheckReply(
        "3.11.7", "/usr/bin/python3", ["no script t.py in /w"], agent.GpusReport("0", [], None),
        {"psnode": "ModuleNotFoundError: x"})
    spawned = [{"name": "worker-0", "pid": 101, "log": "/r/worker-0.log", "rc": "/r/worker-0.rc"},
               {"name": "scheduler", "pid": 102, "log": "/r/s.log", "rc": "/r/s.rc", "offset": 0,
                "address": "10.0.0.1:31000"}]
    assert agent.SpawnRequest("/w", "/r", "py", []).reply(wire(spawned)) == [
        agent.Spawned("worker-0", 101, "/r/worker-0.log", "/r/worker-0.rc"),
        agent.Spawned("scheduler", 102, "/r/s.log", "/r/s.rc", 0, "10.0.0.1:31000")]
    assert agent.FollowRequest("l", "r", 1, 0, False).reply({"rc": None, "offset": 5}) == agent.FollowReply(None, 5)
    assert agent.StatusRequest([]).reply([{"alive": True, "members": [7, 8], "rc": -9}]) == [
        agent.Liveness(True, [7, 8], -9)]
    stopped = agent.StopGroupsRequest([], 1.0).reply(wire({"killed": [7], "left": {"7": [9, 8], "3": [4]}}))
    assert stopped == agent.StopReply([7], {"7": [9, 8], "3": [4]})
    assert stopped.survivors() == [4, 8, 9]
    assert agent.SignalRequest([], 15).reply(None) is None
    assert agent.PutKeyRequest("/r", "k").reply("/r/job.key") == "/r/job.key"
    assert agent.RemoveFilesRequest([]).reply(["/a"]) == ["/a"]
    collected = {"rc": 1, "rc_time": 12.5, "failure": {"kind": "exception"}, "exception": "ValueError: x",
                 "error_file": {"message": "m"}, "error_time": 13.25}
    assert agent.CollectRequest([]).reply(wire([collected])) == [
        agent.Collected(1, 12.5, {"kind": "exception"}, "ValueError: x", {"message": "m"}, 13.25)]
    assert agent.CleanupRequest("/r", "j", False).reply({"failed": ["/r/job.key: Permission denied"]}) == \
        agent.CleanupReply(["/r/job.key: Permission denied"])
    assert agent.ReadFilesRequest("/r", ".jsonl", 9).reply({"files": {"a.jsonl": "{}\n"}, "left": ["b.jsonl"]}) == \
        agent.FilesReply({"a.jsonl": "{}\n"}, ["b.jsonl"])


def test_the_answer_envelope_round_trips() -> None:
    assert agent.to_json(agent.Answer(result=[1, 2])) == {"result": [1, 2], "error": None}
    assert agent.to_json(agent.Answer(error="Traceback ...")) == {"result": None, "error": "Traceback ..."}
    assert agent.from_json(agent.Answer, wire({"result": None})) == agent.Answer(None, None)
    assert agent.from_json(agent.Answer, wire({"error": "boom"})) == agent.Answer(None, "boom")


def test_a_request_answered_here_reads_as_its_reply(tmp_path) -> None:
    (tmp_path / "a.jsonl").write_text('{"t": 1}\n')
    assert agent.answer(agent.ReadFilesRequest(str(tmp_path), ".jsonl", 100)) == agent.FilesReply(
        {"a.jsonl": '{"t": 1}\n'}, [])
    rc = tmp_path / "w.rc"
    rc.write_text("3")
    [state] = agent.answer(agent.StatusRequest([agent.ProcRef(os.getpgrp(), str(rc))]))
    assert (state.alive, state.rc) == (True, 3) and os.getpid() in state.members
    assert agent.answer(agent.CheckRequest(str(tmp_path), [])).python == sys.version.split()[0]


def test_the_recorded_root_cause_keeps_its_json_fields() -> None:
    verdict = Cause("worker 1 on b: ValueError: x", "worker-1", "ValueError: x", 12.5, "/r/worker-1.torch-error.json")
    assert verdict.to_json() == {"headline": "worker 1 on b: ValueError: x", "name": "worker-1",
                                 "reason": "ValueError: x", "time": 12.5, "source": "/r/worker-1.torch-error.json"}
    assert Cause.from_json(wire(verdict.to_json())) == verdict
    no_source = Cause("worker 0 on a: exit code 3", "worker-0", "exit code 3", None)
    assert no_source.to_json() == {"headline": "worker 0 on a: exit code 3", "name": "worker-0",
                                   "reason": "exit code 3", "time": None}
    assert Cause.from_json(wire(no_source.to_json())) == no_source
    alone = Cause("preflight failed: node1: no script t.py")
    assert alone.to_json() == {"headline": "preflight failed: node1: no script t.py", "name": None}
    assert Cause.from_json(wire(alone.to_json())) == alone
    for junk in (None, [], {}, {"headline": 3}, "text"):
        assert Cause.from_json(junk) is None


def test_a_record_writes_and_reads_its_root_cause() -> None:
    rec = JobRecord(id="j1", command=["t.py"], backend="local")
    rec.finish(JobOutcome(JobState.FAILED, 1, headline="preflight failed: localhost: no script t.py"))
    assert json.loads(rec.to_json())["root_cause"] == {"headline": "preflight failed: localhost: no script t.py",
                                                       "name": None}
    assert JobRecord.from_json(rec.to_json()).root_cause == Cause("preflight failed: localhost: no script t.py")
    cause = RootCause("worker 1 on b: KeyError: 'k'", "worker-1", "KeyError: 'k'", 7.25, ("worker 0 on a: x",))
    done = JobRecord(id="j2", command=["t.py"], backend="local")
    done.finish(JobOutcome(JobState.FAILED, 1, cause=cause))
    assert json.loads(done.to_json())["root_cause"] == {"headline": "worker 1 on b: KeyError: 'k'",
                                                        "name": "worker-1", "reason": "KeyError: 'k'", "time": 7.25}
    back = JobRecord.from_json(done.to_json())
    assert back.root_cause == Cause("worker 1 on b: KeyError: 'k'", "worker-1", "KeyError: 'k'", 7.25)
    assert back.consequences == ["worker 0 on a: x"]


def test_the_stop_request_file_keeps_its_json_fields(tmp_path) -> None:
    asked = StopRequest(2.5, 1700000000.25, 4242)
    assert asked.to_json() == {"grace": 2.5, "time": 1700000000.25, "pid": 4242}
    assert StopRequest.from_json(wire(asked.to_json())) == asked
    assert StopRequest.from_json({"grace": 0.1}) == StopRequest(0.1)
    assert StopRequest.from_json({"grace": 3}) == StopRequest(3.0)
    assert StopRequest.from_json({"grace": "1.5"}) == StopRequest(1.5)
    for any_content in ({}, {"grace": "soon"}, [], None, {"grace": True, "pid": "x"}):
        assert StopRequest.from_json(any_content) == StopRequest()
    path = tmp_path / "stop.request"
    path.write_text(json.dumps(asked.to_json()))
    assert StopRequest.read(path) == asked
    path.write_text("{not json")
    assert StopRequest.read(path) == StopRequest()


def test_the_scale_request_file_keeps_its_json_fields() -> None:
    asked = ScaleRequest(5, True, 1700000000.5)
    assert asked.to_json() == {"target": 5, "dry_run": True, "time": 1700000000.5}
    assert ScaleRequest.from_json(wire(asked.to_json())) == asked
    assert ScaleRequest.from_json({"target": "3"}) == ScaleRequest(3, False, None)
    with pytest.raises(KeyError, match="'target'"):
        ScaleRequest.from_json({"dry_run": True})
    with pytest.raises(ValueError, match="invalid literal for int"):
        ScaleRequest.from_json({"target": "many"})
    with pytest.raises(TypeError, match="not a JSON object: \\[3\\]"):
        ScaleRequest.from_json([3])


def test_a_slurm_check_line_keeps_its_json_fields() -> None:
    report = {"visible": None, "gpus": [{"index": 0, "uuid": "GPU-1", "name": "H200", "memory_mib": 143771}],
              "error": None}
    check = agent.NodeCheck("node-2", ["no script t.py in /w"], agent.from_json(agent.GpusReport, report))
    line = check.to_line()
    assert line.startswith("MXDIST-CHECK ")
    assert json.loads(line[len("MXDIST-CHECK "):]) == {"node": "node-2", "errors": ["no script t.py in /w"],
                                                       "gpus": report}
    assert agent.NodeCheck.from_line(line) == check
    for other in ("", "srun: error: x", "MXDIST-CHECKS {}"):
        assert agent.NodeCheck.from_line(other) is None
    with pytest.raises(agent.MessageError, match=r"no JSON: '\{bad'"):
        agent.NodeCheck.from_line("MXDIST-CHECK {bad")
    with pytest.raises(agent.MessageError, match=r"NodeCheck: expected an object \(NodeCheck\), got \[1\]"):
        agent.NodeCheck.from_line("MXDIST-CHECK [1]")


def test_the_slurm_check_script_prints_a_line_its_reader_reads(tmp_path) -> None:
    """The script srun runs on each node (mxdist.backends.slurm), run here as one node would run it."""
    from mxdist.backends.slurm import _CHECK

    env = {**{k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"},
           "SLURMD_NODENAME": "node-7", "PATH": str(tmp_path)}   # no nvidia-smi there
    done = subprocess.run([sys.executable, "-c", _CHECK, str(tmp_path), json.dumps(["script", "t.py"]), "json",
                           "no_such_module_x"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    [line] = done.stdout.splitlines()
    assert agent.NodeCheck.from_line(line) == agent.NodeCheck(
        "node-7", [f"no script t.py in {tmp_path}",
                   f"python cannot import no_such_module_x in {tmp_path}: ModuleNotFoundError: "
                   "No module named 'no_such_module_x'"],
        agent.GpusReport(None, [], None))


def test_the_gpu_report_reads_its_exact_fields() -> None:
    report = {"visible": "1,0", "error": None,
              "gpus": [{"index": 0, "uuid": "GPU-a", "name": "NVIDIA H200", "memory_mib": 143771},
                       {"index": 1, "uuid": "GPU-b", "name": "NVIDIA H200", "memory_mib": None}]}
    read = agent.from_json(agent.GpusReport, wire(report))
    assert read == agent.GpusReport("1,0", [agent.GpuEntry(0, "GPU-a", "NVIDIA H200", 143771),
                                            agent.GpuEntry(1, "GPU-b", "NVIDIA H200", None)], None)
    assert agent.to_json(read) == report
    assert agent.from_json(agent.GpusReport, {}) == agent.GpusReport()
    failed = "nvidia-smi failed (exit 9): x"
    assert agent.from_json(agent.GpusReport, {"error": failed}) == agent.GpusReport(error=failed)
    with pytest.raises(agent.MessageError, match=r"GpusReport.gpus\[0\]: expected an object \(GpuEntry\), got 3"):
        agent.from_json(agent.GpusReport, {"gpus": [3]})


def test_the_agent_source_answers_requests_on_stdin_as_the_ssh_backend_sends_them(tmp_path) -> None:
    """Its source run by a fresh Python, as mxdist.backends.ssh runs it: once (``python -``) and serving."""
    from pathlib import Path

    source = Path(agent.__file__).read_text()
    (tmp_path / "a.jsonl").write_text("{}\n")
    asked = agent.ReadFilesRequest(str(tmp_path), ".jsonl", 100)
    once = f"{source}\nimport json as _j, sys as _s\n_s.exit(_main(_j.loads({json.dumps(asked.to_json())!r})))\n"
    done = subprocess.run([sys.executable, "-"], input=once.encode(), capture_output=True, timeout=120)
    last = done.stderr.decode().strip().splitlines()[-1]
    assert asked.reply(agent.from_json(agent.Answer, json.loads(last)).result) == agent.FilesReply(
        {"a.jsonl": "{}\n"}, [])
    served = f"{source}\nimport sys as _s\n_s.exit(serve())\n".encode()
    lines = [asked.to_json(), agent.StopGroupsRequest([], 0.0).to_json(), {"op": "follow"},
             {"op": "stop", "pgids": [], "grace": 1.0, "force": True}]
    feed = b"%d\n" % len(served) + served + b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    done = subprocess.run([sys.executable, "-c", agent.BOOT], input=feed, capture_output=True, timeout=120)
    first, second, third, fourth = (agent.from_json(agent.Answer, json.loads(line))
                                    for line in done.stdout.decode().splitlines())
    assert asked.reply(first.result) == agent.FilesReply({"a.jsonl": "{}\n"}, [])
    assert agent.StopGroupsRequest([], 0.0).reply(second.result) == agent.StopReply([], {})
    assert third == agent.Answer(None, "MessageError: 'follow' is not served")
    assert fourth == agent.Answer(None, "MessageError: stop: unknown field 'force' (StopGroupsRequest's fields: "
                                        "pgids, grace)")
