"""Attacks on a running job from outside it: another Unix user, and a process of another job.

Shared by the harness test (``tests/cluster/test_auth.py``), the ``mxdist launch`` test on this
machine (``tests/cluster/test_launch_auth.py``) and the SSH-testbed test (``tests/ssh/test_ssh_auth.py``):

* :func:`job_sockets` -- what the job listens on, read (as root) from ``/proc``: every TCP
  port and every abstract Unix address (a server's same-host data plane) of every process in
  the job's process groups.  The tests aim the attacks at all of them, and check that the
  targets they learnt from the job's status are exactly these.
* :func:`run_outsider` -- ``outsider.py`` as the other user: it learns job ids and ports as any
  local user can and sends STOP, STATUS, REGISTER and a push to every TCP port, and a
  same-host HELLO to every Unix address; :func:`check_outsider` asserts that each one was
  refused before a message reached psnode (and returns how many connections each TCP port got,
  for the job's own ``refused`` counters).
* :data:`OTHER_JOB` -- a script that runs with *another* job's secret (``PSNODE_KEY_FILE``)
  and speaks psnode properly (REGISTER, STATUS, STOP to the scheduler, a push to each server,
  a HELLO with a token of its own secret to each Unix address); it prints one JSON line.
"""
from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any

from mxdist.backends import agent
from psnode.errors import PeerLost
from psnode.net.security import Security
from psnode.scheduler.client import status as scheduler_status
from tests.support.cli import kill_cli, run_cli, wait_for

HERE = Path(__file__).resolve().parent
OUTSIDER = (HERE / "outsider.py").read_text()
#: a launched job's id in its processes' command lines: the reaper's ``<run dir>/<id>/<name>.rc``
LAUNCHED_JOB_ID = r"/(\d{8}-\d{6}-[0-9a-f]{4})/(?:scheduler|server-\d+|worker-\d+)\.rc"
COMMANDS = ("stop", "status", "register", "data")
MECHANISMS = ("NULL", "PLAIN")

OTHER_JOB = """
import json, os, socket, sys, time
import numpy as np
from psnode.protocol import Command
from psnode.net.security import Plane, Security
from psnode.samehost.handshake import hello_label
from psnode.net.transport import Poller, Transport
job, scheduler, *rest = sys.argv[1:]
servers = [t for t in rest if not t.startswith("@")]
sec = Security.load(os.environ["PSNODE_KEY_FILE"])          # the secret of *its own* job
t = Transport(job, "worker", 2**22, sec)
host, port = scheduler.rsplit(":", 1)
chans = [t.dealer(host, int(port), "worker-other", Plane.CONTROL)]
for cmd, body in ((Command.REGISTER, {"role": "worker", "host": "127.0.0.1", "port": 0, "pid": 1, "rank": 0}),
                  (Command.STATUS, {}), (Command.STOP, {"reason": "another job"})):
    chans[0].send(cmd, body)
for s in servers:
    host, port = s.rsplit(":", 1)
    chans.append(t.dealer(host, int(port), "w0", Plane.DATA))
    chans[-1].send(Command.DATA, {"ops": [{"op": "push", "k": "w", "p": 0, "q": 1, "a": 0, "id": 1}]},
                   [np.full(4, 1000, np.float32)])
poller = Poller()
for c in chans:
    poller.add(c)
answers, end = 0, time.monotonic() + 10
while time.monotonic() < end and t.refused < len(chans):     # each link refused at least once
    if poller.poll(0.05):
        answers += sum(c.recv() is not None for c in chans)
answers += sum(c.recv() is not None for c in chans)
hellos = []
for name in (t_ for t_ in rest if t_.startswith("@")):
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as u:
        u.settimeout(5)
        u.connect("\\0" + name[1:])
        token = sec.proof(hello_label(job, 0)).hex()
        u.send(b"H" + json.dumps({"job": job, "rank": 0, "pid": os.getpid(), "token": token, "segs": []}).encode())
        data = u.recv(65536)
        hellos.append(data[:1].decode() + (json.loads(data[1:])["reason"] if data[:1] == b"X" else ""))
print("OTHER-JOB", json.dumps({"answers": answers, "refused": t.refused, "hellos": hellos}), flush=True)
t.close()
"""


TRAIN = textwrap.dedent("""
    import numpy as np, psnode, sys, time, os
    kv = psnode.kv.create('dist_sync')
    kv.init('w', np.zeros(4, np.float32))
    kv.barrier()
    deadline = time.monotonic() + 90
    while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:   # attacked meanwhile
        time.sleep(0.05)
    kv.push('w', np.full(4, kv.rank + 1, np.float32))
    got = kv.pull('w')
    print("PULLED", got.tolist(), flush=True)
    assert (got == 1.5).all(), got
    kv.close()
""")


def finish_attacked_job(proc: subprocess.Popen[str], home: Path, rec: dict) -> None:
    """Wait for the attacked job of :data:`TRAIN` (its go file touched) to end: it succeeds,
    both workers pulled the exact average, and its record says so."""
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        kill_cli(proc)
    assert proc.returncode == 0, out
    assert out.count("PULLED [1.5, 1.5, 1.5, 1.5]") == 2, out
    assert json.loads((home / "jobs" / f"{rec['id']}.json").read_text())["state"] == "succeeded"


def _status(rec: dict, key: str | None) -> dict | None:
    try:
        return scheduler_status(rec["scheduler"], rec["id"], key_file=key, timeout=1.0).to_body()
    except PeerLost:
        return None


def _counts(st: dict, servers: list[dict]) -> list[int]:
    """The scheduler's refusals, then each server's (in the order of ``servers``)."""
    by_rank = {n["rank"]: n["refused"] for n in st["nodes"] if n["role"] == "server"}
    return [st["refused"], *(by_rank[s["rank"]] for s in servers)]


def _counted(rec: dict, key: str, servers: list[dict], want: list[int], more: int) -> dict | None:
    """The status once the scheduler and every server counted at least ``want`` + ``more``."""
    st = _status(rec, key)
    return st if st and all(n >= w + more for n, w in zip(_counts(st, servers), want, strict=True)) else None


def attack_a_running_job(other_user, home: Path, env: dict[str, str], rec: dict, other_launch: list[str],
                         tmp_path: Path) -> None:
    """The whole attack on the running job ``rec`` (its processes all on this machine): the
    outsider, then a worker of another job launched with ``other_launch`` (``mxdist launch``
    words before the script), every refusal checked and counted."""
    key = rec["key_file"]
    secret = Security.load(key)
    st = wait_for(lambda: (s := _status(rec, key)) and s["started"] and s, 30, "the job's scheduler to answer")
    servers = sorted((n for n in st["nodes"] if n["role"] == "server"), key=lambda n: n["rank"])
    tcp = [rec["scheduler"]] + [f"{n['host']}:{n['port']}" for n in servers]
    listening, unix_found = job_sockets([p["pid"] for p in rec["procs"]])
    assert set(tcp) == listening, (tcp, listening)           # every TCP port of the job is attacked
    unix = sorted(unix_found)
    assert unix == sorted(f"@psnode.{rec['id']}.{n['host']}.{n['port']}" for n in servers)
    # the secret is in no command line and not in the record
    cmdlines = b"".join(p.read_bytes() for p in Path("/proc").glob("[0-9]*/cmdline") if p.exists())
    words = (secret.token.hex().encode(), secret.curve_secret)
    assert not [w for w in words if w in cmdlines]
    assert not [w for w in words if w in (home / "jobs" / f"{rec['id']}.json").read_bytes()]

    seen = run_outsider(other_user, tcp + unix)
    tried = check_outsider(seen, rec["id"], tcp, unix)
    want = [tried[t] for t in tcp]
    st = wait_for(lambda: _counted(rec, key, servers, want, 0), 15, f"refusal counts {want} (scheduler, servers)")
    assert _counts(st, servers) == want, (st, tried)

    other = run_cli([*other_launch, str(script(tmp_path, "other.py", OTHER_JOB)), rec["id"], *tcp, *unix],
                    env, timeout=120)
    assert other.returncode == 0, other.stdout + other.stderr
    check_other_job(other_job_report(other.stdout), rec["id"], links=len(tcp), unix=len(unix))
    st = wait_for(lambda: _counted(rec, key, servers, want, 1), 15,
                  "the other job's refusals counted by the scheduler and each server")
    assert all(n["state"] == "alive" and n["pushes"] == 0 for n in st["nodes"] if n["role"] == "server")
    assert sorted(n["rank"] for n in st["nodes"] if n["role"] == "worker") == [0, 1]
    # each server logged every refused HELLO (the outsider's, the other job's); remote logs are
    # copied here as they grow
    hellos = {u: sum(a["target"] == u for a in seen["attempts"]) for u in unix}
    expected = [hellos[f"@psnode.{rec['id']}.{n['host']}.{n['port']}"] + 1 for n in servers]
    logs = {p["rank"]: Path(p["log"]) for p in rec["procs"] if p["role"] == "server"}

    def logged() -> list[int]:
        return [logs[n["rank"]].read_text().count("refused a same-host connection")
                if logs[n["rank"]].exists() else 0 for n in servers]

    wait_for(lambda: logged() == expected, 15, f"the servers to log {expected} refused HELLOs",
             describe=lambda: str(logged()))
    # the job's own user still gets through: mxdist status (with the launcher's copy of the secret)
    view = json.loads(run_cli(["status", rec["id"], "--json"], env).stdout)
    assert view["security"] == secret.mode.value and view["state"] == "running", view
    assert view["source"].startswith("live from the scheduler"), view


def script(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def _socket_inodes(pids: list[int]) -> set[int]:
    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(int(link[8:-1]))
    return inodes


def job_sockets(pgids: list[int]) -> tuple[set[str], set[str]]:
    """(``host:port`` of every listening TCP socket, ``@name`` of every listening abstract Unix
    socket) of the processes in the process groups ``pgids`` (the job's recorded pids)."""
    inodes = _socket_inodes([pid for members in agent.group_members(pgids).values() for pid in members])
    tcp = set()
    with open("/proc/net/tcp") as fh:
        for line in fh.readlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and int(cols[9]) in inodes:
                ip_hex, port_hex = cols[1].split(":")
                ip = ".".join(str(b) for b in reversed(bytes.fromhex(ip_hex)))
                tcp.add(f"{ip}:{int(port_hex, 16)}")
    unix = set()
    with open("/proc/net/unix") as fh:
        for line in fh.readlines()[1:]:
            cols = line.split()
            if len(cols) >= 8 and int(cols[3], 16) & 0x10000 and int(cols[6]) in inodes and cols[7].startswith("@"):
                unix.add(cols[7])
    return tcp, unix


def run_outsider(user: Any, targets: list[str], pattern: str = LAUNCHED_JOB_ID, **env: str) -> dict[str, Any]:
    """outsider.py as ``user`` (the ``other_user`` fixture) against ``targets``; its report."""
    res = user.run([user.python, "-", pattern, *targets], input=OUTSIDER, env=env, timeout=120)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def check_outsider(seen: dict[str, Any], job_id: str, tcp: list[str], unix: list[str]) -> dict[str, int]:
    """Assert that the outsider found the job (id from /proc, every target listening) and that
    every attempt was refused before a message reached psnode; connections per TCP target."""
    assert job_id in seen["jobs"], seen["jobs"]
    assert {tuple(t.rsplit(":", 1)) for t in tcp} <= {(h, str(p)) for h, p in seen["listening"]}
    assert set(unix) <= set(seen["unix"]), (unix, seen["unix"])
    attempts = seen["attempts"]
    mine = {(a["target"], a["cmd"], a["mechanism"]) for a in attempts if a["job"] == job_id}
    assert mine == {(t, c, m) for t in tcp for c in COMMANDS for m in MECHANISMS} | {
        (u, "hello", "token") for u in unix}, mine
    answered = [a for a in attempts if (a["messages"] and a["cmd"] != "hello") or a["answer"]]
    assert not answered, answered
    for a in attempts:           # the job hung up during the handshake: never READY or WELCOME
        assert not {"READY", "WELCOME"} & set(a["commands"]), a
    hellos = [a for a in attempts if a["cmd"] == "hello"]
    assert all("is not of this job's user" in (a["refused"] or "") for a in hellos), hellos
    return {t: sum(a["target"] == t for a in attempts) for t in tcp}


def other_job_report(output: str) -> dict[str, Any]:
    """The JSON line :data:`OTHER_JOB` printed (within a launcher's prefixed output too)."""
    line = next(x for x in output.splitlines() if "OTHER-JOB " in x)
    return json.loads(line.split("OTHER-JOB ", 1)[1])


def check_other_job(report: dict[str, Any], job_id: str, links: int, unix: int) -> None:
    """Nothing of the other job's was answered; every link and HELLO refused for its secret."""
    assert report["answers"] == 0 and report["refused"] >= links, report
    assert len(report["hellos"]) == unix, report
    assert all(h.startswith("Xprocess ") and h.endswith(f" does not hold the secret of job {job_id}")
               for h in report["hellos"]), report
