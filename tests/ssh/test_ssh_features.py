"""The job's secret over real SSH: three sshd "hosts" on 127.0.0.2-4 (see conftest.py).

A job gets a fresh secret per launch (authenticated by default), delivered over SSH into a 0600
file on every host; no secret may appear on a command line, in a log or in the job record.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import textwrap
from pathlib import Path

import pytest

from psnode.net.security import Mode, Security
from tests.support.cli import assert_nothing_left, kill_cli, latest, run_cli, start_cli, wait_for

TRAIN = textwrap.dedent("""
    import os, sys, time, numpy as np, psnode
    kv = psnode.kv.create('dist_sync')
    kv.init('w', np.zeros(3, np.float32))
    key = os.environ.get("PSNODE_KEY_FILE")
    mode = oct(os.stat(key).st_mode & 0o777) if key else None
    print("READY", kv.rank, "KEY", key, "MODE", mode, flush=True)
    while len(sys.argv) > 1 and not os.path.exists(sys.argv[1]):   # the test looks meanwhile
        time.sleep(0.05)
    kv.push('w', np.full(3, kv.rank + 1, np.float32))
    print("RESULT", kv.pull('w').tolist(), flush=True)
    kv.close()
""")


def script(tmp_path: Path, text: str) -> str:
    path = tmp_path / "train.py"
    path.write_text(text)
    return str(path)


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def files_under(*roots: Path) -> list[Path]:
    return [p for root in roots if root.exists() for p in root.rglob("*") if p.is_file()]


def test_multi_host_job_runs_with_a_secret_that_never_leaks(ssh_cluster, home, tmp_path):
    env = ssh_cluster.env(home)
    go = tmp_path / "go"
    proc = start_cli(["launch", "-H", "node1,node2,node3", "-n", "3", "-s", "2",
                      script(tmp_path, TRAIN), str(go)], env)
    out: list[str] = []
    try:
        wait_for(lambda: out.append(proc.stdout.readline()) or sum("READY" in s for s in out) == 3,
                 90, "three workers to be ready", interval=0)
        rec = latest(home)
        local_key = Path(rec["key_file"])
        assert local_key == home / "jobs" / rec["id"] / "job.key"
        assert stat.S_IMODE(local_key.stat().st_mode) == 0o600
        content = local_key.read_bytes()
        sec = Security.load(str(local_key))
        assert sec.mode is Mode.AUTHENTICATED                     # the default
        secrets = [sec.token.hex().encode(), sec.curve_secret, sec.curve_public]

        # every process (scheduler, servers, workers) on every host got the key file of its host
        remote = {p["host"]: path for p in rec["procs"] for path in [rec["remote_keys"][p["host"]]]}
        assert set(rec["remote_keys"]) == {"node1", "node2", "node3"}
        for p in rec["procs"]:
            path = environ_of(p["pid"])["PSNODE_KEY_FILE"]
            assert path == remote[p["host"]] and Path(path).is_absolute(), p
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
            assert Path(path).read_bytes() == content
        assert sorted(set(s.split("MODE ")[1].strip() for s in out if "READY" in s)) == ["0o600"]

        # the live scheduler answers mxdist status (which uses the local copy of the keys) ...
        status = run_cli(["status", "--json"], env)
        assert status.returncode == 0, status.stderr
        view = json.loads(status.stdout)
        assert view["source"].startswith("live from the scheduler"), view
        # ... and nobody without them
        from psnode.errors import PeerLost
        from psnode.scheduler.client import status as scheduler_status

        with pytest.raises(PeerLost):
            scheduler_status(rec["scheduler"], rec["id"], key_file=None, timeout=1.0)

        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, timeout=30).stdout
        assert not [s for s in secrets if s in ps]

        go.touch()
        rest, _ = proc.communicate(timeout=90)
        out.append(rest)
        assert proc.returncode == 0, "".join(out)
    finally:
        kill_cli(proc)
    text = "".join(out)
    assert text.count("RESULT [2.0, 2.0, 2.0]") == 3, text
    # no secret in the logs (local copies and remote run dirs) or the record
    for path in files_under(home, home / "remote"):
        assert not [s for s in secrets if s in path.read_bytes()], path
    assert not [s for s in secrets if s.decode() in text]
    # the key files are deleted when the job is over
    assert not local_key.exists()
    assert not any(Path(p).exists() for p in remote.values())
    assert latest(home)["remote_keys"] == {}
    assert_nothing_left(home)


def test_insecure_multi_host_job_runs_without_keys(ssh_cluster, home, tmp_path):
    res = run_cli(["launch", "-H", "node2,node3", "-s", "1", "--insecure", script(tmp_path, TRAIN)],
                  ssh_cluster.env(home), timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("KEY None MODE None") == 2
    assert res.stdout.count("RESULT [1.5, 1.5, 1.5]") == 2
    rec = latest(home)
    assert rec["key_file"] is None and rec["remote_keys"] == {}
    assert not (home / "jobs" / rec["id"] / "job.key").exists()
    assert_nothing_left(home)


def test_detached_secure_job_status_and_stop_use_the_keys(ssh_cluster, home, tmp_path):
    env = ssh_cluster.env(home)
    go = tmp_path / "never"
    res = run_cli(["launch", "-d", "-H", "node1,node2", "-s", "1", script(tmp_path, TRAIN), str(go)], env)
    assert res.returncode == 0, res.stdout + res.stderr
    job = res.stdout.strip().splitlines()[-1]
    # -d returns once the job is recorded; its supervisor delivers the keys and starts it
    rec = wait_for(lambda: (r := latest(home))["state"] == "running" and r, 60, "the job to run")
    assert Path(rec["key_file"]).exists() and len(rec["remote_keys"]) == 2

    def live() -> bool:
        st = run_cli(["status", job, "--json"], env)
        return st.returncode == 0 and json.loads(st.stdout)["source"].startswith("live from the scheduler")

    wait_for(live, 60, "the scheduler to answer status with the job's keys", interval=0.5)
    stop = run_cli(["stop", job], env)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert "node1: nothing of the job left" in stop.stderr and "node2: nothing of the job left" in stop.stderr
    assert not Path(rec["key_file"]).exists()
    assert not any(Path(p).exists() for p in rec["remote_keys"].values())
    assert_nothing_left(home)


RESTART = textwrap.dedent("""
    import os, numpy as np, psnode
    kv = psnode.kv.create('dist_sync')
    kv.set_optimizer(psnode.optimizer.create('sgd', learning_rate=0.125))
    kv.init('w', np.zeros(3, np.float32))
    start = kv.num_pushes('w')
    print("START", start, "RESTARTS", kv.restarts, "KEY", bool(os.environ.get("PSNODE_KEY_FILE")), flush=True)
    for step in range(start, 6):
        if kv.rank == 1 and step == 3 and os.environ.get('PSNODE_RESTART_COUNT', '0') == '0':
            print("crashing at step", step, flush=True)
            os._exit(9)
        kv.push('w', np.full(3, (kv.rank + 1) * (step + 1), np.float32))
        kv.pull('w')
    print("FINAL", kv.pull('w').tolist(), flush=True)
    kv.close()
""")


def test_remote_worker_is_restarted_on_its_host_with_the_job_keys(ssh_cluster, home, tmp_path):
    res = run_cli(["launch", "-H", "node1,node2", "-s", "1", "--max-restarts", "1",
                   script(tmp_path, RESTART)], ssh_cluster.env(home), timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "worker-1 on node2 exit code 9: restarting it with rank 1 (restart 1 of 1)" in res.stderr
    assert "[worker 1 @ node2] START 3 RESTARTS 1 KEY True" in res.stdout
    assert res.stdout.count("crashing at step 3") == 1            # output not replayed
    want = [-0.125 * 1.5 * sum(range(1, 7))] * 3
    assert res.stdout.count(f"FINAL {want}") == 2, res.stdout
    rec = latest(home)
    assert rec["state"] == "succeeded"
    assert next(p for p in rec["procs"] if p["name"] == "worker-1")["restarts"] == 1
    assert_nothing_left(home)


SERVER_CRASH = textwrap.dedent("""
    import sys, time, pathlib, numpy as np, psnode
    flags = pathlib.Path(sys.argv[1])
    kv = psnode.kv.create('dist_sync')
    kv.set_optimizer(psnode.optimizer.create('sgd', learning_rate=0.125, momentum=0.5))
    for k in ('a', 'b'):
        kv.init(k, np.zeros(3, np.float32))
    for step in range(5):
        if kv.rank == 1 and step == 2:
            deadline = time.monotonic() + 60
            while not (flags / 'go').exists():
                assert time.monotonic() < deadline
                time.sleep(0.02)
        for k in ('a', 'b'):
            kv.push(k, np.full(3, (kv.rank + 1) * (step + 1), np.float32))
        if kv.rank == 0 and step == 2:
            (flags / 'pushed').touch()
        for k in ('a', 'b'):
            kv.pull(k)
    print("FINAL", [kv.pull(k).tolist() for k in ('a', 'b')], flush=True)
    kv.close()
""")


def test_remote_server_killed_is_restarted_from_its_checkpoint(ssh_cluster, home, tmp_path):
    flags = tmp_path / "flags"
    flags.mkdir()
    proc = start_cli(["launch", "-H", "node1,node2", "-s", "2", "--max-restarts", "1",
                      "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-rounds", "1",
                      script(tmp_path, SERVER_CRASH), str(flags)], ssh_cluster.env(home))
    try:
        wait_for(lambda: (flags / "pushed").exists(), 90, "worker 0 to push round 3")
        rec = latest(home)
        server = next(p for p in rec["procs"] if p["name"] == "server-1")
        assert server["host"] == "node2"
        children = Path(f"/proc/{server['pid']}/task/{server['pid']}/children").read_text().split()
        os.kill(int(children[0]), 9)                   # the psnode server under its reaper, on node2
        wait_for(lambda: next(p for p in latest(home)["procs"] if p["name"] == "server-1")["restarts"] == 1,
                 60, "the launcher to restart server-1 on node2")
        (flags / "go").touch()
        out, _ = proc.communicate(timeout=120)
    finally:
        kill_cli(proc)
    assert proc.returncode == 0, out
    assert "server-1 on node2 killed by SIGKILL: restarting it with rank 1 (restart 1 of 1)" in out, out
    # the uninterrupted run: sgd with momentum on the mean gradient 1.5 (step + 1)
    w, mom = 0.0, 0.0
    for step in range(5):
        mom = 0.5 * mom - 0.125 * 1.5 * (step + 1)
        w += mom
    finals = [line.split("FINAL ", 1)[1] for line in out.splitlines() if "] FINAL " in line]
    assert finals == [str([[w] * 3, [w] * 3])] * 2, out
    assert latest(home)["state"] == "succeeded"
    assert_nothing_left(home)
