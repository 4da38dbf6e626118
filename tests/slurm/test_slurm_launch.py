"""mxdist --launcher slurm against a real Slurm (see conftest.py): jobs run inside ``salloc`` or
``sbatch`` as a user would, every process a job step on an emulated node.

Every test ends by checking that no step of the job is in the queue and no process of the job
runs (found by ``PSNODE_JOB_ID`` in /proc/*/environ: the tasks and their sruns all carry it).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.cli import ROOT, latest, records, wait_for
from tests.support.slurm_launch import MXDIST, assert_nothing_left, env_for, mxdist_steps, salloc, write

TRAIN = textwrap.dedent("""
    import os, sys, numpy as np, psnode.kv
    kv = psnode.kv.create('dist_sync')
    kv.init(3, np.zeros((2, 3), np.float32))
    kv.push(3, np.full((2, 3), kv.rank + 1, np.float32))
    out = np.empty((2, 3), np.float32); kv.pull(3, out=out)
    assert (out == sum(range(1, kv.num_workers + 1)) / kv.num_workers).all(), out
    print("rank", kv.rank, "of", kv.num_workers, "ok", float(out[0, 0]),
          "node", os.environ["SLURMD_NODENAME"], "bind", os.environ["PSNODE_HOST"], "args", sys.argv[1:])
    kv.close()
""")

SLEEPER = textwrap.dedent("""
    import os, time
    print("started rank", os.environ["RANK"], "step", os.environ["SLURM_STEP_ID"], flush=True)
    time.sleep(300)
""")

FAILING = textwrap.dedent("""
    import os, sys, time
    print("started rank", os.environ["RANK"], flush=True)
    if os.environ["RANK"] == "1":
        time.sleep(1); print("rank 1 gives up", flush=True); sys.exit(3)
    time.sleep(300)
""")


def test_psnode_job_on_three_nodes(slurm3, home, tmp_path):
    train = write(tmp_path, "train.py", TRAIN)
    res = salloc(slurm3, ["-N3", "--ntasks-per-node=2"], home, tmp_path,
                 *MXDIST, "launch", "--launcher", "slurm", "-n", "4", "-s", "2", "--finish-grace", "3",
                 train, "--epochs", "1")
    assert res.returncode == 0, res.stdout + res.stderr
    # workers fill the nodes' task slots in order; addresses are Slurm's node names
    for rank, node in ((0, "127.0.0.2"), (1, "127.0.0.2"), (2, "127.0.0.3"), (3, "127.0.0.3")):
        assert (f"[worker {rank} @ {node}] rank {rank} of 4 ok 2.5 node {node} bind {node} "
                "args ['--epochs', '1']") in res.stdout, res.stdout
    rec = latest(home)
    assert rec["state"] == "succeeded" and rec["backend"] == "slurm"
    assert rec["options"]["job_id"].isdigit()
    assert [(p["name"], p["host"]) for p in rec["procs"] if p["role"] != "worker"] == [
        ("scheduler", "127.0.0.2"), ("server-0", "127.0.0.2"), ("server-1", "127.0.0.3")]
    assert "ok 2.5" in Path(rec["procs"][-1]["log"]).read_text()
    assert_nothing_left(slurm3, rec["id"])


def test_one_node_address_from_slurm(slurm1, home, tmp_path):
    """Node ``localhost`` binds to its NodeAddr (127.0.0.1); defaults come from the allocation."""
    train = write(tmp_path, "train.py", TRAIN)
    res = salloc(slurm1, ["-N1", "-n2"], home, tmp_path, *MXDIST, "launch", "--launcher", "slurm",
                 "--finish-grace", "3", train)
    assert res.returncode == 0, res.stdout + res.stderr
    for rank in (0, 1):
        assert f"[worker {rank} @ localhost] rank {rank} of 2 ok 1.5 node localhost bind 127.0.0.1" in res.stdout
    rec = latest(home)
    assert rec["hosts"][0]["address"] == "127.0.0.1" and len(rec["procs"]) == 4  # 1 server by default
    assert_nothing_left(slurm1, rec["id"])


def test_failing_worker_ends_the_job_and_its_steps(slurm3, home, tmp_path):
    failing = write(tmp_path, "failing.py", FAILING)
    launch = shlex.join([*MXDIST, "launch", "--launcher", "slurm", "-s", "1", "--grace", "2", failing])
    # still inside the allocation after mxdist returns: list the job's steps
    script = f'{launch}; echo "MXDIST_RC=$?"; squeue -h -s -j "$SLURM_JOB_ID" -o "STEP %i %j"'
    res = salloc(slurm3, ["-N3"], home, tmp_path, "sh", "-c", script)
    out = res.stdout + res.stderr
    assert "MXDIST_RC=1" in out, out
    assert "worker 1 on 127.0.0.3: exit code 3" in out
    assert "rank 1 gives up" in out  # the tail of its log
    assert not [line for line in out.splitlines() if line.startswith("STEP") and "mxdist." in line], out
    rec = latest(home)
    assert rec["state"] == "failed"
    assert_nothing_left(slurm3, rec["id"])


def test_detach_status_and_stop(slurm3, home, tmp_path):
    sleeper = write(tmp_path, "sleeper.py", SLEEPER)
    launch = shlex.join([*MXDIST, "launch", "--launcher", "slurm", "-d", "-s", "1", sleeper])
    done = tmp_path / "done"  # the allocation lives until the test creates this file
    keep = f"{launch} && for i in $(seq 600); do [ -e {shlex.quote(str(done))} ] && break; sleep 0.2; done"
    alloc = subprocess.Popen(["salloc", "-N3", "--immediate=30", "sh", "-c", keep],
                             env=env_for(slurm3, home), cwd=tmp_path, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    env = env_for(slurm3, home)  # outside the allocation: no SLURM_JOB_ID
    slurm_job = None
    try:
        rec = wait_for(lambda: records(home), 30, "the job record")[-1]  # (the dir comes before it)
        job = rec["id"]
        slurm_job = rec["options"]["job_id"]

        def all_started() -> bool:
            logs = [Path(p["log"]) for p in latest(home)["procs"] if p["role"] == "worker"]
            return all(p.exists() and "started rank" in p.read_text() for p in logs)

        wait_for(all_started, 30, "three workers to start")
        status = subprocess.run([*MXDIST, "status", "--json", job], env=env, cwd=ROOT, capture_output=True,
                                text=True, timeout=30)
        assert status.returncode == 0, status.stderr
        view = json.loads(status.stdout)
        assert view["backend"] == "slurm" and view["slurm_job"] == slurm_job
        workers = [n for n in view["nodes"] if n["role"] == "worker"]
        assert [n["host"] for n in workers] == ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
        assert all(n["state"] == "running" and re.fullmatch(rf"{slurm_job}\.\d+", n["step"]) for n in workers)
        table = subprocess.run([*MXDIST, "status", job], env={**env, "COLUMNS": "200"}, cwd=ROOT,
                               capture_output=True, text=True, timeout=30)
        assert f"Slurm job {slurm_job}" in table.stdout and "step" in table.stdout, table.stdout

        stop = subprocess.run([*MXDIST, "stop", job], env=env, cwd=ROOT, capture_output=True, text=True,
                              timeout=60)
        assert stop.returncode == 0, stop.stdout + stop.stderr
        for node in ("127.0.0.2", "127.0.0.3", "127.0.0.4"):
            assert f"{node}: nothing of the job left" in stop.stderr
        assert any(line.startswith(slurm_job) for line in slurm3.jobs()), "the allocation itself lives on"
        assert not mxdist_steps(slurm3)
        assert latest(home)["state"] == "stopped"
        assert_nothing_left(slurm3, job, timeout=2)
    finally:
        done.touch()
        try:
            alloc.wait(30)
        except subprocess.TimeoutExpired:
            if slurm_job:
                slurm3.run("scancel", slurm_job, check=False)
            alloc.kill()
            alloc.wait(10)


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(c) for c in text.split()]


def test_ctrl_c_stops_every_step(slurm3, home, tmp_path):
    sleeper = write(tmp_path, "sleeper.py", SLEEPER)
    alloc = subprocess.Popen(["salloc", "-N3", "--immediate=30", *MXDIST, "launch", "--launcher", "slurm",
                              "-s", "1", sleeper], env=env_for(slurm3, home), cwd=tmp_path, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        seen: list[str] = []

        def three_started() -> bool:
            seen.append(alloc.stdout.readline())
            return sum("started rank" in s for s in seen) == 3

        wait_for(three_started, 30, "three workers to start", interval=0)
        launcher = next(c for c in _children(alloc.pid)
                        if "mxdist" in Path(f"/proc/{c}/cmdline").read_text())
        os.kill(launcher, signal.SIGINT)  # what the terminal does on Ctrl-C
        out, _ = alloc.communicate(timeout=60)
        assert alloc.returncode == 130, "".join(seen) + out
    finally:
        if alloc.poll() is None:
            alloc.kill()
            alloc.wait(10)
    rec = latest(home)
    assert rec["state"] == "stopped"
    assert_nothing_left(slurm3, rec["id"])


def test_outside_an_allocation_says_how_to_get_one(slurm3, home, tmp_path):
    res = subprocess.run([*MXDIST, "launch", "--launcher", "slurm", "train.py"], env=env_for(slurm3, home),
                         cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert res.returncode == 2, res.stdout + res.stderr
    text = " ".join(res.stderr.replace("│", " ").split())
    assert "SLURM_JOB_ID is not set" in text and "salloc -N 3" in text and "sbatch" in text


def test_readme_batch_script(slurm3, home, tmp_path):
    """The sbatch example of README.md, as written, runs a job to the end."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(#!/bin/bash\n#SBATCH.*?)```", readme, re.S)
    assert block, "README.md has no sbatch example (```bash block starting with #!/bin/bash)"
    (tmp_path / "job.sh").write_text(block.group(1))
    write(tmp_path, "train.py", TRAIN)
    out = tmp_path / "out.txt"
    env = env_for(slurm3, home)
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"  # the mxdist console script
    res = subprocess.run(["sbatch", "--wait", f"--output={out}", "job.sh"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    text = out.read_text() if out.exists() else ""
    assert res.returncode == 0, res.stdout + res.stderr + text
    assert text.count(" ok ") == 6, text  # 3 nodes x 2 tasks
    rec = latest(home)
    assert rec["state"] == "succeeded"
    assert_nothing_left(slurm3, rec["id"])
