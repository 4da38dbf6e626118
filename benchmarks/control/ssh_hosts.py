"""The SSH launcher's cost per host: ``mxdist launch -H`` on 8 to 64 loopback sshd hosts.

    python benchmarks/control/ssh_hosts.py                         # 8, 16, 32, 64 hosts (needs root, sshd)
    python benchmarks/control/ssh_hosts.py --hosts 8,16 --runs 2 --json /tmp/ssh.json

N real OpenSSH servers, one per address 127.0.1.1..N (one host key, one client key, a private
ssh config and known_hosts, as tests/ssh does), and a job of one process per host that does
nothing (``-n N -s 0 /bin/true``): what is measured is the launcher, not the job.  Per size:
the launch's wall time (start of ``mxdist launch`` to its exit) and the launching process's CPU
time (user + system, from ``resource.getrusage(RUSAGE_CHILDREN)``), both also per host, and a
straight-line fit of each against N, extrapolated to 1,000 hosts.  The sshds' and remote agents'
CPU (the same machine here) is not the launcher's and is left out.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SSHD = "/usr/sbin/sshd"
PORT = 2299


def keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(path)], check=True, timeout=30)
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


def start_hosts(root: Path, n: int) -> tuple[list[subprocess.Popen[bytes]], dict[str, str]]:
    """``n`` sshds on 127.0.1.1..n; (their processes, the launcher's environment additions)."""
    subprocess.run(["install", "-d", "-m", "0755", "/run/sshd"], check=True)
    host_pub = keygen(root / "host_key")
    (root / "authorized_keys").write_text(keygen(root / "client_key") + "\n")
    procs, config, known = [], [], []
    for i in range(1, n + 1):
        addr = f"127.0.1.{i}"
        conf = root / f"sshd{i}.conf"
        conf.write_text(f"Port {PORT}\nListenAddress {addr}\nHostKey {root}/host_key\nPidFile {root}/sshd{i}.pid\n"
                        f"AuthorizedKeysFile {root}/authorized_keys\nPermitRootLogin prohibit-password\n"
                        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                        "MaxSessions 100\nMaxStartups 100:30:200\nLogLevel ERROR\n")
        procs.append(subprocess.Popen([SSHD, "-D", "-f", str(conf), "-E", str(root / f"sshd{i}.log")]))
        config.append(f"Host h{i}\n  HostName {addr}\n")
        known.append(f"[{addr}]:{PORT} {host_pub}\n")
    deadline = time.monotonic() + 30
    for i in range(1, n + 1):
        while not (root / f"sshd{i}.pid").exists():
            if time.monotonic() > deadline:
                raise SystemExit(f"sshd {i} did not start: {(root / f'sshd{i}.log').read_text()}")
            time.sleep(0.02)
    config.append(f"Host *\n  Port {PORT}\n  User root\n  IdentityFile {root}/client_key\n  IdentitiesOnly yes\n")
    (root / "ssh_config").write_text("\n".join(config))
    (root / "known_hosts").write_text("".join(known))
    (root / "hosts").write_text("".join(f"h{i} slots=1\n" for i in range(1, n + 1)))
    return procs, {"MXDIST_SSH_CONFIG": str(root / "ssh_config"), "MXDIST_KNOWN_HOSTS": str(root / "known_hosts")}


def launch(root: Path, n: int, extra: dict[str, str]) -> dict[str, float]:
    home = Path(tempfile.mkdtemp(dir=root))
    env = {**os.environ, **extra, "MXDIST_HOME": str(home), "MXDIST_REMOTE_DIR": str(home / "remote"),
           "PYTHONPATH": str(ROOT), "NO_COLOR": "1", "COLUMNS": "200"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "mxdist", "launch", "-H", str(root / "hosts"), "-n", str(n), "-s", "0",
                          "/bin/true"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode != 0:
        raise SystemExit(f"{n} hosts: exit {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"hosts": n, "wall_s": wall, "cpu_s": cpu, "wall_per_host_ms": 1e3 * wall / n,
            "cpu_per_host_ms": 1e3 * cpu / n}


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares ``y = a + b x``: (a, b)."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", default="8,16,32,64")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if os.geteuid() != 0 or not os.path.exists(SSHD):
        raise SystemExit(f"needs root and {SSHD} (apt-get install openssh-server)")
    sizes = [int(x) for x in a.hosts.split(",")]
    print(f"ssh launcher per host: {platform.python_version()} on {os.cpu_count()} cpu(s); hosts {sizes}", flush=True)
    root = Path(tempfile.mkdtemp(prefix="sshhosts-"))
    procs, extra = start_hosts(root, max(sizes))
    results = []
    try:
        for run in range(a.runs):
            for n in sizes:
                (root / "hosts").write_text("".join(f"h{i} slots=1\n" for i in range(1, n + 1)))
                got = launch(root, n, extra)
                got["run"] = run
                results.append(got)
                print(json.dumps({k: round(v, 3) for k, v in got.items()}), flush=True)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
        shutil.rmtree(root, ignore_errors=True)
    print("| hosts | wall s | launcher CPU s | wall per host ms | CPU per host ms |\n|---|---|---|---|---|")
    for r in results:
        print(f"| {r['hosts']} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | {r['wall_per_host_ms']:.0f} | "
              f"{r['cpu_per_host_ms']:.0f} |")
    xs = [float(r["hosts"]) for r in results]
    for key in ("wall_s", "cpu_s") if len(set(xs)) > 1 else ():
        a0, b = fit(xs, [r[key] for r in results])
        print(f"{key}: {a0:.2f} s + {1e3 * b:.0f} ms per host; at 1,000 hosts: {a0 + 1000 * b:.0f} s")
    if a.json:
        Path(a.json).write_text(json.dumps({"argv": sys.argv, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
