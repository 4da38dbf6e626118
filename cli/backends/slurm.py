"""SlurmBackend (``--launcher slurm``): the job's processes as job steps of a Slurm allocation.

The only module that runs ``srun``, ``scontrol``, ``squeue`` and ``scancel``.

Allocation: ``mxdist launch --launcher slurm`` runs inside an allocation (``salloc``, or an
``sbatch`` script) and reads it from the environment: ``SLURM_JOB_ID``, ``SLURM_JOB_NODELIST``
(expanded with ``scontrol show hostnames``), ``SLURM_TASKS_PER_NODE`` (slots: how many workers a
node runs by default) and ``SLURM_JOB_CPUS_PER_NODE``.  Placement is :mod:`mxdist.planning.plan`'s, as for
SSH: the nodes are the hosts, in the order Slurm lists them.

Addresses: a process binds to and is reached at its node's address as Slurm knows it, never
``hostname`` (emulated nodes on one machine share a hostname): a node named by an IP address is
that address; otherwise its ``NodeAddr`` (``scontrol show node``), resolved to an IP address here.

Processes: one step per process, ``srun --jobid=J --overlap -N1 -n1 -w NODE --export=ALL
--job-name=mxdist.<mxdist job>.<process> -- ARGV``.  The step's task is the process itself, in
the foreground under slurmstepd, so Slurm tracks it and ``scancel`` ends it with its children.
``--overlap`` lets steps share a node; ``--cpus-per-task`` is the job's CPU count on that node so
a process may use all of them.  The environment (``PSNODE_*``, ``RANK``...) travels in srun's own
environment (``--export=ALL``), never on a command line.  srun itself runs on this machine under
:mod:`mxdist.backends.agent`'s reaper, exactly like a local process (the backend composes a
:class:`mxdist.backends.local.LocalRunner` that runs ``srun`` lines): its output (the task's, plus
srun's own error lines) goes to the job's log file, its exit status to the rc file.  srun reports a task
killed by signal N as 128+N; :func:`exit_code` turns that back into ``-N``.

The job's secret (``PSNODE_KEY_FILE``) reaches the nodes through the shared file system: the
processes read the launcher's own copy, ``MXDIST_HOME/jobs/<id>/job.key`` (0600 in a 0700
directory; :mod:`mxdist.supervisor.preflight`), which every node sees as it sees the job's logs.  Not through
srun's environment: psnode reads its secret from a file whose owner and mode it checks, an
environment is inherited by everything the training script starts, and srun's environment
travels in Slurm's launch messages, which munge signs but does not encrypt.

Steps are found by name (``squeue -s``), so ``mxdist status`` and ``mxdist stop`` work from any
shell that reaches the cluster, with or without the launcher.  Stop: ``scancel --signal=TERM``
for the steps, ``scancel`` (KILL) for those left after the grace period, then the local srun
processes; nothing is left when no step of the job is in ``squeue`` (Slurm drops a step only when
all its processes are gone) and no srun runs here.  Clean-up removes the secret file and, with one
short step per node while the allocation lasts, the job's shared-memory segments there.
"""
from __future__ import annotations

import contextlib
import inspect
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal as _signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from ..job.records import ProcRecord
from ..planning.gpus import HostGpus
from ..planning.hosts import Host
from ..planning.plan import PlanError, ProcSpec
from . import agent
from .base import (
    BackendError,
    BackendStatus,
    Capability,
    Evidence,
    ExitStatus,
    HostProblem,
    LaunchRequest,
    Preflight,
    ProcStatus,
    Started,
    command_fix,
    host_gpus,
)
from .local import LocalRunner

HOW_TO_ALLOCATE = (
    "--launcher slurm runs inside a Slurm allocation, and SLURM_JOB_ID is not set here. Get one "
    "first: interactively with 'salloc -N 3 --ntasks-per-node=2 mxdist launch --launcher slurm "
    "train.py', or put that mxdist line in a batch script and submit it with sbatch (see README.md, "
    "section Slurm)"
)

_CHECK = (  # the working directory, the command, the imports and (mxdist.backends.agent.gpus) the GPUs, on each node
    "from __future__ import annotations\nimport importlib.util,json,os,sys\nfrom dataclasses import dataclass,field\n"
    "from typing import ClassVar\n"
    + "".join(inspect.getsource(o) for o in (agent.to_json, agent.gpus, agent.GpuEntry, agent.GpusReport,
                                             agent.command_problem, agent.NodeCheck)) +
    "wd,target,mods,errs=sys.argv[1],json.loads(sys.argv[2]),sys.argv[3:],[]\n"
    "if os.path.realpath(os.getcwd())!=os.path.realpath(wd):\n"
    " errs.append('working directory %s does not exist on this node'%wd)\n"
    "else:\n"
    " e=command_problem(wd,target[0],target[1]) if target else None\n"
    " if e:errs.append(e)\n"
    " for m in mods:\n"
    "  try:\n"   # (looked for, not run: as the SSH agent's preflight, mxdist.backends.agent.missing_modules)
    "   if importlib.util.find_spec(m) is None:raise ModuleNotFoundError(\"No module named '%s'\"%m)\n"
    "  except Exception as e:errs.append('python cannot import %s in %s: %s: %s'%(m,wd,type(e).__name__,e))\n"
    "print(NodeCheck(os.environ.get('SLURMD_NODENAME'),errs,gpus()).to_line(),flush=True)\n"
)


class SlurmError(BackendError):
    """A Slurm command failed or the allocation cannot be used; the message says which and why."""


def parse_counts(spec: str) -> list[int]:
    """Slurm's per-node counts, ``"2(x3),1"`` -> ``[2, 2, 2, 1]``."""
    out: list[int] = []
    for part in filter(None, spec.split(",")):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise SlurmError(f"cannot read Slurm's per-node count {spec!r}")
        out.extend([int(m.group(1))] * int(m.group(2) or 1))
    return out


def exit_code(rc: int | None, log_tail: str) -> int | None:
    """srun's exit status -> the task's (``-N`` for a signal), using srun's report in the log."""
    if rc is None or rc <= 128:
        return rc
    if re.search(r"task \d+: Exited with exit code \d+", log_tail):
        return rc
    return -(rc - 128)


def step_name(tag: str, proc: str) -> str:
    """The Slurm step name of process ``proc`` of mxdist job ``tag``."""
    return f"mxdist.{tag}.{proc}"


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


def _tail(path: str, size: int = 4096) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


_SHM_CLEAN = ("import glob,os,sys\n"
              "for p in glob.glob('/dev/shm/psnode.%s.*'%sys.argv[1]):\n"
              " try:os.unlink(p)\n"
              " except OSError:pass\n")


class SlurmBackend:
    """Processes as steps of Slurm job ``job_id``; see the module docstring."""

    name = "slurm"
    # no KEYS: the nodes read the launcher's copy of the job's secret
    capabilities: ClassVar[frozenset[Capability]] = frozenset({Capability.SHARED_FS, Capability.DESCRIBE})

    def __init__(self, workdir: str, python: str, job_id: str, tag: str,
                 cpus: Mapping[str, int] | None = None, slurm_conf: str | None = None,
                 **_: Any) -> None:
        self.workdir = workdir
        self.python = python
        self.job_id = str(job_id)
        self.tag = tag
        self.cpus = dict(cpus or {})
        self.slurm_conf = slurm_conf
        self.runner = LocalRunner(workdir, sys.executable, argv=self._argv,
                                  exit_code=lambda rc, proc: exit_code(rc, _tail(proc.run_log)))

    @classmethod
    def for_launch(cls, request: LaunchRequest) -> tuple[SlurmBackend, list[Host]]:
        """The allocation this command runs in (:func:`from_allocation`)."""
        if request.hosts or request.sync:
            raise PlanError("--launcher slurm runs on the nodes of the Slurm allocation, which share "
                            "the file system: drop -H and --sync")
        return from_allocation(request.environ, request.workdir, request.python, request.job_id)

    def options(self) -> dict[str, Any]:
        return {"workdir": self.workdir, "python": self.python, "job_id": self.job_id, "tag": self.tag,
                "cpus": self.cpus, "slurm_conf": self.slurm_conf}

    # -- Slurm commands ---------------------------------------------------------------------------

    def _env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ)
        if self.slurm_conf and "SLURM_CONF" not in env:
            env["SLURM_CONF"] = self.slurm_conf  # mxdist status/stop from a shell without it
        env.update(extra or {})
        return env

    def _run(self, argv: Sequence[str], timeout: float = 30.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        try:
            res = subprocess.run(list(argv), env=self._env(), capture_output=True, text=True,
                                 timeout=timeout, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise SlurmError(f"{argv[0]} not found: is Slurm installed here (or its module loaded)?") from None
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{shlex.join(argv)} did not answer within {timeout:.0f} s") from None
        if check and res.returncode != 0:
            raise SlurmError(f"{shlex.join(argv)} failed: {res.stderr.strip() or res.stdout.strip()}")
        return res

    def steps(self) -> dict[str, tuple[str, str]]:
        """This job's steps in the queue: process name -> (step id ``J.S``, node)."""
        res = self._run(["squeue", "-h", "-s", "-j", self.job_id, "-o", "%i|%j|%N"], check=False)
        if res.returncode != 0:
            if "Invalid job id" in res.stderr:
                return {}  # the allocation has ended: no step can be left
            raise SlurmError(f"squeue failed: {res.stderr.strip()}")
        prefix = step_name(self.tag, "")
        out: dict[str, tuple[str, str]] = {}
        for line in res.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) == 3 and parts[1].startswith(prefix):
                out[parts[1][len(prefix):]] = (parts[0], parts[2])
        return out

    def _scancel(self, step_ids: Sequence[str], signame: str | None = None) -> None:
        if not step_ids:
            return
        argv = ["scancel", "--quiet"] + ([f"--signal={signame}"] if signame else []) + list(step_ids)
        # scancel 22.05 exits non-zero after signalling a step; the queue is what we check
        self._run(argv, check=False)

    # -- allocation -------------------------------------------------------------------------------

    def hosts(self, environ: Mapping[str, str]) -> list[Host]:
        """The allocation's nodes as hosts (address from Slurm, slots from tasks per node)."""
        nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
        if not nodelist:
            res = self._run(["scontrol", "-o", "show", "job", self.job_id])
            m = re.search(r"(?:^|\s)NodeList=(\S+)", res.stdout)
            if not m or m.group(1) == "(null)":
                raise SlurmError(f"Slurm job {self.job_id} has no nodes (is it still pending?)")
            nodelist = m.group(1)
        nodes = self._run(["scontrol", "show", "hostnames", nodelist]).stdout.split()
        if not nodes:
            raise SlurmError(f"the allocation's node list {nodelist!r} is empty")
        cpus = _per_node(environ.get("SLURM_JOB_CPUS_PER_NODE"), len(nodes), 1)
        slots = _per_node(environ.get("SLURM_TASKS_PER_NODE"), len(nodes), 0) or cpus
        self.cpus = dict(zip(nodes, cpus, strict=False))
        addresses = self.addresses(nodes)
        return [Host(name=n, address=addresses[n], slots=max(1, s)) for n, s in zip(nodes, slots, strict=False)]

    def addresses(self, nodes: Sequence[str]) -> dict[str, str]:
        """Node name -> IP address to bind to: the name if it is one, else its NodeAddr, resolved."""
        out = {n: n for n in nodes if _is_ip(n)}
        rest = [n for n in nodes if n not in out]
        if not rest:
            return out
        res = self._run(["scontrol", "-o", "show", "node", ",".join(rest)])
        node_addr = {}
        for line in res.stdout.splitlines():
            name_m = re.search(r"(?:^|\s)NodeName=(\S+)", line)
            addr_m = re.search(r"(?:^|\s)NodeAddr=(\S+)", line)
            if name_m and addr_m:
                node_addr[name_m.group(1)] = addr_m.group(1)
        for node in rest:
            addr = node_addr.get(node, node)
            if not _is_ip(addr):
                try:
                    addr = socket.getaddrinfo(addr, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
                except OSError as exc:
                    raise SlurmError(f"node {node}: cannot resolve its address {addr!r}: {exc}") from None
            out[node] = addr
        return out

    # -- the Backend protocol ---------------------------------------------------------------------

    def srun_argv(self, node: str, step: str, argv: Sequence[str], **extra: str) -> list[str]:
        opts = [f"--jobid={self.job_id}", "--overlap", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1",
                f"--cpus-per-task={self.cpus.get(node, 1)}", f"--nodelist={node}", f"--job-name={step}",
                "--export=ALL", f"--chdir={self.workdir}", "--mpi=none"]
        opts += [f"--{k.replace('_', '-')}={v}" for k, v in extra.items()]
        return ["srun", *opts, "--", *argv]

    def preflight(self, hosts: Sequence[Host], modules: Sequence[str],
                  env: Mapping[str, str], target: tuple[str, str] | None = None) -> Preflight:
        """One step over all nodes checks the working directory and the imports on each, and reports
        its GPUs."""
        for tool in ("srun", "squeue", "scancel", "scontrol"):
            if shutil.which(tool) is None:
                return Preflight([HostProblem("slurm", f"{tool} not found on this machine",
                                              "run mxdist where the Slurm client commands are (module load slurm?)")])
        try:
            res = self._run(["scontrol", "-o", "show", "job", self.job_id], check=False)
        except SlurmError as exc:
            return Preflight([HostProblem("slurm", str(exc), "check that slurmctld is reachable (SLURM_CONF?)")])
        state = re.search(r"JobState=(\S+)", res.stdout)
        if res.returncode != 0 or not state or state.group(1) != "RUNNING":
            why = res.stderr.strip() or (f"state {state.group(1)}" if state else "unknown state")
            return Preflight([HostProblem("slurm", f"Slurm job {self.job_id} is not running ({why})",
                                          "launch inside a live allocation (salloc / sbatch)")])
        names = [h.name for h in hosts]
        argv = ["srun", f"--jobid={self.job_id}", "--overlap", f"--nodes={len(names)}",
                f"--ntasks={len(names)}", "--ntasks-per-node=1", f"--nodelist={','.join(names)}",
                f"--job-name={step_name(self.tag, 'preflight')}", "--export=ALL",
                f"--chdir={self.workdir}", "--mpi=none", "--", self.python, "-c", _CHECK, self.workdir,
                json.dumps(list(target) if target else None), *modules]
        try:
            proc = subprocess.run(argv, env=self._env(env), capture_output=True, text=True, timeout=60,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            self._scancel([sid for n, (sid, _) in self.steps().items() if n == "preflight"])
            return Preflight([HostProblem("slurm", "the preflight step did not finish within 60 s",
                                          "are the nodes responsive? (sinfo, squeue -s)")])
        reports: dict[str, list[str]] = {}
        label = {h.name: h.label for h in hosts}
        gpus: dict[str, HostGpus] = {}
        for line in proc.stdout.splitlines():
            try:
                item = agent.NodeCheck.from_line(line)
            except agent.MessageError as exc:
                return Preflight([HostProblem("slurm", f"a node's preflight answer does not read: {exc}",
                                              "run the same mxdist on every node (--python)")])
            if item is not None and item.node is not None:
                reports[item.node] = item.errors
                if item.node in label:
                    gpus[label[item.node]] = host_gpus(item.gpus)
        problems = []
        err = " ".join(proc.stderr.split())[-300:]
        for node in names:
            if node not in reports:
                if "execve" in proc.stderr or proc.returncode in (2, 126, 127):
                    problems.append(HostProblem(node, f"cannot run {self.python} there: {err}",
                                                "pass --python PATH (a Python with psnode on every node)"))
                else:
                    problems.append(HostProblem(node, f"the preflight step did not run there: {err}",
                                                "check the node (sinfo -N, scontrol show node)"))
                continue
            for msg in reports[node]:
                fix = ("use a directory shared by all nodes (--workdir)" if "directory" in msg else
                       "install it for --python on every node, or set PYTHONPATH")
                problems.append(HostProblem(node, msg, command_fix(msg, fix)))
        return Preflight(problems, gpus)

    # srun runs here, under the agent's reaper: the local runner starts and follows it
    def _argv(self, host: Host, proc: ProcSpec) -> list[str]:
        return self.srun_argv(host.name, step_name(self.tag, proc.name), proc.argv)

    def reachable(self, host: Host, timeout: float) -> None:
        pass  # srun, squeue and the logs are all on this machine

    def disconnect(self, host: Host) -> None:
        pass  # (nothing connects this machine to it)

    def start(self, host: Host, procs: Sequence[ProcSpec], run_dir: str) -> list[Started]:
        return self.runner.start(host, procs, run_dir)

    def follow(self, host: Host, proc: ProcRecord, emit: Callable[[bytes], None],
               wait: bool = True, offset: int = 0) -> ExitStatus | None:
        return self.runner.follow(proc, emit, wait, offset)

    def collect(self, host: Host, procs: Sequence[ProcRecord], run_dir: str) -> list[Evidence]:
        return self.runner.collect(procs, run_dir)

    def cleanup(self, host: Host, job_id: str, run_dir: str) -> None:
        self.runner.cleanup(job_id, run_dir)
        # the allocation may be gone: then so is what its steps left in the nodes' tmpfs
        with contextlib.suppress(SlurmError):
            self._run(self.srun_argv(host.name, step_name(self.tag, "cleanup"),
                                     [self.python, "-c", _SHM_CLEAN, job_id], immediate="5"),
                      timeout=15, check=False)

    def close(self) -> None:
        pass

    def status(self, host: Host, procs: Sequence[ProcRecord]) -> list[ProcStatus]:
        steps = self.steps()
        return [ProcStatus(p.name in steps or st.alive, st.members, st.code)
                for p, st in zip(procs, self.runner.status(procs), strict=True)]

    def describe(self, procs: Sequence[ProcRecord]) -> BackendStatus:
        """For ``mxdist status``: the Slurm job id, and the step id of each running process."""
        try:
            steps = self.steps()
        except SlurmError:
            steps = {}
        return BackendStatus({"slurm_job": self.job_id}, f"Slurm job {self.job_id}",
                             {name: sid for name, (sid, _) in steps.items()})

    def signal(self, host: Host, procs: Sequence[ProcRecord], signum: int) -> None:
        names = {p.name for p in procs}
        ids = [sid for n, (sid, _) in self.steps().items() if n in names]
        self._scancel(ids, _signal.Signals(signum).name.removeprefix("SIG"))

    def stop(self, host: Host, procs: Sequence[ProcRecord], grace: float) -> list[int]:
        """TERM the steps, KILL (scancel) after ``grace``, then the local sruns; verify."""
        names = {p.name for p in procs}
        pids = [p.pid for p in procs if p.pid]

        def mine() -> list[str]:
            return [sid for n, (sid, _) in self.steps().items() if n in names]

        def local_alive() -> bool:
            return any(agent.group_members(pids).values()) if pids else False

        self._scancel(mine(), "TERM")
        deadline = time.monotonic() + grace
        while (left := mine()) or local_alive():
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if left:
            self._scancel(left)
            end = time.monotonic() + 30  # Slurm's KillWait and the step's cleanup
            while (left := mine()) and time.monotonic() < end:
                time.sleep(0.2)
        leftover = agent.answer(agent.StopGroupsRequest(pids, 2.0)).survivors() if pids else []
        if left:
            raise SlurmError(f"Slurm steps still present after scancel: {', '.join(left)} "
                             f"(squeue -s -j {self.job_id}; scancel {' '.join(left)})")
        return leftover



def _per_node(spec: str | None, count: int, default: int) -> list[int]:
    if not spec:
        return [default] * count
    values = parse_counts(spec)
    return values if len(values) == count else [default] * count


def from_allocation(environ: Mapping[str, str], workdir: str, python: str, tag: str
                    ) -> tuple[SlurmBackend, list[Host]]:
    """The backend and hosts of the allocation this command runs in; SlurmError outside one."""
    job_id = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    if not job_id:
        raise SlurmError(HOW_TO_ALLOCATE)
    backend = SlurmBackend(workdir=workdir, python=python, job_id=job_id, tag=tag,
                           slurm_conf=environ.get("SLURM_CONF"))
    return backend, backend.hosts(environ)
