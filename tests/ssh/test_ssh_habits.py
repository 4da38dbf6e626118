"""horovodrun and torchrun habits over real SSH (three sshd "hosts" on 127.0.0.2-4, conftest.py):
``-H host:slots``, a port written the ssh way, ``-H`` naming a file that is not there,
``-m MODULE`` on remote hosts, ``addr=`` for the job's own traffic, ``--nproc-per-node``.

Every test that starts a job ends by checking that no process of the job remains.
"""
from __future__ import annotations

import json
import textwrap
from pathlib import Path

from tests.support.cli import assert_nothing_left, latest, records, run_cli

SHOW = textwrap.dedent("""
    import json, os, sys
    import numpy as np, psnode.kv
    kv = psnode.kv.create('dist_sync')
    kv.init(3, np.zeros(2, np.float32))
    kv.push(3, np.full(2, kv.rank + 1, np.float32))
    out = np.empty(2, np.float32); kv.pull(3, out=out)
    keys = ["RANK", "LOCAL_RANK", "MASTER_ADDR", "PSNODE_HOST", "PSNODE_SCHEDULER"]
    print("SHOW " + json.dumps({"module": __name__, "args": sys.argv[1:], "sum": float(out[0]) * kv.num_workers,
                                **{k: os.environ.get(k) for k in keys}}))
    kv.close()
""")


def shown(stdout: str) -> list[dict]:
    rows = [json.loads(line.split("SHOW ", 1)[1]) for line in stdout.splitlines() if "SHOW " in line]
    return sorted(rows, key=lambda r: int(r["RANK"]))


def text_of(res) -> str:
    return " ".join((res.stdout + res.stderr).replace("│", " ").split())


def test_inline_host_slots_as_horovodrun(ssh_cluster, home, tmp_path):
    job = tmp_path / "show.py"
    job.write_text(SHOW)
    res = run_cli(["launch", "-H", "node1:2,node2", "-s", "1", str(job)], ssh_cluster.env(home), timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert [(r["RANK"], r["LOCAL_RANK"], r["PSNODE_HOST"], r["sum"]) for r in shown(res.stdout)] == [
        ("0", "0", "127.0.0.2", 6.0), ("1", "1", "127.0.0.2", 6.0), ("2", "0", "127.0.0.3", 6.0)]
    assert_nothing_left(home)


def test_port_field_inline_reaches_the_sshd(ssh_cluster, home, tmp_path):
    """The SSH port written ``HOST:port=N`` (here against a config that gives none)."""
    config = tmp_path / "ssh_config"
    config.write_text(f"Host *\n  User root\n  IdentityFile {ssh_cluster.client_key}\n  IdentitiesOnly yes\n")
    job = tmp_path / "show.py"
    job.write_text(SHOW)
    port = ssh_cluster.port
    res = run_cli(["launch", "-H", f"127.0.0.2:2:port={port},127.0.0.3:port={port}", "-s", "1", str(job)],
                  ssh_cluster.env(home, MXDIST_SSH_CONFIG=str(config)), timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert [r["PSNODE_HOST"] for r in shown(res.stdout)] == ["127.0.0.2", "127.0.0.2", "127.0.0.3"]
    # the ssh way (host:port) says what to write instead, before any connection
    res = run_cli(["launch", "-H", f"127.0.0.2:{port}", str(job)], ssh_cluster.env(home, MXDIST_SSH_CONFIG=str(config)))
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"for SSH port {port} write 127.0.0.2:port={port}" in text_of(res)
    assert "Traceback" not in res.stderr
    # in a hosts file the same words are MXNet's ip:port lines: one host per line, SSH on that port
    hosts = tmp_path / "mxnet_hosts"
    hosts.write_text(f"127.0.0.2:{port}\n127.0.0.3:{port}\n127.0.0.4:{port}\n")
    res = run_cli(["launch", "-H", str(hosts), "-n", "3", "-s", "3", str(job)],
                  ssh_cluster.env(home, MXDIST_SSH_CONFIG=str(config)), timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert [r["PSNODE_HOST"] for r in shown(res.stdout)] == ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    assert_nothing_left(home)


def test_host_colon_n_where_no_sshd_listens_says_slots_and_port(ssh_cluster, home, tmp_path):
    job = tmp_path / "show.py"
    job.write_text(SHOW)
    res = run_cli(["launch", "--launcher", "ssh", "-H", "localhost:2", str(job)], ssh_cluster.env(home))
    assert res.returncode == 3, res.stdout + res.stderr
    text = text_of(res)
    assert f"localhost: cannot connect to 127.0.0.1:{ssh_cluster.port}: connection refused" in text or \
        f"localhost: cannot connect to localhost:{ssh_cluster.port}: connection refused" in text, text
    assert ("-H localhost:port=N, localhost:N in a hosts file, or Port in the ssh config; -H localhost:N means N "
            "slots") in text, text


def test_a_missing_hosts_file_without_a_dot(ssh_cluster, home, tmp_path):
    job = tmp_path / "show.py"
    job.write_text(SHOW)
    res = run_cli(["launch", "-H", "myhosts", str(job)], ssh_cluster.env(home))
    assert res.returncode == 3, res.stdout + res.stderr
    text = text_of(res)
    assert "-H myhosts: neither an existing hosts file (no file myhosts in " in text, text
    assert "nor a host name that resolves" in text
    assert "a hosts file: give its path (-H ./myhosts); a host: check the spelling, DNS, or HostName in the ssh " \
        "config" in text
    assert "unknown host name" not in text and "Traceback" not in res.stderr
    assert_nothing_left(home)


def test_a_long_inline_list_is_refused_by_its_entry_not_a_traceback(ssh_cluster, home, tmp_path):
    spec = ",".join(f"127.0.{i // 200}.{i % 200 + 10}:22{i:03d}" for i in range(32))
    assert len(spec) > 500
    res = run_cli(["launch", "-H", spec, "train.py"], ssh_cluster.env(home))
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr and "File name too long" not in res.stderr
    assert "-H item 1: '127.0.0.10:22000': HOST:N in -H means N slots" in text_of(res)
    assert records(home) == []


def test_module_over_ssh_with_nproc_per_node(ssh_cluster, home, tmp_path):
    work = tmp_path / "work"
    (work / "trainer").mkdir(parents=True)
    (work / "trainer" / "__init__.py").write_text("")
    (work / "trainer" / "main.py").write_text(SHOW)
    res = run_cli(["launch", "-H", "node2,node3", "--nproc-per-node", "2", "--workdir", str(work), "-m",
                   "trainer.main", "--lr", "3"], ssh_cluster.env(home), timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = shown(res.stdout)
    assert [(r["module"], r["args"], r["PSNODE_HOST"], r["LOCAL_RANK"], r["sum"]) for r in rows] == [
        ("__main__", ["--lr", "3"], "127.0.0.3", "0", 10.0), ("__main__", ["--lr", "3"], "127.0.0.3", "1", 10.0),
        ("__main__", ["--lr", "3"], "127.0.0.4", "0", 10.0), ("__main__", ["--lr", "3"], "127.0.0.4", "1", 10.0)]
    assert latest(home)["command"] == ["-m", "trainer.main", "--lr", "3"]
    # preflight looks for the module on every host
    res = run_cli(["launch", "-H", "node2,node3", "--workdir", str(work), "-m", "trainer.nope"], ssh_cluster.env(home))
    assert res.returncode == 3, res.stdout + res.stderr
    text = text_of(res)
    for host in ("node2", "node3"):
        assert f"{host}: no module trainer.nope in {work}" in text, text
    assert_nothing_left(home)


def test_addr_moves_the_jobs_traffic_off_the_ssh_address(ssh_cluster, home, tmp_path):
    """node1 and node2 are reached over SSH at 127.0.0.2 and .3; their processes bind and are
    reached at 127.0.0.12 and .13 (every 127/8 address is this machine's)."""
    hosts = tmp_path / "hosts"
    hosts.write_text("node1 addr=127.0.0.12\nnode2 slots=2 addr=127.0.0.13\n")
    job = tmp_path / "show.py"
    job.write_text(SHOW)
    res = run_cli(["launch", "-H", str(hosts), str(job)], ssh_cluster.env(home), timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = shown(res.stdout)
    assert [(r["PSNODE_HOST"], r["MASTER_ADDR"], r["sum"]) for r in rows] == [
        ("127.0.0.12", "127.0.0.12", 6.0), ("127.0.0.13", "127.0.0.12", 6.0), ("127.0.0.13", "127.0.0.12", 6.0)]
    assert all(r["PSNODE_SCHEDULER"].startswith("127.0.0.12:") for r in rows)
    rec = latest(home)
    assert {p["address"] for p in rec["procs"]} == {"127.0.0.12", "127.0.0.13"}
    assert_nothing_left(home)
