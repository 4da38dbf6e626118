"""mxdist.planning.plan: placement, ports, argv and environment of every process (pure)."""
from __future__ import annotations

import pytest

from mxdist.planning.hosts import Host
from mxdist.planning.plan import (
    NodeOptions,
    PlanError,
    PlanRequest,
    command_argv,
    is_secret,
    make_plan,
    parse_env_assignments,
    passthrough_env,
)
from psnode.config import NodeConfig, Role
from psnode.net.security import Mode

HOSTS = [Host("a", address="10.0.0.1", slots=2), Host("b", address="10.0.0.2"), Host("c", address="10.0.0.3")]


def request(**kw):
    """A PlanRequest; NodeOptions fields among ``kw`` go into its ``node`` options."""
    node = {k: kw.pop(k) for k in list(kw) if k in NodeOptions.__dataclass_fields__}
    base = dict(job_id="job-1", command=["train.py", "--lr", "0.1"], hosts=HOSTS, python="/usr/bin/python3",
                scheduler_port=9000, master_port=9001, node=NodeOptions(**node))
    base.update(kw)
    return PlanRequest(**base)


def test_defaults_one_server_per_host_workers_fill_slots():
    plan = make_plan(request())
    assert plan.num_workers == 4 and plan.num_servers == 3
    assert [p.name for p in plan.procs] == [
        "scheduler", "server-0", "server-1", "server-2", "worker-0", "worker-1", "worker-2", "worker-3"]
    assert [p.host.name for p in plan.of_role(Role.SERVER)] == ["a", "b", "c"]
    assert [(p.host.name, p.local_rank) for p in plan.of_role(Role.WORKER)] == [
        ("a", 0), ("a", 1), ("b", 0), ("c", 0)]
    assert plan.procs[0].host.name == "a" and plan.scheduler_address == "10.0.0.1:9000"
    assert not plan.warnings


def test_env_round_trips_through_node_config():
    plan = make_plan(request())
    for proc in plan.procs:
        cfg = NodeConfig.from_env(proc.env)
        assert cfg.role is proc.role and cfg.job_id == "job-1"
        assert cfg.scheduler_address == "10.0.0.1:9000"
        assert cfg.num_workers == 4 and cfg.num_servers == 3 and cfg.backup_workers == 0
        assert cfg.host == proc.host.address
        assert cfg.rank == proc.rank
    server = plan.of_role(Role.SERVER)[1]
    assert server.env["PSNODE_PORT"] == "0"


def test_workers_get_torch_variables():
    plan = make_plan(request())
    w = plan.of_role(Role.WORKER)[3]
    assert {k: w.env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")} == {
        "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "9001"}
    assert w.env["PYTHONUNBUFFERED"] == "1"
    assert "RANK" not in plan.procs[0].env


def test_workers_get_torchruns_whole_environment():
    """Hosts a (2 slots), b, c: node ranks by host order, local world size per host, the run id,
    restarts and each worker's error file in the run directory."""
    from mxdist.planning.torchenv import VARIABLES

    plan = make_plan(request(max_restarts=3, run_dir="~/.mxdist/run/job-1"))
    got = [{k: w.env[k] for k in VARIABLES} for w in plan.of_role(Role.WORKER)]
    same = {"WORLD_SIZE": "4", "ROLE_WORLD_SIZE": "4", "GROUP_WORLD_SIZE": "3", "ROLE_NAME": "default",
            "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "9001", "TORCHELASTIC_RUN_ID": "job-1",
            "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "3"}
    own = [(0, 0, 2, 0), (1, 1, 2, 0), (2, 0, 1, 1), (3, 0, 1, 2)]   # rank, local rank, local world, node
    assert got == [{**same, "RANK": str(r), "ROLE_RANK": str(r), "LOCAL_RANK": str(lr), "LOCAL_WORLD_SIZE": str(lw),
                    "GROUP_RANK": str(n), "NODE_RANK": str(n),
                    "TORCHELASTIC_ERROR_FILE": f"~/.mxdist/run/job-1/worker-{r}.torch-error.json"}
                   for r, lr, lw, n in own]
    assert plan.nodes == ("a", "b", "c")
    assert not any(k in p.env for p in plan.procs if p.role is not Role.WORKER for k in VARIABLES)


def test_torch_node_ranks_count_hosts_with_workers_only():
    """Two workers on a host of three: one node; wrapped placement keeps local ranks dense."""
    plan = make_plan(request(num_workers=2))
    assert [(w.env["GROUP_RANK"], w.env["GROUP_WORLD_SIZE"], w.env["LOCAL_WORLD_SIZE"])
            for w in plan.of_role(Role.WORKER)] == [("0", "1", "2"), ("0", "1", "2")]
    assert "TORCHELASTIC_ERROR_FILE" not in plan.of_role(Role.WORKER)[0].env   # no run directory
    wrapped = make_plan(request(num_workers=6))
    assert [(w.host.name, w.env["LOCAL_RANK"], w.env["LOCAL_WORLD_SIZE"], w.env["GROUP_RANK"])
            for w in wrapped.of_role(Role.WORKER)] == [
        ("a", "0", "3", "0"), ("a", "1", "3", "0"), ("b", "0", "2", "1"), ("c", "0", "1", "2"),
        ("a", "2", "3", "0"), ("b", "1", "2", "1")]


def test_joiners_keep_node_ranks_stable():
    """An elastic job on a and b: a joiner on b keeps b's node rank; one on a new host d takes
    the next node rank, and GROUP_WORLD_SIZE counts it."""
    from mxdist.planning.plan import joiner, with_worker

    b = Host("b", address="10.0.0.2", slots=2)
    plan = make_plan(request(num_workers=3, max_workers=6, hosts=[HOSTS[0], b], slots_bound=False))
    assert plan.nodes == ("a", "b")
    on_b = joiner(plan, 3, b, 1, 4, 2)
    assert {k: on_b.env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                     "GROUP_WORLD_SIZE")} == {
        "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2"}
    plan = with_worker(plan, on_b, b)
    new = Host("d", address="10.0.0.4", slots=2)
    on_d = joiner(plan, 4, new, 0, 5, 1)
    assert (on_d.env["GROUP_RANK"], on_d.env["NODE_RANK"], on_d.env["GROUP_WORLD_SIZE"]) == ("2", "2", "3")
    assert with_worker(plan, on_d, new).nodes == ("a", "b", "d")
    with pytest.raises(PlanError, match="inconsistent placement"):
        joiner(plan, 4, new, 1, 5, 1)     # local rank 1 of 1 worker


def test_counts_scheduler_choice_and_zero_servers():
    plan = make_plan(request(num_workers=2, num_servers=0, scheduler_host="c"))
    assert plan.num_servers == 0 and not plan.of_role(Role.SERVER)
    assert plan.procs[0].host.name == "c" and plan.scheduler_address == "10.0.0.3:9000"
    assert plan.of_role(Role.WORKER)[0].env["MASTER_ADDR"] == "10.0.0.3"
    assert [p.host.name for p in plan.of_role(Role.WORKER)] == ["a", "a"]


def test_more_workers_than_slots_wraps_with_a_warning():
    plan = make_plan(request(num_workers=6))
    assert [p.host.name for p in plan.of_role(Role.WORKER)] == ["a", "a", "b", "c", "a", "b"]
    assert [p.local_rank for p in plan.of_role(Role.WORKER)] == [0, 1, 0, 0, 2, 1]
    assert plan.warnings and "slots" in plan.warnings[0]


@pytest.mark.parametrize("kw, message", [
    ({"num_workers": 0}, "at least one worker"),
    ({"num_servers": -1}, "negative"),
    ({"scheduler_host": "zz"}, "not one of the hosts"),
    ({"master_port": 9000}, "must differ"),
    ({"scheduler_port": 70000}, "1..65535"),
    ({"command": []}, "no command"),
    ({"hosts": []}, "no hosts"),
    ({"num_workers": 3, "backup_workers": 3}, r"--backup-workers 3: .* 3 workers \(-n 3\); use 0 to 2"),
    ({"backup_workers": -1}, "--backup-workers -1: must be 0 or more"),
])
def test_plan_errors(kw, message):
    with pytest.raises(PlanError, match=message):
        make_plan(request(**kw))


def test_command_argv_keeps_words():
    assert command_argv(["t.py", "a b", "it's", "x;y"], "/py") == ("/py", "t.py", "a b", "it's", "x;y")
    assert command_argv(["bash", "-c", "echo $RANK"], "/py") == ("bash", "-c", "echo $RANK")


def test_environment_layers():
    environ = {"PYTHONPATH": "/p", "OMP_NUM_THREADS": "2", "NCCL_DEBUG": "INFO", "HOME": "/root",
               "AWS_SECRET_ACCESS_KEY": "s", "PATH": "/bin"}
    base = passthrough_env(environ)
    assert base == {"PYTHONPATH": "/p", "OMP_NUM_THREADS": "2", "NCCL_DEBUG": "INFO"}
    user = parse_env_assignments(["A=1", "B=x=y", "C="])
    assert user == {"A": "1", "B": "x=y", "C": ""}
    plan = make_plan(request(base_env=base, user_env={**user, "OMP_NUM_THREADS": "4", "PSNODE_ROLE": "x"}))
    w = plan.of_role(Role.WORKER)[0]
    assert w.env["OMP_NUM_THREADS"] == "4" and w.env["PYTHONPATH"] == "/p" and w.env["B"] == "x=y"
    assert w.env["PSNODE_ROLE"] == "worker"  # psnode variables always win
    assert "HOME" not in w.env and "AWS_SECRET_ACCESS_KEY" not in w.env


@pytest.mark.parametrize("item", ["NOEQUALS", "1A=2", "A-B=1", "$(id)=1", "=v"])
def test_bad_env_assignments(item):
    with pytest.raises(PlanError):
        parse_env_assignments([item])


def test_secret_names():
    assert is_secret("WANDB_API_KEY") and is_secret("HF_TOKEN") and is_secret("DB_PASSWORD")
    assert not is_secret("OMP_NUM_THREADS")


# -- psnode options, restarts, job keys -------------------------------------------------------

def test_node_options_reach_every_process_through_node_config():
    from psnode.config import Distribution

    plan = make_plan(request(distribution="data", checkpoint_dir="/ck", checkpoint_interval=2.5,
                             checkpoint_rounds=3, resume=True, skip_nonfinite=True, max_restarts=2))
    for proc in plan.procs:
        cfg = NodeConfig.from_env(proc.env)
        assert cfg.distribution is Distribution.DATA and cfg.checkpoint_dir == "/ck"
        assert (cfg.checkpoint_interval, cfg.checkpoint_rounds) == (2.5, 3)
        assert cfg.resume and cfg.skip_nonfinite and cfg.max_restarts == 2 and cfg.restart_count == 0
        assert cfg.key_file is None


@pytest.mark.parametrize("kw, message", [
    (dict(distribution="model"), "choose data, param or hybrid"),
    (dict(max_restarts=-1), "--max-restarts -1"),
    (dict(checkpoint_interval=-1.0, checkpoint_dir="/c"), "--checkpoint-interval"),
    (dict(checkpoint_interval=float("nan"), checkpoint_dir="/c"), "--checkpoint-interval"),
    (dict(checkpoint_rounds=-2, checkpoint_dir="/c"), "--checkpoint-rounds -2"),
    (dict(resume=True), "--resume needs --checkpoint-dir"),
    (dict(checkpoint_rounds=1, checkpoint_interval=1.0), "need --checkpoint-dir"),
])
def test_node_option_errors(kw, message):
    with pytest.raises(PlanError, match=message.replace("-", r"\-").replace("(", r"\(")):
        make_plan(request(**kw))


@pytest.mark.parametrize("name, hint", [
    ("PSNODE_DISTRIBUTION", "--distribution"), ("PSNODE_MAX_RESTARTS", "--max-restarts"),
    ("PSNODE_CHECKPOINT_DIR", "--checkpoint-dir"), ("PSNODE_RESUME", "--resume"),
    ("PSNODE_SKIP_NONFINITE", "--skip-nonfinite"), ("PSNODE_KEY_FILE", "--insecure"),
    ("psnode_log_level", "--log-level"), ("PSNODE_REGISTER_TIMEOUT", "--start-timeout"),
    ("PSNODE_RETRY_TIMEOUT", "no option"),
    ("PSNODE_CPU_POLICY", "--cpu-policy"),
])
def test_env_cannot_set_psnode_variables(name, hint):
    with pytest.raises(PlanError) as err:
        parse_env_assignments([f"{name}=1"])
    assert name in str(err.value) and hint in str(err.value)


def test_key_files_per_host_and_resolution():
    from mxdist.planning.plan import with_key_files

    plan = make_plan(request(key_files={h.label: "~/run/job-1/job.key" for h in HOSTS}))
    assert {NodeConfig.from_env(p.env).key_file for p in plan.procs} == {"~/run/job-1/job.key"}
    resolved = with_key_files(plan, {"a": "/root/run/job-1/job.key", "b": "/home/b/run/job.key",
                                     "c": "/c/job.key"})
    want = {"a": "/root/run/job-1/job.key", "b": "/home/b/run/job.key", "c": "/c/job.key"}
    for before, p in zip(plan.procs, resolved.procs):
        assert p.env["PSNODE_KEY_FILE"] == want[p.host.label]
        assert {k: v for k, v in p.env.items() if k != "PSNODE_KEY_FILE"} == {
            k: v for k, v in before.env.items() if k != "PSNODE_KEY_FILE"}
    assert not is_secret("PSNODE_KEY_FILE")


def test_restarted_worker_keeps_rank_host_argv_and_env():
    from mxdist.planning.plan import restarted

    plan = make_plan(request(max_restarts=2))
    spec = plan.of_role(Role.WORKER)[1]
    again = restarted(spec, 2)
    assert (again.rank, again.host, again.argv, again.name) == (spec.rank, spec.host, spec.argv, spec.name)
    assert again.env["PSNODE_RESTART_COUNT"] == again.env["TORCHELASTIC_RESTART_COUNT"] == "2"
    counts = ("PSNODE_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT")
    assert {k: v for k, v in again.env.items() if k not in counts} == {
        k: v for k, v in spec.env.items() if k not in counts}
    server = restarted(plan.of_role(Role.SERVER)[0], 1)
    assert server.env["PSNODE_RESTART_COUNT"] == "1" and "TORCHELASTIC_RESTART_COUNT" not in server.env


def test_local_plan_binds_to_loopback_only(tmp_path):
    from mxdist.job import records
    from mxdist.planning.options import LaunchOptions
    from mxdist.supervisor.setup import prepare

    records.use_home(tmp_path)
    prepared = prepare(LaunchOptions(command=["t.py"], num_workers=2, num_servers=2))
    assert prepared.plan.scheduler_address.startswith("127.0.0.1:")
    for p in prepared.plan.procs:
        cfg = NodeConfig.from_env(p.env)
        assert cfg.host == "127.0.0.1" and cfg.scheduler_host == "127.0.0.1"
        assert cfg.key_file == str(records.key_path(prepared.record.id))   # the launcher's own copy
    assert prepared.settings.security is Mode.AUTHENTICATED                # the default, local jobs too


@pytest.mark.parametrize("flags, mode", [
    ({}, "authenticated"), ({"encrypt": True}, "encrypted"), ({"insecure": True}, "insecure")])
def test_security_mode_from_the_flags(tmp_path, flags, mode):
    from mxdist.job import records
    from mxdist.planning.options import LaunchOptions
    from mxdist.supervisor.setup import prepare

    records.use_home(tmp_path)
    prepared = prepare(LaunchOptions(command=["t.py"], num_workers=1, num_servers=1, **flags))
    assert prepared.settings.security.value == mode
    keys = {NodeConfig.from_env(p.env).key_file for p in prepared.plan.procs}
    assert keys == ({None} if mode == "insecure" else {str(records.key_path(prepared.record.id))})
    with pytest.raises(PlanError, match="--insecure and --encrypt contradict each other"):
        prepare(LaunchOptions(command=["t.py"], insecure=True, encrypt=True))


def test_node_options_defaults_are_node_configs():
    """Each psnode default is written once (NodeConfig); the launch options take it from there."""
    from dataclasses import fields

    from psnode.config import default

    for f in fields(NodeOptions):
        assert getattr(NodeOptions(), f.name) == default(f.name), f.name
        assert f.metadata["flag"].startswith("--")
    cfg = NodeConfig.from_env(make_plan(request()).procs[1].env)
    assert (cfg.heartbeat_interval, cfg.heartbeat_liveness, cfg.shm) == (
        default("heartbeat_interval"), default("heartbeat_liveness"), True)


def test_no_shm_and_error_files_reach_every_process():
    plan = make_plan(request(shm=False, run_dir="~/.mxdist/run/job-1"))
    for proc in plan.procs:
        cfg = NodeConfig.from_env(proc.env)
        assert cfg.shm is False
        assert cfg.error_file == f"~/.mxdist/run/job-1/{proc.name}.failure.json"
    assert NodeConfig.from_env(make_plan(request()).procs[0].env).error_file is None


@pytest.mark.parametrize("kw, message", [
    (dict(heartbeat_interval=0.0), "--heartbeat-interval"),
    (dict(heartbeat_liveness=0), "--heartbeat-liveness 0"),
    (dict(log_level="LOUD"), "--log-level LOUD"),
    (dict(cpu_policy="fast"), "--cpu-policy 'fast': choose batch or normal"),
])
def test_more_node_option_errors(kw, message):
    with pytest.raises(PlanError, match=message):
        NodeOptions(**kw)


def test_busy_hosts_leave_out_hosts_without_processes():
    plan = make_plan(request(num_workers=1, num_servers=1))
    assert [h.name for h in plan.busy_hosts] == ["a"]


def test_cpu_policy_reaches_every_process():
    from psnode.config import CpuPolicy

    for kw, want in (({}, CpuPolicy.BATCH), ({"cpu_policy": "normal"}, CpuPolicy.NORMAL),
                     ({"cpu_policy": "BATCH"}, CpuPolicy.BATCH)):
        plan = make_plan(request(**kw))
        assert [NodeConfig.from_env(p.env).cpu_policy for p in plan.procs] == [want] * len(plan.procs)
        assert {p.env["PSNODE_CPU_POLICY"] for p in plan.procs} == {want.value}



SERVER_HOSTS = [Host("s1", address="10.0.1.1"), Host("s2", address="10.0.1.2")]


def test_server_hosts_run_only_the_servers():
    """--server-hosts: one server per server host by default, workers only on -H's hosts."""
    plan = make_plan(request(server_hosts=SERVER_HOSTS))
    assert plan.num_servers == 2 and plan.num_workers == 4
    assert [(p.name, p.host.name) for p in plan.procs] == [
        ("scheduler", "a"), ("server-0", "s1"), ("server-1", "s2"),
        ("worker-0", "a"), ("worker-1", "a"), ("worker-2", "b"), ("worker-3", "c")]
    assert [h.name for h in plan.hosts] == ["a", "b", "c", "s1", "s2"]
    assert [NodeConfig.from_env(p.env).host for p in plan.of_role(Role.SERVER)] == ["10.0.1.1", "10.0.1.2"]
    assert {NodeConfig.from_env(p.env).slice_bytes for p in plan.procs} == {256 * 1024}   # big arrays sliced
    assert {p.env["PSNODE_SLICE_BYTES"] for p in make_plan(request(server_hosts=SERVER_HOSTS, slice_bytes=2**20)).procs
            } == {"1048576"}
    assert {p.env["PSNODE_SLICE_BYTES"] for p in make_plan(request()).procs} == {"0"}   # shared hosts: per server
    more = make_plan(request(server_hosts=SERVER_HOSTS, num_servers=3, scheduler_host="s2"))
    assert [p.host.name for p in more.of_role(Role.SERVER)] == ["s1", "s2", "s1"]
    assert more.procs[0].host.name == "s2" and more.scheduler_address == "10.0.1.2:9000"


def test_server_hosts_refuses_a_workers_host_and_no_servers():
    with pytest.raises(PlanError, match=r"--server-hosts b: also among the workers' hosts \(-H\)"):
        make_plan(request(server_hosts=[Host("b", address="10.0.0.2")]))
    with pytest.raises(PlanError, match=r"--slice-bytes -1: must be 0 \(one part per server\) or more"):
        make_plan(request(slice_bytes=-1))
    with pytest.raises(PlanError, match=r"-s 0 with --server-hosts: the server hosts need at least one server"):
        make_plan(request(server_hosts=SERVER_HOSTS, num_servers=0))


def test_a_worker_planned_after_the_failover_registers_at_the_standby():
    """Once the plan went over to the standby scheduler (its scheduler's host lost), a worker
    planned anew (a lost host's worker moved to a free slot) registers at the standby at once,
    as a restarted process does, never at the lost scheduler."""
    from mxdist.planning.plan import joiner, with_standby_scheduler

    plan = make_plan(request(num_workers=3, num_servers=3, replicas=2, max_restarts=3, standby=True,
                             hosts=[*HOSTS, Host("d", address="10.0.0.4")]))
    before = joiner(plan, 0, HOSTS[2], 0, 3, 1)
    assert (before.env["PSNODE_SCHEDULER"], before.env["PSNODE_SCHEDULER_STANDBY"]) == ("10.0.0.1:9000",
                                                                                        "10.0.0.2:9002")
    after = joiner(with_standby_scheduler(plan), 0, HOSTS[2], 0, 3, 1)
    assert after.env["PSNODE_SCHEDULER"] == "10.0.0.2:9002" and "PSNODE_SCHEDULER_STANDBY" not in after.env


def test_a_scheduler_moved_off_a_taken_port_is_everyones_address():
    """The scheduler and its standby announce the ports they bound (PSNODE_ADDRESS_FILE, in the run
    directory); with_scheduler_port gives every process, the standby and later joiners that address;
    a restarted scheduler binds its address or fails (no address file)."""
    from mxdist.planning.plan import STANDBY_RANK, joiner, restarted, with_scheduler_port

    plan = make_plan(request(num_servers=2, max_workers=6, standby=True, run_dir="/run/j", slots_bound=False))
    sched, standby = plan.of_role(Role.SCHEDULER)
    assert sched.env["PSNODE_ADDRESS_FILE"] == "/run/j/scheduler.address"
    assert standby.env["PSNODE_ADDRESS_FILE"] == "/run/j/scheduler-1.address"
    assert all("PSNODE_ADDRESS_FILE" not in p.env for p in plan.procs if p.role is not Role.SCHEDULER)
    plan = with_scheduler_port(with_scheduler_port(plan, None, 31000), STANDBY_RANK, 31002)
    assert plan.scheduler_address == "10.0.0.1:31000"
    sched, standby = plan.of_role(Role.SCHEDULER)
    assert (sched.env["PSNODE_SCHEDULER"], standby.env["PSNODE_SCHEDULER"], standby.env["PSNODE_PRIMARY"]) == (
        "10.0.0.1:31000", "10.0.0.2:31002", "10.0.0.1:31000")
    for p in plan.procs[2:]:
        assert (p.env["PSNODE_SCHEDULER"], p.env["PSNODE_SCHEDULER_STANDBY"]) == ("10.0.0.1:31000", "10.0.0.2:31002")
    late = joiner(plan, 4, HOSTS[1], 1, 5, 2)
    assert (late.env["PSNODE_SCHEDULER"], late.env["PSNODE_SCHEDULER_STANDBY"]) == ("10.0.0.1:31000", "10.0.0.2:31002")
    again = restarted(sched, 1)
    assert "PSNODE_ADDRESS_FILE" not in again.env and again.env["PSNODE_SCHEDULER"] == "10.0.0.1:31000"


def test_a_new_standby_after_a_failover_stands_by_for_the_scheduler_that_took_over():
    """After a failover the launcher starts a new standby on another host: the first standby's
    command and variables, bound to its new host at the standby's port, standing by for the
    scheduler that took the job over; every node (and a worker planned later) registers there
    and goes over to the new standby."""
    from mxdist.planning.plan import joiner, next_standby, with_proc, with_schedulers

    hosts = [*HOSTS, Host("d", address="10.0.0.4")]
    plan = make_plan(request(num_workers=3, num_servers=3, replicas=2, max_restarts=3, standby=True, hosts=hosts))
    spec = next_standby(plan, hosts[3], 2, "10.0.0.2:9002")
    cfg = NodeConfig.from_env(spec.env)
    assert spec.name == "scheduler-2" and spec.host.label == "d"
    assert (cfg.role, cfg.standby, cfg.primary, cfg.host) == (Role.SCHEDULER, True, "10.0.0.2:9002", "10.0.0.4")
    assert (cfg.scheduler_host, cfg.scheduler_port, cfg.rank) == ("10.0.0.4", 9002, None)
    after = with_schedulers(with_proc(plan, spec), "10.0.0.2:9002", "10.0.0.4:9002")
    assert [p.name for p in after.procs].count("scheduler-2") == 1
    for p in after.procs:
        if p.role is not Role.SCHEDULER:
            assert (p.env["PSNODE_SCHEDULER"], p.env["PSNODE_SCHEDULER_STANDBY"]) == ("10.0.0.2:9002",
                                                                                      "10.0.0.4:9002"), p.name
    moved = joiner(after, 0, HOSTS[2], 0, 3, 1)
    assert (moved.env["PSNODE_SCHEDULER"], moved.env["PSNODE_SCHEDULER_STANDBY"]) == ("10.0.0.2:9002",
                                                                                      "10.0.0.4:9002")
    with pytest.raises(PlanError, match="has no standby scheduler"):
        next_standby(make_plan(request()), hosts[3], 2, "10.0.0.2:9002")


def test_nodes_on_a_host_with_eight_or_more_of_the_job_are_told_how_many():
    """There their heartbeats go through the host's relay (PSNODE_HEARTBEAT_RELAY=auto)."""
    hosts = [Host("a", address="10.0.0.1", slots=8), Host("b", address="10.0.0.2", slots=4)]
    plan = make_plan(request(hosts=hosts, num_workers=12, num_servers=2))
    got = {(p.name, p.host.name): p.env.get("PSNODE_HOST_PROCESSES") for p in plan.procs}
    assert {k: v for k, v in got.items() if k[1] == "a"} == {
        **{(f"worker-{r}", "a"): "9" for r in range(8)}, ("server-0", "a"): "9", ("scheduler", "a"): "0"}
    assert all(v == "0" for k, v in got.items() if k[1] == "b")
    relayed = {p.name for p in plan.procs if p.role is not Role.SCHEDULER and NodeConfig.from_env(p.env).relay}
    assert relayed == {"server-0", *(f"worker-{r}" for r in range(8))}
