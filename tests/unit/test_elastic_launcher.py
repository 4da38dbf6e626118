"""The launcher's elastic rules (mxdist.elastic.rules, the workers' bounds of mxdist.planning.bounds, the
supervision rule 7, the record's changes, the options) without processes: bounds, slot and rank choice, scale plans, discovery parsing."""
from __future__ import annotations

import json
import os
import stat

import pytest
from typer.testing import CliRunner

from mxdist.elastic.rules import (
    Joiner,
    Live,
    ScaleAnswer,
    ScaleChange,
    discovery_changes,
    free_ranks,
    free_slots,
    parse_discovery,
    plan_scale,
    shortfall,
)
from mxdist.job import records
from mxdist.job.lifecycle import Action, Failure, Supervision
from mxdist.job.records import Change, Elastic, JobRecord, ProcRecord
from mxdist.main import app
from mxdist.planning.bounds import Bounds, ElasticError, bounds
from mxdist.planning.hosts import Host, HostsError, parse_hosts_file

runner = CliRunner()


# -- bounds ---------------------------------------------------------------------------------------

def test_default_bounds_are_the_initial_size_and_not_elastic():
    b = bounds(3, None, None)
    assert b == Bounds(3, 3, 3) and not b.elastic
    assert bounds(3, 2, None).elastic and bounds(3, None, 4).elastic


@pytest.mark.parametrize("args, message", [
    ((2, 0, None), "--min-workers 0: a job needs at least one worker"),
    ((2, 3, None), "--min-workers 3 is more than the 2 workers it starts with (-n 2)"),
    ((2, None, 1), "--max-workers 1 is less than the 2 workers it starts with (-n 2)"),
])
def test_bounds_out_of_order_are_refused(args, message):
    with pytest.raises(ElasticError, match=f"^{message.replace('(', '[(]').replace(')', '[)]')}$"):
        bounds(*args)


def test_max_workers_must_fit_the_hosts_file_slots_naming_file_and_line():
    hosts = parse_hosts_file("n1 slots=2\n# comment\nn2\n", "hosts.txt")
    assert bounds(2, None, 3, hosts, True).maximum == 3
    with pytest.raises(ElasticError) as err:
        bounds(2, None, 4, hosts, True, "the hosts in hosts.txt")
    assert str(err.value) == ("--max-workers 4: the hosts in hosts.txt have 3 slots in total (hosts.txt:1 n1 "
                              "slots=2; hosts.txt:3 n2 slots=1); give the hosts more slots (slots=N) or lower "
                              "--max-workers")
    assert bounds(2, None, 4, hosts, False).maximum == 4       # a discovery script may add hosts
    assert bounds(5, None, None, hosts, True).maximum == 5     # not elastic: wrapping as before


def test_check_names_the_bound():
    b = Bounds(2, 2, 3)
    b.check(2)
    b.check(3)
    with pytest.raises(ElasticError, match=r"^4 workers is above the job's --max-workers 3$"):
        b.check(4)
    with pytest.raises(ElasticError, match=r"^1 worker is below the job's --min-workers 2$"):
        b.check(1)
    with pytest.raises(ElasticError, match="keeps its size"):
        Bounds(2, 2, 2).check(3)


# -- slots and ranks ------------------------------------------------------------------------------

def test_free_ranks_are_the_lowest_not_held():
    assert free_ranks([0, 1], 1, 3) == [2]
    assert free_ranks([0, 2, 3], 2, 5) == [1, 4]
    with pytest.raises(ElasticError, match="only 1 free rank below --max-workers 3"):
        free_ranks([0, 1], 2, 3)


def test_free_slots_in_host_order_with_the_lowest_free_local_rank():
    hosts = [Host("a", slots=2), Host("b", slots=2)]
    live = [Live(0, "a", 0), Live(3, "b", 1)]
    assert free_slots(hosts, live, 2) == [("a", 1), ("b", 0)]
    assert free_slots(hosts, [Live(0, "a", 1)], 1) == [("a", 0)]
    with pytest.raises(ElasticError, match=r"^3 more workers need 3 free slots, the hosts have 2 "
                                           r"\(4 slots, 2 in use\)$"):
        free_slots(hosts, live, 3)


def test_plan_scale_up_takes_free_ranks_and_slots_down_the_highest_ranks():
    hosts = [Host("a", slots=2), Host("b", slots=2)]
    live = [Live(0, "a", 0), Live(1, "a", 1), Live(2, "b", 0)]
    up = plan_scale(4, Bounds(2, 3, 4), hosts, live)
    assert up == ScaleChange(3, 4, joiners=(Joiner(3, "b", 1),))
    down = plan_scale(2, Bounds(2, 3, 4), hosts, live)
    assert down == ScaleChange(3, 2, leavers=(2,))
    assert plan_scale(3, Bounds(2, 3, 4), hosts, live).empty
    gap = plan_scale(3, Bounds(1, 3, 4), hosts, [Live(0, "a", 0), Live(2, "b", 0)])
    assert gap.joiners == (Joiner(1, "a", 1),)
    with pytest.raises(ElasticError, match="above the job's --max-workers 4"):
        plan_scale(5, Bounds(2, 3, 4), hosts, live)


def test_shortfall_says_why():
    assert shortfall(2, 2) is None
    assert shortfall(2, 3) == "2 workers live, at least 3 needed (--min-workers)"
    assert shortfall(1, 2) == "1 worker live, at least 2 needed (--min-workers)"


def test_scale_answer_round_trip_and_words():
    change = ScaleChange(2, 3, joiners=(Joiner(2, "n2", 0),))
    answer = ScaleAnswer("J", change)
    assert ScaleAnswer.from_dict(json.loads(json.dumps(answer.to_dict()))) == answer
    assert answer.lines() == ["job J: scaled from 2 to 3 workers", "started worker 2 on n2 (local rank 0)"]
    assert ScaleAnswer("J", change, dry_run=True).lines() == ["job J: would scale from 2 to 3 workers",
                                                              "would start worker 2 on n2 (local rank 0)"]
    down = ScaleAnswer("J", ScaleChange(4, 2, leavers=(2, 3)))
    assert down.lines()[1] == "asked workers 2, 3 to leave: they end at the next round boundary, exit code 0"
    assert ScaleAnswer("J", ScaleChange(2, 2)).lines() == ["job J runs 2 workers already: nothing to change"]
    refused = ScaleAnswer("J", error="no", refused=True)
    assert ScaleAnswer.from_dict(refused.to_dict()) == refused


# -- discovery ------------------------------------------------------------------------------------

def test_discovery_output_host_and_slots():
    hosts = parse_discovery("node1:2\n\n# spare\nalice@node2\n10.0.0.3:4  # big\n", "find.sh")
    assert [(h.label, h.slots, h.origin) for h in hosts] == [("node1", 2, "find.sh:1"), ("alice@node2", 1, "find.sh:4"),
                                                             ("10.0.0.3", 4, "find.sh:5")]


@pytest.mark.parametrize("text, message", [
    ("node1:0\n", "find.sh:1: slots '0'"),
    ("node1:x\n", "find.sh:1: 'x' after ':' in 'node1:x' is neither a slot count nor a field"),
    ("a;b\n", "find.sh:1: host 'a;b' is not a valid host name"),
    ("-oProxy\n", "starts with '-'"),
    ("n1\nn1:2\n", "find.sh:2: n1 is listed twice"),
])
def test_discovery_output_errors_name_the_line(text, message):
    with pytest.raises(HostsError, match=message.replace("(", "[(]")):
        parse_discovery(text, "find.sh")


def test_discovery_changes():
    before = [Host("a", slots=1), Host("b", slots=2)]
    after = [Host("b", slots=3), Host("c", slots=1)]
    changes = discovery_changes(before, after)
    assert [h.label for h in changes.added] == ["c"] and [h.label for h in changes.removed] == ["a"]
    assert [(h.label, h.slots) for h in changes.resized] == [("b", 3)]
    assert discovery_changes(after, list(after)).empty


# -- supervision rule 7 ---------------------------------------------------------------------------

def _rules(minimum: int | None, workers: int = 3, restarts: int = 0) -> Supervision:
    procs = [("scheduler", "scheduler"), ("server-0", "server"), *((f"worker-{r}", "worker") for r in range(workers))]
    return Supervision.of(procs, restarts, minimum=minimum)


def test_a_lost_worker_above_min_workers_goes_on_below_fails():
    rules = _rules(2)
    assert rules.exited("worker-2", False, Failure(-9, None, 30.0)) is Action.LOSE
    assert rules.lost == {"worker-2"}
    assert rules.exited("worker-1", False, Failure(1, "ValueError: x", 30.0)) is Action.FAIL
    assert rules.shortfall == "1 worker live, at least 2 needed (--min-workers)"


def test_restarts_come_first_and_a_fixed_size_job_fails_as_before():
    rules = _rules(2, restarts=1)
    assert rules.exited("worker-2", False, Failure(-9, None, 30.0)) is Action.RESTART
    assert rules.exited("worker-2", False, Failure(-9, None, 30.0)) is Action.LOSE
    fixed = _rules(None)
    assert fixed.exited("worker-2", False, Failure(-9, None, 30.0)) is Action.FAIL and fixed.shortfall is None


def test_the_rest_finishing_after_a_loss_winds_down_and_a_joiner_counts():
    rules = _rules(1, workers=2)
    assert rules.exited("worker-1", False, Failure(-9, None, 30.0)) is Action.LOSE
    rules.add_worker("worker-1")              # the rank taken again by mxdist scale
    assert rules.exited("worker-0", True) is Action.CONTINUE
    assert rules.exited("worker-1", True) is Action.WIND_DOWN
    rules = _rules(1, workers=2)
    assert rules.exited("worker-0", True) is Action.CONTINUE
    assert rules.exited("worker-1", False, Failure(-9, None, 30.0)) is Action.WIND_DOWN
    assert rules.lost == {"worker-1"}


def test_a_worker_asked_to_leave_is_never_restarted():
    rules = _rules(1, restarts=3)
    rules.leave("worker-2")
    assert rules.live_workers == 2
    assert rules.exited("worker-2", False, Failure(-15, None, 30.0)) is Action.LOSE
    rules.leave("worker-1")
    assert rules.exited("worker-1", True) is Action.CONTINUE and "worker-1" in rules.finished


# -- the record -----------------------------------------------------------------------------------

def test_record_keeps_joins_leaves_and_losses_across_a_save():
    rec = JobRecord(id="J", command=["x"], backend="local",
                    procs=[ProcRecord("worker-0", "worker", 0, "h"), ProcRecord("worker-1", "worker", 1, "h")],
                    elastic=Elastic(1, 3, 2))
    rec.scale_to(3)
    joined = rec.join("worker-2", 2, "h2", "10.0.0.2", "/logs/worker-2.log", 10.0)
    joined.started(99, "/run/worker-2.log", "/run/worker-2.rc")
    rec.leaving([2])
    rec.left(joined, 11.0)
    rec.lost(rec.proc("worker-1"), "killed by SIGKILL", 12.0)
    again = rec.join("worker-2", 2, "h", "10.0.0.1", "/logs/worker-2.log", 13.0)
    assert again is joined and again.host == "h" and again.pid is None and again.restarts == 0
    back = JobRecord.from_json(rec.to_json())
    assert back.elastic == Elastic(1, 3, 3, [], None)
    assert [(c.change, c.rank, c.why) for c in back.changes] == [
        (Change.JOINED, 2, ""), (Change.LEFT, 2, ""), (Change.LOST, 1, "killed by SIGKILL"), (Change.JOINED, 2, "")]
    assert (back.count(Change.JOINED), back.count(Change.LEFT), back.count(Change.LOST)) == (2, 1, 1)
    old = JobRecord.from_json(json.dumps({"id": "J", "backend": "local"}))
    assert old.elastic is None and old.changes == []


# -- the options ----------------------------------------------------------------------------------

@pytest.fixture
def home(tmp_path, monkeypatch):
    path = tmp_path / "home"
    monkeypatch.setenv("MXDIST_HOME", str(path))
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.delenv("MXDIST_SSH_CONFIG", raising=False)
    records.use_home(path)
    yield path
    records.use_home(None)


def invoke(*args: str):
    result = runner.invoke(app, list(args))
    assert "Traceback" not in result.output
    return result


@pytest.mark.parametrize("args, message", [
    (["-n", "2", "--min-workers", "3"], "--min-workers 3 is more than the 2 workers it starts with (-n 2)"),
    (["-n", "2", "--max-workers", "1"], "--max-workers 1 is less than the 2 workers it starts with (-n 2)"),
    (["-H", "a,b", "--max-workers", "3"], "--max-workers 3: the hosts (-H) have 2 slots in total"),
    (["--engine", "mxnet", "-n", "2", "--max-workers", "3"], "--max-workers: ps-lite's workers are fixed"),
    (["-H", "a", "--host-discovery-script", "x.sh"], "-H and --host-discovery-script both name the hosts"),
    (["--host-discovery-script", "/no/such/script"], "not an executable file"),
])
def test_launch_option_errors(home, args, message):
    result = invoke("launch", "--dry-run", *args, "train.py")
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()), result.output


def test_dry_run_of_an_elastic_local_job_gives_every_process_the_bounds(home):
    result = invoke("launch", "--dry-run", "-n", "2", "--min-workers", "1", "--max-workers", "4", "train.py")
    assert result.exit_code == 0, result.output
    assert "PSNODE_MIN_WORKERS=1" in result.output and "PSNODE_MAX_WORKERS=4" in result.output
    plain = invoke("launch", "--dry-run", "-n", "2", "train.py")
    assert "PSNODE_MIN_WORKERS" not in plain.output and "PSNODE_MAX_WORKERS" not in plain.output


def test_discovery_script_gives_the_first_hosts(home, tmp_path):
    script = tmp_path / "find.sh"
    script.write_text("#!/bin/sh\necho n1:2\necho n2\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    result = invoke("launch", "--dry-run", "--host-discovery-script", str(script), "-n", "2",
                    "--max-workers", "8", "train.py")
    assert result.exit_code == 0, result.output
    assert "n1" in result.output and "n2" in result.output
    failing = tmp_path / "fail.sh"
    failing.write_text("#!/bin/sh\necho boom >&2\nexit 3\n")
    failing.chmod(0o700)
    bad = invoke("launch", "--dry-run", "--host-discovery-script", str(failing), "train.py")
    assert bad.exit_code == 2 and "exited with code 3: boom" in bad.output


def test_scale_usage_and_a_job_that_is_not_running(home):
    assert invoke("scale", "a", "b", "c").exit_code == 2
    assert invoke("scale", "x").exit_code == 2
    rec = JobRecord(id="20260101-000000-aaaa", command=["x"], backend="local", state=records.JobState.SUCCEEDED,
                    ended=1.0)
    records.save(rec)
    result = invoke("scale", rec.id, "3")
    assert result.exit_code == 1 and f"job {rec.id} is not running (succeeded)" in " ".join(result.output.split())
    assert not os.path.exists(records.log_dir(rec.id) / "scale.request")


def test_status_of_an_ended_elastic_job_shows_its_workers_as_recorded(home):
    rec = JobRecord(id="20260101-000000-bbbb", command=["x"], backend="local", state=records.JobState.SUCCEEDED,
                    ended=2.0, created=1.0, exit_code=0, elastic=Elastic(2, 4, 3),
                    procs=[ProcRecord("worker-0", "worker", 0, "localhost")])
    rec.changes.append(records.MemberChange(Change.JOINED, 2, "localhost", 1.5))
    records.save(rec)
    text = invoke("status", rec.id)
    assert text.exit_code == 0, text.output
    assert "workers: (target 3, min 2, max 4); 1 joined, 0 left, 0 lost" in text.output
    data = json.loads(invoke("status", rec.id, "--json").output)
    assert data["membership"] == {"min_workers": 2, "max_workers": 4, "target": 3, "generation": None,
                                  "members": None, "joined": 1, "left": 0, "lost": 0, "leaving": []}


# ------------------------------------------------------------------ a lost host's worker (new_home)
def test_a_lost_hosts_worker_takes_the_first_free_slot_of_a_host_that_answers() -> None:
    from mxdist.elastic.rules import Joiner, Live, new_home

    hosts = [Host("a", slots=2), Host("b", slots=1), Host("c", slots=2)]
    live = [Live(0, "a", 0), Live(1, "a", 1), Live(2, "b", 0), Live(3, "c", 1)]
    # worker 2's host b is lost: a is full, so c's free local rank 0
    assert new_home(2, hosts, live, {"b"}) == Joiner(2, "c", 0)
    # worker 1's host a is lost: never a again, though its slot is free once 1 is gone
    assert new_home(1, hosts, live, {"a"}) == Joiner(1, "c", 0)
    # nothing free on the hosts that answer: the error names the lost hosts and the fix
    with pytest.raises(ElasticError, match=r"no host that answers has a free slot for worker 3 \(hosts lost: c; "
                                           r"give spare slots in the hosts file"):
        new_home(3, hosts[:2] + [Host("c", slots=2)], live + [Live(4, "b", 1)], {"c"})


def test_a_restart_that_cannot_start_loses_an_elastic_worker_and_fails_a_fixed_job() -> None:
    """A lost host's worker with no free slot to move to: its restart cannot start.  An
    elastic job goes on without it while enough workers live (rule 7); a fixed one fails."""
    procs = [("scheduler", "scheduler"), ("server-0", "server"), ("worker-0", "worker"),
             ("worker-1", "worker"), ("worker-2", "worker")]
    lost = Failure(None, None, 60.0)
    r = Supervision.of(procs, 1, minimum=2)
    assert r.exited("worker-2", False, lost) is Action.RESTART
    assert r.restart_failed("worker-2") is Action.LOSE and r.lost == {"worker-2"}
    assert r.exited("worker-1", False, lost) is Action.RESTART
    assert r.restart_failed("worker-1") is Action.FAIL                     # one left: below --min-workers 2
    assert r.shortfall == "1 worker live, at least 2 needed (--min-workers)"
    fixed = Supervision.of(procs, 1)
    assert fixed.exited("worker-2", False, lost) is Action.RESTART
    assert fixed.restart_failed("worker-2") is Action.FAIL and not fixed.lost
