"""The start of an SSH job: ``mxdist launch -H`` against OpenSSH starting the same processes.

    python benchmarks/control/ssh_start.py                      # 3 hosts, 3 runs
    python benchmarks/control/ssh_start.py --hosts 2,3,8 --runs 3 --json /tmp/start.json
    python benchmarks/control/ssh_start.py --hosts 3 --runs 1 --phases   # where the launcher's time goes
    git archive REV | tar -x -C /tmp/old && python benchmarks/control/ssh_start.py --baseline /tmp/old

Root and ``/usr/sbin/sshd``: N real OpenSSH servers on 127.0.0.2, .3, ... (one per fake host,
one host key, strict host key checking against a known_hosts of their keys).

The job, N hosts, ``-n N -s N`` (a scheduler, N servers, N workers): each worker runs the
one-line script :data:`ONE_LINE` (create a store, one barrier, close).  Two ways to start it,
interleaved in each run, timed from the command to its exit:

* **mxdist**: ``mxdist launch -H h1,...,hN -n N -s N one_line.py`` (its defaults: a fresh
  secret on every host, preflight, the output streamed back);
* **OpenSSH**: one ``ssh hK env PSNODE_...=... python ...`` per process, all started at once,
  waited for together: the same scheduler, servers and workers with the same psnode
  environment (insecure: no secret to deliver), the least a launcher can do over SSH.

``--baseline DIR`` adds a third way, interleaved with the others: ``mxdist launch`` of another
checkout (its launcher and its psnode, e.g. the commit before a change), named ``baseline``.

``--phases`` runs the launcher once more per size with its SSH backend and supervisor traced
(this process's wrappers around their methods; nothing in the product changes): when each
host's connection, preflight, secret and start began and ended, and when the first process was
started, relative to the launcher's start.

Prints per size the median and range of each, and the ratio mxdist / OpenSSH (the goal: 1.5 or
less at 3 hosts).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support.hosts import SSHD, keygen, sshd_config  # noqa: E402

ONE_LINE = "import psnode.kv; kv = psnode.kv.create('dist_sync'); kv.barrier(); kv.close()\n"
PY = sys.executable


class Hosts:
    """N sshd servers on 127.0.0.2.. (one port), an ssh config naming them h1..hN, a known_hosts."""

    def __init__(self, n: int, root: Path) -> None:
        self.n, self.root = n, root
        self.addresses = [f"127.0.0.{i + 2}" for i in range(n)]
        self.names = [f"h{i + 1}" for i in range(n)]
        self.procs: list[subprocess.Popen] = []
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run(["install", "-d", "-m", "0755", "/run/sshd"], check=True)
        client = keygen(root / "client_key")
        (root / "authorized_keys").write_text(client + "\n")
        host_pub = keygen(root / "host_key")
        self.port = _free_port(self.addresses)
        for i, addr in enumerate(self.addresses):
            conf = root / f"sshd{i}.conf"
            conf.write_text(sshd_config(self.port, addr, root / "host_key", root / f"sshd{i}.pid",
                                        root / "authorized_keys"))
            self.procs.append(subprocess.Popen([SSHD, "-D", "-f", str(conf), "-E", str(root / f"sshd{i}.log")]))
        deadline = time.monotonic() + 20
        for i in range(n):
            while not (root / f"sshd{i}.pid").exists():
                if time.monotonic() > deadline:
                    raise SystemExit(f"sshd {i} did not start: {(root / f'sshd{i}.log').read_text()}")
                time.sleep(0.02)
        self.known_hosts = root / "known_hosts"
        self.known_hosts.write_text("".join(f"[{a}]:{self.port} {host_pub}\n" for a in self.addresses))
        self.ssh_config = root / "ssh_config"
        blocks = "".join(f"Host {n}\n  HostName {a}\n" for n, a in zip(self.names, self.addresses, strict=True))
        self.ssh_config.write_text(blocks + f"Host *\n  Port {self.port}\n  User root\n"
                                   f"  IdentityFile {root / 'client_key'}\n  IdentitiesOnly yes\n"
                                   f"  UserKnownHostsFile {self.known_hosts}\n"
                                   "  StrictHostKeyChecking yes\n")

    def close(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


def _free_port(addresses: list[str]) -> int:
    for port in range(20022, 30000, 7):
        ok = True
        for a in addresses:
            with socket.socket() as s:
                try:
                    s.bind((a, port))
                except OSError:
                    ok = False
                    break
        if ok:
            return port
    raise SystemExit("no port free on every address")


def mxdist_env(hosts: Hosts, home: Path, tree: Path = ROOT) -> dict[str, str]:
    """The launcher's environment; ``tree``: the checkout whose ``mxdist`` and ``psnode`` run
    (another one's through a directory where ``mxdist`` names its ``cli``; PYTHONPATH reaches the
    job's processes too)."""
    env = dict(os.environ)
    path = str(ROOT)
    if tree != ROOT:
        shim = home.parent / "shim"
        shim.mkdir(parents=True, exist_ok=True)
        if not (shim / "mxdist").exists():
            (shim / "mxdist").symlink_to(tree / "cli")
        path = f"{shim}{os.pathsep}{tree}"
    env.update(MXDIST_HOME=str(home), MXDIST_SSH_CONFIG=str(hosts.ssh_config),
               MXDIST_KNOWN_HOSTS=str(hosts.known_hosts), MXDIST_REMOTE_DIR=str(home / "remote"),
               PYTHONPATH=path, NO_COLOR="1", COLUMNS="200")
    return env


def run_mxdist(hosts: Hosts, script: Path, home: Path, trace: Path | None = None, tree: Path = ROOT) -> float:
    n = hosts.n
    argv = ["launch", "-H", ",".join(hosts.names), "-n", str(n), "-s", str(n), str(script)]
    cmd = [PY, "-m", "mxdist", *argv] if trace is None else [PY, __file__, "--traced-launch", str(trace), *argv]
    out = home.parent / f"{home.name}.out"   # a file, as a terminal would be: no pipe to watch
    home.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as fh:
        t0 = time.perf_counter()
        res = subprocess.run(cmd, env=mxdist_env(hosts, home, tree), cwd=tree, stdout=fh, stderr=subprocess.STDOUT,
                             timeout=300)
        took = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"mxdist failed ({res.returncode}):\n{out.read_text()[-3000:]}")
    return took


def run_openssh(hosts: Hosts, script: Path, job: str) -> float:
    """Every process of the job through its own ``ssh``, all at once; seconds until all exit."""
    n = hosts.n
    sched = f"{hosts.addresses[0]}:{_free_port([hosts.addresses[0]])}"
    common = {"PSNODE_SCHEDULER": sched, "PSNODE_NUM_WORKERS": str(n), "PSNODE_NUM_SERVERS": str(n),
              "PSNODE_JOB_ID": job}
    procs = [({**common, "PSNODE_ROLE": "scheduler", "PSNODE_HOST": hosts.addresses[0]}, hosts.names[0],
              [PY, "-m", "psnode"])]
    for r in range(n):
        procs.append(({**common, "PSNODE_ROLE": "server", "PSNODE_HOST": hosts.addresses[r], "PSNODE_RANK": str(r)},
                      hosts.names[r], [PY, "-m", "psnode"]))
    for r in range(n):
        procs.append(({**common, "PSNODE_ROLE": "worker", "PSNODE_HOST": hosts.addresses[r], "PSNODE_RANK": str(r)},
                      hosts.names[r], [PY, str(script)]))
    t0 = time.perf_counter()
    running = []
    for env, host, argv in procs:
        remote = " ".join(["cd", str(ROOT), "&&", "env", *(f"{k}={v}" for k, v in env.items()), *argv])
        running.append(subprocess.Popen(["ssh", "-F", str(hosts.ssh_config), "-o", "BatchMode=yes", host, remote],
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    try:
        codes = [p.wait(300) for p in running]
    finally:
        for p in running:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    took = time.perf_counter() - t0
    if any(codes):
        outs = [p.stdout.read().decode(errors="replace")[-800:] for p in running if p.stdout]
        raise SystemExit(f"OpenSSH start failed {codes}:\n" + "\n".join(outs))
    return took


# -- the launcher, traced (--traced-launch) ----------------------------------------------------------

def traced_launch(out: str, argv: list[str]) -> int:
    """Run ``mxdist ARGV`` in this process with its SSH backend and supervisor wrapped: each
    wrapped call's start and end (seconds since this process started) to ``out`` as JSON."""
    t0 = time.perf_counter()
    events: list[dict] = []

    def wrap(owner: object, name: str, label: str, host_arg: int | None = 0) -> None:
        fn = getattr(owner, name)

        def wrapped(*args, **kwargs):
            host = ""
            if host_arg is not None and len(args) > host_arg + 1:
                h = args[host_arg + 1]
                host = getattr(h, "label", "")
                label_ = f"agent:{getattr(args[2], 'op', '?')}" if name == "_agent" and len(args) > 2 else label
            else:
                label_ = label
            start = time.perf_counter() - t0
            try:
                return fn(*args, **kwargs)
            finally:
                events.append({"what": label_, "host": host, "start": round(start, 4),
                               "end": round(time.perf_counter() - t0, 4)})

        setattr(owner, name, wrapped)

    import mxdist.main as main
    from mxdist.backends import ssh
    from mxdist.supervisor import preflight, setup, supervisor

    wrap(ssh.SshBackend, "_connect", "connect")
    wrap(ssh.SshBackend, "_agent", "agent")
    wrap(ssh.SshBackend, "_once", "channel+python (once)")
    wrap(ssh._ServingAgent, "start", "serving agent start", None)
    wrap(supervisor.Supervisor, "_start_all", "start all", None)
    wrap(supervisor.Supervisor, "_preflight", "preflight (all hosts)", None)
    wrap(preflight, "_install_secret", "secret (all hosts)", None)
    wrap(setup, "prepare", "prepare (plan)", None)
    events.append({"what": "imports done", "host": "", "start": 0.0, "end": round(time.perf_counter() - t0, 4)})
    code = 0
    try:
        main.app(argv, prog_name="mxdist")
    except SystemExit as exc:
        code = int(exc.code or 0)
    finally:
        events.append({"what": "exit", "host": "", "start": round(time.perf_counter() - t0, 4),
                       "end": round(time.perf_counter() - t0, 4)})
        Path(out).write_text(json.dumps(events))
    return code


def show_phases(n: int, events: list[dict]) -> None:
    print(f"\n-- where mxdist's start goes, {n} hosts (seconds since the launcher started) --")
    for e in sorted(events, key=lambda e: (e["start"], e["host"])):
        if e["what"] == "agent:follow":
            continue
        print(f"  {e['what']:28s} {e['host']:5s} {e['start']:7.3f} -> {e['end']:7.3f}  ({e['end'] - e['start']:.3f})")
    follows = [e for e in events if e["what"] == "agent:follow"]
    if follows:
        print(f"  {'output streams (follow)':28s} {len(follows)} started {min(e['start'] for e in follows):.3f} .. "
              f"{max(e['start'] for e in follows):.3f}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--traced-launch"]:
        return traced_launch(argv[1], argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", default="3", help="host counts, comma-separated (default 3)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--phases", action="store_true", help="also trace one launch per size")
    ap.add_argument("--json", help="write every measurement here")
    ap.add_argument("--baseline", type=Path, help="another checkout's mxdist launch, measured beside (see above)")
    args = ap.parse_args(argv)
    if os.geteuid() != 0 or not os.path.exists(SSHD):
        raise SystemExit("needs root and /usr/sbin/sshd")
    sizes = [int(x) for x in args.hosts.split(",")]
    root = Path(tempfile.mkdtemp(prefix="ssh-start-"))
    results: dict[int, dict[str, list[float]]] = {}
    phases: dict[int, list[dict]] = {}
    hosts: Hosts | None = None
    try:
        hosts = Hosts(max(sizes), root / "hosts")
        script = root / "one_line.py"
        script.write_text(ONE_LINE)
        for n in sizes:
            sub = Hosts.__new__(Hosts)
            sub.__dict__.update(hosts.__dict__)
            sub.n, sub.names, sub.addresses = n, hosts.names[:n], hosts.addresses[:n]
            run_mxdist(sub, script, root / "warm")        # warm caches (pyc, page cache) once
            ways = ["openssh", "mxdist"]
            if args.baseline:
                run_mxdist(sub, script, root / "warm-baseline", tree=args.baseline.resolve())
                ways.append("baseline")
            for r in range(args.runs):
                order = ways if r % 2 == 0 else ways[::-1]
                for who in order:
                    if who == "openssh":
                        took = run_openssh(sub, script, f"bench-{n}-{r}")
                    else:
                        took = run_mxdist(sub, script, root / f"home-{who}-{n}",
                                          tree=args.baseline.resolve() if who == "baseline" else ROOT)
                    results.setdefault(n, {}).setdefault(who, []).append(took)
                    print(f"hosts={n} run={r} {who:8s} {took:6.2f} s", flush=True)
            if args.phases:
                trace = root / f"trace-{n}.json"
                run_mxdist(sub, script, root / f"home-{n}", trace)
                phases[n] = json.loads(trace.read_text())
                show_phases(n, phases[n])
    finally:
        if hosts is not None:
            hosts.close()
        shutil.rmtree(root, ignore_errors=True)
    base = " / baseline (s, its ratio)" if args.baseline else ""
    print(f"\n{'hosts':>5} {'procs':>5} {'OpenSSH (s)':>18} {'mxdist (s)':>18} {'mxdist/OpenSSH':>15}{base}")
    for n, res in results.items():
        o, m = res["openssh"], res["mxdist"]
        line = (f"{n:5d} {2 * n + 1:5d} {statistics.median(o):7.2f} [{min(o):.2f}-{max(o):.2f}] "
                f"{statistics.median(m):7.2f} [{min(m):.2f}-{max(m):.2f}] "
                f"{statistics.median(m) / statistics.median(o):15.2f}")
        if "baseline" in res:
            b = res["baseline"]
            line += (f"   {statistics.median(b):7.2f} [{min(b):.2f}-{max(b):.2f}] "
                     f"{statistics.median(b) / statistics.median(o):.2f}")
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps({"results": results, "phases": phases}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
