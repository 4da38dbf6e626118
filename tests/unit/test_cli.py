"""The mxdist CLI through typer's CliRunner: parsing, plans and errors (no process started)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mxdist.job import records
from mxdist.job.records import JobRecord, JobState, ProcRecord
from mxdist.main import app

runner = CliRunner()


@pytest.fixture
def supervised():
    """Hold the supervisor's lock of the jobs a test names, as a live supervisor would."""
    held = []

    def hold(job_id: str) -> None:
        lock = records.try_lock(job_id)
        assert lock is not None
        held.append(lock)

    yield hold
    for lock in held:
        lock.release()


@pytest.fixture
def ssh_config(tmp_path, monkeypatch):
    config = tmp_path / "ssh_config"
    config.write_text("Host n1\n  HostName 10.1.0.1\n  User alice\n  Port 2200\nHost *\n  User bob\n")
    monkeypatch.setenv("MXDIST_SSH_CONFIG", str(config))
    return config


def invoke(*args: str):
    result = runner.invoke(app, list(args))
    assert "Traceback" not in result.output
    return result


def test_local_dry_run_prints_the_plan_and_starts_nothing(home):
    result = invoke("launch", "--dry-run", "-n", "2", "-e", "WANDB_API_KEY=hunter2", "-e", "FOO=bar",
                    "train.py", "--lr", "0.1", "a b")
    assert result.exit_code == 0, result.output
    out = result.output
    for word in ("scheduler", "server", "worker", "127.0.0.1", "RANK=1", "WORLD_SIZE=2", "FOO=bar",
                 "PSNODE_NUM_WORKERS=2", "train.py --lr 0.1 'a b'"):
        assert word in out, word
    assert "hunter2" not in out and "WANDB_API_KEY=****" in out
    assert not (home / "jobs").exists() or not list((home / "jobs").iterdir())


def test_ssh_dry_run_resolves_hosts_without_connecting(home, ssh_config):
    result = invoke("launch", "--dry-run", "-H", "n1,n2:port=2222,carol@n3", "-s", "0", "--port", "23000",
                    "--python", "/opt/py/bin/python3", "train.py")
    assert result.exit_code == 0, result.output
    assert "10.1.0.1:23000" in result.output            # the scheduler on n1's HostName
    assert "MASTER_PORT=23001" in result.output
    assert "/opt/py/bin/python3 train.py" in result.output
    assert "server" not in result.output.split("environment")[0]


def test_server_hosts_file_resolved_and_user_errors(home, ssh_config, tmp_path):
    """--server-hosts FILE: resolved through the ssh config like -H; its user errors name it."""
    servers = tmp_path / "servers.hosts"
    servers.write_text("n1\n")
    result = invoke("launch", "--dry-run", "-H", "n2,n3", "--server-hosts", str(servers), "train.py")
    assert result.exit_code == 0, result.output
    assert "PSNODE_ROLE=server PSNODE_HOST=10.1.0.1" in result.output       # n1's HostName
    assert "PSNODE_SLICE_BYTES=262144" in result.output
    for args, message in (
            (["-H", "n2", "--server-hosts", str(tmp_path / "none.hosts")], "none.hosts: no such hosts file"),
            (["-H", "n2", "--server-hosts", "n1,$(id)"], "--server-hosts item 2: host '$(id)' is not a valid"),
            (["--server-hosts", "n1"], "--server-hosts names SSH hosts for the servers: give the workers' hosts"),
            (["-H", "n2", "--server-hosts", "n1", "--max-workers", "3"], "--server-hosts is for a job of fixed size"),
            (["-H", "n2", "--slice-bytes", "-1"], "--slice-bytes -1: must be 0")):
        result = invoke("launch", "--dry-run", *args, "train.py")
        assert result.exit_code == 2 and message in " ".join(result.output.split()), (args, result.output)


def test_hosts_file_errors_name_file_and_line(home, tmp_path):
    hosts = tmp_path / "cluster.hosts"
    hosts.write_text("node1\nnode2 slots=two\n")
    result = invoke("launch", "-H", str(hosts), "train.py")
    assert result.exit_code == 2
    assert f"{hosts}:2" in result.output and "node2 slots=two" in result.output


@pytest.mark.parametrize("spec", ["h;touch /tmp/mxdist-x", "$(id)", "`id`", "-oProxyCommand=touch_x",
                                  "a,b c", "$(id)@h", "h:port=99999", "h:addr=$(id)"])
def test_dangerous_hosts_rejected_before_any_connection(home, spec):
    result = invoke("launch", "-H", spec, "train.py")
    assert result.exit_code == 2, result.output
    assert "invalid launch options" in result.output
    assert "no such hosts file" not in result.output           # the bad value itself is named
    assert not Path("/tmp/mxdist-x").exists()


def test_missing_hosts_file(home):
    result = invoke("launch", "-H", "./nope.hosts", "train.py")
    assert result.exit_code == 2 and "no such hosts file" in result.output


@pytest.mark.parametrize("args, message", [
    (["-e", "BAD-NAME=1"], "not a valid environment variable name"),
    (["-e", "NOVALUE"], "expected NAME=VALUE"),
    (["--launcher", "local", "-H", "a"], "drop -H"),
    (["--launcher", "ssh"], "needs hosts"),
    (["--launcher", "slurm"], "SLURM_JOB_ID is not set"),
    (["-n", "0"], "at least one worker"),
    (["--sync", "/definitely/not/here", "-H", "a"], "not a directory"),
])
def test_option_errors(home, args, message):
    result = invoke("launch", "--dry-run", *args, "train.py")
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_arguments_after_the_command_belong_to_it(home):
    result = invoke("launch", "--dry-run", "-n", "1", "train.py", "-n", "5", "--dry-run", "x;y")
    assert result.exit_code == 0, result.output
    assert "train.py -n 5 --dry-run 'x;y'" in result.output
    assert "WORLD_SIZE=1" in result.output


def test_no_command_is_a_usage_error(home):
    result = invoke("launch")
    assert result.exit_code == 2


def _record(job_id: str, state: JobState, created: float) -> JobRecord:
    rec = JobRecord(id=job_id, command=["t.py"], backend="local", scheduler="127.0.0.1:1",
                    workdir=os.getcwd(), hosts=[{"name": "localhost", "address": "127.0.0.1"}],
                    options={"workdir": os.getcwd(), "python": "python3"},
                    procs=[ProcRecord(name="worker-0", role="worker", rank=0, host="localhost",
                                      address="127.0.0.1", log="/nonexistent.log", pid=2**22 + 7,
                                      run_log="/nonexistent.log", rc_file="/nonexistent.rc")],
                    state=state, created=created)
    records.save(rec)
    return rec


def test_status_and_logs_without_jobs(home):
    assert invoke("status").exit_code == 1
    result = invoke("logs", "nope")
    assert result.exit_code == 1 and "no job 'nope'" in result.output
    result = invoke("stop", "--all")
    assert result.exit_code == 0 and "no running jobs" in result.output


def test_status_lists_jobs_when_several_run(home, supervised):
    _record("job-a", JobState.RUNNING, 1.0)
    _record("job-b", JobState.RUNNING, 2.0)
    _record("job-c", JobState.SUCCEEDED, 3.0)
    supervised("job-a")
    supervised("job-b")
    result = invoke("status")
    assert result.exit_code == 0, result.output
    assert "2 jobs running" in result.output and "job-a" in result.output and "job-b" in result.output
    result = invoke("status", "--json")
    assert {j["id"] for j in json.loads(result.output)["jobs"]} == {"job-a", "job-b"}


def test_status_of_a_live_job_checks_the_processes_the_scheduler_does_not_know(home, supervised):
    _record("job-a", JobState.RUNNING, 1.0)
    supervised("job-a")
    result = invoke("status", "job-a", "--json")
    assert result.exit_code == 0, result.output
    view = json.loads(result.output)
    assert view["nodes"][0]["state"] == "lost" and "checked on this machine" in view["source"]
    assert view["state"] == "running"                       # the supervisor owns the record


def test_status_finalises_a_job_whose_supervisor_is_gone(home):
    _record("job-a", JobState.RUNNING, 1.0)                 # nobody holds its lock: gone
    result = invoke("status", "job-a", "--json")
    assert result.exit_code == 0, result.output
    view = json.loads(result.output)
    assert view["state"] == "failed" and view["nodes"][0]["state"] == "lost"
    assert any("supervisor was lost" in n for n in view["notes"])
    rec = records.load("job-a")
    assert rec.supervisor_lost and rec.state is JobState.FAILED and rec.ended is not None


def test_stop_is_idempotent(home):
    _record("job-a", JobState.RUNNING, 1.0)     # supervisor and processes gone: the job is over
    for _ in range(2):
        result = invoke("stop", "job-a")
        assert result.exit_code == 0, result.output
        assert "job job-a already failed: nothing to stop" in result.output
    assert records.load("job-a").state is JobState.FAILED and records.load("job-a").supervisor_lost


def test_logs_filters_by_role_and_rank(home):
    _record("job-a", JobState.RUNNING, 1.0)
    result = invoke("logs", "job-a", "--role", "server")
    text = " ".join(result.output.replace("│", " ").split())
    assert result.exit_code == 2 and "job job-a has no server; its processes: worker 0" in text, text
    result = invoke("logs", "job-a", "--role", "worker", "--rank", "3")
    text = " ".join(result.output.replace("│", " ").split())
    assert result.exit_code == 2 and "has no worker 3; its processes: worker 0" in text and "None" not in text
    result = invoke("logs", "job-a", "--role", "wrkr")        # the roles are the choices
    text = " ".join(result.output.replace("│", " ").split())
    assert result.exit_code == 2 and "'wrkr' is not one of 'scheduler', 'server', 'worker'" in text, text


def test_record_round_trip(home):
    rec = _record("job-z", JobState.STARTING, 5.0)
    loaded = records.load("job-z")
    assert loaded == rec
    assert records.resolve(None).id == "job-z"
    assert not list((home / "jobs").glob(".*tmp"))


# -- psnode options (--distribution, --max-restarts, checkpoints, --skip-nonfinite, --insecure) --

def test_node_options_in_the_dry_run(home):
    result = invoke("launch", "--dry-run", "-n", "2", "--distribution", "param", "--max-restarts", "2",
                    "--checkpoint-dir", "ck", "--checkpoint-rounds", "3", "--checkpoint-interval", "1.5",
                    "--skip-nonfinite", "train.py")
    assert result.exit_code == 0, result.output
    for word in ("PSNODE_DISTRIBUTION=param", "PSNODE_MAX_RESTARTS=2", "PSNODE_CHECKPOINT_ROUNDS=3",
                 "PSNODE_CHECKPOINT_INTERVAL=1.5", "PSNODE_SKIP_NONFINITE=1", "PSNODE_RESUME=0",
                 f"PSNODE_CHECKPOINT_DIR={os.path.join(os.getcwd(), 'ck')}"):
        assert word in result.output, word
    assert f"PSNODE_KEY_FILE={home}/jobs/" in result.output     # local jobs get a secret too
    result = invoke("launch", "--dry-run", "-n", "2", "--insecure", "train.py")
    assert result.exit_code == 0, result.output
    assert "PSNODE_KEY_FILE" not in result.output


def test_ssh_dry_run_plans_job_keys_unless_insecure(home, ssh_config):
    result = invoke("launch", "--dry-run", "-H", "n1,n2", "-s", "0", "train.py")
    assert result.exit_code == 0, result.output
    assert "PSNODE_KEY_FILE=~/.mxdist/run/" in result.output and "/job.key" in result.output
    result = invoke("launch", "--dry-run", "-H", "n1,n2", "-s", "0", "--insecure", "train.py")
    assert result.exit_code == 0, result.output
    assert "PSNODE_KEY_FILE" not in result.output


@pytest.mark.parametrize("args, message", [
    (["--distribution", "model"], "--distribution 'model': choose data, param or hybrid"),
    (["--max-restarts", "-1"], "--max-restarts -1: must be 0 or more"),
    (["--resume"], "--resume needs --checkpoint-dir"),
    (["--checkpoint-rounds", "5"], "--checkpoint-rounds needs --checkpoint-dir"),
    (["--checkpoint-dir", "c", "--checkpoint-interval", "-2"], "--checkpoint-interval -2"),
    (["--checkpoint-dir", "c", "--checkpoint-interval", "inf"], "--checkpoint-interval inf"),
    (["--checkpoint-dir", "/nonexistent/ck", "--resume"], "no checkpoint server-0.npz in /nonexistent/ck"),
    (["-s", "0", "--checkpoint-dir", "/tmp", "--resume"], "the job has no servers"),
    (["-e", "PSNODE_DISTRIBUTION=data"], "use --distribution instead"),
    (["-e", "PSNODE_MAX_RESTARTS=3"], "use --max-restarts instead"),
    (["-e", "PSNODE_KEY_FILE=/k"], "--insecure or --encrypt"),
    (["--insecure", "--encrypt"], "--insecure and --encrypt contradict each other"),
    (["--max-restarts", "x"], "--max-restarts"),
    (["--checkpoint-rounds", "1.5"], "--checkpoint-rounds"),
])
def test_node_option_errors(home, args, message):
    result = invoke("launch", "--dry-run", *args, "train.py")
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_ssh_checkpoint_dir_under_home_is_refused(home, ssh_config):
    result = invoke("launch", "--dry-run", "-H", "n1", "--checkpoint-dir", "~/ck", "train.py")
    assert result.exit_code == 2 and "give an absolute path" in result.output


def test_status_passes_the_local_key_file_and_stop_deletes_it(home, monkeypatch):
    from mxdist.control import commands

    calls = []

    def status(scheduler, job_id, key_file=None, timeout=2.0):
        calls.append(("status", key_file))
        raise OSError("no scheduler")

    monkeypatch.setattr(commands.door, "status", status)
    rec = _record("job-k", JobState.RUNNING, 1.0)
    key = records.key_path("job-k")
    key.write_text("k\n")
    rec.key_file = str(key)
    records.save(rec)
    lock = records.try_lock("job-k")           # a live supervisor
    assert invoke("status", "job-k", "--json").exit_code == 0
    assert calls == [("status", str(key))]
    lock.release()                          # ... that is gone: stop takes over
    result = invoke("stop", "job-k")
    assert result.exit_code == 0, result.output
    assert not key.exists()                 # stop deletes the job's keys once nothing is left
    assert records.load("job-k").state is JobState.FAILED     # its process was gone: lost


# ---------------------------------------------------------------- listening ports
def test_listen_range_avoids_the_ephemeral_range() -> None:
    from mxdist.planning.options import listen_range
    assert listen_range((32768, 60999)) == (20000, 32767)       # Linux's default
    assert listen_range((15000, 60000)) == (60001, 65535)       # no room below: above
    assert listen_range((1024, 65000)) == (1024, 65535)         # no room at all: anywhere
    assert listen_range((21000, 65535)) == (20000, 20999)


def test_ephemeral_range_read_or_default(tmp_path: Path) -> None:
    from mxdist.planning.options import DEFAULT_EPHEMERAL
    from mxdist.supervisor.setup import ephemeral_range
    f = tmp_path / "range"
    f.write_text("40000\t50000\n")
    assert ephemeral_range(str(f)) == (40000, 50000)
    f.write_text("garbage")
    assert ephemeral_range(str(f)) == DEFAULT_EPHEMERAL
    assert ephemeral_range(str(tmp_path / "missing")) == DEFAULT_EPHEMERAL


def test_local_ports_are_free_distinct_and_outside_the_ephemeral_range() -> None:
    import socket

    from mxdist.supervisor.setup import ephemeral_range, free_listen_port
    lo, hi = ephemeral_range()
    for _ in range(20):
        first = free_listen_port()
        second = free_listen_port(avoid=frozenset({first}))
        assert first != second
        for port in (first, second):
            assert not lo <= port <= hi, (port, lo, hi)
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))   # really free


# -- GPUs: --gpus-per-worker, --pass-local-rank, the devices in the plan ------------------------------

def fake_nvidia_smi(directory: Path, gpus: int) -> str:
    """A directory whose nvidia-smi lists ``gpus`` H200s as ``--query-gpu ... --format=csv`` does."""
    directory.mkdir(exist_ok=True)
    rows = "".join(f'echo "{i}, GPU-{i:04d}, NVIDIA H200, 143771"\n' for i in range(gpus))
    (directory / "nvidia-smi").write_text("#!/bin/sh\n" + rows)
    (directory / "nvidia-smi").chmod(0o755)
    return str(directory)


def test_dry_run_shows_each_workers_devices_on_a_cpu_host(home, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))            # no nvidia-smi: a CPU host
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    result = invoke("launch", "--dry-run", "-n", "2", "train.py")
    assert result.exit_code == 0, result.output
    assert "gpus" in result.output and "device" in result.output
    assert result.output.count("all (no GPU)") == 2
    assert "GPUs of the hosts:\n  localhost: no GPU" in result.output


def test_dry_run_places_gpus_from_this_machines_nvidia_smi(home, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", fake_nvidia_smi(tmp_path / "bin", 4))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    result = invoke("launch", "--dry-run", "-n", "2", "--gpus-per-worker", "2", "--pass-local-rank",
                    "train.py", "--lr", "1")
    assert result.exit_code == 0, result.output
    out = result.output
    env = {line.split(":")[0].strip(): line.split(": ", 1)[1].split() for line in out.splitlines()
           if line.startswith("  worker ")}
    assert {"CUDA_VISIBLE_DEVICES=0,1", "CUDA_DEVICE_ORDER=PCI_BUS_ID", "LOCAL_RANK=0"} <= set(env["worker 0"])
    assert {"CUDA_VISIBLE_DEVICES=2,3", "CUDA_DEVICE_ORDER=PCI_BUS_ID", "LOCAL_RANK=1"} <= set(env["worker 1"])
    assert "train.py --local_rank=0 --lr 1" in out and "train.py --local_rank=1 --lr 1" in out
    assert out.count("cuda:0-1") == 2
    assert "localhost: 4 GPUs 0,1,2,3 (4 x NVIDIA H200, 140 GiB each)" in out
    assert "fails on local ranks 2 and up" not in out     # 2 GPUs each: --local_rank 0 and 1 exist
    # default: all visible, LOCAL_RANK -> cuda:LOCAL_RANK, a warning past the host's GPUs
    result = invoke("launch", "--dry-run", "-n", "5", "train.py")
    assert result.exit_code == 0, result.output
    assert "cuda:3" in result.output and "cuda:4 (host has 4)" in result.output
    assert "localhost runs 5 workers but shows 4 GPUs" in " ".join(result.output.split())


def test_dry_run_with_too_few_gpus_fails_as_the_launch_would(home, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", fake_nvidia_smi(tmp_path / "bin", 1))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    result = invoke("launch", "--dry-run", "-n", "2", "--gpus-per-worker", "1", "train.py")
    assert result.exit_code == 3, result.output
    text = " ".join(result.output.replace("│", " ").split())
    assert "localhost: has 1 GPU 0 (1 x NVIDIA H200, 140 GiB each), but its 2 workers x --gpus-per-worker 1 " \
           "need 2 GPUs" in text
    result = invoke("launch", "--dry-run", "--gpus-per-worker", "0", "train.py")
    assert result.exit_code == 2 and "--gpus-per-worker 0: must be 1 or more" in result.output


def test_ssh_dry_run_shows_gpu_positions_until_preflight(home, ssh_config, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    # 4 workers on 2 hosts of 1 slot: local ranks 0, 0, 1, 1 (more workers than slots wrap around)
    result = invoke("launch", "--dry-run", "-H", "n1,n2", "-n", "4", "-s", "0", "--gpus-per-worker", "2", "train.py")
    assert result.exit_code == 0, result.output
    assert "host's #0-1 (at preflight)" in result.output and "host's #2-3 (at preflight)" in result.output
    assert "n1: known at preflight" in result.output and "CUDA_VISIBLE_DEVICES" not in result.output
    # every process gets the user's CUDA_VISIBLE_DEVICES: that is each host's list, known now
    result = invoke("launch", "--dry-run", "-H", "n1,n2", "-n", "4", "-s", "0", "--gpus-per-worker", "1",
                    "-e", "CUDA_VISIBLE_DEVICES=4,6", "train.py")
    assert result.exit_code == 0, result.output
    env = {line.split(":")[0].strip(): line.split(": ", 1)[1].split() for line in result.output.splitlines()
           if line.startswith("  worker ")}
    for rank, devices in enumerate(("4", "4", "6", "6")):
        assert f"CUDA_VISIBLE_DEVICES={devices}" in env[f"worker {rank}"], env


def test_help_documents_the_device_mapping(home):
    result = invoke("launch", "--help")
    text = " ".join(result.output.split())
    assert "--gpus-per-worker" in text and "LOCAL_RANK -> cuda:LOCAL_RANK" in text
    assert "--pass-local-rank" in text and "--local_rank=LOCAL_RANK" in text


def _flat(text: str) -> str:
    return " ".join(text.replace("│", " ").split())


def test_stop_with_nothing_running_says_so_and_touches_no_host(home, supervised):
    _record("job-a", JobState.SUCCEEDED, 1.0)
    result = invoke("stop")
    assert result.exit_code == 0 and "no running jobs (the latest, job-a, succeeded)" in result.output
    assert "not verified" not in result.output and "nothing of the job left" not in result.output
    _record("job-b", JobState.RUNNING, 2.0)
    _record("job-c", JobState.RUNNING, 3.0)
    supervised("job-b")
    supervised("job-c")
    result = invoke("stop")                        # which one? not a guess: the user names it
    text = _flat(result.output)
    assert result.exit_code == 2 and "2 jobs are running: job-b, job-c" in text and "--all" in text, text
    assert not records.stop_request_path("job-b").exists() and not records.stop_request_path("job-c").exists()


def test_clean_asks_before_removing_every_finished_job(home):
    _record("job-a", JobState.SUCCEEDED, 1.0)
    _record("job-b", JobState.FAILED, 2.0)
    result = invoke("clean")                       # CliRunner's stdin is no terminal: nobody to ask
    text = _flat(result.output)
    assert result.exit_code == 2 and "removes 2 finished jobs" in text and "pass --yes" in text, text
    assert [j.id for j in records.all_jobs()] == ["job-a", "job-b"]
    result = runner.invoke(app, ["clean"], input="y\n")      # an answer on a pipe confirms nothing: --yes does
    assert result.exit_code == 2 and len(records.all_jobs()) == 2
    result = invoke("clean", "job-a")              # named jobs: no question
    assert result.exit_code == 0 and "removed 1 job: job-a" in result.output
    result = invoke("clean", "--yes")
    assert result.exit_code == 0 and "removed 1 job: job-b" in result.output
    result = invoke("clean")
    assert result.exit_code == 0 and "no finished job to remove" in result.output


def test_logs_says_when_a_log_is_empty(home, tmp_path):
    rec = _record("job-a", JobState.SUCCEEDED, 1.0)
    empty = tmp_path / "worker-0.log"
    empty.write_text("")
    rec.procs[0].log = str(empty)
    records.save(rec)
    result = invoke("logs", "job-a")
    assert result.exit_code == 0 and f"worker 0: the log is empty ({empty})" in _flat(result.output)


def test_launch_usage_line_and_the_workers_default():
    result = runner.invoke(app, ["launch", "--help"], env={"COLUMNS": "200"})
    assert result.output.splitlines()[0] == "Usage: mxdist launch [OPTIONS] COMMAND [ARGS]..."
    text = _flat(result.output)
    assert "workers (default: the hosts' slots in total with -H; the allocation's tasks in Slurm; 1 on this " \
           "machine)" in text, text
    assert "-i, --identity-file KEY" in text
