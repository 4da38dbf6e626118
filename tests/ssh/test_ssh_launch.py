"""mxdist over real SSH: three sshd "hosts" on 127.0.0.2-4 (see conftest.py).

Every test ends by checking that no process of the job remains on any host.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.cli import (
    assert_nothing_left,
    group_members,
    kill_cli,
    latest,
    records,
    run_cli,
    start_cli,
    wait_for,
)

TRAIN = textwrap.dedent("""
    import numpy as np, psnode.kv
    kv = psnode.kv.create('dist_sync')
    kv.init(3, np.zeros((2, 3), np.float32))
    kv.push(3, np.full((2, 3), kv.rank + 1, np.float32))
    out = np.empty((2, 3), np.float32); kv.pull(3, out=out)
    assert (out == sum(range(1, kv.num_workers + 1)) / kv.num_workers).all(), out
    print("rank", kv.rank, "of", kv.num_workers, "ok", float(out[0, 0]))
    kv.close()
""")

SHOW = textwrap.dedent("""
    import json, os, sys
    keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "PSNODE_HOST", "MY_VAR"]
    print("ARGS " + json.dumps(sys.argv[1:]))
    print("ENV " + json.dumps({k: os.environ.get(k) for k in keys}))
""")

SLEEPER = textwrap.dedent("""
    import os, time
    print("started rank", os.environ["RANK"], flush=True)
    time.sleep(300)
""")

FAILING = textwrap.dedent("""
    import os, sys, time
    if os.environ["RANK"] == "1":
        print("rank 1 gives up"); sys.exit(3)
    time.sleep(300)
""")


def script(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_psnode_job_over_three_hosts(ssh_cluster, home, tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("# three fake hosts\nnode1 slots=2\n\nnode2\nnode3\n")
    train = script(tmp_path, "train.py", TRAIN)
    res = run_cli(["launch", "-H", str(hosts), "-n", "4", "-s", "2", train], ssh_cluster.env(home), timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    for rank, host in ((0, "node1"), (1, "node1"), (2, "node2"), (3, "node3")):
        assert f"[worker {rank} @ {host}] rank {rank} of 4 ok 2.5" in res.stdout
    rec = latest(home)
    assert rec["state"] == "succeeded" and rec["backend"] == "ssh"
    assert {p["address"] for p in rec["procs"]} == set(ssh_cluster.addresses)
    assert "ok 2.5" in Path(rec["procs"][-1]["log"]).read_text()  # local copy of a remote log
    assert_nothing_left(home)


def test_arguments_and_env_reach_remote_workers(ssh_cluster, home, tmp_path):
    show = script(tmp_path, "show.py", SHOW)
    args = ["a b", "it's", 'say "hi"', "x;touch /tmp/mxdist-pwned", "$(id)"]
    res = run_cli(["launch", "-H", "node2,node3", "-s", "0", "-e", "MY_VAR=v w;$HOME", show, *args],
                  ssh_cluster.env(home))
    assert res.returncode == 0, res.stdout + res.stderr
    lines = [line.split("] ", 1)[1] for line in res.stdout.splitlines() if "] " in line]
    assert [json.loads(l[5:]) for l in lines if l.startswith("ARGS ")] == [args, args]
    envs = sorted((json.loads(l[4:]) for l in lines if l.startswith("ENV ")), key=lambda e: e["RANK"])
    assert [(e["RANK"], e["PSNODE_HOST"], e["LOCAL_RANK"]) for e in envs] == [
        ("0", "127.0.0.3", "0"), ("1", "127.0.0.4", "0")]
    assert all(e["WORLD_SIZE"] == "2" and e["MASTER_ADDR"] == "127.0.0.3" for e in envs)
    assert all(e["MY_VAR"] == "v w;$HOME" for e in envs)
    assert not Path("/tmp/mxdist-pwned").exists()
    assert "v w;$HOME" not in (home / "jobs" / f"{latest(home)['id']}.json").read_text()
    assert_nothing_left(home)


def test_detach_status_logs_stop(ssh_cluster, home, tmp_path):
    sleeper = script(tmp_path, "sleeper.py", SLEEPER)
    env = ssh_cluster.env(home)
    res = run_cli(["launch", "-d", "-H", "node1,node2", "-s", "0", sleeper], env)
    assert res.returncode == 0, res.stdout + res.stderr
    job = res.stdout.strip().splitlines()[-1]
    assert job == latest(home)["id"]
    wait_for(lambda: "started rank 1" in run_cli(["logs", job, "--role", "worker", "--rank", "1"], env).stdout,
             30, "worker 1's first line")
    status = run_cli(["status", "--json"], env)
    assert status.returncode == 0, status.stderr
    view = json.loads(status.stdout)
    assert view["id"] == job
    workers = [n for n in view["nodes"] if n["role"] == "worker"]
    assert sorted(n["host"] for n in workers) == ["node1", "node2"]
    assert all(n["state"] == "running" for n in workers)
    table = run_cli(["status", job], env)
    assert "worker" in table.stdout and "node2" in table.stdout
    stop = run_cli(["stop", job], env)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert "node1: nothing of the job left" in stop.stderr
    assert "node2: nothing of the job left" in stop.stderr
    assert_nothing_left(home)
    again = run_cli(["stop", job], env)
    assert again.returncode == 0, again.stderr
    assert latest(home)["state"] == "stopped"


def test_ctrl_c_stops_every_host(ssh_cluster, home, tmp_path):
    sleeper = script(tmp_path, "sleeper.py", SLEEPER)
    proc = start_cli(["launch", "-H", "node1,node2,node3", "-s", "1", sleeper], ssh_cluster.env(home))
    try:
        seen: list[str] = []

        def three_started() -> bool:
            line = proc.stdout.readline()
            seen.append(line)
            return sum("started rank" in s for s in seen) == 3

        wait_for(three_started, 60, "three workers to start", interval=0)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 130, out
    finally:
        kill_cli(proc)
    assert latest(home)["state"] == "stopped"
    assert_nothing_left(home)


def test_failing_worker_stops_the_job(ssh_cluster, home, tmp_path):
    failing = script(tmp_path, "failing.py", FAILING)
    res = run_cli(["launch", "-H", "node1,node2,node3", "-s", "1", "--grace", "2", failing],
                  ssh_cluster.env(home))
    assert res.returncode == 1, res.stdout + res.stderr
    assert "worker 1 on node2: exit code 3" in res.stderr
    assert "[worker 1 @ node2] rank 1 gives up" in res.stdout   # streamed (the panel omits the tail)
    rec = latest(home)
    assert rec["state"] == "failed"
    assert_nothing_left(home)


def test_unreachable_host_is_reported_and_nothing_starts(ssh_cluster, home, tmp_path):
    show = script(tmp_path, "show.py", SHOW)
    res = run_cli(["launch", "-H", "node1,127.0.0.5", "-s", "0", "--connect-timeout", "3", show],
                  ssh_cluster.env(home))
    assert res.returncode == 3, res.stdout + res.stderr
    assert "preflight failed" in res.stderr and "127.0.0.5" in res.stderr
    assert "cannot connect" in res.stderr
    closed = run_cli(["launch", "-H", "127.0.0.2:port=9", "-s", "0", show], ssh_cluster.env(home))
    assert closed.returncode == 3 and "127.0.0.2:9: connection refused" in closed.stderr, closed.stderr
    assert "Errno None" not in closed.stderr
    assert "no job recorded" in closed.stderr and not records(home)      # nothing started: nothing kept
    status = run_cli(["status"], ssh_cluster.env(home))
    assert status.returncode == 1 and "Traceback" not in status.stderr, status.stdout + status.stderr
    assert_nothing_left(home)


def test_unknown_and_changed_host_keys_are_refused(ssh_cluster, home, tmp_path):
    show = script(tmp_path, "show.py", SHOW)
    known = tmp_path / "known_hosts"
    # node2's key missing, node3's key replaced by another host's key
    known.write_text(ssh_cluster.known_hosts_line("127.0.0.2")
                     + ssh_cluster.known_hosts_line("127.0.0.2").replace("127.0.0.2", "127.0.0.4"))
    env = ssh_cluster.env(home, MXDIST_KNOWN_HOSTS=str(known))
    res = run_cli(["launch", "-H", "node1,node2,node3", "-s", "0", show], env)
    assert res.returncode == 3, res.stdout + res.stderr
    assert "unknown host key" in res.stderr and "CHANGED" in res.stderr
    assert res.stderr.count("SHA256:") >= 3          # unknown: its key; changed: expected and got
    assert "--accept-new-host-keys" in res.stderr
    assert all(p["pid"] is None for r in records(home) for p in r["procs"])

    # explicit opt-in: the unknown key is recorded, the changed one is still refused
    res = run_cli(["launch", "-H", "node1,node2", "-s", "0", "--accept-new-host-keys", show], env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"[127.0.0.3]:{ssh_cluster.port} {ssh_cluster.host_pubkeys['127.0.0.3']}" in known.read_text()
    res = run_cli(["launch", "-H", "node3", "-s", "0", "--accept-new-host-keys", show], env)
    assert res.returncode == 3 and "CHANGED" in res.stderr
    assert_nothing_left(home)


def test_sync_copies_a_directory_and_skips_unchanged_files(ssh_cluster, home, tmp_path):
    src = tmp_path / "project"
    (src / "pkg").mkdir(parents=True)
    (src / "show.py").write_text(SHOW)
    (src / "pkg" / "data.bin").write_bytes(b"x" * 100_000)
    dest = tmp_path / "remote-copy"
    env = ssh_cluster.env(home)
    res = run_cli(["launch", "-H", "node1", "-s", "0", "--sync", f"{src}:{dest}", "--workdir", str(dest),
                   "show.py", "synced"], env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert 'ARGS ["synced"]' in res.stdout
    assert (dest / "pkg" / "data.bin").read_bytes() == b"x" * 100_000
    assert "sync" in res.stderr  # the progress bar's description

    from mxdist.backends.ssh import SshBackend
    from mxdist.planning.hosts import Host

    backend = SshBackend(workdir=str(dest), python="python3", ssh_config=str(ssh_cluster.ssh_config),
                         known_hosts=str(ssh_cluster.known_hosts))
    try:
        host = backend.resolve(Host("node1"))
        assert backend.sync(host, str(src), str(dest), lambda n: None) == (0, 2)
        (src / "show.py").write_text(SHOW + "\n# changed\n")
        assert backend.sync(host, str(src), str(dest), lambda n: None) == (1, 1)
    finally:
        backend.close()
    assert_nothing_left(home)


def test_a_hosts_short_operations_share_one_python(ssh_cluster, home, tmp_path):
    """One Python start per host for any number of short operations (a status frame, a stop:
    a round trip each); one asked while that agent is busy runs on its own, at once; an agent
    that died is replaced; close() ends it."""
    from mxdist.backends.base import BackendError
    from mxdist.backends.ssh import SshBackend
    from mxdist.job.records import ProcRecord
    from mxdist.planning.hosts import Host

    starts = tmp_path / "python-starts"
    python = tmp_path / "counting-python"
    python.write_text(f'#!/bin/sh\necho "$1 $$" >> {starts}\nexec {sys.executable} "$@"\n')   # $$: the Python
    python.chmod(0o755)

    def started() -> list[str]:
        return [line.split()[0] for line in starts.read_text().splitlines()] if starts.exists() else []

    def serving() -> list[int]:
        return [int(line.split()[1]) for line in starts.read_text().splitlines() if line.startswith("-c ")]

    def alive(pid: int) -> bool:
        with contextlib.suppress(OSError):
            return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
        return False

    termed = tmp_path / "termed"
    stubborn = subprocess.Popen(["sh", "-c", f"trap 'touch {termed}' TERM; while :; do sleep 0.1; done"],
                                start_new_session=True)
    proc = ProcRecord(name="worker-0", role="worker", rank=0, host="node1", address="127.0.0.2", log="",
                      pid=stubborn.pid, rc_file=str(tmp_path / "no.rc"))
    backend = SshBackend(workdir=str(tmp_path), python=str(python), ssh_config=str(ssh_cluster.ssh_config),
                         known_hosts=str(ssh_cluster.known_hosts))
    try:
        host = backend.resolve(Host("node1"))
        for _ in range(5):
            assert backend.status(host, [proc])[0].alive
        assert started() == ["-c"]
        with ThreadPoolExecutor(1) as pool:
            stop = pool.submit(backend.stop, host, [proc], 4.0)      # TERM does not end it: 4 s, then KILL
            wait_for(termed.exists, 10, "the stop's TERM")
            assert backend.status(host, [proc])[0].alive and not stop.done()   # meanwhile, on its own
            assert started() == ["-c", "-"]
            assert stop.result(30) == [] and stubborn.wait(10) == -signal.SIGKILL
        [first] = serving()
        os.kill(first, signal.SIGKILL)

        def answers() -> bool:
            with contextlib.suppress(BackendError):
                return not backend.status(host, [proc])[0].alive
            return False

        wait_for(answers, 10, "an answer from a new serving agent")
        assert started() == ["-c", "-", "-c"] and alive(serving()[1])
    finally:
        backend.close()
        if stubborn.poll() is None:
            os.killpg(stubborn.pid, signal.SIGKILL)
            stubborn.wait(10)
    wait_for(lambda: not alive(serving()[1]), 10, "the serving agent's end once the backend is closed")


def test_missing_remote_python_is_reported_per_host(ssh_cluster, home, tmp_path):
    show = script(tmp_path, "show.py", SHOW)
    res = run_cli(["launch", "-H", "node1,node2", "-s", "0", "--python", "/nonexistent/python3", show],
                  ssh_cluster.env(home))
    assert res.returncode == 3, res.stdout + res.stderr
    assert res.stderr.count("/nonexistent/python3 not found") == 2 and "--python" in res.stderr
    assert all(p["pid"] is None for r in records(home) for p in r["procs"])


@pytest.mark.parametrize("flags, mode", [([], "authenticated"), (["--encrypt"], "encrypted"),
                                         (["--insecure"], "insecure")], ids=["default", "encrypt", "insecure"])
def test_examples_over_ssh(ssh_cluster, home, tmp_path, flags, mode):
    """The README's examples run unchanged with -H, in each of the three security modes: the
    numpy MLP (2 servers) and DDP/gloo."""
    root = Path(__file__).resolve().parents[2]
    env = ssh_cluster.env(home)
    mlp = run_cli(["launch", *flags, "-H", "node1,node2", "-n", "2", "-s", "2", "--workdir", str(root),
                   str(root / "examples" / "mlp_numpy.py"), "--epochs", "2"], env, timeout=180)
    assert mlp.returncode == 0, mlp.stdout + mlp.stderr
    acc = [line for line in mlp.stdout.splitlines() if "accuracy=" in line]
    assert len(acc) == 1 and "[worker 0 @ node1]" in acc[0] and float(acc[0].split("accuracy=")[1]) > 0.9
    rec = latest(home)
    assert rec["security"] == mode and (rec["key_file"] is None) == (mode == "insecure")
    assert_nothing_left(home)
    ddp = run_cli(["launch", *flags, "-H", "node1,node2", "-n", "2", "-s", "0", "--workdir", str(root),
                   str(root / "examples" / "ddp_gloo.py"), "--epochs", "1"], env, timeout=180)
    assert ddp.returncode == 0, ddp.stdout + ddp.stderr
    assert "accuracy=" in ddp.stdout and latest(home)["security"] == mode
    assert_nothing_left(home)


RAISES = textwrap.dedent("""
    import time, numpy as np, psnode
    kv = psnode.kv.create('dist_sync')
    kv.init('w', np.zeros(2, np.float32))
    for step in range(200):
        if kv.rank == 1 and step == 3:
            raise ValueError(f"bad batch at step {step}")
        kv.push('w', np.ones(2, np.float32)); kv.pull('w')
        time.sleep(0.02)
    kv.close()
""")

TRAIN_SLOW = textwrap.dedent("""
    import time, numpy as np, psnode
    kv = psnode.kv.create('dist_sync')
    kv.init('w', np.zeros(2, np.float32))
    print("TRAINING", kv.rank, flush=True)
    for step in range(3000):
        kv.push('w', np.ones(2, np.float32)); kv.pull('w')
        time.sleep(0.02)
    kv.close()
""")


def test_root_cause_headline_over_ssh_and_remote_run_files_are_private_then_removed(ssh_cluster, home, tmp_path):
    env = ssh_cluster.env(home)
    res = run_cli(["launch", "-H", "node1,node2", "-n", "2", "-s", "2", script(tmp_path, "raises.py", RAISES)],
                  env, timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "worker 1 on node2: ValueError: bad batch at step 3" in res.stderr
    rec = latest(home)
    assert rec["root_cause"]["headline"] == "worker 1 on node2: ValueError: bad batch at step 3"
    worker0 = [line for line in res.stdout.splitlines() if line.startswith("[worker 0 @ node1]")]
    assert len(worker0) == 1 and "ended" in worker0[0], worker0          # one line, no traceback
    assert not (home / "remote" / rec["id"]).exists()                    # run files gone on every host
    assert_nothing_left(home)


def remote_run_dir_modes(run_dir: Path) -> dict[str, int]:
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in [run_dir, *run_dir.iterdir()]}


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def test_a_host_that_stops_answering_is_named_and_not_waited_on(ssh_cluster, home, tmp_path):
    """node3 freezes (its sshd and the job's processes there get SIGSTOP, as if cut off): the
    scheduler's verdict names its worker within the heartbeat timeout, launch ends a few seconds
    later reporting node3 'not verified', and the next stop, once node3 is back, cleans it up."""
    env = ssh_cluster.env(home)
    proc = start_cli(["launch", "-H", "node1,node2,node3", "-n", "3", "-s", "2", "--heartbeat-interval", "0.5",
                      "--grace", "1", script(tmp_path, "slow.py", TRAIN_SLOW)], env)
    frozen: list[int] = []
    try:
        seen: list[str] = []
        wait_for(lambda: seen.append(proc.stdout.readline()) or sum("TRAINING" in s for s in seen) == 3,
                 90, "three workers training", interval=0)
        rec = latest(home)
        run_dir = home / "remote" / rec["id"]
        modes = remote_run_dir_modes(run_dir)
        assert modes.pop(run_dir.name) == 0o700 and set(modes.values()) == {0o600}, modes
        node3 = [p["pid"] for p in rec["procs"] if p["host"] == "node3"]
        frozen = descendants(ssh_cluster.sshd_pids["127.0.0.4"]) + [
            m for g in node3 for m in group_members(g)]
        t0 = time.monotonic()
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        out, _ = proc.communicate(timeout=60)
        took = time.monotonic() - t0
        assert proc.returncode == 1, out
        assert took < 2.5 + 10, (took, out)              # heartbeat timeout + a few seconds
        assert "worker 2 on node3: stopped responding" in out, out
        assert "node3: not verified" in out, out
        final = latest(home)
        assert final["state"] == "failed" and "node3" in final["unverified"]
    finally:
        for pid in frozen:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)
        kill_cli(proc)
    stop = run_cli(["stop", final["id"]], env)
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert "node3: nothing of the job left" in stop.stderr
    assert not latest(home)["unverified"]
    status = run_cli(["status", final["id"]], env)
    assert status.returncode == 0 and "not verified" not in status.stdout + status.stderr, status.stdout
    assert_nothing_left(home)


def test_preflight_names_each_module_the_job_cannot_import_with_its_python(ssh_cluster, home, tmp_path):
    """From the checkout (psnode/ in the working directory), a --python without numpy and zmq
    (a fresh venv without them, whatever this machine's Pythons have) is refused, one row per
    host, before anything starts."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    python = str(bare / "bin" / "python")
    lacks = subprocess.run([python, "-c", "import importlib.util as u; print([m for m in ('numpy', 'zmq') "
                            "if u.find_spec(m) is None])"], capture_output=True, text=True, timeout=30)
    assert lacks.stdout.strip() == "['numpy', 'zmq']", lacks.stdout + lacks.stderr    # the state asserted on
    env = ssh_cluster.env(home)
    env.pop("PYTHONPATH")
    res = run_cli(["launch", "-H", "node1,node2", "-n", "2", "--python", python, "examples/mlp_numpy.py"], env)
    assert res.returncode == 3, res.stdout + res.stderr
    text = " ".join(res.stderr.replace("│", " ").split())
    root = str(Path(__file__).resolve().parents[2])
    for node in ("node1", "node2"):
        assert (f"{node}: {python} cannot import numpy, zmq in {root}: "
                "ModuleNotFoundError: No module named 'numpy'") in text, res.stderr
    assert text.count(f"install them for that Python: {python} -m pip install numpy pyzmq; "
                      "or pass --python with a Python that has them on that host") == 2, res.stderr
    assert "Traceback" not in res.stdout + res.stderr
    assert all(p["pid"] is None for r in records(home) for p in r["procs"])


def test_preflight_checks_psnode_from_the_scripts_folder(ssh_cluster, home, tmp_path):
    """psnode importable in the working directory (python -m psnode finds it there) but not from
    the script's folder, where ``python sub/train.py`` looks: refused before anything starts."""
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / "psnode").symlink_to(Path(__file__).resolve().parents[2] / "psnode")
    (work / "sub" / "train.py").write_text(TRAIN)
    env = ssh_cluster.env(home)
    env.pop("PYTHONPATH")
    import numpy
    import zmq
    # this machine's python3 (without mxdist's editable install) with the test's numpy and zmq
    site = ":".join(sorted({str(Path(m.__file__).resolve().parents[1]) for m in (numpy, zmq)}))
    res = run_cli(["launch", "-H", "node1", "-n", "1", "--workdir", str(work), "--python", "/usr/bin/python3",
                   "-e", f"PYTHONPATH={site}", "sub/train.py"], env)
    assert res.returncode == 3, res.stdout + res.stderr
    text = " ".join(res.stderr.replace("│", " ").split())
    assert (f"node1: /usr/bin/python3 cannot import psnode from sub/train.py's folder {work}/sub (python "
            f"puts the script's folder on its path, not {work}): ModuleNotFoundError: No module named 'psnode'"
            ) in text, res.stderr
    assert "/usr/bin/python3 -m pip install mxdist (mxdist holds psnode" in text, res.stderr
    assert all(p["pid"] is None for r in records(home) for p in r["procs"])


def test_sync_destination_is_the_working_directory(ssh_cluster, home, tmp_path):
    """``--sync .:DEST`` from the project: the processes run in DEST (no --workdir); --dry-run
    says so, and where the copy goes; an explicit --workdir still wins."""
    src = tmp_path / "project"
    src.mkdir()
    (src / "where.py").write_text("import os\nprint('CWD', os.getcwd())\n")
    dest = tmp_path / "remote-copy"
    env = ssh_cluster.env(home)

    def mxdist(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "mxdist", *args], env=env, cwd=src, capture_output=True,
                              text=True, timeout=120)

    dry = mxdist("launch", "--dry-run", "-H", "node1", "-s", "0", "--sync", f".:{dest}", "where.py")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert f"--sync copies {src} to {dest} on every host first" in dry.stdout, dry.stdout
    assert f"working directory of every process: {dest}" in dry.stdout, dry.stdout
    res = mxdist("launch", "-H", "node1", "-s", "0", "--sync", f".:{dest}", "where.py")
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"[worker 0 @ node1] CWD {dest}" in res.stdout, res.stdout
    assert latest(home)["workdir"] == str(dest)
    res = mxdist("launch", "-H", "node1", "-s", "0", "--sync", f".:{dest}", "--workdir", str(src), "where.py")
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"[worker 0 @ node1] CWD {src}" in res.stdout, res.stdout
    assert_nothing_left(home)


SERVERS_AT = textwrap.dedent("""
    import numpy as np, psnode.kv
    kv = psnode.kv.create('dist_sync')
    kv.init('w', np.zeros(3_000_000, np.float32))     # above the bound: sliced over both servers
    out = np.empty(3_000_000, np.float32)
    kv.pushpull('w', np.full(3_000_000, kv.rank + 1, np.float32), out=out)
    assert (out == 1.5).all(), out[:4]
    print("servers at", " ".join(kv._engine._address(s) for s in range(kv.num_servers)), flush=True)
    kv.close()
""")


def test_server_hosts_run_the_servers_and_nothing_else(ssh_cluster, home, tmp_path):
    """--server-hosts: the servers run on those hosts (the workers reach them there), the
    workers and the scheduler on -H's; the dry run shows the same placement."""
    train = script(tmp_path, "servers_at.py", SERVERS_AT)
    args = ["launch", "-H", "node1,node2", "--server-hosts", "node3", "-s", "2", train]
    dry = run_cli([*args[:1], "--dry-run", *args[1:]], ssh_cluster.env(home))
    assert dry.returncode == 0, dry.stdout + dry.stderr
    rows = [line.split("│")[1:4] for line in dry.stdout.splitlines() if line.startswith("│")]
    assert [[c.strip() for c in r] for r in rows] == [
        ["node1", "scheduler", ""], ["node3", "server", "0"], ["node3", "server", "1"],
        ["node1", "worker", "0"], ["node2", "worker", "1"]], dry.stdout
    res = run_cli(args, ssh_cluster.env(home), timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    rec = latest(home)
    assert rec["state"] == "succeeded"
    where = {p["name"]: p["address"] for p in rec["procs"]}
    assert where == {"scheduler": "127.0.0.2", "server-0": "127.0.0.4", "server-1": "127.0.0.4",
                     "worker-0": "127.0.0.2", "worker-1": "127.0.0.3"}, where
    for rank, host in ((0, "node1"), (1, "node2")):
        line = next(line for line in res.stdout.splitlines() if f"[worker {rank} @ {host}] servers at" in line)
        addresses = line.split("servers at ", 1)[1].split()
        assert len(addresses) == 2 and all("127.0.0.4:" in a for a in addresses), line
    assert_nothing_left(home)


def test_server_hosts_refused_with_a_workers_host(ssh_cluster, home, tmp_path):
    res = run_cli(["launch", "-H", "node1,node2", "--server-hosts", "node2", "--dry-run", "python", "-c", "pass"],
                  ssh_cluster.env(home))
    assert res.returncode != 0
    assert "--server-hosts node2: also among the workers' hosts (-H)" in res.stdout + res.stderr
