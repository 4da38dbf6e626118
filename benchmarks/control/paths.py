"""The project's modules that two paths cross, in the order first entered, counted with
``sys.setprofile``.

    python benchmarks/control/paths.py                              # both paths (ssh: root, /usr/sbin/sshd)
    python benchmarks/control/paths.py --path push --json /tmp/push.json
    python benchmarks/control/paths.py --path ssh
    python benchmarks/control/paths.py --tree /tmp/other-checkout --python /tmp/other-checkout/.venv/bin/python

- **push**: a same-host ``dist_sync`` push of one small key (16 float32) on the user's thread,
  in a job of one worker and one server on 127.0.0.1 (scheduler, server and worker started
  through the env contract, ``python -m psnode``).  After three warm-up rounds (push, pull),
  the worker profiles its own thread from the call of ``KVStore.push`` until the first send on
  a Unix ``SOCK_SEQPACKET`` socket (the datagram naming the array in the shared segment); the
  rest of the push, up to its return, is listed apart.  Also recorded: the call edges between
  psnode modules (caller -> callee), the entries in order (each call into a module from another
  psnode module, its caller the nearest psnode frame) and which of them go back into a module
  entered before, the Python function calls of any module up to the datagram, and whether the
  push sent anything over ZeroMQ.
- **ssh**: ``mxdist launch -H node1 -n 1 -s 1 train.py`` with ``node1`` a real OpenSSH sshd
  started here on 127.0.0.2 (its keys, config and known_hosts in a temp dir, as tests/ssh does;
  needs root and ``/usr/sbin/sshd``).  The launching process runs the typer app of
  ``mxdist.main`` (imported before profiling) with every thread profiled, until the first of the
  job's processes is handed to a remote host (the first agent request ``spawn`` written to an
  SSH channel), then on to the job's end.

A module is crossed when one of its functions runs (a ``call`` event whose code belongs to the
module, by its globals' ``__name__``: methods a dataclass generates count for the dataclass's
module; module bodies, i.e. imports, do not count).  Only the package's own modules are
listed (``psnode.*`` for push, ``mxdist.*`` for ssh).

``--tree DIR`` measures another checkout of the project (its psnode and cli, through
``--python``, default ``DIR/.venv/bin/python`` when it exists): the processes measured run with
``PYTHONPATH=DIR`` from ``DIR``; this script and the sshd helpers stay this checkout's.
Prints both lists and their counts; ``--json FILE`` writes them.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARK = "PATHSRESULT "

#: The profiler both measured processes run (source: it runs in the measured tree's Python).
RECORDER = textwrap.dedent('''
    import socket, sys, threading

    class Recorder:
        """Modules of package ``root`` whose functions run, in first-entry order, per window."""

        def __init__(self, root, edges=False):
            self.root = root
            self.edges_on = edges
            self.order = []          # modules, first entry first
            self.seen = set()
            self.in_source = set()   # modules entered through code of their source file
            self.edges = set()       # (caller module, callee module), caller the nearest package frame
            self.marks = {}          # name -> how many modules were crossed when it happened
            self.entry_marks = {}    # name -> how many entries there were when it happened
            self.calls = 0           # Python function calls, any module (module bodies aside)
            self.call_marks = {}     # name -> how many calls there were when it happened
            self.entries = []        # the module called, for each call from another package module
            self.events = []         # what the marks saw (strings)

        def module(self, frame):
            name = frame.f_globals.get("__name__") or ""
            if name == self.root or name.startswith(self.root + "."):
                return name
            return None

        def mark(self, name, what=""):
            if name not in self.marks:
                self.marks[name] = len(self.order)
                self.entry_marks[name] = len(self.entries)
                self.call_marks[name] = self.calls
                if what:
                    self.events.append(f"{name}: {what}")

        def enter(self, frame):
            if frame.f_code.co_name == "<module>":
                return
            self.calls += 1
            mod = self.module(frame)
            if mod is None:
                return
            if mod not in self.seen:
                self.seen.add(mod)
                self.order.append(mod)
            if not frame.f_code.co_filename.startswith("<"):
                self.in_source.add(mod)
            if self.edges_on:
                up = frame.f_back
                for _ in range(64):
                    if up is None:
                        break
                    caller = self.module(up)
                    if caller is not None and up.f_code.co_name != "<module>":
                        if caller != mod:
                            self.edges.add((caller, mod))
                            self.entries.append(mod)
                        break
                    up = up.f_back

        def result(self):
            return {"order": self.order, "marks": self.marks, "events": self.events,
                    "entries": self.entries, "entry_marks": self.entry_marks, "call_marks": self.call_marks,
                    "edges": sorted(self.edges),
                    "generated_only": [m for m in self.order if m not in self.in_source]}
''')

PUSH_WORKER = RECORDER + textwrap.dedent('''
    import json, numpy as np, psnode

    def sock_send(arg):
        """(family, type) of the socket a C-level send is called on, else None."""
        if getattr(arg, "__name__", "") not in ("send", "sendall", "sendmsg"):
            return None
        owner = getattr(arg, "__self__", None)
        if isinstance(owner, socket.socket):
            return owner.family, owner.type
        return None

    class PushRecorder(Recorder):
        def __call__(self, frame, event, arg):
            if event == "call":
                self.enter(frame)
                code = frame.f_code
                if "/zmq/" in code.co_filename and code.co_name in ("send", "send_multipart"):
                    self.mark("zmq send", code.co_name)
            elif event == "c_call":
                kind = sock_send(arg)
                if kind == (socket.AF_UNIX, socket.SOCK_SEQPACKET):
                    self.mark("datagram", f"{arg.__name__} from {self.module(frame) or frame.f_code.co_filename}")
                    self.seqpacket_sends = getattr(self, "seqpacket_sends", 0) + 1

    kv = psnode.kv.create("dist_sync")
    g = np.full(16, kv.rank + 1, np.float32)
    out = np.empty(16, np.float32)
    kv.init(3, np.zeros(16, np.float32))
    for _ in range(3):
        kv.push(3, g)
        kv.pull(3, out=out)
    rec = PushRecorder("psnode", edges=True)
    sys.setprofile(rec)
    kv.push(3, g)
    sys.setprofile(None)
    kv.pull(3, out=out)
    assert (out == 1.0).all(), out
    res = rec.result()
    res["seqpacket_sends"] = getattr(rec, "seqpacket_sends", 0)
    print("PATHSRESULT " + json.dumps(res), flush=True)
    kv.close()
''')

LAUNCH = RECORDER + textwrap.dedent('''
    import json
    from mxdist.main import app

    class LaunchRecorder(Recorder):
        def __call__(self, frame, event, arg):
            if event != "call":
                return
            self.enter(frame)
            code = frame.f_code
            if code.co_filename.endswith("paramiko/channel.py"):
                if code.co_name == "exec_command":
                    self.mark("first remote command", str(frame.f_locals.get("command"))[:80])
                elif code.co_name in ("sendall", "send"):
                    data = frame.f_locals.get("s")
                    if isinstance(data, (bytes, bytearray)) and b'"op": "spawn"' in data:
                        self.mark("first spawn")

    out = sys.argv[1]
    rec = LaunchRecorder("mxdist")
    threading.setprofile(rec)
    sys.setprofile(rec)
    sys.argv = ["mxdist", *sys.argv[2:]]
    code = 0
    try:
        app()
    except SystemExit as exc:
        code = exc.code
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    res = rec.result()
    res["exit"] = code
    with open(out, "w") as fh:
        json.dump(res, fh)
''')

ENV = textwrap.dedent('''
    import json, sys
    from psnode.config import NodeConfig, Role
    port, job = int(sys.argv[1]), sys.argv[2]
    def env(role, rank):
        return NodeConfig(role=role, scheduler_host="127.0.0.1", scheduler_port=port, num_workers=1,
                          num_servers=1, job_id=job, host="127.0.0.1", rank=rank).to_env()
    print(json.dumps({"scheduler": env(Role.SCHEDULER, None), "server": env(Role.SERVER, 0),
                      "worker": env(Role.WORKER, 0)}))
''')

TRAIN = textwrap.dedent('''
    import numpy as np, psnode.kv
    kv = psnode.kv.create('dist_sync')
    kv.init(3, np.zeros(16, np.float32))
    kv.push(3, np.full(16, kv.rank + 1, np.float32))
    out = np.empty(16, np.float32); kv.pull(3, out=out)
    assert (out == 1.0).all(), out
    print("rank", kv.rank, "ok", float(out[0]))
    kv.close()
''')


def base_env(tree: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PSNODE_", "MXDIST_"))}
    env.update(PYTHONPATH=str(tree), PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", NO_COLOR="1",
               COLUMNS="200")
    return env


def free_port(host: str = "127.0.0.1") -> int:
    sys.path.insert(0, str(ROOT))
    from tests.support import free_listen_ports
    return free_listen_ports(1, host)[0]


def stop(procs: list[subprocess.Popen]) -> None:
    """Kill what is left of the processes this script started (their own sessions), and reap them."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
    for p in procs:
        p.wait(10)


def measure_push(tree: Path, python: str, timeout: float) -> dict:
    """The push path: one job of one worker and one server on 127.0.0.1, the worker profiling."""
    env = base_env(tree)
    port, job = free_port(), f"paths{uuid.uuid4().hex[:8]}"
    roles = json.loads(subprocess.run([python, "-c", ENV, str(port), job], env=env, cwd=tree, check=True,
                                      capture_output=True, text=True, timeout=60).stdout)
    env.update(PSNODE_HEARTBEAT_INTERVAL="0.5", PSNODE_REGISTER_TIMEOUT="30")
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="paths-") as tmp, contextlib.ExitStack() as files:
        try:
            for role, argv in (("scheduler", ["-m", "psnode"]), ("server", ["-m", "psnode"]),
                               ("worker", ["-c", PUSH_WORKER])):
                log = files.enter_context(open(Path(tmp) / f"{role}.log", "w"))
                procs.append(subprocess.Popen([python, *argv], env={**env, **roles[role]}, cwd=tree,
                                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and any(p.poll() is None for p in procs):
                time.sleep(0.05)
        finally:
            stop(procs)
        logs = {role: (Path(tmp) / f"{role}.log").read_text() for role in ("scheduler", "server", "worker")}
    found = [line[len(MARK):] for line in logs["worker"].splitlines() if line.startswith(MARK)]
    if not found or any(p.returncode != 0 for p in procs):
        raise SystemExit("the push job failed:\n" + "\n".join(f"--- {r}\n{t[-3000:]}" for r, t in logs.items()))
    rec = json.loads(found[0])
    if "datagram" not in rec["marks"]:
        raise SystemExit(f"the push sent no datagram on a same-host link: {rec}")
    n = rec["marks"]["datagram"]
    rec["to_datagram"] = rec["order"][:n]
    rec["after_datagram"] = rec["order"][n:]
    rec["entries_to_datagram"] = rec["entries"][:rec["entry_marks"]["datagram"]]
    rec["reentries"] = reentries(rec["entries_to_datagram"])
    return rec


def reentries(entries: list[str]) -> list[int]:
    """The positions in ``entries`` where a module is entered again (it was left before)."""
    seen: set[str] = set()
    again = []
    for i, mod in enumerate(entries):
        if mod in seen:
            again.append(i)
        seen.add(mod)
    return again


def measure_ssh(tree: Path, python: str, timeout: float) -> dict:
    """The SSH launch path: a real sshd on 127.0.0.2 named node1, the launcher profiled."""
    sys.path.insert(0, str(ROOT))
    from tests.support.hosts import SSHD, keygen, sshd_config

    if not os.path.exists(SSHD) or os.geteuid() != 0:
        raise SystemExit(f"the ssh path needs root and {SSHD} (apt-get install openssh-server)")
    address = "127.0.0.2"
    root = Path(tempfile.mkdtemp(prefix="paths-ssh-"))
    sshd: subprocess.Popen | None = None
    try:
        subprocess.run(["install", "-d", "-m", "0755", "/run/sshd"], check=True)
        client_pub = keygen(root / "client_key")
        (root / "authorized_keys").write_text(client_pub + "\n")
        host_pub = keygen(root / "host_key")
        port = free_port(address)
        conf = root / "sshd.conf"
        conf.write_text(sshd_config(port, address, root / "host_key", root / "sshd.pid", root / "authorized_keys"))
        subprocess.run([SSHD, "-t", "-f", str(conf)], check=True, timeout=30)
        sshd = subprocess.Popen([SSHD, "-D", "-f", str(conf), "-E", str(root / "sshd.log")])
        deadline = time.monotonic() + 10
        while not (root / "sshd.pid").exists():
            if time.monotonic() > deadline:
                raise SystemExit(f"sshd did not start: {(root / 'sshd.log').read_text()}")
            time.sleep(0.02)
        (root / "ssh_config").write_text(f"Host node1\n  HostName {address}\n  Port {port}\n  User root\n"
                                         f"  IdentityFile {root / 'client_key'}\n  IdentitiesOnly yes\n")
        (root / "known_hosts").write_text(f"[{address}]:{port} {host_pub}\n")
        (root / "train.py").write_text(TRAIN)
        env = base_env(tree)
        env.update(MXDIST_HOME=str(root / "home"), MXDIST_SSH_CONFIG=str(root / "ssh_config"),
                   MXDIST_KNOWN_HOSTS=str(root / "known_hosts"), MXDIST_REMOTE_DIR=str(root / "remote"))
        out = root / "launch.json"
        args = ["launch", "-H", "node1", "-n", "1", "-s", "1", str(root / "train.py")]
        # stdout a file, as a terminal: through a pipe the launcher supervises in a child process,
        # which this process's profiler would not see (mxdist.supervisor.detach.through_pipe)
        with tempfile.TemporaryFile("w+") as shown:
            res = subprocess.run([python, "-c", LAUNCH, str(out), *args], env=env, cwd=tree, stdout=shown,
                                 stderr=subprocess.PIPE, text=True, timeout=timeout)
            shown.seek(0)
            res.stdout = shown.read()
        if res.returncode != 0 or not out.exists():
            raise SystemExit(f"mxdist {' '.join(args)} failed (exit {res.returncode}):\n{res.stdout}\n{res.stderr}")
        rec = json.loads(out.read_text())
        if rec["exit"] not in (0, None) or "rank 0 ok 1.0" not in res.stdout:
            raise SystemExit(f"the launched job failed (exit {rec['exit']}):\n{res.stdout}\n{res.stderr}")
        if "first spawn" not in rec["marks"]:
            raise SystemExit(f"no spawn request seen on an SSH channel: {rec['events']}")
        n = rec["marks"]["first spawn"]
        rec["to_first_spawn"] = rec["order"][:n]
        rec["after_first_spawn"] = rec["order"][n:]
        rec["command"] = "mxdist " + " ".join(args)
        return rec
    finally:
        if sshd is not None:
            sshd.terminate()
            try:
                sshd.wait(10)
            except subprocess.TimeoutExpired:
                sshd.kill()
                sshd.wait(10)
        shutil.rmtree(root, ignore_errors=True)


def show(title: str, mods: list[str]) -> None:
    print(f"{title}: {len(mods)} modules")
    for i, m in enumerate(mods, 1):
        print(f"  {i:2d} {m}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--path", choices=["push", "ssh", "both"], default="both")
    ap.add_argument("--tree", type=Path, default=ROOT, help="the checkout measured (default: this one)")
    ap.add_argument("--python", help="its Python (default: TREE/.venv/bin/python if present, else this one)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per job")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)
    tree = args.tree.resolve()
    python = args.python or (str(tree / ".venv/bin/python") if (tree / ".venv/bin/python").exists()
                             else sys.executable)
    out: dict = {"tree": str(tree), "python": python}
    if args.path in ("push", "both"):
        push = measure_push(tree, python, args.timeout)
        out["push"] = push
        show("push: KVStore.push to the same-host datagram (the user's thread)", push["to_datagram"])
        show("push: after the datagram, until KVStore.push returns", push["after_datagram"])
        entries, again = push["entries_to_datagram"], set(push["reentries"])
        print(f"push: entries to the datagram (a call into a module from another): {len(entries)} "
              f"into {len(set(entries))} modules, {len(again)} into a module entered before")
        for i, m in enumerate(entries):
            print(f"  {i + 1:3d} {m}{'   (again)' if i in again else ''}")
        print(f"  Python function calls to the datagram (any module): {push['call_marks']['datagram']}")
        print(f"  same-host datagrams sent: {push['seqpacket_sends']}; "
              f"ZeroMQ sends: {1 if 'zmq send' in push['marks'] else 0}")
    if args.path in ("ssh", "both"):
        ssh = measure_ssh(tree, python, args.timeout)
        out["ssh"] = ssh
        print(f"ssh: {ssh['command']}")
        for e in ssh["events"]:
            print(f"  ({e})")
        show("ssh: mxdist.main to the first spawn request on an SSH channel", ssh["to_first_spawn"])
        show("ssh: the whole launch, to the job's end", ssh["order"])
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
