"""Placement: who runs where, on which ports, with which argv and environment.

Pure: no I/O.  The caller gives hosts (already resolved: ``Host.address`` is where a process
binds), the command, counts and ports; :func:`make_plan` returns every process to start.

Rules:

* the scheduler runs on the first host, or on ``scheduler_host`` (a host's name or label);
* servers are spread over the hosts round-robin (default: one per host; 0 is allowed); with
  ``--replicas`` K > 1, ranks are swapped where that keeps a server's copies (held by the next
  K-1 servers) off its own host (:func:`mxdist.planning.servers.place_servers`), and a server
  whose copies all share its host is a warning; with
  ``server_hosts`` (``--server-hosts``) over those instead (default: one per server host), and
  the workers' hosts run no server: every worker's link then carries its gradient once each way;
  big arrays are then sliced into parts of at most :data:`SERVER_HOSTS_SLICE_BYTES` (unless
  ``--slice-bytes`` says otherwise), so that a pushpull's answers flow back while it still pushes;
* workers fill the hosts' slots in order (host 1's slots, then host 2's, ...); more workers than
  slots wrap around round-robin and the plan carries a warning;
* the job's engine (:mod:`mxdist.planning.engines`, ``--engine``) says what the scheduler and the servers
  run and gives every process its variables (psnode's: ``NodeConfig(...).to_env()``; MXNet's:
  ``DMLC_*``); workers also get torchrun's whole environment (RANK, WORLD_SIZE, LOCAL_RANK,
  LOCAL_WORLD_SIZE, GROUP_RANK/NODE_RANK by host order, MASTER_ADDR: the scheduler's address,
  MASTER_PORT, TORCHELASTIC_*...: :mod:`mxdist.planning.torchenv`, the one place it is built), whatever
  the engine and the backend;
* a command ending in ``.py`` runs with ``python``; anything else runs as given; arguments are
  kept as separate words (never joined into a shell string here);
* ``pass_local_rank`` (``--pass-local-rank``): each worker also gets ``--local_rank=LOCAL_RANK``
  as an argument, where ``torch.distributed.launch`` put it (right after a ``.py`` script, before
  its arguments; at the end of any other command), for scripts that read ``args.local_rank``;
* GPUs: by default visibility is left alone (LOCAL_RANK names ``cuda:LOCAL_RANK``); with
  ``gpus_per_worker`` the plan records it, and :func:`with_gpus` gives each worker its
  ``CUDA_VISIBLE_DEVICES`` once the hosts' GPU lists are known (an input: preflight's report).

psnode options: one :class:`NodeOptions` per job (filled from ``mxdist launch``'s flags, defaults
from NodeConfig) becomes the NodeConfig fields of every process.  With ``run_dir`` set, each
process gets ``PSNODE_ERROR_FILE=<run_dir>/<name>.failure.json`` (:func:`psnode.launcher.path_in`):
where it writes its failure record for the supervisor to name the root cause.

Environment of every process = allowlisted variables of the launcher's environment
(:data:`PASSTHROUGH`, and the engine's own patterns) + the user's ``-e K=V`` +
``PYTHONUNBUFFERED=1`` (together :attr:`Plan.base_env`) + the engine's and torch variables
(which win).  ``-e PSNODE_*`` is refused (:func:`parse_env_assignments`): every psnode variable
comes from an ``mxdist launch`` option through ``NodeConfig.to_env()``; so are the variables the
engine sets (``JobEngine.reserved_env``).

The job's secret (:mod:`psnode.net.security`): ``key_files`` maps a host label to the secret
file's path on that host (the launcher writes the file there before starting anything; see
:mod:`mxdist.supervisor.preflight`); hosts without an entry get ``key_file`` (None: insecure).  A path may
still start with ``~`` at planning time: :func:`with_key_files` puts the path each host resolved
into the plan.
"""
from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from psnode.config import LOG_LEVELS, RELAY_FROM, CpuPolicy, Distribution, NodeConfig, Role, default
from psnode.errors import ConfigError
from psnode.launcher import path_in

from .bounds import Bounds, ElasticError, bounds
from .engines import PSNODE, JobEngine, NodeFacts
from .gpus import VISIBLE, GpuShortage, HostGpus, describe_worker, sharing_warnings, shortages, worker_env, worker_slots
from .hosts import Host, HostsError, check_env_name
from .servers import copies_at_home, place_servers
from .torchenv import TorchJob, TorchPlace, node_ranks, places, torch_env
from .torchenv import restarted as torch_restarted

#: Variables copied from the launcher's environment to every process (shell-style patterns).
PASSTHROUGH: tuple[str, ...] = (
    "PYTHONPATH",
    "PYTHONHASHSEED",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "NCCL_*",
    "GLOO_*",
    "TORCH_*",
    "LANG",
    "LC_ALL",
    "TZ",
)

_SECRET_RE = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH)", re.I)
#: Names matching _SECRET_RE whose values are paths, not secrets.
_NOT_SECRET = frozenset({"PSNODE_KEY_FILE"})

class PlanError(ValueError):
    """Options that cannot be placed (too few hosts, bad counts, unknown scheduler host...)."""


SERVER_HOSTS_SLICE_BYTES = 256 * 1024   # --server-hosts' slices (benchmarks/network/clusterbench.py)


@dataclass(frozen=True)
class NodeOptions:
    """The psnode options of one job: the same for every process.

    Filled once from ``mxdist launch``'s flags (each field names its flag), carried by the plan
    and turned into the NodeConfig fields of the same names (:meth:`config_fields`); the
    defaults are NodeConfig's own (:func:`psnode.config.default`), written once there.
    Invalid values raise :class:`PlanError` naming the flag.
    """

    distribution: Distribution = field(default=default("distribution"), metadata={"flag": "--distribution"})
    heartbeat_interval: float = field(default=default("heartbeat_interval"), metadata={"flag": "--heartbeat-interval"})
    heartbeat_liveness: int = field(default=default("heartbeat_liveness"), metadata={"flag": "--heartbeat-liveness"})
    log_level: str = field(default=default("log_level"), metadata={"flag": "--log-level"})
    checkpoint_dir: str | None = field(default=default("checkpoint_dir"), metadata={"flag": "--checkpoint-dir"})
    checkpoint_interval: float = field(default=default("checkpoint_interval"),
                                       metadata={"flag": "--checkpoint-interval"})
    checkpoint_rounds: int = field(default=default("checkpoint_rounds"), metadata={"flag": "--checkpoint-rounds"})
    resume: bool = field(default=default("resume"), metadata={"flag": "--resume"})
    replicas: int = field(default=default("replicas"), metadata={"flag": "--replicas"})
    skip_nonfinite: bool = field(default=default("skip_nonfinite"), metadata={"flag": "--skip-nonfinite"})
    max_restarts: int = field(default=default("max_restarts"), metadata={"flag": "--max-restarts"})
    shm: bool = field(default=default("shm"), metadata={"flag": "--no-shm"})
    cpu_policy: CpuPolicy = field(default=default("cpu_policy"), metadata={"flag": "--cpu-policy"})
    stall_warning: float = field(default=default("stall_warning"), metadata={"flag": "--stall-warning"})
    register_timeout: float = field(default=default("register_timeout"), metadata={"flag": "--start-timeout"})
    slice_bytes: int = field(default=default("slice_bytes"), metadata={"flag": "--slice-bytes"})
    backup_workers: int = field(default=default("backup_workers"), metadata={"flag": "--backup-workers"})

    def __post_init__(self) -> None:
        if not isinstance(self.distribution, Distribution):
            try:
                object.__setattr__(self, "distribution", Distribution(str(self.distribution).lower()))
            except ValueError:
                raise PlanError(f"--distribution {self.distribution!r}: choose data, param or hybrid") from None
        if not isinstance(self.cpu_policy, CpuPolicy):
            try:
                object.__setattr__(self, "cpu_policy", CpuPolicy(str(self.cpu_policy).lower()))
            except ValueError:
                raise PlanError(f"--cpu-policy {self.cpu_policy!r}: choose batch or normal") from None
        object.__setattr__(self, "log_level", str(self.log_level).upper())
        object.__setattr__(self, "checkpoint_dir", self.checkpoint_dir or None)
        if self.log_level not in LOG_LEVELS:
            raise PlanError(f"--log-level {self.log_level}: choose one of {', '.join(LOG_LEVELS)}")
        if not math.isfinite(self.heartbeat_interval) or self.heartbeat_interval <= 0:
            raise PlanError(f"--heartbeat-interval {self.heartbeat_interval:g}: must be seconds > 0")
        if not math.isfinite(self.stall_warning) or self.stall_warning < 0:
            raise PlanError(f"--stall-warning {self.stall_warning:g}: must be seconds >= 0 (0: never warn)")
        if not math.isfinite(self.register_timeout) or self.register_timeout <= 0:
            raise PlanError(f"--start-timeout {self.register_timeout:g}: must be seconds > 0 (how long the "
                            "scheduler waits for every process to register)")
        if self.heartbeat_liveness < 1:
            raise PlanError(f"--heartbeat-liveness {self.heartbeat_liveness}: must be 1 or more")
        if self.max_restarts < 0:
            raise PlanError(f"--max-restarts {self.max_restarts}: must be 0 or more")
        if not math.isfinite(self.checkpoint_interval) or self.checkpoint_interval < 0:
            raise PlanError(f"--checkpoint-interval {self.checkpoint_interval:g}: must be seconds >= 0")
        if self.slice_bytes < 0:
            raise PlanError(f"--slice-bytes {self.slice_bytes}: must be 0 (one part per server) or more")
        if self.backup_workers < 0:
            raise PlanError(f"--backup-workers {self.backup_workers}: must be 0 or more (0: every round waits for "
                            "every worker)")
        if self.checkpoint_rounds < 0:
            raise PlanError(f"--checkpoint-rounds {self.checkpoint_rounds}: must be 0 or more")
        if self.replicas < 1:
            raise PlanError(f"--replicas {self.replicas}: must be 1 or more (1: each server's state on its "
                            "own host only; 2: survives the loss of any one host)")
        if not self.checkpoint_dir:
            used = [flag for flag, on in (("--checkpoint-interval", self.checkpoint_interval > 0),
                                          ("--checkpoint-rounds", self.checkpoint_rounds > 0 and self.replicas < 2),
                                          ("--resume", self.resume)) if on]
            if used:
                raise PlanError(f"{' and '.join(used)} need{'s' if len(used) == 1 else ''} --checkpoint-dir DIR")

    def config_fields(self) -> dict[str, Any]:
        """These options as NodeConfig keyword arguments."""
        return asdict(self)

    def given(self) -> list[str]:
        """The flags of the options that differ from their defaults (what the user asked for)."""
        return [f.metadata["flag"] for f in fields(self) if getattr(self, f.name) != f.default]

    @property
    def servers_restart(self) -> bool:
        """A failed server is replaced when restarts are allowed and its state outlives it: servers
        checkpoint (it restores its checkpoint) or are replicated (it copies its state back from
        a server holding a copy, on any host)."""
        return self.max_restarts > 0 and (bool(self.checkpoint_dir) or self.replicas > 1)

    def check_servers(self, servers: int) -> None:
        """PlanError when these options do not fit a job of ``servers`` servers (``-s``)."""
        if self.replicas > 1 and servers < self.replicas:
            fix = "give -s 2 or more" if servers < 2 else f"give --replicas {servers} or less, or -s {self.replicas}"
            raise PlanError(f"--replicas {self.replicas}: each server's state is copied to the next "
                            f"{self.replicas - 1} server{'s' if self.replicas > 2 else ''}, and the job has "
                            f"{servers} (-s {servers}); {fix}")


#: The ``mxdist launch`` option that sets each psnode variable (``-e`` may not set them).
PSNODE_OPTION: dict[str, str] = {
    **{f"PSNODE_{f.name.upper()}": f.metadata["flag"] for f in fields(NodeOptions)},
    "PSNODE_KEY_FILE": "--insecure or --encrypt (mxdist writes a fresh secret for every job)",
    "PSNODE_NUM_WORKERS": "-n/--num-workers",
    "PSNODE_MIN_WORKERS": "--min-workers",
    "PSNODE_MAX_WORKERS": "--max-workers",
    "PSNODE_NUM_SERVERS": "-s/--num-servers",
    "PSNODE_SCHEDULER": "--scheduler and --port",
    "PSNODE_PORT": "--port",
}


@dataclass(frozen=True)
class ProcSpec:
    """One process of the job: where it runs and exactly what it runs."""

    role: Role
    rank: int | None
    host: Host
    argv: tuple[str, ...]
    env: Mapping[str, str]
    local_rank: int = 0
    gpus: tuple[str, ...] | None = None   # --gpus-per-worker: its CUDA_VISIBLE_DEVICES entries, once placed

    @property
    def name(self) -> str:
        """``scheduler``, ``server-0``, ``worker-3``: unique in a job; names its log file."""
        return self.role.value if self.rank is None else f"{self.role.value}-{self.rank}"


@dataclass(frozen=True)
class PlanRequest:
    """Everything :func:`make_plan` needs; built by the CLI from options."""

    job_id: str
    command: Sequence[str]
    hosts: Sequence[Host]
    python: str
    scheduler_port: int
    master_port: int
    num_workers: int | None = None
    num_servers: int | None = None
    scheduler_host: str | None = None
    server_hosts: Sequence[Host] = ()    # hosts that run only servers (none: the workers' hosts)
    user_env: Mapping[str, str] = field(default_factory=dict)
    base_env: Mapping[str, str] = field(default_factory=dict)
    node: NodeOptions = field(default_factory=NodeOptions)
    key_file: str | None = None
    key_files: Mapping[str, str] = field(default_factory=dict)   # host label -> key file there
    run_dir: str | None = None        # where processes keep run files (failure records) on their host
    timeline: bool = False            # --timeline: processes append timeline events to <run_dir>/timeline
    gpus_per_worker: int | None = None   # None: leave GPU visibility alone (every worker sees all)
    pass_local_rank: bool = False        # workers also get --local_rank=N as an argument
    engine: JobEngine = PSNODE              # what runs as the scheduler and servers, their variables
    min_workers: int | None = None       # --min-workers (None: the first generation's size)
    max_workers: int | None = None       # --max-workers (None: the first generation's size)
    slots_bound: bool = True             # the hosts' slots bound --max-workers (no discovery script)
    slots_from: str = "the hosts"        # where the slots come from, for the error that says so
    standby: bool | None = False         # --standby-scheduler: a standby scheduler on the second host
    #                                      (None: one when the servers are replicated on 2+ hosts)
    standby_port: int | None = None      # the standby's port (None: scheduler_port + STANDBY_PORT_OFFSET)


@dataclass(frozen=True)
class Plan:
    """The processes to start, in start order: scheduler, servers, workers."""

    job_id: str
    hosts: tuple[Host, ...]
    procs: tuple[ProcSpec, ...]
    scheduler_address: str
    num_workers: int
    num_servers: int
    node: NodeOptions = field(default_factory=NodeOptions)
    warnings: tuple[str, ...] = ()
    gpus_per_worker: int | None = None
    gpus: Mapping[str, HostGpus] = field(default_factory=dict)   # host label -> its GPUs, where known
    engine: JobEngine = PSNODE
    base_env: Mapping[str, str] = field(default_factory=dict)    # what every process gets, before its
    #                                                              engine's and torch's variables
    bounds: Bounds | None = None       # the workers' bounds (mxdist.planning.bounds; None: -n alone)
    nodes: tuple[str, ...] = ()        # host names in node-rank order (GROUP_RANK; mxdist.planning.torchenv)
    request: PlanRequest | None = None   # what it was made from: joiners are planned the same way
    #: (scheduler, standby) its nodes register at and go over to, once a failover changed them
    #: (:func:`with_schedulers`; None: as planned)
    schedulers: tuple[str, str | None] | None = None

    @property
    def busy_hosts(self) -> list[Host]:
        """The hosts that run at least one process, in host order."""
        used = {p.host.label for p in self.procs}
        return [h for h in self.hosts if h.label in used]

    def of_role(self, role: Role) -> list[ProcSpec]:
        return [p for p in self.procs if p.role is role]

    def workers_per_host(self) -> dict[str, int]:
        """Host label -> how many workers it runs (hosts in plan order, only those with workers)."""
        counts: dict[str, int] = {}
        for p in self.of_role(Role.WORKER):
            counts[p.host.label] = counts.get(p.host.label, 0) + 1
        return {h.label: counts[h.label] for h in self.hosts if h.label in counts}


def placement(plan: Plan) -> str:
    """``4 processes on 2 hosts`` (and the hosts that run nothing), as the launch line says it."""
    busy = plan.busy_hosts
    text = f"{len(plan.procs)} processes on {len(busy)} host{'s' if len(busy) != 1 else ''}"
    idle = [h.label for h in plan.hosts if h not in busy]
    if idle:
        text += f" ({', '.join(idle)} run{'s' if len(idle) == 1 else ''} nothing)"
    return text


def parse_env_assignments(items: Sequence[str], reserved: Mapping[str, str] | None = None) -> dict[str, str]:
    """``["K=V", ...]`` -> dict; names are validated, values kept verbatim; PSNODE_* refused, and
    the ``reserved`` names (the engine's variables -> what sets them)."""
    out: dict[str, str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq:
            raise PlanError(f"-e {item!r}: expected NAME=VALUE")
        try:
            check_env_name(name, "-e")
        except HostsError as exc:
            raise PlanError(str(exc)) from None
        if name.upper().startswith("PSNODE_"):
            option = PSNODE_OPTION.get(name.upper())
            how = f"use {option} instead" if option else "no option changes this one"
            raise PlanError(f"-e {name}: PSNODE_* variables are set by mxdist; {how}")
        if reserved and name in reserved:
            raise PlanError(f"-e {name}: set by mxdist for every process, from {reserved[name]}")
        out[name] = value
    return out


def passthrough_env(environ: Mapping[str, str], patterns: Sequence[str] = PASSTHROUGH) -> dict[str, str]:
    """The variables of ``environ`` whose names match an allowlist pattern."""
    return {
        k: v for k, v in environ.items() if any(fnmatch.fnmatchcase(k, p) for p in patterns)
    }


def is_secret(name: str) -> bool:
    """Names that look like credentials: their values are never printed."""
    return name not in _NOT_SECRET and bool(_SECRET_RE.search(name))


_MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def is_module(command: Sequence[str]) -> bool:
    """Whether the command is ``-m MODULE ARGS`` (``mxdist launch -m``)."""
    return len(command) > 0 and command[0] == "-m"


def command_argv(command: Sequence[str], python: str) -> tuple[str, ...]:
    """A ``.py`` script and ``-m MODULE`` run with ``python``; anything else runs as given."""
    if not command:
        raise PlanError("no command given (example: mxdist launch train.py --epochs 3)")
    if is_module(command):
        if len(command) < 2 or not _MODULE_RE.match(command[1]) or command[1].endswith(".py"):
            what = repr(command[1]) if len(command) > 1 else "nothing"
            fix = f"mxdist launch {command[1]}" if len(command) > 1 and command[1].endswith(".py") else \
                "mxdist launch -m pkg.module ARGS"
            raise PlanError(f"-m takes a Python module name (pkg.module), got {what}: write {fix}")
        return (python, *command)
    if command[0].endswith(".py"):
        return (python, *command)
    return tuple(command)


def command_target(command: Sequence[str]) -> tuple[str, str]:
    """What must exist on every host for the command to start (preflight checks it):
    ``("script", path)`` for a ``.py`` command (path relative to the working directory),
    ``("module", name)`` for ``-m MODULE`` (importable from the working directory), else
    ``("program", name)`` (a path, or a name looked up on the PATH)."""
    if is_module(command):
        return ("module", command[1])
    return ("script", command[0]) if command[0].endswith(".py") else ("program", command[0])


def with_local_rank_arg(argv: Sequence[str], command: Sequence[str], local_rank: int) -> tuple[str, ...]:
    """``argv`` (from :func:`command_argv`) with ``--local_rank=N`` where torch.distributed.launch
    put it: right after a ``.py`` script or ``-m MODULE``; at the end of any other command."""
    arg = f"--local_rank={local_rank}"
    if is_module(command):
        return (*argv[:3], arg, *argv[3:])
    if command[0].endswith(".py"):
        return (*argv[:2], arg, *argv[2:])
    return (*argv, arg)


def per_node(hosts: Sequence[Host], nproc: int | None, num_workers: int | None, elastic: bool,
             derived: bool, slots_from: str) -> list[Host]:
    """``--nproc-per-node N``: every host gets N slots (torchrun's habit).  Refused by name when
    it contradicts a host's own slots (``derived``: the hosts' slots come from ``-n``, not from
    the user, and never contradict) or ``-n`` (a job of fixed size runs N per host: ``-n`` is
    then N times the hosts; an ``elastic`` one starts with at most that)."""
    if nproc is None:
        return list(hosts)
    if nproc < 1:
        raise PlanError(f"--nproc-per-node {nproc}: must be 1 or more")
    if not derived:
        odd = [h for h in hosts if h.slots not in (1, nproc)]
        if odd:
            listed = "; ".join(f"{h.origin + ' ' if ':' in h.origin else ''}{h.label} slots={h.slots}" for h in odd[:4])
            raise PlanError(f"--nproc-per-node {nproc} contradicts the slots of {slots_from} ({listed}): give the "
                            "slots once (drop --nproc-per-node, or the hosts' slots)")
    total = nproc * len(hosts)
    if num_workers is not None and (num_workers > total or (num_workers != total and not elastic)):
        many = f"{len(hosts)} host{'s' if len(hosts) != 1 else ''}"
        raise PlanError(f"-n {num_workers} contradicts --nproc-per-node {nproc} on {many} ({total} workers): "
                        f"give one of them (-n {total}, or leave -n out)")
    return [h.with_slots(nproc) for h in hosts]


def _find_host(hosts: Sequence[Host], wanted: str) -> Host:
    for host in hosts:
        if wanted in (host.name, host.label, host.address):
            return host
    names = ", ".join(h.label for h in hosts)
    raise PlanError(f"--scheduler {wanted!r} is not one of the hosts ({names})")


def place_workers(hosts: Sequence[Host], count: int) -> tuple[list[Host], bool]:
    """Fill slots in order; wrap round-robin past the total. Returns (host per rank, wrapped)."""
    order = [h for h in hosts for _ in range(h.slots)]
    if count <= len(order):
        return order[:count], False
    extra = [hosts[i % len(hosts)] for i in range(count - len(order))]
    return order + extra, True


def make_plan(req: PlanRequest) -> Plan:
    """Compute every process of the job (see the module docstring for the rules)."""
    hosts = tuple(req.hosts)
    if not hosts:
        raise PlanError("no hosts")
    total = sum(h.slots for h in hosts)
    server_hosts = tuple(req.server_hosts) or hosts
    both = [h.label for h in req.server_hosts if h.label in {w.label for w in hosts}]
    if both:
        raise PlanError(f"--server-hosts {', '.join(both)}: also among the workers' hosts (-H); a server host "
                        "runs servers only (leave --server-hosts out to share the workers' hosts)")
    workers = total if req.num_workers is None else req.num_workers
    servers = len(server_hosts) if req.num_servers is None else req.num_servers
    if req.server_hosts and servers < 1:
        raise PlanError(f"-s {servers} with --server-hosts: the server hosts need at least one server")
    if workers < 1:
        raise PlanError(f"-n {workers}: a job needs at least one worker")
    if servers < 0:
        raise PlanError(f"-s {servers}: the number of servers cannot be negative")
    engine = req.engine
    req.node.check_servers(servers)
    if req.node.backup_workers >= workers > 0 and req.node.backup_workers:
        raise PlanError(f"--backup-workers {req.node.backup_workers}: a round needs at least one push, and the job "
                        f"has {workers} workers (-n {workers}); use 0 to {workers - 1}")
    if req.standby is None:   # (a job that survives a lost host survives its scheduler's too)
        many = len({h.label for h in (*hosts, *req.server_hosts)}) > 1
        req = replace(req, standby=engine.name == "psnode" and servers > 0 and req.node.replicas > 1 and many)
    if servers < engine.min_servers:
        raise PlanError(f"-s {servers}: --engine {engine.name} needs at least {engine.min_servers} "
                        f"server{'s' if engine.min_servers > 1 else ''} (its kvstore keeps the values there)")
    if not 1 <= req.scheduler_port <= 65535 or not 1 <= req.master_port <= 65535:
        raise PlanError("ports must be in 1..65535")
    if req.scheduler_port == req.master_port:
        raise PlanError("the scheduler port and MASTER_PORT must differ")
    if req.standby and (engine.name != "psnode" or servers == 0):
        raise PlanError("--standby-scheduler is for psnode jobs with servers (-s 1 or more, --engine psnode): "
                        "it is psnode's scheduler that the standby takes over")
    if req.gpus_per_worker is not None and req.gpus_per_worker < 1:
        raise PlanError(f"--gpus-per-worker {req.gpus_per_worker}: must be 1 or more (leave it out to give "
                        "every worker all of its host's GPUs)")
    try:
        limits = bounds(workers, req.min_workers, req.max_workers, hosts, req.slots_bound, req.slots_from)
    except ElasticError as exc:
        raise PlanError(str(exc)) from None
    if req.server_hosts and not req.node.slice_bytes:
        req = replace(req, node=replace(req.node, slice_bytes=SERVER_HOSTS_SLICE_BYTES))
    req = replace(req, num_workers=workers, num_servers=servers, hosts=hosts, server_hosts=tuple(req.server_hosts),
                  min_workers=limits.minimum if limits.elastic else None,
                  max_workers=limits.maximum if limits.elastic else None)
    sched = scheduler_host(req)
    warnings: list[str] = []
    worker_hosts, wrapped = place_workers(hosts, workers)
    if wrapped:
        warnings.append(
            f"{workers} workers but the hosts have {total} slot{'s' if total != 1 else ''}: some hosts run "
            "more workers than slots (set slots=N in the hosts file)"
        )

    node_argv = engine.daemon_argv(req.python)
    procs: list[ProcSpec] = [
        ProcSpec(Role.SCHEDULER, None, sched, node_argv, _node_env(req, Role.SCHEDULER, sched, None,
                                                                  req.scheduler_port))
    ]
    if req.standby:
        second = standby_host(req)
        env = _node_env(req, Role.SCHEDULER, second, STANDBY_RANK, _standby_port(req))
        env.update(PSNODE_SCHEDULER=f"{second.address}:{_standby_port(req)}",
                   PSNODE_HOST=second.address, PSNODE_STANDBY="1",
                   PSNODE_PRIMARY=f"{sched.address}:{req.scheduler_port}")
        env.pop("PSNODE_SCHEDULER_STANDBY", None)
        env.pop("PSNODE_RANK", None)
        procs.append(ProcSpec(Role.SCHEDULER, STANDBY_RANK, second, node_argv, env))
    if req.node.replicas > 1 and not req.node.max_restarts:
        warnings.append(f"--replicas {req.node.replicas} without --max-restarts: a failed server is not replaced, "
                        "so its copies are never used (give --max-restarts N)")
    homes = place_servers(server_hosts, servers, req.node.replicas)
    alone = copies_at_home([h.label for h in homes], req.node.replicas) if len(server_hosts) > 1 else []
    if alone:
        warnings.append(
            f"--replicas {req.node.replicas}: the copies of server{'s' if len(alone) > 1 else ''} "
            f"{', '.join(map(str, alone))} are all on {'their' if len(alone) > 1 else 'its'} own host, which "
            f"{'their' if len(alone) > 1 else 'its'} state does not survive (give -s a multiple of the "
            f"{len(server_hosts)} hosts that run servers, or a larger --replicas)")
    for rank, host in enumerate(homes):
        procs.append(ProcSpec(Role.SERVER, rank, host, node_argv, _node_env(req, Role.SERVER, host, rank, 0)))
    nodes, worker_places = places([h.name for h in worker_hosts])
    for host, place in zip(worker_hosts, worker_places, strict=True):
        procs.append(worker_spec(req, host, place))
    per = req.gpus_per_worker
    if per and req.pass_local_rank and max(p.local_world_size for p in worker_places) > per:   # a local rank >= per
        warnings.append(
            f"--pass-local-rank with --gpus-per-worker {per}: each worker sees its GPUs as "
            f"{'cuda:0' if per == 1 else f'cuda:0-{per - 1}'}, so a script using cuda:args.local_rank "
            f"fails on local ranks {per} and up; use cuda:0 there, or leave --gpus-per-worker out")
    return Plan(
        job_id=req.job_id,
        hosts=(*hosts, *req.server_hosts),
        procs=tuple(crowded(procs)),
        scheduler_address=f"{sched.address}:{req.scheduler_port}",
        num_workers=workers,
        num_servers=servers,
        node=req.node,
        warnings=tuple(warnings),
        gpus_per_worker=per,
        engine=engine,
        base_env=_base_env(req),
        bounds=limits,
        nodes=nodes,
        request=req,
    )


def crowded(procs: Sequence[ProcSpec]) -> list[ProcSpec]:
    """``procs``, each psnode node on a host with :data:`~psnode.config.RELAY_FROM` or more of
    the job's nodes told how many (``PSNODE_HOST_PROCESSES``): there its heartbeats go through
    the host's relay unless ``PSNODE_HEARTBEAT_RELAY`` says otherwise (psnode.net.relay)."""
    nodes = {id(p) for p in procs if p.role is not Role.SCHEDULER and "PSNODE_ROLE" in p.env}
    count: dict[str, int] = {}
    for p in procs:
        if id(p) in nodes:
            count[p.host.label] = count.get(p.host.label, 0) + 1
    return [replace(p, env={**p.env, "PSNODE_HOST_PROCESSES": str(count[p.host.label])})
            if id(p) in nodes and count[p.host.label] >= RELAY_FROM else p for p in procs]


#: the standby scheduler: ``scheduler-1``, at ``--port`` + 2 (``MASTER_PORT`` is ``--port`` + 1)
STANDBY_RANK = 1
STANDBY_PORT_OFFSET = 2


def standby_host(req: PlanRequest) -> Host:
    """The host of the standby scheduler (``--standby-scheduler``): the first host, servers'
    hosts included, that is not the scheduler's; PlanError when the job has one host."""
    sched = scheduler_host(req)
    for host in (*req.hosts, *req.server_hosts):
        if host.label != sched.label:
            return host
    raise PlanError("--standby-scheduler needs a second host (the standby must outlive the scheduler's host); "
                    "on one host the scheduler is restarted instead: leave the option out")


def standby_address(req: PlanRequest) -> str | None:
    """``host:port`` of the standby scheduler, or None without one."""
    if not req.standby:
        return None
    return f"{standby_host(req).address}:{_standby_port(req)}"


def _standby_port(req: PlanRequest) -> int:
    return req.scheduler_port + STANDBY_PORT_OFFSET if req.standby_port is None else req.standby_port


def scheduler_host(req: PlanRequest) -> Host:
    """The host running the scheduler: ``--scheduler`` (any host, server hosts too), else the first host."""
    return _find_host((*req.hosts, *req.server_hosts), req.scheduler_host) if req.scheduler_host else req.hosts[0]


def _base_env(req: PlanRequest) -> dict[str, str]:
    return {**req.base_env, **req.user_env, "PYTHONUNBUFFERED": "1"}


def _node_env(req: PlanRequest, role: Role, host: Host, rank: int | None, port: int) -> dict[str, str]:
    """One process's environment: the base, then its engine's variables (a planned request:
    ``num_workers`` and ``num_servers`` set)."""
    assert req.num_workers is not None and req.num_servers is not None
    sched = scheduler_host(req)
    name = role.value if rank is None else f"{role.value}-{rank}"
    facts = NodeFacts(job_id=req.job_id, role=role, rank=rank, host=host.address, port=port,
                      scheduler=sched.address, scheduler_port=req.scheduler_port, num_workers=req.num_workers,
                      num_servers=req.num_servers, node=req.node.config_fields(),
                      key_file=req.key_files.get(host.label, req.key_file),
                      error_file=path_in(req.run_dir, name) if req.run_dir else None,
                      address_file=f"{req.run_dir}/{name}.address" if req.run_dir and role is Role.SCHEDULER else None,
                      timeline=f"{req.run_dir}/timeline" if req.timeline and req.run_dir else None,
                      min_workers=req.min_workers, max_workers=req.max_workers)
    try:
        env = {**_base_env(req), **req.engine.env(facts)}
    except ConfigError as exc:
        raise PlanError(str(exc)) from None
    standby = standby_address(req)
    if standby is not None and role is not Role.SCHEDULER:
        env["PSNODE_SCHEDULER_STANDBY"] = standby
    return env


def worker_spec(req: PlanRequest, host: Host, place: TorchPlace) -> ProcSpec:
    """The worker at ``place`` (its rank, local rank, node rank...) on ``host`` (a planned
    request: :attr:`Plan.request`): its command and environment, psnode's and torchrun's
    variables included."""
    env = _node_env(req, Role.WORKER, host, place.rank, 0)
    job = TorchJob(req.job_id, scheduler_host(req).address, req.master_port, req.node.max_restarts, req.run_dir)
    env.update(torch_env(job, place, f"{Role.WORKER.value}-{place.rank}"))
    argv = command_argv(req.command, req.python)
    local = place.local_rank
    own_argv = with_local_rank_arg(argv, req.command, local) if req.pass_local_rank else argv
    own_argv = req.engine.worker_argv(own_argv, command_target(req.command)[0] == "script")
    return ProcSpec(Role.WORKER, place.rank, host, own_argv, env, local_rank=local)


def joiner(plan: Plan, rank: int, host: Host, local: int, world_size: int, local_world_size: int,
           key_file: str | None = None) -> ProcSpec:
    """A worker joining ``plan``'s running job: planned as the first ones were (same command and
    variables, at the standby scheduler once the plan went over to it; ``PSNODE_RANK`` its
    rank), in a job of ``world_size`` workers of which
    ``local_world_size`` on ``host`` (it included), its host keeping its node rank or, new to
    the job, taking the next one (:mod:`mxdist.planning.torchenv`); with the job's secret file at
    ``key_file`` on its host, else where the plan's processes there read it, else as planned."""
    if plan.request is None:
        raise PlanError("this plan cannot add workers (it was not made by make_plan)")
    nodes = node_ranks(plan.nodes, [host.name])
    try:
        place = TorchPlace(rank, world_size, local, local_world_size, nodes.index(host.name), len(nodes))
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    spec = worker_spec(plan.request, host, place)
    if plan.schedulers is not None:
        spec = _pointed(spec, *plan.schedulers)
    known = key_file or next((p.env["PSNODE_KEY_FILE"] for p in plan.procs if p.host.label == host.label
                              and "PSNODE_KEY_FILE" in p.env), None)
    return replace(spec, env=_with_config(spec.env, key_file=known)) if known else spec


def with_worker(plan: Plan, spec: ProcSpec, host: Host) -> Plan:
    """The plan with worker ``spec`` (replacing a worker of the same rank) and ``host`` among its
    hosts (a host found by discovery)."""
    procs = (*(p for p in plan.procs if p.name != spec.name), spec)
    hosts = plan.hosts if any(h.label == host.label for h in plan.hosts) else (*plan.hosts, host)
    return replace(plan, procs=procs, hosts=hosts, nodes=node_ranks(plan.nodes, [host.name]))


def moved_server(plan: Plan, name: str, host: Host, key_file: str | None = None) -> ProcSpec:
    """Server ``name`` of ``plan`` as it restarts on ``host`` (its own host lost, its state copied
    back from a replica): the same rank, command and variables, bound to ``host``'s address
    (``PSNODE_HOST``; its port as planned: 0, any free one), with the job's secret file at
    ``key_file`` on ``host``, else where the plan's processes there read it, else as planned."""
    spec = next((p for p in plan.procs if p.name == name and p.role is Role.SERVER), None)
    if spec is None:
        raise PlanError(f"{name} is not a server of job {plan.job_id}")
    known = key_file or next((p.env["PSNODE_KEY_FILE"] for p in plan.procs if p.host.label == host.label
                              and "PSNODE_KEY_FILE" in p.env), None)
    changes: dict[str, object] = {"host": host.address}
    if known:
        changes["key_file"] = known
    return replace(spec, host=host, env=_with_config(spec.env, **changes))


def with_proc(plan: Plan, spec: ProcSpec) -> Plan:
    """The plan with ``spec`` replacing its process of the same name (or added, a new one), and
    ``spec``'s host among its hosts."""
    procs = tuple(spec if p.name == spec.name else p for p in plan.procs)
    if not any(p.name == spec.name for p in plan.procs):
        procs = (*procs, spec)
    hosts = plan.hosts if any(h.label == spec.host.label for h in plan.hosts) else (*plan.hosts, spec.host)
    return replace(plan, procs=procs, hosts=hosts)


def with_standby_scheduler(plan: Plan) -> Plan:
    """The plan with every node pointed at the standby scheduler (its scheduler is lost, or
    being): a node started from now on registers there at once, a joiner planned later too
    (:func:`joiner`).  Unchanged without a standby."""
    standby = next((p.env["PSNODE_SCHEDULER_STANDBY"] for p in plan.procs
                    if p.role is not Role.SCHEDULER and "PSNODE_SCHEDULER_STANDBY" in p.env), None)
    return plan if standby is None else with_schedulers(plan, standby, None)


def with_schedulers(plan: Plan, scheduler: str, standby: str | None) -> Plan:
    """The plan with every node (and every joiner planned later: :func:`joiner`) registering at
    ``scheduler`` (``host:port``) and going over to ``standby`` when it is lost (None: nowhere)."""
    return replace(plan, procs=tuple(_pointed(p, scheduler, standby) for p in plan.procs),
                   schedulers=(scheduler, standby))


def _pointed(spec: ProcSpec, scheduler: str, standby: str | None) -> ProcSpec:
    """Node ``spec`` registering at ``scheduler``, its standby ``standby`` (a scheduler: as it is)."""
    if spec.role is Role.SCHEDULER:
        return spec
    env = {k: v for k, v in spec.env.items() if k != "PSNODE_SCHEDULER_STANDBY"}
    env["PSNODE_SCHEDULER"] = scheduler
    if standby is not None:
        env["PSNODE_SCHEDULER_STANDBY"] = standby
    return replace(spec, env=env)


def next_standby(plan: Plan, host: Host, rank: int, primary: str, key_file: str | None = None) -> ProcSpec:
    """Standby scheduler ``scheduler-<rank>`` on ``host``, standing by for the scheduler at
    ``primary`` (one that took the job over): the first standby's command and variables, bound
    to ``host``'s address on the first standby's port (``--port`` + 2), with the job's secret
    file at ``key_file`` on ``host``, else where the plan's processes there read it."""
    first = next((p for p in plan.procs if p.role is Role.SCHEDULER and p.rank == STANDBY_RANK), None)
    if first is None:
        raise PlanError(f"job {plan.job_id} has no standby scheduler to start another like it")
    cfg = NodeConfig.from_env(first.env)
    name = f"{Role.SCHEDULER.value}-{rank}"
    changes: dict[str, object] = {"host": host.address, "scheduler_host": host.address, "primary": primary}
    if cfg.error_file:
        changes["error_file"] = path_in(cfg.error_file.rpartition("/")[0] or "/", name)
    known = key_file or next((p.env["PSNODE_KEY_FILE"] for p in plan.procs if p.host.label == host.label
                              and "PSNODE_KEY_FILE" in p.env), None)
    if known:
        changes["key_file"] = known
    return ProcSpec(Role.SCHEDULER, rank, host, first.argv, _with_config(first.env, **changes))


def _with_config(env: Mapping[str, str], **changes: object) -> dict[str, str]:
    """``env`` with its psnode variables rewritten through NodeConfig (from_env -> replace -> to_env)."""
    cfg = replace(NodeConfig.from_env(env), **changes)  # type: ignore[arg-type]
    rest = {k: v for k, v in env.items() if not k.startswith("PSNODE_")}
    return {**rest, **cfg.to_env()}


def restarted(spec: ProcSpec, count: int) -> ProcSpec:
    """The same process (rank, host, argv, env) with ``PSNODE_RESTART_COUNT=count`` (and, for a
    worker, ``TORCHELASTIC_RESTART_COUNT``).  A restarted scheduler binds its address or fails:
    the live nodes look for it there."""
    changes: dict[str, Any] = {"restart_count": count}
    if spec.role is Role.SCHEDULER:
        changes["address_file"] = None
    return replace(spec, env=torch_restarted(_with_config(spec.env, **changes), count))


#: what names a scheduler's address in a process's environment
_SCHEDULER_VARS = ("PSNODE_SCHEDULER", "PSNODE_SCHEDULER_STANDBY", "PSNODE_PRIMARY")


def with_scheduler_port(plan: Plan, rank: int | None, port: int) -> Plan:
    """The plan with its scheduler (``rank`` None) or its standby (:data:`STANDBY_RANK`) at
    ``port`` on its host: the port it bound, its planned one having been taken
    (``PSNODE_ADDRESS_FILE``).  Every process started from this plan, joiners included, is given
    that address."""
    spec = next(p for p in plan.of_role(Role.SCHEDULER) if p.rank == rank)
    old = spec.env["PSNODE_SCHEDULER"]
    new = f"{spec.host.address}:{port}"
    procs = tuple(replace(p, env={k: (new if k in _SCHEDULER_VARS and v == old else v) for k, v in p.env.items()})
                  for p in plan.procs)
    req = plan.request
    if req is not None:
        req = replace(req, scheduler_port=port, standby_port=_standby_port(req)) if rank is None \
            else replace(req, standby_port=port)
    return replace(plan, procs=procs, request=req,
                   scheduler_address=new if plan.scheduler_address == old else plan.scheduler_address)


def with_key_files(plan: Plan, paths: Mapping[str, str]) -> Plan:
    """The plan with ``PSNODE_KEY_FILE`` set to ``paths[host label]`` on every process of those hosts."""
    procs = tuple(replace(p, env=_with_config(p.env, key_file=paths[p.host.label]))
                  if p.host.label in paths else p for p in plan.procs)
    return replace(plan, procs=procs)


# -- GPUs (the rules: mxdist.planning.gpus) -------------------------------------------------------------

class GpuShortageError(PlanError):
    """``--gpus-per-worker`` asks more GPUs of some hosts than they show; one entry per host."""

    def __init__(self, found: Sequence[GpuShortage]) -> None:
        super().__init__("not enough GPUs: " + "; ".join(f"{s.host} {s.reason}" for s in found))
        self.shortages = tuple(found)


def with_gpus(plan: Plan, found: Mapping[str, HostGpus]) -> Plan:
    """The plan with the GPUs of the hosts in ``found`` known and, with ``--gpus-per-worker``,
    the workers of those hosts given theirs (``CUDA_VISIBLE_DEVICES``, :mod:`mxdist.planning.gpus`' rules);
    workers already given theirs keep them.  Raises :class:`GpuShortageError` naming every host
    in ``found`` with too few."""
    known = {**plan.gpus, **found}
    per = plan.gpus_per_worker
    if not per:
        return replace(plan, gpus=known)
    counts = {label: n for label, n in plan.workers_per_host().items() if label in found}
    short = shortages(found, counts, per)
    if short:
        raise GpuShortageError(short)
    procs = []
    for p in plan.procs:
        if p.role is Role.WORKER and p.gpus is None and p.host.label in found:
            host = found[p.host.label]
            slots = worker_slots(p.local_rank, per)
            devices = host.devices[slots.start:slots.stop]
            p = replace(p, gpus=devices, env={**p.env, **worker_env(devices, host, p.env)})
        procs.append(p)
    return replace(plan, procs=tuple(procs), gpus=known)


def gpu_view(plan: Plan) -> tuple[list[str], list[str], list[str]]:
    """What the plan's hosts show and each worker gets: (a line per host with workers, a line
    per worker, warnings)."""
    workers = plan.workers_per_host()
    hosts = [f"{label}: {plan.gpus[label].describe() if label in plan.gpus else 'known at preflight'}"
             for label in workers]
    lines = []
    for p in plan.of_role(Role.WORKER):
        visible, device = describe_worker(p.local_rank, p.env, plan.gpus_per_worker, p.gpus,
                                          plan.gpus.get(p.host.label))
        shown = (visible.replace("all", "all GPUs visible", 1) if visible.startswith("all")
                 else f"{VISIBLE}={visible}")
        lines.append(f"worker {p.rank} @ {p.host.label}: {shown}, LOCAL_RANK {p.local_rank} -> {device}")
    warnings = [] if plan.gpus_per_worker else sharing_warnings(plan.gpus, workers)
    return hosts, lines, warnings
