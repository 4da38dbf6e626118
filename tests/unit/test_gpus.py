"""mxdist.planning.gpus and the GPU parts of mxdist.planning.plan (pure): host GPU lists, each worker's devices, shortages.

The hosts' GPU lists are an input of the plan (preflight's report, read by mxdist.backends.base.host_gpus); here they
are made up.
"""
from __future__ import annotations

import pytest

from mxdist.backends import agent
from mxdist.backends.base import host_gpus
from mxdist.planning.gpus import GpuSource, HostGpus, describe_worker, parse_visible, sharing_warnings
from mxdist.planning.hosts import Host
from mxdist.planning.plan import GpuShortageError, PlanError, PlanRequest, gpu_view, make_plan, restarted, with_gpus
from psnode.config import Role

HOSTS = [Host("a", address="10.0.0.1", slots=4), Host("b", address="10.0.0.2", slots=2)]
H200 = [{"index": i, "uuid": f"GPU-{i}", "name": "NVIDIA H200", "memory_mib": 143771} for i in range(4)]


def request(**kw):
    base = {"job_id": "job-1", "command": ["train.py", "--lr", "0.1"], "hosts": HOSTS,
            "python": "/usr/bin/python3", "scheduler_port": 9000, "master_port": 9001}
    base.update(kw)
    return PlanRequest(**base)


def reported(wire: dict) -> HostGpus:
    """A host's GPUs from its agent's report, as it arrives (its wire form)."""
    return host_gpus(agent.from_json(agent.GpusReport, wire))


def smi(n: int, visible: str | None = None, error: str | None = None) -> HostGpus:
    return reported({"visible": visible, "gpus": H200[:n], "error": error})


def workers(plan):
    return [(p.host.label, p.local_rank, p.env.get("CUDA_VISIBLE_DEVICES"), p.env.get("CUDA_DEVICE_ORDER"))
            for p in plan.of_role(Role.WORKER)]


# -- what a host reports ---------------------------------------------------------------------------

def test_host_report_from_nvidia_smi_environment_or_nothing():
    four = smi(4)
    assert (four.devices, four.source) == (("0", "1", "2", "3"), GpuSource.SMI)
    assert four.describe() == "4 GPUs 0,1,2,3 (4 x NVIDIA H200, 140 GiB each)"
    # the environment's CUDA_VISIBLE_DEVICES is the list, whatever nvidia-smi says
    mine = smi(4, visible="3,1")
    assert (mine.devices, mine.source) == (("3", "1"), GpuSource.ENV)
    assert mine.describe() == "CUDA_VISIBLE_DEVICES=3,1: 2 GPUs of the 4 GPUs nvidia-smi lists"
    cpu = reported({"visible": None, "gpus": [], "error": None})
    assert (cpu.devices, cpu.source, cpu.describe()) == ((), GpuSource.NONE, "no GPU")
    assert host_gpus(None) == cpu == HostGpus()
    broken = smi(0, error="/usr/bin/nvidia-smi failed (exit 9): NVIDIA-SMI has failed")
    assert broken.devices == () and broken.describe() == (
        "no GPU (/usr/bin/nvidia-smi failed (exit 9): NVIDIA-SMI has failed)")
    hidden = smi(2, visible="")
    assert hidden.devices == () and hidden.describe().startswith("CUDA_VISIBLE_DEVICES=: no GPU")


@pytest.mark.parametrize("value, devices", [
    ("0,1,2", ("0", "1", "2")), (" 2 , 3 ", ("2", "3")), ("", ()), ("1,-1,2", ("1",)), ("-1", ()),
    ("GPU-8b1c,GPU-99aa", ("GPU-8b1c", "GPU-99aa")), ("0,,1", ("0",)),
])
def test_parse_visible_as_cuda_reads_it(value, devices):
    assert parse_visible(value) == devices


# -- the default: visibility left alone ------------------------------------------------------------

def test_default_leaves_visibility_alone_and_local_rank_names_the_device():
    plan = with_gpus(make_plan(request(num_workers=5)), {"a": smi(4), "b": smi(2)})
    assert workers(plan) == [("a", 0, None, None), ("a", 1, None, None), ("a", 2, None, None),
                             ("a", 3, None, None), ("b", 0, None, None)]
    rows = [describe_worker(p.local_rank, p.env, None, p.gpus, plan.gpus[p.host.label])
            for p in plan.of_role(Role.WORKER)]
    assert rows == [("all", "cuda:0"), ("all", "cuda:1"), ("all", "cuda:2"), ("all", "cuda:3"), ("all", "cuda:0")]
    hosts, lines, warnings = gpu_view(plan)
    assert hosts == ["a: 4 GPUs 0,1,2,3 (4 x NVIDIA H200, 140 GiB each)",
                     "b: 2 GPUs 0,1 (2 x NVIDIA H200, 140 GiB each)"]
    assert lines[1] == "worker 1 @ a: all GPUs visible, LOCAL_RANK 1 -> cuda:1"
    assert warnings == []


def test_default_warns_when_a_gpu_host_runs_more_workers_than_gpus_but_not_for_cpu_hosts():
    plan = with_gpus(make_plan(request(num_workers=6)), {"a": smi(2), "b": HostGpus()})
    hosts, lines, warnings = gpu_view(plan)
    assert hosts[1] == "b: no GPU"
    assert lines[3] == "worker 3 @ a: all GPUs visible, LOCAL_RANK 3 -> cuda:3 (host has 2)"
    assert lines[4] == "worker 4 @ b: all GPUs visible (no GPU), LOCAL_RANK 0 -> -"
    assert len(warnings) == 1 and warnings[0].startswith(
        "a runs 4 workers but shows 2 GPUs: cuda:LOCAL_RANK does not exist for local ranks 2-3")
    assert sharing_warnings({"a": smi(1)}, {"a": 2})[0].startswith(
        "a runs 2 workers but shows 1 GPU: cuda:LOCAL_RANK does not exist for local rank 1 ")


def test_users_visible_devices_are_shown_and_local_rank_still_indexes_them():
    plan = make_plan(request(num_workers=3, base_env={"CUDA_VISIBLE_DEVICES": "5,7"}))
    rows = [describe_worker(p.local_rank, p.env, None, p.gpus, None) for p in plan.of_role(Role.WORKER)]
    assert rows == [("5,7", "cuda:0"), ("5,7", "cuda:1"), ("5,7", "cuda:2 (not visible)")]


# -- --gpus-per-worker -------------------------------------------------------------------------------

def test_gpus_per_worker_gives_each_local_rank_its_slice_of_the_host_list():
    plan = make_plan(request(num_workers=6, num_servers=2, gpus_per_worker=2))
    assert all(p.gpus is None for p in plan.procs)       # not placed before the hosts are known
    placed = with_gpus(plan, {"a": reported({"gpus": H200 * 2}), "b": smi(4)})
    # worker with local rank l on a host: entries 2l, 2l+1 of that host's list
    assert workers(placed) == [("a", 0, "0,1", "PCI_BUS_ID"), ("a", 1, "2,3", "PCI_BUS_ID"),
                               ("a", 2, "0,1", "PCI_BUS_ID"), ("a", 3, "2,3", "PCI_BUS_ID"),
                               ("b", 0, "0,1", "PCI_BUS_ID"), ("b", 1, "2,3", "PCI_BUS_ID")]
    assert [p.gpus for p in placed.of_role(Role.WORKER)][:2] == [("0", "1"), ("2", "3")]
    # only workers: the scheduler and servers keep their environment
    for before, after in zip(plan.procs, placed.procs, strict=True):
        if after.role is not Role.WORKER:
            assert after.env == before.env
        else:
            assert {k: v for k, v in after.env.items() if not k.startswith("CUDA_")} == dict(before.env)
    assert describe_worker(1, placed.procs[4].env, 2, placed.procs[4].gpus, None) == ("2,3", "cuda:0-1")


def test_gpus_per_worker_takes_entries_of_the_users_list_and_keeps_its_order_variable():
    env = {"CUDA_VISIBLE_DEVICES": "4,6,7", "CUDA_DEVICE_ORDER": "FASTEST_FIRST"}
    plan = make_plan(request(hosts=HOSTS[:1], num_workers=3, gpus_per_worker=1, user_env=env))
    placed = with_gpus(plan, {"a": smi(8, visible="4,6,7")})
    assert workers(placed) == [("a", 0, "4", "FASTEST_FIRST"), ("a", 1, "6", "FASTEST_FIRST"),
                               ("a", 2, "7", "FASTEST_FIRST")]
    # a list from the environment alone (no nvidia-smi asked): no order variable added
    plan = make_plan(request(hosts=HOSTS[:1], num_workers=2, gpus_per_worker=1))
    assert workers(with_gpus(plan, {"a": HostGpus.from_visible("GPU-x,GPU-y")})) == [
        ("a", 0, "GPU-x", None), ("a", 1, "GPU-y", None)]


def test_too_few_gpus_names_every_short_host_with_what_it_has_and_what_was_asked():
    plan = make_plan(request(num_workers=6, gpus_per_worker=2))
    with pytest.raises(GpuShortageError) as err:
        with_gpus(plan, {"a": smi(4), "b": HostGpus()})
    short = err.value.shortages
    assert [(s.host, s.workers, s.needed) for s in short] == [("a", 4, 8), ("b", 2, 4)]
    assert short[0].reason == ("has 4 GPUs 0,1,2,3 (4 x NVIDIA H200, 140 GiB each), but its 4 workers "
                               "x --gpus-per-worker 2 need 8 GPUs")
    assert short[1].reason == "has no GPU, but its 2 workers x --gpus-per-worker 2 need 4 GPUs"
    assert "--gpus-per-worker" in short[0].fix and "slots=N" in short[0].fix
    assert isinstance(err.value, PlanError) and "a has 4 GPUs" in str(err.value)
    # enough on a, none on b: only b is named
    with pytest.raises(GpuShortageError) as err:
        with_gpus(make_plan(request(num_workers=5, gpus_per_worker=1)), {"a": smi(4), "b": smi(0)})
    assert [s.host for s in err.value.shortages] == ["b"]
    assert err.value.shortages[0].reason == "has no GPU, but its 1 worker x --gpus-per-worker 1 need 1 GPU"


def test_hosts_are_placed_as_they_become_known_and_placed_workers_keep_theirs():
    plan = make_plan(request(num_workers=6, gpus_per_worker=1))
    half = with_gpus(plan, {"b": smi(2)})
    assert [w[2] for w in workers(half)] == [None, None, None, None, "0", "1"]
    rows = [describe_worker(p.local_rank, p.env, 1, p.gpus, None) for p in half.of_role(Role.WORKER)]
    assert rows[1] == ("host's #1 (at preflight)", "cuda:0") and rows[5] == ("1", "cuda:0")
    assert describe_worker(1, {}, 3, None, None) == ("host's #3-5 (at preflight)", "cuda:0-2")
    full = with_gpus(half, {"a": smi(4), "b": smi(2, visible="1,0")})     # b already placed: kept
    assert [w[2] for w in workers(full)] == ["0", "1", "2", "3", "0", "1"]
    assert gpu_view(half)[0] == ["a: known at preflight", "b: 2 GPUs 0,1 (2 x NVIDIA H200, 140 GiB each)"]


def test_a_restarted_worker_keeps_its_gpus():
    placed = with_gpus(make_plan(request(num_workers=2, gpus_per_worker=2)), {"a": smi(4)})
    spec = placed.of_role(Role.WORKER)[1]
    again = restarted(spec, 1)
    assert again.env["CUDA_VISIBLE_DEVICES"] == "2,3" and again.gpus == ("2", "3")


def test_gpus_per_worker_must_be_positive():
    with pytest.raises(PlanError, match="--gpus-per-worker 0: must be 1 or more"):
        make_plan(request(gpus_per_worker=0))


# -- --pass-local-rank --------------------------------------------------------------------------------

def test_pass_local_rank_goes_where_torch_distributed_launch_put_it():
    plan = make_plan(request(num_workers=5, pass_local_rank=True))
    assert [p.argv for p in plan.of_role(Role.WORKER)] == [
        ("/usr/bin/python3", "train.py", f"--local_rank={local}", "--lr", "0.1") for local in (0, 1, 2, 3, 0)]
    assert plan.procs[0].argv == ("/usr/bin/python3", "-m", "psnode")      # the scheduler: untouched
    other = make_plan(request(num_workers=1, command=["./run.sh", "a b"], pass_local_rank=True))
    assert other.of_role(Role.WORKER)[0].argv == ("./run.sh", "a b", "--local_rank=0")
    plain = make_plan(request(num_workers=2))
    assert all("--local_rank" not in " ".join(p.argv) for p in plain.procs)
    assert not plan.warnings


def test_pass_local_rank_with_gpus_per_worker_warns_about_local_ranks_without_their_device():
    plan = make_plan(request(num_workers=3, gpus_per_worker=1, pass_local_rank=True))
    assert len(plan.warnings) == 1 and "fails on local ranks 1 and up" in plan.warnings[0]
    # one worker per host: --local_rank=0 is cuda:0, nothing to warn about
    assert not make_plan(request(hosts=[Host("a", slots=1), Host("b", slots=1)], num_workers=2,
                                 gpus_per_worker=1, pass_local_rank=True)).warnings
