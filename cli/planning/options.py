"""From ``mxdist launch`` options to a plan, a backend, a job record and launch settings.

This is the glue between the typer command (:mod:`mxdist.main`) and the pure modules: it picks
the launcher, has its backend find the job's hosts (:func:`mxdist.backends.registry.for_launch`), chooses
ports, and computes the plan.  What depends on the backend is a question to it
(:class:`mxdist.backends.base.Capability`: whether the processes run on this machine, whether they
see its files), never its name.  No process is started here.

Options that become psnode configuration are one :class:`mxdist.planning.plan.NodeOptions` (filled once by
the typer command, validated there, carried by the plan into every process's NodeConfig);
:class:`LaunchOptions` holds it and the launcher's own options, each default written once here
(the typer command reads them from :func:`launch_default`).  Every error is a
:class:`PlanError` (exit 2, no traceback).

The command (:func:`job_command`): ``-m`` makes it ``-m MODULE ARGS`` (run as ``python -m``); a
first word that looks like an option is refused, never run.  ``--nproc-per-node`` gives every
host its slots (:func:`mxdist.planning.plan.per_node`).

The engine (``--engine``, :mod:`mxdist.planning.engines`) is asked which of the options given it can run
(:meth:`~mxdist.planning.engines.JobEngine.admit`: refusals are errors naming the option, its notes become
the plan's warnings), what preflight imports, which variables pass through or are its own, and
whether the job can have a secret.

Security (:func:`security_mode`): every job, local ones included, is ``authenticated`` by
default (a fresh secret per job; :mod:`psnode.launcher` says what each mode protects);
``--encrypt`` makes it ``encrypted`` (CURVE on every link), ``--insecure`` turns it off.  Every
process's ``PSNODE_KEY_FILE`` is planned as ``<run dir>/job.key`` on its host; the supervisor
writes the secret there before anything starts (:mod:`mxdist.supervisor.preflight`).
"""
from __future__ import annotations

import difflib
import os
import random
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from psnode.launcher import Mode, checkpoint_path

from ..backends import agent
from ..backends.base import Backend, Capability, LaunchRequest, resolver
from ..backends.registry import NAMES, capabilities, for_launch
from ..elastic.discovery import DiscoveryError, discover
from ..job import records
from ..job.records import JobRecord
from ..supervisor.supervisor import LaunchSettings, new_record
from .engines import JobEngine, engine_named
from .gpus import VISIBLE, HostGpus
from .hosts import Host, HostsError, looks_like_file, parse_host_list, parse_hosts_file
from .plan import (
    PASSTHROUGH,
    NodeOptions,
    Plan,
    PlanError,
    PlanRequest,
    make_plan,
    parse_env_assignments,
    passthrough_env,
    per_node,
)

# Ports a job listens on are chosen where the kernel never puts the source port of an outgoing
# connection (its ephemeral range: 32768-60999 on Linux by default), so nothing can take a port
# between the launcher choosing it and the scheduler or rank 0's torch store binding it.
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
DEFAULT_EPHEMERAL = (32768, 60999)
REMOTE_PORT_RANGE = (20000, 32000)   # below the default ephemeral range of the remote hosts


@dataclass
class LaunchOptions:
    """``mxdist launch`` options, as typed by the user (see ``mxdist launch --help``); the
    defaults here are the command's defaults."""

    command: list[str]
    node: NodeOptions = field(default_factory=NodeOptions)
    hosts: str | None = None
    server_hosts: str | None = None        # hosts that run only servers (same forms as -H)
    num_workers: int | None = None
    num_servers: int | None = None
    launcher: str | None = None
    python: str = sys.executable
    env: list[str] = field(default_factory=list)
    workdir: str | None = None
    sync: list[str] = field(default_factory=list)
    scheduler: str | None = None
    port: int | None = None
    quiet: bool = False
    detach: bool = False
    ranks: str | None = None
    grace: float = 5.0
    finish_grace: float = 10.0
    ssh_config: str | None = None
    known_hosts: str | None = None
    accept_new_host_keys: bool = False
    connect_timeout: float = 10.0
    identity_file: str | None = None       # ssh -i: tried before the ssh config's IdentityFile
    remote_dir: str = "~/.mxdist/run"
    insecure: bool = False
    encrypt: bool = False
    keep_jobs: int = 100
    gpus_per_worker: int | None = None     # None: every worker sees all of its host's GPUs
    pass_local_rank: bool = False
    engine: str = "psnode"                 # mxdist.planning.engines: psnode, or MXNet's own ps-lite processes
    min_workers: int | None = None         # mxdist.elastic.rules: None is -n (a job of fixed size)
    max_workers: int | None = None
    host_discovery_script: str | None = None   # mxdist.elastic.discovery: the hosts, polled (instead of -H)
    timeline: str | None = None            # --timeline: None off, "" the job's directory, else the trace's path
    module: bool = False                   # -m: the command is a module, run as python -m COMMAND ARGS
    nproc_per_node: int | None = None      # every host's slots (None: the hosts say)
    known_options: tuple[str, ...] = ()    # the command's option names, to suggest one for a typo

    def given(self) -> list[str]:
        """The flags of the psnode, membership and security options given (for the engine to admit)."""
        return [*self.node.given(), *(["--insecure"] if self.insecure else []),
                *(["--encrypt"] if self.encrypt else []),
                *(["--min-workers"] if self.min_workers is not None else []),
                *(["--max-workers"] if self.max_workers is not None else []),
                *(["--host-discovery-script"] if self.host_discovery_script else [])]


#: Options of torchrun and horovodrun that mxdist spells otherwise -> what to write.
HABITS: dict[str, str] = {
    "-np": "-n N (workers in total)",
    "--nnodes": "-H with one entry per node (and --nproc-per-node N, or HOST:N slots)",
    "--node-rank": "nothing: mxdist starts every node itself",
    "--master-addr": "--scheduler HOST",
    "--master-port": "--port PORT",
    "--standalone": "nothing: without -H mxdist runs on this machine",
    "--rdzv-timeout": "--start-timeout SECONDS",
    "--rdzv-endpoint": "--scheduler HOST --port PORT",
    "--hostfile": "-H FILE",
}


def job_command(command: Sequence[str], module: bool, known: Sequence[str] = ()) -> list[str]:
    """The command as the job runs it: ``-m MODULE ARGS`` with ``module``, else as given.  A first
    word that looks like an option is one mxdist does not know, typed before the script (the
    options go before it): refused, naming the nearest of ``known`` or the torchrun/horovodrun
    habit it looks like, rather than run as the command."""
    if command and command[0].startswith("-") and command[0] != "-":
        word = command[0].split("=", 1)[0]
        spelled = word.replace("_", "-")
        if spelled in HABITS:
            hint = f"; mxdist says {HABITS[spelled]}"
        else:
            same = [k for k in known if k.startswith("--") == spelled.startswith("--")]
            near = difflib.get_close_matches(spelled, same, n=1, cutoff=0.6)
            hint = f"; did you mean {near[0]}?" if near else "; mxdist launch --help lists them"
        raise PlanError(f"unknown option {word} before the command{hint} (mxdist launch [OPTIONS] COMMAND "
                        "[ARGS]...: mxdist's options go before the command, the command's own after it)")
    return ["-m", *command] if module else list(command)


def security_mode(opts: LaunchOptions, engine: JobEngine | None = None) -> Mode:
    """The job's security mode from ``--insecure`` / ``--encrypt`` (neither: authenticated);
    ``insecure`` whatever they say for an engine whose processes cannot read a secret."""
    if opts.insecure and opts.encrypt:
        raise PlanError("--insecure and --encrypt contradict each other: choose one (neither: every "
                        "connection authenticated, traffic in clear)")
    if engine is not None and not engine.secured:
        return Mode.INSECURE
    return Mode.INSECURE if opts.insecure else Mode.ENCRYPTED if opts.encrypt else Mode.AUTHENTICATED


def launch_default(name: str) -> Any:
    """The default of a LaunchOptions field (the typer command's default)."""
    return LaunchOptions.__dataclass_fields__[name].default


def parse_ranks(spec: str | None) -> frozenset[int] | None:
    """``--ranks 0,2-3`` -> {0, 2, 3}; None streams every process."""
    if not spec:
        return None
    out: set[int] = set()
    for part in spec.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi if sep else lo)
        except ValueError:
            raise PlanError(f"--ranks {spec!r}: use ranks and ranges, e.g. 0 or 0,2-3") from None
        if first < 0 or last < first:
            raise PlanError(f"--ranks {spec!r}: ranges go from a lower to a higher rank >= 0")
        out.update(range(first, last + 1))
    return frozenset(out)


@dataclass
class Prepared:
    plan: Plan
    backend: Backend
    record: JobRecord
    settings: LaunchSettings


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on this machine now (bind to 0, read, close)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def ephemeral_range(path: str = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """This machine's range of ports for outgoing connections (the Linux default if unknown)."""
    try:
        with open(path) as fh:
            lo, hi = (int(x) for x in fh.read().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    return (lo, hi) if 1 <= lo <= hi <= 65535 else DEFAULT_EPHEMERAL


def listen_range(ephemeral: tuple[int, int]) -> tuple[int, int]:
    """Ports to listen on outside ``ephemeral`` (at least 1000 of them): below it from 20000
    when there is room, else above it; the whole unprivileged range if it leaves no room."""
    lo, hi = ephemeral
    if lo - 20000 >= 1000:
        return 20000, lo - 1
    if 65535 - hi >= 1000:
        return hi + 1, 65535
    return 1024, 65535


def free_listen_port(host: str = "127.0.0.1", avoid: frozenset[int] = frozenset()) -> int:
    """A port free on this machine now, outside its ephemeral range and not in ``avoid``."""
    low, high = listen_range(ephemeral_range())
    for _ in range(200):
        port = random.randint(low, high)
        if port in avoid:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        return port
    port = free_port(host)   # a crowded range: fall back to any free port
    while port in avoid:
        port = free_port(host)
    return port


def _ports(opts: LaunchOptions, here: bool) -> tuple[int, int]:
    """The scheduler's port and MASTER_PORT: ``--port``, else free on this machine when the job
    runs ``here``, else drawn from :data:`REMOTE_PORT_RANGE`."""
    if opts.port is not None:
        return opts.port, opts.port + 1
    if here:
        first = free_listen_port()
        return first, free_listen_port(avoid=frozenset({first}))
    low, high = REMOTE_PORT_RANGE
    port = random.randrange(low, high - 1)
    return port, port + 1


def _sync_pairs(items: list[str]) -> list[tuple[str, str]]:
    pairs = []
    for item in items:
        local, sep, remote = item.partition(":")
        local_abs = os.path.abspath(os.path.expanduser(local))
        if not os.path.isdir(local_abs):
            raise PlanError(f"--sync {item}: {local_abs} is not a directory")
        pairs.append((local_abs, remote if sep else local_abs))
    return pairs


def run_workdir(given: str | None, sync: list[tuple[str, str]], cwd: str) -> str:
    """Where the job's processes run: ``--workdir`` when given; else, with ``--sync``, where the
    directory launched from lands (the destination of the synced directory that holds ``cwd``,
    plus ``cwd``'s path inside it; with one ``--sync`` and ``cwd`` outside it, its destination);
    else ``cwd``."""
    if given:
        return os.path.abspath(given)
    for local, remote in sync:
        if cwd == local or cwd.startswith(local.rstrip(os.sep) + os.sep):
            inside = os.path.relpath(cwd, local)
            return remote if inside == "." else f"{remote.rstrip('/')}/{inside}"
    if len(sync) == 1:
        return sync[0][1]
    return cwd


def _identity_file(path: str | None) -> str | None:
    """``-i PATH`` as an absolute path to a readable private key file (None if not given)."""
    if not path:
        return None
    full = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(full):
        raise PlanError(f"-i {path}: no such file (a private key, e.g. ~/.ssh/id_ed25519)")
    if not os.access(full, os.R_OK):
        raise PlanError(f"-i {path}: cannot read it (permissions)")
    return full


def checkpoint_dir(opts: LaunchOptions, workdir: str, shared_fs: bool) -> str | None:
    """``--checkpoint-dir`` as an absolute path on the hosts (relative: under the workdir; ``~``
    only where the hosts see this machine's files, ``shared_fs``)."""
    if not opts.node.checkpoint_dir:
        return None
    path = opts.node.checkpoint_dir
    if path.startswith("~"):
        if not shared_fs:
            raise PlanError(f"--checkpoint-dir {path}: give an absolute path (or one relative to "
                            "--workdir): the remote home directory is not known here")
        path = os.path.expanduser(path)
    return os.path.normpath(os.path.join(workdir, path))


def check_resume(plan: Plan, directory: str) -> None:
    """``--resume`` where the hosts see this machine's files: every server's checkpoint file must
    exist before anything starts."""
    missing = [os.path.basename(checkpoint_path(directory, r)) for r in range(plan.num_servers)
               if not os.path.isfile(checkpoint_path(directory, r))]
    if plan.num_servers == 0:
        raise PlanError("--resume loads the servers' checkpoints: the job has no servers (-s 0)")
    if missing:
        raise PlanError(f"--resume: no checkpoint {', '.join(missing)} in {directory} "
                        f"(resume with the same -s as the job that wrote it)")


def prepare(opts: LaunchOptions, environ: dict[str, str] | None = None) -> Prepared:
    """Validate options and compute everything a launch needs; raise HostsError/PlanError."""
    environ = dict(os.environ if environ is None else environ)
    opts = replace(opts, command=job_command(opts.command, opts.module, opts.known_options), module=False)
    launcher = opts.launcher or ("ssh" if opts.hosts or opts.host_discovery_script else "local")
    if launcher not in NAMES:
        raise PlanError(f"--launcher {launcher!r}: choose local, ssh or slurm")
    ranks = parse_ranks(opts.ranks)
    engine = engine_named(opts.engine)
    notes = engine.admit(opts.given())
    job_id = records.new_job_id()
    user_env = parse_env_assignments(opts.env, engine.reserved_env)
    sync = _sync_pairs(opts.sync)
    workdir = run_workdir(opts.workdir, sync, os.getcwd())
    if opts.identity_file and Capability.LOGIN not in capabilities(launcher):
        raise PlanError(f"-i/--identity-file is for SSH hosts (-H); --launcher {launcher} does not use SSH")
    here = os.path.abspath(opts.workdir or os.getcwd())   # (the discovery script runs on this machine)
    script = discovery_script(opts, launcher, here)
    if script and opts.nproc_per_node is not None:
        raise PlanError("--nproc-per-node and --host-discovery-script both say the slots: the script prints "
                        "host:slots for each host; give one")
    backend, hosts = for_launch(launcher, LaunchRequest(
        job_id=job_id, workdir=workdir, python=opts.python, hosts=opts.hosts, num_workers=opts.num_workers,
        sync=bool(opts.sync), environ=environ, ssh_config=opts.ssh_config, known_hosts=opts.known_hosts,
        accept_new_host_keys=opts.accept_new_host_keys, connect_timeout=opts.connect_timeout,
        identity_file=_identity_file(opts.identity_file), max_workers=opts.max_workers,
        discovered=tuple(first_hosts(script, here)) if script else ()))
    hosts = per_node(hosts, opts.nproc_per_node, opts.num_workers, opts.max_workers is not None,
                     Capability.HOSTS not in backend.capabilities, _slots_from(opts, launcher))
    server_hosts = _server_hosts(opts, backend, script)
    scheduler_port, master_port = _ports(opts, Capability.THIS_MACHINE in backend.capabilities)
    # paths here are the paths the processes see: their run files go to the job's directory here
    # (Slurm: srun runs here and writes the logs here; the nodes share the file system)
    shared_fs = Capability.SHARED_FS in backend.capabilities
    run_dir = str(records.log_dir(job_id)) if shared_fs else f"{opts.remote_dir.rstrip('/')}/{job_id}"
    security = security_mode(opts, engine)
    ckpt = checkpoint_dir(opts, workdir, shared_fs)
    plan = make_plan(PlanRequest(
        job_id=job_id, command=opts.command, hosts=hosts, python=backend.python,
        scheduler_port=scheduler_port, master_port=master_port,
        num_workers=opts.num_workers, num_servers=opts.num_servers,
        scheduler_host=opts.scheduler, server_hosts=server_hosts, user_env=user_env,
        base_env=passthrough_env(environ, (*PASSTHROUGH, *engine.passthrough)),
        node=replace(opts.node, checkpoint_dir=ckpt), run_dir=run_dir,
        key_files=({h.label: f"{run_dir}/job.key" for h in (*hosts, *server_hosts)}
                   if security is not Mode.INSECURE else {}),
        gpus_per_worker=opts.gpus_per_worker, pass_local_rank=opts.pass_local_rank, engine=engine,
        min_workers=opts.min_workers, max_workers=opts.max_workers, slots_bound=script is None,
        slots_from=_slots_from(opts, launcher), timeline=opts.timeline is not None,
    ))
    plan = replace(plan, warnings=(*notes, *plan.warnings))
    if opts.node.resume and ckpt and shared_fs:
        check_resume(plan, ckpt)
    if opts.grace < 0 or opts.finish_grace < 0:
        raise PlanError("--grace and --finish-grace are seconds >= 0")
    log_dir = records.log_dir(job_id)
    record = new_record(plan, backend, opts.command, workdir, log_dir, security, script)
    if opts.timeline is not None:
        record.timeline = os.path.abspath(os.path.join(here, os.path.expanduser(opts.timeline))) \
            if opts.timeline else str(log_dir / "timeline.json")
    settings = LaunchSettings(run_dir=run_dir, grace=opts.grace, finish_grace=opts.finish_grace,
                              detach=opts.detach, quiet=opts.quiet or opts.detach, ranks=ranks,
                              sync=sync, security=security, check_modules=engine.modules,
                              timeline_dir=f"{run_dir}/timeline" if opts.timeline is not None else None,
                              timeline_local=shared_fs)
    return Prepared(plan, backend, record, settings)


def _server_hosts(opts: LaunchOptions, backend: Backend, script: str | None) -> list[Host]:
    """``--server-hosts`` (a hosts file or an inline list, as ``-H``), resolved like ``-H``'s hosts;
    [] when not given.  Only for SSH hosts, and only for a job of fixed size (an elastic job's
    new workers go to hosts with free slots, which a server host must not offer)."""
    if not opts.server_hosts:
        return []
    found = resolver(backend)
    if found is None or not opts.hosts:
        raise PlanError("--server-hosts names SSH hosts for the servers: give the workers' hosts with -H "
                        "(and --launcher ssh)")
    if script or opts.min_workers is not None or opts.max_workers is not None:
        raise PlanError("--server-hosts is for a job of fixed size: leave out --min-workers, --max-workers "
                        "and --host-discovery-script, or put the servers on the workers' hosts")
    spec = opts.server_hosts
    path = os.path.expanduser(spec)
    if os.path.isfile(path):
        try:
            with open(path) as fh:
                text = fh.read()
        except OSError as exc:
            raise HostsError(f"--server-hosts {spec}: cannot read: {exc}") from None
        hosts = parse_hosts_file(text, spec)
    elif looks_like_file(spec):
        raise HostsError(f"--server-hosts {spec}: no such hosts file")
    else:
        try:
            hosts = parse_host_list(spec)
        except HostsError as exc:   # (its messages name -H's items: the same form)
            raise HostsError(str(exc).replace("-H item", "--server-hosts item")) from None
    return [found.resolve(h) for h in hosts]


def discovery_script(opts: LaunchOptions, launcher: str, workdir: str) -> str | None:
    """``--host-discovery-script`` as an absolute path (None if not given): instead of ``-H``,
    for a launcher that logs in to hosts it is given."""
    if not opts.host_discovery_script:
        return None
    if opts.hosts:
        raise PlanError("-H and --host-discovery-script both name the hosts: give one")
    caps = capabilities(launcher)
    if Capability.HOSTS not in caps or Capability.LOGIN not in caps:
        raise PlanError(f"--host-discovery-script names SSH hosts; --launcher {launcher} finds its own "
                        "(use --launcher ssh)")
    path = os.path.join(workdir, os.path.expanduser(opts.host_discovery_script))
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        raise PlanError(f"--host-discovery-script {opts.host_discovery_script}: not an executable file "
                        "(it prints host[:slots] lines; chmod +x it)")
    return path


def first_hosts(script: str, workdir: str) -> list[Host]:
    """The discovery script's first answer: the job's first hosts (PlanError if it fails or
    names none)."""
    try:
        hosts = discover(script, cwd=workdir)
    except DiscoveryError as exc:
        raise PlanError(f"--host-discovery-script: {exc}") from None
    if not hosts:
        raise PlanError(f"--host-discovery-script: {script} printed no hosts (host[:slots] per line)")
    return hosts


def _slots_from(opts: LaunchOptions, launcher: str) -> str:
    """Where the hosts' slots come from, as an error names it."""
    if opts.hosts:
        return "the hosts (-H)" if not looks_like_file(opts.hosts) else f"the hosts in {opts.hosts}"
    if Capability.HOSTS not in capabilities(launcher):
        return f"the {launcher} launcher's hosts" if launcher != "slurm" else "the allocation's nodes"
    return "the hosts"


def known_gpus(prepared: Prepared) -> dict[str, HostGpus]:
    """The hosts' GPUs as far as a dry run knows them without connecting anywhere: this
    machine's for a local job (nvidia-smi here), else the ``CUDA_VISIBLE_DEVICES`` that every
    process gets (passed through or ``-e``) when there is one; other hosts: at preflight."""
    plan = prepared.plan
    env = dict(plan.base_env)
    if Capability.THIS_MACHINE in prepared.backend.capabilities:
        return {h.label: HostGpus.from_report(agent.gpus(env)) for h in plan.busy_hosts}
    if VISIBLE in env:
        return {h.label: HostGpus.from_visible(env[VISIBLE]) for h in plan.busy_hosts}
    return {}
