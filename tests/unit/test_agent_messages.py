"""The host agent's messages, typed once: every request and every reply goes to its JSON form and
back to an equal value through the one generic writer and reader (mxdist.backends.agent.to_json and
from_json), and a message that does not read names the field, what it holds and what it takes."""
from __future__ import annotations

import json
from typing import Any

import pytest

from mxdist.backends import agent

GPUS = agent.GpusReport("1,0", [agent.GpuEntry(0, "GPU-a", "NVIDIA H200", 143771), agent.GpuEntry(1)], None)

#: one request of each operation, with a reply of its type
EXCHANGES: list[tuple[agent.AgentRequest[Any], Any]] = [
    (agent.CheckRequest("/w", ["psnode", "zmq"], {"A": "1"}, ["module", "train"]),
     agent.CheckReply("3.11.7", "/usr/bin/python3", ["no module train in /w"], GPUS, {"zmq": "ModuleNotFoundError"})),
    (agent.GpusRequest(None), agent.GpusReport(None, [], "nvidia-smi did not answer within 20 s")),
    (agent.SpawnRequest("/w", "~/run", "python3", [
        agent.SpawnItem("worker-0", ["python3", "t.py", "--lr", "0.1"], {"K": "v"}, "/r/w.failure.json"),
        agent.SpawnItem("scheduler", ["python3", "-m", "psnode"], {}, "/r/s.failure.json", "/r/s.torch.json",
                        "/r/s.address")]),
     [agent.Spawned("worker-0", 101, "/r/worker-0.log", "/r/worker-0.rc", 17),
      agent.Spawned("scheduler", 102, "/r/s.log", "/r/s.rc", 0, "10.0.0.1:31000")]),
    (agent.FollowRequest("/r/w.log", "/r/w.rc", 4242, 17, True), agent.FollowReply(None, 99)),
    (agent.StatusRequest([agent.ProcRef(12, "/r/a.rc")]), [agent.Liveness(True, [12, 13], None),
                                                           agent.Liveness(False, [], -9)]),
    (agent.StopGroupsRequest([12, 13], 2.5), agent.StopReply([13], {"13": [14]})),
    (agent.SignalRequest([12], 15), None),
    (agent.PutKeyRequest("/r", "s3cret"), "/r/job.key"),
    (agent.RemoveFilesRequest(["/a", "/b"]), ["/b"]),
    (agent.CollectRequest([agent.CollectItem("worker-1", "/r/w.rc", "/r/w.log", "/r/f.json", "/r/t.json")]),
     [agent.Collected(1, 12.5, {"kind": "exception", "type": "ValueError"}, "ValueError: x", {"message": "m"}, 13.25),
      agent.Collected(None, None, None, None)]),
    (agent.CleanupRequest("/r/j1", "j1", True), agent.CleanupReply(["/r/job.key: Permission denied"])),
    (agent.ReadFilesRequest("/r/tl", ".jsonl", 1000), agent.FilesReply({"a.jsonl": "{}\n"}, ["b.jsonl"])),
]


def across(message: Any) -> Any:
    """What the other end reads: the JSON text, parsed."""
    return json.loads(json.dumps(message))


def test_every_operation_is_exchanged_here() -> None:
    assert sorted(r.op for r, _ in EXCHANGES) == sorted(agent.REQUESTS)


@pytest.mark.parametrize(("request_", "reply"), EXCHANGES, ids=[r.op for r, _ in EXCHANGES])
def test_each_request_and_its_reply_round_trip(request_, reply) -> None:
    assert agent.request_from_json(across(request_.to_json())) == request_
    assert request_.reply(across(agent.to_json(reply))) == reply
    assert request_.reply_type() is not None


def test_a_reply_answered_here_is_the_reply_read_from_the_wire(tmp_path) -> None:
    (tmp_path / "a.jsonl").write_text("{}\n")
    asked = agent.ReadFilesRequest(str(tmp_path), ".jsonl", 100)
    here = agent.answer(asked)
    assert here == agent.FilesReply({"a.jsonl": "{}\n"}, [])
    sent = across(agent.to_json(agent.Answer(agent.to_json(here))))
    assert sent == {"result": {"files": {"a.jsonl": "{}\n"}, "left": []}, "error": None}
    assert asked.reply(agent.from_json(agent.Answer, sent).result) == here


@pytest.mark.parametrize(("wire", "said"), [
    ({"op": "stop", "pgids": [1], "grace": 1.0, "force": True},
     "stop: unknown field 'force' (StopGroupsRequest's fields: pgids, grace)"),
    ({"op": "stop", "pgids": [1]}, "stop: missing field 'grace' (StopGroupsRequest's fields: pgids, grace)"),
    ({"op": "stop", "pgids": ["1"], "grace": 1.0}, "stop.pgids[0]: expected an integer, got '1' (str)"),
    ({"op": "stop", "pgids": 1, "grace": 1.0}, "stop.pgids: expected a list, got 1 (int)"),
    ({"op": "stop", "pgids": [], "grace": True}, "stop.grace: expected a number, got True (bool)"),
    ({"op": "follow", "log": "l", "rc_file": "r", "pid": 1, "offset": 0, "wait": 1},
     "follow.wait: expected true or false, got 1 (int)"),
    ({"op": "spawn", "workdir": "/w", "run_dir": "/r", "python": "p", "procs": [{"name": "w", "argv": [], "env": {},
                                                                            "failure": 3}]},
     "spawn.procs[0].failure: expected a string, got 3 (int)"),
    ({"op": "spawn", "workdir": "/w", "run_dir": "/r", "python": "p",
      "procs": [{"name": "w", "argv": [], "env": {"K": None}, "failure": "f"}]},
     "spawn.procs[0].env['K']: expected a string, got None (NoneType)"),
    ({"op": "check", "workdir": "/w", "modules": ["psnode"], "target": "script"},
     "check.target: expected a list, got 'script' (str)"),
    ({"op": "format_disk"}, "unknown operation 'format_disk' (the agent answers check, gpus, spawn, follow, "
                            "status, stop, signal, put_key, remove_files, collect, cleanup, read_files)"),
])
def test_a_request_that_does_not_read_names_its_field(wire, said) -> None:
    with pytest.raises(agent.MessageError) as caught:
        agent.request_from_json(wire)
    assert str(caught.value) == said


def test_a_reply_that_does_not_read_names_its_field() -> None:
    with pytest.raises(agent.MessageError) as caught:
        agent.StatusRequest([]).reply([{"alive": True, "members": [7], "rc": None, "zombie": True}])
    assert str(caught.value) == ("the status reply[0]: unknown field 'zombie' (Liveness's fields: alive, members, "
                                 "rc)")
    with pytest.raises(agent.MessageError) as caught:
        agent.CheckRequest("/w", []).reply({"python": "3.11", "executable": "p", "errors": [], "missing": {},
                                            "gpus": {"gpus": [{"index": "0"}]}})
    assert str(caught.value) == "the check reply.gpus.gpus[0].index: expected an integer, got '0' (str)"
    with pytest.raises(agent.MessageError, match=r"^the follow reply: expected an object \(FollowReply\), got None"):
        agent.FollowRequest("l", "r", 1, 0, True).reply(None)


def test_defaults_fill_what_a_message_leaves_out_and_tuples_and_floats_read_as_their_types() -> None:
    assert agent.from_json(agent.Spawned, {"name": "w", "pid": 1, "log": "l", "rc": "r"}) == \
        agent.Spawned("w", 1, "l", "r", 0, None)
    assert agent.from_json(tuple[int, ...], [1, 2]) == (1, 2)
    assert agent.from_json(float, 3) == 3.0 and isinstance(agent.from_json(float, 3), float)
    assert agent.from_json(int | str, "x") == "x"
    with pytest.raises(agent.MessageError, match=r"^x: expected int or str, got 1.5 \(float\)$"):
        agent.from_json(int | str, 1.5, "x")


def test_on_a_python_older_than_3_10_the_agent_says_what_it_needs() -> None:
    """The source as the SSH backend sends it, run by a Python that reports itself as 3.9."""
    import subprocess
    import sys
    from pathlib import Path

    older = "import sys\nsys.version_info = (3, 9, 18, 'final', 0)\n" + agent.BOOT
    source = Path(agent.__file__).read_text().encode()
    done = subprocess.run([sys.executable, "-c", older], input=b"%d\n" % len(source) + source, capture_output=True,
                          timeout=60)
    assert done.returncode == 1
    assert done.stderr.decode().strip() == (f"mxdist's host agent needs Python 3.10 or newer; {sys.executable} is "
                                            f"{sys.version.split()[0]} (pass --python with a newer one)")
