"""torchrun and horovodrun habits at ``mxdist launch`` (typer's CliRunner: nothing is started).

An unknown option before the script, ``-m MODULE``, horovodrun's ``-H host:slots``, a long inline
host list, ``--nproc-per-node``, ``--start-timeout`` and ``addr=``: each as the user types it.
"""
from __future__ import annotations

import socket

import pytest
from typer.testing import CliRunner

from mxdist.main import app

runner = CliRunner()


def invoke(*args: str):
    result = runner.invoke(app, list(args))
    assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)
    return result


def no_record(home) -> bool:
    return not (home / "jobs").exists() or not list((home / "jobs").glob("*.json"))


def workers(output: str) -> list[str]:
    """The plan table's worker rows (host and command columns)."""
    return [line for line in output.splitlines() if "│ worker " in line]


@pytest.mark.parametrize("typed, said", [
    (["--dryrun", "-n", "2"], "unknown option --dryrun before the command; did you mean --dry-run?"),
    (["--max-worker", "4"], "unknown option --max-worker before the command; did you mean --max-workers?"),
    (["--nproc_per_node=2"], "unknown option --nproc_per_node before the command; did you mean --nproc-per-node?"),
    (["--nnodes", "2"], "unknown option --nnodes before the command; mxdist says -H with one entry per node"),
    (["--master-addr", "h1"], "unknown option --master-addr before the command; mxdist says --scheduler HOST"),
    (["-x"], "unknown option -x before the command; mxdist launch --help lists them"),
])
def test_an_unknown_option_before_the_script_is_refused_not_run(home, typed, said):
    result = invoke("launch", *typed, "examples/mlp_numpy.py")
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.replace("│", " ").split())
    assert said in text, text
    assert "mxdist's options go before the command, the command's own after it" in text
    assert "command not found" not in text
    assert no_record(home)


def test_options_after_the_script_still_belong_to_it(home):
    result = invoke("launch", "--dry-run", "-n", "1", "train.py", "--dryrun", "--max-worker", "4")
    assert result.exit_code == 0, result.output
    assert "train.py --dryrun --max-worker 4" in result.output


def test_horovodrun_np_is_the_number_of_workers(home):
    result = invoke("launch", "--dry-run", "-np", "3", "train.py")
    assert result.exit_code == 0, result.output
    assert len(workers(result.output)) == 3


def test_module_runs_as_python_dash_m_and_the_dry_run_shows_it(home):
    result = invoke("launch", "--dry-run", "-n", "2", "--pass-local-rank", "-m", "pkg.train", "--lr", "3", "-n", "9")
    assert result.exit_code == 0, result.output
    rows = workers(result.output)
    assert len(rows) == 2
    for local, row in enumerate(rows):
        assert f"-m pkg.train --local_rank={local} --lr 3 -n 9" in row, row


@pytest.mark.parametrize("typed, said", [
    (["-m", "train.py"], "-m takes a Python module name (pkg.module), got 'train.py': write mxdist launch train.py"),
    (["-m", "pkg/train"], "-m takes a Python module name (pkg.module), got 'pkg/train'"),
])
def test_module_that_is_no_module_name(home, typed, said):
    result = invoke("launch", "-n", "1", *typed)
    assert result.exit_code == 2, result.output
    assert said in " ".join(result.output.replace("│", " ").split())
    assert no_record(home)


def test_inline_slots_as_horovodrun(home):
    result = invoke("launch", "--dry-run", "-H", "h1:2,h2:4", "-s", "0", "--port", "23000", "train.py")
    assert result.exit_code == 0, result.output
    hosts = [row.split("│")[1].strip() for row in workers(result.output)]
    assert hosts == ["h1"] * 2 + ["h2"] * 4


def test_a_long_inline_list_is_a_list_not_a_path(home):
    """32 entries (about 600 characters) are longer than a file name may be."""
    spec = ",".join(f"10.0.{i // 200}.{i % 200 + 1}:port=22001" for i in range(32))
    assert len(spec) > 500
    result = invoke("launch", "--dry-run", "-H", spec, "-s", "0", "--port", "23000", "train.py")
    assert result.exit_code == 0, result.output
    assert len(workers(result.output)) == 32
    # the same list written the ssh way (addr:port) is refused by its first entry, with what to write
    old = spec.replace(":port=", ":")
    result = invoke("launch", "--dry-run", "-H", old, "train.py")
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.replace("│", " ").split())
    assert ("-H item 1: '10.0.0.1:22001': HOST:N in -H means N slots (as horovodrun -H and the discovery script), and "
            "22001 is more than 1024; for SSH port 22001 write 10.0.0.1:port=22001 (or Port in ~/.ssh/config)") in text


def test_an_mxnet_hosts_file_places_one_worker_per_line(home, tmp_path):
    """MXNet's launch.py hosts file (``ip:port`` lines): SSH port 22 on each host, a worker each."""
    hosts = tmp_path / "hosts"
    hosts.write_text("10.0.0.1:22\n10.0.0.2:22\n10.0.0.3:22\n")
    result = invoke("launch", "--dry-run", "-H", str(hosts), "-n", "3", "-s", "3", "--port", "23000", "train.py")
    assert result.exit_code == 0, result.output
    rows = [[cell.strip() for cell in row.split("│")[1:4]] for row in workers(result.output)]
    assert rows == [[f"10.0.0.{i + 1}:port=22", "worker", str(i)] for i in range(3)]


def test_a_hosts_file_number_that_could_be_slots_or_a_port_places_nothing(home, tmp_path):
    hosts = tmp_path / "cluster.hosts"
    hosts.write_text("node1 slots=2\nnode2:4\n")
    result = invoke("launch", "--dry-run", "-H", str(hosts), "train.py")
    assert result.exit_code == 2 and no_record(home)
    text = " ".join(result.output.replace("│", " ").split())
    assert (f"{hosts}:2: 'node2:4': in a hosts file HOST:N is the SSH port (MXNet's ip:port lines), and 4 could be a "
            "slot count (horovodrun's -H h1:4) as well: write node2:slots=4 for 4 slots, or node2:port=4 for SSH "
            "port 4") in text
    assert "2 | node2:4" in text and "│ worker" not in result.output


@pytest.mark.parametrize("typed, count, per_host", [
    (["--nproc-per-node", "3"], 3, {"localhost": 3}),
    (["--nproc-per-node", "2", "-H", "a,b"], 4, {"a": 2, "b": 2}),
    (["--nproc-per-node", "2", "-H", "a:2,b", "-n", "4"], 4, {"a": 2, "b": 2}),
    (["--nproc-per-node", "2", "-H", "a,b", "-n", "2", "--max-workers", "4"], 2, {"a": 2}),
])
def test_nproc_per_node_gives_every_host_its_slots(home, typed, count, per_host):
    result = invoke("launch", "--dry-run", "-s", "0", "--port", "23000", *typed, "train.py")
    assert result.exit_code == 0, result.output
    hosts = [row.split("│")[1].strip() for row in workers(result.output)]
    assert len(hosts) == count and {h: hosts.count(h) for h in hosts} == per_host


@pytest.mark.parametrize("typed, said", [
    (["--nproc-per-node", "2", "-n", "3"],
     "-n 3 contradicts --nproc-per-node 2 on 1 host (2 workers): give one of them (-n 2, or leave -n out)"),
    (["--nproc-per-node", "2", "-H", "a,b", "-n", "5"],
     "-n 5 contradicts --nproc-per-node 2 on 2 hosts (4 workers)"),
    (["--nproc-per-node", "2", "-H", "a:4,b"],
     "--nproc-per-node 2 contradicts the slots of the hosts (-H) (a slots=4): give the slots once"),
    (["--nproc-per-node", "0"], "--nproc-per-node 0: must be 1 or more"),
])
def test_nproc_per_node_contradictions_are_named(home, typed, said):
    result = invoke("launch", "--dry-run", *typed, "train.py")
    assert result.exit_code == 2, result.output
    assert said in " ".join(result.output.replace("│", " ").split())


def test_start_timeout_reaches_every_process(home):
    result = invoke("launch", "--dry-run", "-n", "2", "--start-timeout", "7.5", "train.py")
    assert result.exit_code == 0, result.output
    assert "PSNODE_REGISTER_TIMEOUT=7.5" in result.output
    result = invoke("launch", "--dry-run", "--start-timeout", "0", "train.py")
    assert result.exit_code == 2
    assert "--start-timeout 0: must be seconds > 0" in " ".join(result.output.replace("│", " ").split())
    result = invoke("launch", "--dry-run", "--engine", "mxnet", "--start-timeout", "9", "train.py")
    assert result.exit_code == 2 and "--start-timeout" in result.output


def test_addr_is_what_the_processes_bind_to(home):
    result = invoke("launch", "--dry-run", "-H", "h1:addr=10.1.0.1,h2 addr=10.1.0.2", "--port", "23000", "train.py")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "10.1.0.1:23000" in out                        # the scheduler, reached on h1's addr
    assert "MASTER_ADDR=10.1.0.1" in out and "PSNODE_SCHEDULER=10.1.0.1:23000" in out
    assert "server 1: PSNODE_ROLE=server PSNODE_HOST=10.1.0.2" in out


def test_the_slurm_preflight_looks_for_a_module_as_python_m_would(tmp_path):
    """The check Slurm runs on every node (its source, run here as srun would run it)."""
    import json
    import subprocess
    import sys

    from mxdist.backends.slurm import _CHECK

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text("")
    found = {}
    for module in ("pkg.train", "pkg.trian"):
        out = subprocess.run([sys.executable, "-c", _CHECK, str(tmp_path), json.dumps(["module", module])],
                             cwd=tmp_path, capture_output=True, text=True, timeout=60)
        line = next(x for x in out.stdout.splitlines() if x.startswith("MXDIST-CHECK "))
        found[module] = json.loads(line.split(" ", 1)[1])["errors"]
    assert found == {"pkg.train": [],
                     "pkg.trian": [f"no module pkg.trian in {tmp_path} (python -m pkg.trian: not found)"]}


@pytest.mark.parametrize("spec, how", [
    ("localhost:2", "on this machine, without SSH (-H localhost:2 names this machine"),
    ("127.0.0.1,[::1]", "on this machine, without SSH"),
    (f"{socket.gethostname()}:2", "on this machine, without SSH"),
    ("localhost:2,h2", "over SSH, on every host"),               # other hosts must reach it: one way for all
    ("alice@localhost", "over SSH, on every host"),              # a user or a port asks for a login
    ("localhost:port=2222", "over SSH, on every host"),
])
def test_the_dry_run_says_how_the_processes_start(home, spec, how):
    result = invoke("launch", "--dry-run", "-H", spec, "-s", "0", "--port", "23000", "train.py")
    assert result.exit_code == 0, result.output
    assert f"how the processes start: {how}" in " ".join(result.output.split())
    if "without SSH" in how:
        assert {row.split("│")[1].strip() for row in workers(result.output)} == {"localhost"}
        assert len(workers(result.output)) == 2


def test_ssh_only_options_with_hosts_naming_this_machine_say_how_to_log_in(home, tmp_path):
    key = tmp_path / "key"
    key.write_text("k\n")
    for args, said in ((["-i", str(key)], "-i/--identity-file is for SSH logins, and -H localhost:2 names this "
                        "machine, which runs without SSH: drop -i, or pass --launcher ssh to log in over SSH"),
                       (["--sync", str(tmp_path)], "--sync copies to remote hosts: it needs -H with other hosts, or "
                        "--launcher ssh")):
        result = invoke("launch", "--dry-run", "-H", "localhost:2", *args, "train.py")
        assert result.exit_code == 2 and said in " ".join(result.output.replace("│", " ").split()), result.output


def test_launcher_local_with_another_host_names_it(home):
    result = invoke("launch", "--dry-run", "--launcher", "local", "-H", "localhost,h2", "train.py")
    assert result.exit_code == 2
    assert "--launcher local runs on this machine only, and -H names h2" in " ".join(result.output.split())


def test_the_timeline_hint_is_true_and_a_path_after_timeline_is_not_run(home, tmp_path):
    """``mxdist logs --timeline`` of a job without one says how to record it, in options that parse;
    ``--timeline trace.json train.py`` (a path after the flag) is refused, never run as the program."""
    from mxdist.job import records
    from mxdist.job.records import JobRecord, JobState

    records.save(JobRecord(id="job-t", command=["t.py"], backend="local", state=JobState.SUCCEEDED))
    result = invoke("logs", "job-t", "--timeline")
    text = " ".join(result.output.replace("│", " ").split())
    assert result.exit_code == 2
    assert ("launch it with mxdist launch --timeline (the trace: timeline.json in the job's directory) or "
            "--timeline-path PATH") in text, text
    trace = str(tmp_path / "trace.json")
    result = invoke("launch", "--dry-run", "--timeline", trace, "train.py")
    text = " ".join(result.output.replace("│", " ").split())
    assert result.exit_code == 2 and [j.id for j in records.all_jobs()] == ["job-t"]
    assert f"--timeline takes no path, and {trace} is no program to run: write --timeline-path {trace}" in text, text
    result = invoke("launch", "--dry-run", "--timeline-path", trace, "train.py")
    assert result.exit_code == 0, result.output


def test_the_dry_run_shows_the_standby_schedulers_port(home):
    result = invoke("launch", "--dry-run", "-H", "h1,h2", "-s", "2", "--standby-scheduler", "--port", "23000",
                    "train.py")
    assert result.exit_code == 0, result.output
    rows = [[cell.strip() for cell in row.split("│")[1:5]] for row in result.output.splitlines()
            if "│ scheduler " in row]
    assert rows == [["h1", "scheduler", "", "h1:23000"], ["h2", "scheduler", "1", "h2:23002"]], result.output
