"""From ``mxdist launch`` options to a plan, a backend, a job record and launch settings: the
I/O of a launch's preparation.

The glue between the typer command (:mod:`mxdist.main`) and the pure planning
(:mod:`mxdist.planning`): it picks the launcher, has its backend find the job's hosts
(:func:`mxdist.backends.registry.for_launch`), runs the discovery script once for the first
hosts, chooses free ports on this machine, checks the files the options name, and computes the
plan.  What depends on the backend is a question to it (:class:`mxdist.backends.base.Capability`:
whether the processes run on this machine, whether they see its files), never its name.  No
process of the job is started here.

The engine (``--engine``, :mod:`mxdist.planning.engines`) is asked which of the options given it
can run (:meth:`~mxdist.planning.engines.JobEngine.admit`: refusals are errors naming the option,
its notes become the plan's warnings), what preflight imports, which variables pass through or
are its own, and whether the job can have a secret.  Every process's ``PSNODE_KEY_FILE`` is
planned as ``<run dir>/job.key`` on its host; the supervisor writes the secret there before
anything starts (:mod:`mxdist.supervisor.preflight`).  Every error is a ``PlanError`` or
``HostsError`` (exit 2, no traceback).
"""
from __future__ import annotations

import os
import random
import socket
from dataclasses import dataclass, replace

from psnode import launcher as door
from psnode.launcher import Mode

from ..backends.base import Backend, Capability, LaunchRequest, all_here, read_hosts, resolver, this_machine_gpus
from ..backends.registry import NAMES, capabilities, for_launch
from ..elastic.discovery import DiscoveryError, discover
from ..job import records
from ..job.records import JobRecord
from ..planning.engines import engine_named
from ..planning.gpus import VISIBLE, HostGpus
from ..planning.hosts import Host, HostsError, looks_like_file, parse_host_list, parse_hosts_file
from ..planning.options import (
    DEFAULT_EPHEMERAL,
    EPHEMERAL_RANGE_FILE,
    REMOTE_PORT_RANGE,
    LaunchOptions,
    LaunchSettings,
    checkpoint_dir,
    job_command,
    listen_range,
    parse_ranks,
    run_workdir,
    security_mode,
    slots_from,
)
from ..planning.plan import (
    PASSTHROUGH,
    Plan,
    PlanError,
    PlanRequest,
    make_plan,
    parse_env_assignments,
    passthrough_env,
    per_node,
)
from .supervisor import new_record


@dataclass
class Prepared:
    plan: Plan
    backend: Backend
    record: JobRecord
    settings: LaunchSettings
    how: str = ""       # how the processes start (how_started)


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


def check_resume(plan: Plan, directory: str) -> None:
    """``--resume`` where the hosts see this machine's files: every server's checkpoint file must
    exist before anything starts."""
    missing = [os.path.basename(door.checkpoint_path(directory, r)) for r in range(plan.num_servers)
               if not os.path.isfile(door.checkpoint_path(directory, r))]
    if plan.num_servers == 0:
        raise PlanError("--resume loads the servers' checkpoints: the job has no servers (-s 0)")
    if missing:
        raise PlanError(f"--resume: no checkpoint {', '.join(missing)} in {directory} "
                        f"(resume with the same -s as the job that wrote it)")


def prepare(opts: LaunchOptions, environ: dict[str, str] | None = None) -> Prepared:
    """Validate options and compute everything a launch needs; raise HostsError/PlanError."""
    environ = dict(os.environ if environ is None else environ)
    if opts.timeline == "" and opts.command and opts.command[0].endswith(".json") and not opts.module:
        raise PlanError(f"--timeline takes no path, and {opts.command[0]} is no program to run: write "
                        f"--timeline-path {opts.command[0]}")
    opts = replace(opts, command=job_command(opts.command, opts.module, opts.known_options), module=False)
    launcher = opts.launcher or default_launcher(opts)
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
        if opts.hosts and not opts.launcher:
            raise PlanError(f"-i/--identity-file is for SSH logins, and -H {opts.hosts} names this machine, which "
                            "runs without SSH: drop -i, or pass --launcher ssh to log in over SSH")
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
    own_hosts = Capability.HOSTS not in backend.capabilities
    hosts = per_node(hosts, opts.nproc_per_node, opts.num_workers, opts.max_workers is not None,
                     own_hosts, slots_from(opts, launcher, own_hosts))
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
        standby=opts.standby_scheduler,
        min_workers=opts.min_workers, max_workers=opts.max_workers, slots_bound=script is None,
        slots_from=slots_from(opts, launcher, own_hosts), timeline=opts.timeline is not None,
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
    return Prepared(plan, backend, record, settings, how_started(opts, backend))


def default_launcher(opts: LaunchOptions) -> str:
    """The launcher when ``--launcher`` is not given: SSH for hosts given (``-H``, a discovery
    script) unless every ``-H`` host names this machine (``-H localhost:2`` runs here, as
    horovodrun runs it), else this machine."""
    if opts.host_discovery_script or (opts.hosts and opts.server_hosts):
        return "ssh"
    if opts.hosts:
        return "local" if all_here(read_hosts(opts.hosts)) else "ssh"
    return "local"


def how_started(opts: LaunchOptions, backend: Backend) -> str:
    """How the job's processes start, in the dry run's words."""
    caps = backend.capabilities
    if Capability.LOGIN in caps:
        return "over SSH, on every host"
    if Capability.THIS_MACHINE in caps:
        if opts.hosts:
            return (f"on this machine, without SSH (-H {opts.hosts} names this machine; --launcher ssh logs in "
                    "over SSH)")
        return "on this machine"
    return f"by the {backend.name} launcher, on the hosts it finds"


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


def known_gpus(prepared: Prepared) -> dict[str, HostGpus]:
    """The hosts' GPUs as far as a dry run knows them without connecting anywhere: this
    machine's for a local job (nvidia-smi here), else the ``CUDA_VISIBLE_DEVICES`` that every
    process gets (passed through or ``-e``) when there is one; other hosts: at preflight."""
    plan = prepared.plan
    env = dict(plan.base_env)
    if Capability.THIS_MACHINE in prepared.backend.capabilities:
        return {h.label: this_machine_gpus(env) for h in plan.busy_hosts}
    if VISIBLE in env:
        return {h.label: HostGpus.from_visible(env[VISIBLE]) for h in plan.busy_hosts}
    return {}
