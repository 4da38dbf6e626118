"""mxdist.planning.engines: what each engine starts and with which variables, what it refuses, and what
``mxdist status`` may ask of it (the plan is pure; status is checked against a real socket)."""
from __future__ import annotations

import json
import os
import re
import socket
from dataclasses import fields

import pytest
from typer.testing import CliRunner

from mxdist.job import records
from mxdist.job.records import JobRecord, JobState, ProcRecord
from mxdist.main import app
from mxdist.planning.engines import ENGINES, MXNET, MXNET_BOOT, PSNODE, EngineError, engine_named
from mxdist.planning.hosts import Host
from mxdist.planning.options import LaunchOptions
from mxdist.planning.plan import NodeOptions, PlanError, PlanRequest, make_plan, parse_env_assignments
from mxdist.supervisor.setup import prepare
from psnode.config import Role
from psnode.net.security import Mode

HOSTS = [Host("a", address="10.0.0.1", slots=2), Host("b", address="10.0.0.2")]
TORCH = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def mxnet_plan(**kw):
    base = {"job_id": "job-1", "command": ["train.py", "--lr", "0.1"], "hosts": HOSTS, "python": "/venv/bin/python",
            "scheduler_port": 9000, "master_port": 9001, "num_workers": 3, "num_servers": 2, "engine": MXNET,
            "user_env": {"FOO": "bar"}}
    base.update(kw)
    return make_plan(PlanRequest(**base))


def test_mxnet_plan_starts_mxnet_processes_with_the_dmlc_contract():
    plan = mxnet_plan()
    assert [p.name for p in plan.procs] == ["scheduler", "server-0", "server-1", "worker-0", "worker-1", "worker-2"]
    for p in plan.procs:
        own = {k: v for k, v in p.env.items() if k.startswith("DMLC_")}
        assert own == {"DMLC_ROLE": p.role.value, "DMLC_PS_ROOT_URI": "10.0.0.1", "DMLC_PS_ROOT_PORT": "9000",
                       "DMLC_NUM_SERVER": "2", "DMLC_NUM_WORKER": "3", "DMLC_NODE_HOST": p.host.address}
        assert not [k for k in p.env if k.startswith("PSNODE_")]          # no psnode variable at all
        assert p.env["FOO"] == "bar" and p.env["PYTHONUNBUFFERED"] == "1"
        if p.role is Role.WORKER:
            assert p.argv == ("/venv/bin/python", "-c", MXNET_BOOT, "train.py", "--lr", "0.1")   # see test_mx_engine
        else:
            assert p.argv == ("/venv/bin/python", "-c", "import mxnet")
            assert not set(TORCH) & set(p.env)
    assert [(p.host.name, p.env["DMLC_NODE_HOST"]) for p in plan.of_role(Role.SERVER)] == [
        ("a", "10.0.0.1"), ("b", "10.0.0.2")]
    workers = [{k: w.env[k] for k in TORCH} for w in plan.of_role(Role.WORKER)]
    assert workers == [
        {"RANK": "0", "WORLD_SIZE": "3", "LOCAL_RANK": "0", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "9001"},
        {"RANK": "1", "WORLD_SIZE": "3", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "9001"},
        {"RANK": "2", "WORLD_SIZE": "3", "LOCAL_RANK": "0", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "9001"}]
    assert plan.engine is MXNET and plan.base_env == {"FOO": "bar", "PYTHONUNBUFFERED": "1"}


def test_mxnet_workers_commands():
    """A .py script runs through the bootstrap (after --local_rank's insertion); a program as given."""
    plan = mxnet_plan(pass_local_rank=True, num_workers=1)
    assert plan.of_role(Role.WORKER)[0].argv == (
        "/venv/bin/python", "-c", MXNET_BOOT, "train.py", "--local_rank=0", "--lr", "0.1")
    plan = mxnet_plan(command=["./run.sh", "x"], num_workers=1)
    assert plan.of_role(Role.WORKER)[0].argv == ("./run.sh", "x")
    assert MXNET.show_argv(("py", "-c", MXNET_BOOT, "a b.py")) == "py -c MXNET_BOOT 'a b.py'"
    assert PSNODE.show_argv(("py", "a b.py")) == "py 'a b.py'"


def test_mxnet_scheduler_on_another_host_and_at_least_one_server():
    plan = mxnet_plan(scheduler_host="b")
    assert plan.procs[0].host.name == "b" and plan.scheduler_address == "10.0.0.2:9000"
    assert {p.env["DMLC_PS_ROOT_URI"] for p in plan.procs} == {"10.0.0.2"}
    with pytest.raises(PlanError, match=r"-s 0: --engine mxnet needs at least 1 server"):
        mxnet_plan(num_servers=0)
    assert make_plan(PlanRequest(job_id="j", command=["t.py"], hosts=HOSTS, python="py", scheduler_port=9000,
                                 master_port=9001, num_servers=0)).num_servers == 0    # psnode: allowed


def test_psnode_is_the_default_engine_and_its_base_env_has_no_psnode_variable():
    plan = make_plan(PlanRequest(job_id="j", command=["t.py"], hosts=HOSTS, python="py", scheduler_port=9000,
                                 master_port=9001, user_env={"FOO": "bar"}))
    assert plan.engine is PSNODE and plan.procs[0].argv == ("py", "-m", "psnode")
    assert plan.base_env == {"FOO": "bar", "PYTHONUNBUFFERED": "1"}
    assert plan.base_env == {k: v for k, v in plan.procs[0].env.items() if not k.startswith("PSNODE_")}


def test_every_psnode_option_is_refused_or_accepted_by_mxnet_by_name():
    flags = [f.metadata["flag"] for f in fields(NodeOptions)]
    for flag in flags:
        if flag in MXNET.ACCEPTED:
            assert MXNET.admit([flag, "--insecure"]) == [
                f"--engine mxnet: {flag} needs nothing from mxdist: {MXNET.ACCEPTED[flag]}"]
        else:
            with pytest.raises(EngineError, match=re.escape(f"{flag}: {MXNET.REFUSED[flag]}")):
                MXNET.admit([flag])
    with pytest.raises(EngineError) as err:
        MXNET.admit(["--checkpoint-dir", "--no-shm", "--max-restarts", "--encrypt"])
    text = str(err.value)
    assert all(f in text for f in ("--checkpoint-dir:", "--max-restarts:", "--encrypt:")) and "--no-shm" not in text
    assert MXNET.admit([]) == [MXNET.UNAUTHENTICATED]                  # neither --insecure nor a note
    assert PSNODE.admit([*flags, "--encrypt"]) == []                   # psnode runs every option
    with pytest.raises(EngineError, match="--engine 'tf': choose psnode or mxnet"):
        engine_named("tf")
    assert set(ENGINES) == {"psnode", "mxnet"}


def test_node_options_given_names_the_flags_that_differ_from_their_defaults():
    assert NodeOptions().given() == []
    node = NodeOptions(checkpoint_dir="/ck", shm=False, cpu_policy="normal", max_restarts=1)  # type: ignore[arg-type]
    assert node.given() == ["--checkpoint-dir", "--max-restarts", "--no-shm", "--cpu-policy"]


def test_env_cannot_set_the_engines_variables():
    for name, what in MXNET.reserved_env.items():
        with pytest.raises(PlanError, match=f"-e {name}: set by mxdist for every process, from"):
            parse_env_assignments([f"{name}=x"], MXNET.reserved_env)
        assert what
    assert parse_env_assignments(["DMLC_ROLE=x"]) == {"DMLC_ROLE": "x"}       # psnode's jobs: a plain variable
    assert parse_env_assignments(["DMLC_INTERFACE=eth0", "PS_VERBOSE=1"], MXNET.reserved_env) == {
        "DMLC_INTERFACE": "eth0", "PS_VERBOSE": "1"}
    with pytest.raises(PlanError, match="PSNODE_"):
        parse_env_assignments(["PSNODE_LOG_LEVEL=DEBUG"], MXNET.reserved_env)


def test_prepare_an_mxnet_job(tmp_path):
    records.use_home(tmp_path)
    try:
        environ = {"MXNET_ENGINE_TYPE": "NaiveEngine", "PS_VERBOSE": "1", "DMLC_INTERFACE": "lo",
                   "DMLC_ROLE": "server", "OMP_NUM_THREADS": "1", "UNRELATED": "x"}
        prepared = prepare(LaunchOptions(command=["t.py"], num_workers=2, num_servers=1, engine="mxnet",
                                         node=NodeOptions(shm=False)), environ)
        plan, record, settings = prepared.plan, prepared.record, prepared.settings
        assert record.engine == "mxnet" and settings.check_modules == ("mxnet",)
        assert settings.security is Mode.INSECURE and record.security == "insecure"   # ps-lite has no secret
        no_shm = f"--engine mxnet: --no-shm needs nothing from mxdist: {MXNET.ACCEPTED['--no-shm']}"
        assert plan.warnings[:2] == (no_shm, MXNET.UNAUTHENTICATED)
        assert plan.base_env == {"MXNET_ENGINE_TYPE": "NaiveEngine", "PS_VERBOSE": "1", "DMLC_INTERFACE": "lo",
                                 "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}   # DMLC_ROLE is each process's own
        assert [p.env["DMLC_ROLE"] for p in plan.procs] == ["scheduler", "server", "worker", "worker"]
        port = plan.scheduler_address.rsplit(":", 1)[1]
        assert {p.env["DMLC_PS_ROOT_PORT"] for p in plan.procs} == {port}
        assert {p.env["DMLC_NODE_HOST"] for p in plan.procs} == {"127.0.0.1"}     # a local job binds to loopback
        psnode_job = prepare(LaunchOptions(command=["t.py"]), environ)
        assert "MXNET_ENGINE_TYPE" not in psnode_job.plan.base_env and psnode_job.record.engine == "psnode"
        assert psnode_job.settings.security is Mode.AUTHENTICATED and psnode_job.settings.check_modules == ("psnode", "numpy", "zmq")
        with pytest.raises(EngineError, match="--resume"):
            prepare(LaunchOptions(command=["t.py"], engine="mxnet",
                                  node=NodeOptions(checkpoint_dir="/ck", resume=True)), environ)
    finally:
        records.use_home(None)


# -- the command line ------------------------------------------------------------------------------

runner = CliRunner()


def test_cli_refuses_psnode_options_with_mxnet_and_exits_2(home):
    for args, named in ((["--checkpoint-dir", "ck"], "--checkpoint-dir"), (["--max-restarts", "1"], "--max-restarts"),
                        (["--encrypt"], "--encrypt"), (["--heartbeat-interval", "2"], "--heartbeat-interval"),
                        (["--skip-nonfinite"], "--skip-nonfinite"), (["--distribution", "param"], "--distribution"),
                        (["-s", "0"], "-s 0"), (["-e", "DMLC_NUM_WORKER=4"], "-e DMLC_NUM_WORKER"),
                        (["--engine", "tf"], "--engine 'tf'")):
        result = runner.invoke(app, ["launch", "--dry-run", "--engine", "mxnet", *args, "t.py"])
        assert result.exit_code == 2, (args, result.output)
        assert "invalid launch options" in result.output and named in result.output, result.output
    assert not (home / "jobs").exists() or not list((home / "jobs").iterdir())      # nothing recorded


def test_cli_dry_run_of_an_mxnet_job(home):
    result = runner.invoke(app, ["launch", "--dry-run", "--engine", "mxnet", "-n", "2", "-s", "1", "--no-shm",
                                 "--insecure", "t.py"])
    assert result.exit_code == 0, result.output
    assert "-c 'import mxnet'" in result.output and "DMLC_ROLE=worker RANK=1" in result.output
    assert "-c MXNET_BOOT t.py" in result.output and "_mxdist_boot" not in result.output
    assert "--no-shm needs nothing from mxdist" in result.output and "does not authenticate" not in result.output


def _listener() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    s.settimeout(0.5)
    return s


@pytest.mark.parametrize("engine", ["mxnet", "psnode"])
def test_status_asks_only_a_psnode_scheduler(home, engine):
    """A running job's scheduler address is a real listening socket: psnode's status query
    connects to it; an MXNet job's status never does (ps-lite would read psnode's frames) and
    says why its rows are checked on the host instead."""
    with _listener() as sched:
        rec = JobRecord(id="job-m", command=["t.py"], backend="local", scheduler=f"127.0.0.1:{sched.getsockname()[1]}",
                        workdir=os.getcwd(), hosts=[{"name": "localhost", "address": "127.0.0.1"}],
                        options={"workdir": os.getcwd(), "python": "python3"}, engine=engine, security="insecure",
                        procs=[ProcRecord(name="worker-0", role="worker", rank=0, host="localhost",
                                          address="127.0.0.1", log="/nonexistent.log", pid=2**22 + 7,
                                          run_log="/nonexistent.log", rc_file="/nonexistent.rc")],
                        state=JobState.RUNNING)
        records.save(rec)
        lock = records.try_lock(rec.id)          # a live supervisor owns it
        try:
            result = runner.invoke(app, ["status", rec.id, "--json"])
        finally:
            lock.release()
        assert result.exit_code == 0, result.output
        view = json.loads(result.output)
        try:
            sched.accept()[0].close()
            asked = True
        except TimeoutError:
            asked = False
    assert view["engine"] == engine and view["source"] == "checked on this machine"
    assert asked is (engine == "psnode")
    assert (MXNET.status_note in view["notes"]) is (engine == "mxnet")
    assert records.load(rec.id).engine == engine
