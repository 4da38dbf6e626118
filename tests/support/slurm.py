"""A real Slurm 22.05 cluster on this machine, for tests: munged, slurmctld and one slurmd per node.

Nodes are emulated on loopback addresses (``127.0.0.2``, ``127.0.0.3``, ...), each slurmd on its
own port, or a single node ``localhost`` (NodeAddr 127.0.0.1).  Everything lives in one temp dir
(munge key and socket, slurm.conf, state, spool, logs); client commands need ``SLURM_CONF``
(:meth:`SlurmCluster.env`).

Start takes about a second; :meth:`SlurmCluster.stop` cancels every job, waits for the queue to
drain, then ends the daemons by their saved pids and removes the directory.  Every wait is bounded.
Usable by hand too: ``python -m tests.support.slurm DIR 127.0.0.2 127.0.0.3`` starts one and
prints the ``SLURM_CONF`` to export; Ctrl-C or SIGTERM stops it.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support import free_listen_ports, wait_for

MUNGED = "/usr/sbin/munged"
BINARIES = ("slurmctld", "slurmd", "srun", "salloc", "sbatch", "squeue", "scancel", "scontrol", "sinfo")


def missing_binaries() -> list[str]:
    missing = [b for b in BINARIES if shutil.which(b) is None and not os.path.exists(f"/usr/sbin/{b}")]
    if not os.path.exists(MUNGED) and shutil.which("munged") is None:
        missing.append("munged")
    return missing


@dataclass
class SlurmCluster:
    root: Path
    nodes: tuple[str, ...]                  # node names (loopback addresses, or "localhost")
    cpus: int = 2
    pids: dict[str, int] = field(default_factory=dict)
    _procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def env(self, base: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        for name in [k for k in env if k.startswith(("SLURM_", "SALLOC_", "SBATCH_", "SRUN_"))]:
            del env[name]
        env["SLURM_CONF"] = str(self.conf)
        env.update(extra)
        return env

    def run(self, *argv: str, timeout: float = 30.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), env=self.env(), capture_output=True, text=True,
                              timeout=timeout, check=check)

    # -- start --------------------------------------------------------------------------------

    def start(self) -> SlurmCluster:
        root = self.root
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o755)
        munge_dir = root / "munge"
        munge_dir.mkdir(mode=0o755, exist_ok=True)
        key = munge_dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        shutil.chown(munge_dir, "munge", "munge")
        shutil.chown(key, "munge", "munge")
        socket_path = munge_dir / "munge.socket"
        self._spawn("munged", ["setpriv", "--reuid=munge", "--regid=munge", "--init-groups", "--",
                               MUNGED, "-F", f"--socket={socket_path}", f"--key-file={key}",
                               f"--pid-file={munge_dir / 'munged.pid'}",
                               f"--seed-file={munge_dir / 'munge.seed'}",
                               f"--log-file={munge_dir / 'munged.log'}"])
        wait_for(socket_path.exists, 10, "munged's socket")

        ctld_port, *node_ports = free_listen_ports(1 + len(self.nodes))
        lines = [
            "ClusterName=mxdisttest", "SlurmctldHost=localhost", f"SlurmctldPort={ctld_port}",
            "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge", "CredType=cred/munge",
            f"AuthInfo=socket={socket_path}",
            f"StateSaveLocation={root}/state", f"SlurmdSpoolDir={root}/spool/%n", f"TmpFS={root}/tmp/%n",
            f"SlurmctldPidFile={root}/slurmctld.pid", f"SlurmdPidFile={root}/slurmd-%n.pid",
            f"SlurmctldLogFile={root}/slurmctld.log", f"SlurmdLogFile={root}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
            "SchedulerParameters=batch_sched_delay=0", "SwitchType=switch/none", "MpiDefault=none",
            "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none",
            "JobAcctGatherType=jobacct_gather/none", "ReturnToService=2",
            "SlurmdParameters=config_overrides", "KillWait=5", "InactiveLimit=0",
            "SlurmctldDebug=info", "SlurmdDebug=info",
        ]
        for name, port in zip(self.nodes, node_ports):
            addr = "NodeAddr=127.0.0.1 " if name == "localhost" else ""
            lines.append(f"NodeName={name} {addr}Port={port} CPUs={self.cpus} RealMemory=1000 State=UNKNOWN")
        lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        for sub in ("state", "spool", "tmp"):
            (root / sub).mkdir(exist_ok=True)
        for name in self.nodes:
            (root / "spool" / name).mkdir(exist_ok=True)
            (root / "tmp" / name).mkdir(exist_ok=True)

        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        for name in self.nodes:
            self._spawn(f"slurmd-{name}", ["slurmd", "-D", "-N", name, "-f", str(self.conf)])
        want = str(len(self.nodes))

        def ready() -> bool:
            res = self.run("sinfo", "-h", "-t", "idle", "-o", "%D", check=False, timeout=10)
            return res.stdout.strip() == want

        try:
            wait_for(ready, 30, f"{want} idle Slurm node(s)", interval=0.1)
        except RuntimeError:
            logs = "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in root.glob("*.log"))
            raise RuntimeError(f"Slurm did not come up:\n{logs}") from None
        return self

    def _spawn(self, name: str, argv: list[str]) -> None:
        with open(self.root / f"{name}.out", "ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=self.env())
        self._procs.append(proc)
        self.pids[name] = proc.pid

    # -- state --------------------------------------------------------------------------------

    def steps(self) -> list[str]:
        """Every job step in the queue (``JOB.STEP NAME STATE``), batch/extern steps excluded."""
        res = self.run("squeue", "-h", "-s", "-o", "%i %j %T", check=False)
        return [line for line in res.stdout.splitlines()
                if line.strip() and not line.split()[0].endswith((".batch", ".extern", ".interactive"))]

    def jobs(self) -> list[str]:
        return self.run("squeue", "-h", "-o", "%i %T", check=False).stdout.split("\n")[:-1]

    # -- stop ---------------------------------------------------------------------------------

    def cancel_all(self, timeout: float = 30.0) -> None:
        """Cancel every job and wait until the queue is empty."""
        self.run("scancel", "--user=root", check=False)
        wait_for(lambda: not self.jobs(), timeout, "the Slurm queue to drain", interval=0.2)

    def stop(self) -> None:
        try:
            self.cancel_all()
        except Exception:
            pass
        finally:
            for proc in self._procs:  # all at once: each takes about 2 s to exit
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 15
            for proc in self._procs:
                try:
                    proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
            shutil.rmtree(self.root, ignore_errors=True)


if __name__ == "__main__":
    def _interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _interrupt)
    cluster = SlurmCluster(Path(sys.argv[1]), tuple(sys.argv[2:]) or ("localhost",)).start()
    print(f"export SLURM_CONF={cluster.conf}", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
