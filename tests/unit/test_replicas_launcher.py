"""mxdist launch --replicas: the option, where servers run (mxdist.planning.servers), a lost host's
server restarting elsewhere (its spec, its record), and the rules that restart servers."""
from __future__ import annotations

import json
from collections import Counter

import pytest
from typer.testing import CliRunner

from mxdist.job import records
from mxdist.job.lifecycle import Action, Supervision
from mxdist.job.records import Change, JobRecord, JobState, MemberChange, ProcRecord
from mxdist.main import app
from mxdist.planning.engines import MXNET, EngineError
from mxdist.planning.hosts import Host
from mxdist.planning.plan import NodeOptions, PlanError, PlanRequest, make_plan, moved_server, restarted, with_proc
from mxdist.planning.servers import copies_at_home, copy_ranks, place_servers, server_home
from psnode.config import NodeConfig, Role

HOSTS = [Host("a", address="10.0.0.1"), Host("b", address="10.0.0.2"), Host("c", address="10.0.0.3")]


def request(hosts=HOSTS, **kw) -> PlanRequest:
    node = {k: kw.pop(k) for k in list(kw) if k in NodeOptions.__dataclass_fields__}
    base = {"job_id": "job-r", "command": ["train.py"], "hosts": hosts, "python": "/usr/bin/python3",
                "scheduler_port": 9000, "master_port": 9001, "node": NodeOptions(**node)}
    base.update(kw)
    return PlanRequest(**base)


# -- the pure rules ------------------------------------------------------------------------------------


def test_copy_ranks_are_the_next_servers_wrapping():
    assert copy_ranks(0, 3, 2) == [1]
    assert copy_ranks(2, 3, 2) == [0]
    assert copy_ranks(3, 4, 3) == [0, 1]
    assert copy_ranks(1, 4, 1) == []
    assert copy_ranks(0, 2, 5) == [1]          # never itself, however many are asked for


def test_one_replica_keeps_round_robin():
    for servers in range(8):
        for hosts in range(1, 5):
            assert place_servers(list(range(hosts)), servers, 1) == [r % hosts for r in range(servers)]


def _clashes(placed: list[int], replicas: int) -> int:
    n = len(placed)
    return sum(1 for r in range(n) for c in copy_ranks(r, n, replicas) if placed[c] == placed[r])


@pytest.mark.parametrize("servers", range(2, 13))
@pytest.mark.parametrize("hosts", range(2, 6))
def test_two_replicas_put_every_servers_copy_on_another_host_where_the_counts_allow(servers, hosts):
    placed = place_servers(list(range(hosts)), servers, 2)
    # the hosts keep round-robin's server counts
    assert Counter(placed) == Counter(r % hosts for r in range(servers))
    possible = hosts >= 3 or servers % 2 == 0      # two hosts: a ring of odd length has one pair left
    assert _clashes(placed, 2) == (0 if possible else 1), placed
    assert copies_at_home(placed, 2) == ([] if possible else [servers - 1])


def test_placements_with_more_replicas():
    assert place_servers(["a", "b", "c"], 3, 2) == ["a", "b", "c"]       # one per host: round-robin
    assert place_servers(["a", "b", "c"], 4, 2) == ["a", "b", "a", "c"]  # servers 2 and 3 swapped
    assert place_servers(["a", "b"], 6, 3) == ["a", "b", "a", "b", "a", "b"]
    placed = place_servers(["a", "b"], 4, 3)
    assert copies_at_home(placed, 3) == [] and Counter(placed) == {"a": 2, "b": 2}
    assert copies_at_home(["a", "a"], 2) == [0, 1]                       # one host: nowhere else
    assert copies_at_home(["a", "b", "a"], 1) == []                      # no copies: nothing to say


def test_a_lost_hosts_server_goes_where_none_of_its_neighbours_is_then_the_fewest_servers():
    hosts = ["a", "b", "c", "d"]
    # 4 servers, one per host; b is lost: server 1's copy is on c (server 2), it holds server 0's (on a)
    live = {0: "a", 2: "c", 3: "d"}
    assert server_home(1, 4, 2, hosts, {"b"}, live) == "d"
    # without replicas' neighbours to avoid: the fewest servers, ties in hosts-file order
    assert server_home(1, 4, 1, hosts, {"b"}, live) == "a"
    assert server_home(1, 4, 1, hosts, {"b"}, {0: "a", 2: "a", 3: "c"}) == "d"
    # every host answering holds a neighbour: the fewest servers
    assert server_home(1, 3, 2, ["a", "b", "c"], {"b"}, {0: "a", 2: "c"}) == "a"
    assert server_home(1, 3, 2, ["a", "b", "c", "e"], {"b"}, {0: "a", 2: "c"}) == "e"   # a host with no server
    assert server_home(0, 2, 2, ["a", "b"], {"a", "b"}, {1: "b"}) is None
    assert server_home(0, 2, 2, ["a", "a", "b"], {"a"}, {1: "b"}) == "b"     # a label given twice counts once


# -- the option ------------------------------------------------------------------------------------------


def test_replicas_reach_every_process_and_servers_restart_with_them():
    plan = make_plan(request(replicas=2, max_restarts=1))
    assert {p.env["PSNODE_REPLICAS"] for p in plan.procs} == {"2"}
    assert all(NodeConfig.from_env(p.env).servers_restartable for p in plan.procs)
    assert plan.warnings == ()
    assert NodeOptions(replicas=2, max_restarts=1).given() == ["--replicas", "--max-restarts"]
    assert NodeOptions(replicas=2, max_restarts=1).servers_restart
    assert NodeOptions(checkpoint_dir="/ck", max_restarts=1).servers_restart
    assert not NodeOptions(replicas=2).servers_restart
    assert not NodeOptions(max_restarts=3).servers_restart


@pytest.mark.parametrize("kw, message", [
    ({"replicas": 0}, "--replicas 0: must be 1 or more (1: each server's state on its own host only; "
                       "2: survives the loss of any one host)"),
    ({"replicas": 4}, "--replicas 4: each server's state is copied to the next 3 servers, and the job has 3 "
                       "(-s 3); give --replicas 3 or less, or -s 4"),
    ({"replicas": 2, "num_servers": 1}, "--replicas 2: each server's state is copied to the next 1 server, and "
                                      "the job has 1 (-s 1); give -s 2 or more"),
    ({"replicas": 2, "num_servers": 0}, "the job has 0 (-s 0); give -s 2 or more"),
])
def test_replicas_that_do_not_fit_the_servers_are_refused(kw, message):
    with pytest.raises(PlanError) as err:
        make_plan(request(**kw))
    assert message in str(err.value)


def test_plan_warnings_of_replicas():
    plan = make_plan(request(replicas=2))
    assert plan.warnings == ("--replicas 2 without --max-restarts: a failed server is not replaced, so its "
                             "copies are never used (give --max-restarts N)",)
    plan = make_plan(request(hosts=HOSTS[:2], num_servers=3, replicas=2, max_restarts=1))
    assert [p.host.name for p in plan.of_role(Role.SERVER)] == ["a", "b", "a"]
    assert plan.warnings == ("--replicas 2: the copies of server 2 are all on its own host, which its state "
                             "does not survive (give -s a multiple of the 2 hosts that run servers, or a "
                             "larger --replicas)",)
    plan = make_plan(request(num_servers=4, replicas=2, max_restarts=1))
    assert [p.host.name for p in plan.of_role(Role.SERVER)] == ["a", "b", "a", "c"] and plan.warnings == ()
    plan = make_plan(request(hosts=HOSTS[:1], num_servers=2, replicas=2, max_restarts=1))
    assert plan.warnings == ()        # one host: its loss is the job's, whatever the copies


def test_mxnet_refuses_replicas_by_name():
    with pytest.raises(EngineError, match="--replicas: MXNet's servers keep each key's state once"):
        MXNET.admit(["--replicas"])


def test_rule_3_restarts_a_server_with_replicas():
    procs = [("scheduler", "scheduler"), ("server-0", "server"), ("server-1", "server"), ("worker-0", "worker")]
    node = NodeOptions(replicas=2, max_restarts=1)
    rules = Supervision.of(procs, node.max_restarts, node.servers_restart)
    assert rules.exited("server-1", False) is Action.RESTART
    node = NodeOptions(max_restarts=1)
    assert Supervision.of(procs, node.max_restarts, node.servers_restart).exited("server-1", False) is Action.FAIL


# -- a lost host's server --------------------------------------------------------------------------------


def test_a_moved_server_binds_on_its_new_host_with_its_rank():
    plan = make_plan(request(replicas=2, max_restarts=2, key_files={"a": "/ra/job.key", "b": "/rb/job.key",
                                                                   "c": "/rc/job.key"}, run_dir="/run/job-r"))
    spec = restarted(moved_server(plan, "server-1", HOSTS[2]), 1)
    cfg = NodeConfig.from_env(spec.env)
    assert (spec.host.name, spec.rank, spec.role) == ("c", 1, Role.SERVER)
    assert (cfg.host, cfg.port, cfg.rank, cfg.restart_count, cfg.replicas) == ("10.0.0.3", 0, 1, 1, 2)
    assert cfg.key_file == "/rc/job.key"                                   # where c's processes read it
    assert cfg.error_file == "/run/job-r/server-1.failure.json"
    before = next(p for p in plan.procs if p.name == "server-1")
    same = {k: v for k, v in before.env.items() if k not in ("PSNODE_HOST", "PSNODE_KEY_FILE")}
    assert {k: v for k, v in moved_server(plan, "server-1", HOSTS[2]).env.items() if k in same} == same
    assert NodeConfig.from_env(moved_server(plan, "server-1", HOSTS[2], "/fresh/job.key").env).key_file == \
        "/fresh/job.key"
    new_host = Host("d", address="10.0.0.4")
    moved = with_proc(plan, moved_server(plan, "server-1", new_host))
    assert [p.host.name for p in moved.of_role(Role.SERVER)] == ["a", "d", "c"]
    assert [h.name for h in moved.hosts] == ["a", "b", "c", "d"] and len(moved.procs) == len(plan.procs)
    with pytest.raises(PlanError, match="worker-0 is not a server of job job-r"):
        moved_server(plan, "worker-0", new_host)


def test_a_moved_server_is_recorded_as_such_and_old_changes_read_as_workers(home):
    rec = JobRecord(id="job-m", command=["t.py"], backend="ssh", scheduler="10.0.0.1:9000", workdir="/w",
                    state=JobState.RUNNING,
                    procs=[ProcRecord("server-1", "server", 1, "b", "10.0.0.2", "/l/server-1.log"),
                           ProcRecord("worker-0", "worker", 0, "a", "10.0.0.1", "/l/worker-0.log")])
    rec.moved(rec.proc("server-1"), "c", "10.0.0.3", "b did not answer", 100.0)
    rec.moved(rec.proc("worker-0"), "c", "10.0.0.3", "a did not answer", 101.0)
    assert (rec.proc("server-1").host, rec.proc("server-1").address) == ("c", "10.0.0.3")
    records.save(rec)
    loaded = records.load("job-m")
    assert [(c.who, c.host, c.why) for c in loaded.changes] == [
        ("server 1", "c", "b did not answer"), ("worker 0", "c", "a did not answer")]
    raw = json.loads(records.record_path("job-m").read_text())
    raw["changes"] = [{"change": "moved", "rank": 2, "host": "c", "when": 1.0, "why": "x"}]
    loaded = JobRecord.from_json(json.dumps(raw))
    assert loaded.changes == [MemberChange(Change.MOVED, 2, "c", 1.0, "x", "worker")]


# -- the command line --------------------------------------------------------------------------------------


def test_launch_replicas_on_the_command_line(home):
    runner = CliRunner()
    ok = runner.invoke(app, ["launch", "--dry-run", "-n", "2", "-s", "2", "--replicas", "2",
                             "--max-restarts", "1", "train.py"])
    assert ok.exit_code == 0, ok.output
    assert "PSNODE_REPLICAS=2" in ok.output and "Traceback" not in ok.output
    bad = runner.invoke(app, ["launch", "--dry-run", "-n", "2", "-s", "2", "--replicas", "3", "train.py"])
    assert bad.exit_code == 2 and "Traceback" not in bad.output
    assert "--replicas 3: each server's state is copied to the next 2 servers" in " ".join(bad.output.split())
    mx = runner.invoke(app, ["launch", "--dry-run", "--engine", "mxnet", "--replicas", "2", "train.py"])
    assert mx.exit_code == 2 and "--replicas: MXNet's servers" in " ".join(mx.output.split())


def test_status_notes_name_each_servers_holders_and_count_the_failovers() -> None:
    from mxdist.control.commands import _notes, replica_line

    rec = JobRecord(id="j", command=["t.py"], backend="ssh", replicas=2, procs=[
        ProcRecord("server-0", "server", 0, "node1"), ProcRecord("server-1", "server", 1, "node4"),
        ProcRecord("server-2", "server", 2, "node3"), ProcRecord("worker-0", "worker", 0, "node1")])
    assert replica_line(rec) == ("replicas: server 0 (node1) -> server 1 (node4); server 1 (node4) -> server 2 "
                                 "(node3); server 2 (node3) -> server 0 (node1)")
    rec.changes.append(MemberChange(Change.MOVED, 1, "node4", 0.0, "node2 did not answer", role="server"))
    rec.changes.append(MemberChange(Change.MOVED, 1, "node4", 0.0, "node2 did not answer"))
    notes = _notes(rec)
    assert notes[0].startswith("replicas: server 0 (node1)") and notes[-1] == "failovers so far: 1", notes
    assert replica_line(JobRecord(id="j", command=[], backend="ssh", procs=rec.procs)) is None   # --replicas 1
