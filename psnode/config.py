"""The environment contract: how a launcher configures every psnode process.

``mxdist launch`` (or any other launcher, or a user by hand) configures each process of a job
only through these environment variables; :meth:`NodeConfig.to_env` writes them and
:meth:`NodeConfig.from_env` reads and validates them.  Bad values raise :class:`ConfigError`
naming the variable, the value and what is accepted.

=================================  ==========================================================
variable                           meaning (default)
=================================  ==========================================================
``PSNODE_ROLE``                    ``scheduler``, ``server`` or ``worker`` (required)
``PSNODE_SCHEDULER``               scheduler address ``host:port`` (required)
``PSNODE_SCHEDULER_STANDBY``       a standby scheduler's ``host:port`` (none): a node whose
                                   scheduler is silent for the heartbeat timeout goes over to it
                                   once, and registers there again with what it knows (the
                                   scheduler may name a later standby: STANDBY, WELCOME)
``PSNODE_STANDBY``                 ``1``: this scheduler is the standby (at ``PSNODE_SCHEDULER``,
                                   its own address): it waits, and takes the job over from the
                                   live nodes when the first one comes (``0``)
``PSNODE_PRIMARY``                 the standby's scheduler ``host:port`` (none): the standby asks
                                   it first and, while it answers, takes nothing over (a node
                                   that came over is cut off from it, not the job from it)
``PSNODE_HOST``                    address this node binds to and is reached at (scheduler's
                                   host for the scheduler; ``127.0.0.1``)
``PSNODE_PORT``                    port a server binds (``0``: any free port)
``PSNODE_ADDRESS_FILE``            a scheduler writes the ``host:port`` it listens at to this file
                                   once bound; with it set, a ``PSNODE_SCHEDULER`` port found
                                   taken is replaced by a free one, and the launcher, reading the
                                   file, gives that address to the other processes (none: the
                                   planned port, or a ConfigError naming it)
``PSNODE_NUM_WORKERS``             number of workers of the job's first generation: the job
                                   starts when they registered (required, >= 1)
``PSNODE_MIN_WORKERS``             fewest live workers the job runs on (the launcher fails the job
                                   below it); below ``PSNODE_NUM_WORKERS``, a worker lost for
                                   good leaves the membership instead of failing the job
                                   (``PSNODE_NUM_WORKERS``)
``PSNODE_MAX_WORKERS``             most workers at once: a worker registering after the first
                                   generation joins the running job (a **joiner**) with the rank
                                   ``PSNODE_RANK`` (< this) it was given (``PSNODE_NUM_WORKERS``)
``PSNODE_NUM_SERVERS``             number of servers in the job (required, >= 0)
``PSNODE_JOB_ID``                  job id; frames of another job are dropped (required)
``PSNODE_RANK``                    requested rank of this node (stable across restarts and for a
                                   worker's life; none)
``PSNODE_HEARTBEAT_INTERVAL``      seconds between heartbeats (``1.0``)
``PSNODE_HEARTBEAT_LIVENESS``      missed intervals before a node is declared dead (``5``)
``PSNODE_HEARTBEAT_RELAY``         ``on``: the job's processes on one host send their heartbeats
                                   through one of them, which sends the scheduler one batch per
                                   interval (psnode.net.relay); ``off``: each its own; ``auto``:
                                   on where ``PSNODE_HOST_PROCESSES`` is 8 or more (``auto``)
``PSNODE_HOST_PROCESSES``          how many of the job's nodes the launcher runs on this node's
                                   host (``mxdist launch`` says so where they are 8 or more;
                                   ``0``: not known)
``PSNODE_REGISTER_TIMEOUT``        seconds to wait for the whole job to register (``120``)
``PSNODE_RETRY_TIMEOUT``           seconds a worker waits for a server's answer before it sends
                                   the request again (``2``); a request still parked on a live
                                   server (a sync round waiting for others) is not a loss
``PSNODE_MAX_RETRIES``             resends of one request before the worker gives up with an
                                   error naming the server (``3``)
``PSNODE_BIG_ARRAY_BOUND``         arrays with more elements are sliced over all servers
                                   (``1000000``)
``PSNODE_SLICE_BYTES``             ``0``: a sliced array has one part per server; N: dense arrays
                                   of more than N bytes go in parts of at most N bytes (their
                                   count a multiple of the servers), dealt round-robin over the
                                   servers, and a worker keeps at most two parts unanswered per
                                   remote server, so that pushpulls of one array pipeline (``0``)
``PSNODE_DISTRIBUTION``            ``data``, ``param`` or ``hybrid`` (``hybrid``)
``PSNODE_KEY_FILE``                the job's secret file (mode 0600; :mod:`psnode.net.security`);
                                   unset: insecure
``PSNODE_MAX_MESSAGE_BYTES``       largest frame accepted (``4294967296``)
``PSNODE_CHECKPOINT_DIR``          servers checkpoint their shards here (none)
``PSNODE_CHECKPOINT_INTERVAL``     seconds between server checkpoints (``0``: none by time)
``PSNODE_CHECKPOINT_ROUNDS``       completed rounds between server checkpoints (``0``: none by
                                   rounds); a server also checkpoints when the job ends well, and,
                                   when it may be restarted (``PSNODE_MAX_RESTARTS`` > 0), before
                                   any answer its last checkpoint lacks (psnode.server.store)
``PSNODE_RESUME``                  ``1``: servers load their shards from the checkpoint dir
``PSNODE_REPLICAS``                copies of each server's state (``1``: the server's own); with
                                   ``K`` > 1 a server sends its state to the next ``K``-1 servers
                                   (rank order, wrapping), which hold it in memory, and a pushed
                                   value is durable once they all hold it: a server restarted
                                   anywhere copies its state back from one of them, with no disk
                                   (psnode.server.replicas)
``PSNODE_SKIP_NONFINITE``          ``1``: a round whose gradient holds NaN/Inf is skipped whole and
                                   reported with key and worker (``0``)
``PSNODE_MAX_RESTARTS``            restarts the launcher allows per worker, and per server when
                                   servers checkpoint (``PSNODE_CHECKPOINT_DIR``) or are
                                   replicated (``PSNODE_REPLICAS`` > 1) (``0``)
``PSNODE_RESTART_COUNT``           how many times this process was restarted (``0``)
``PSNODE_LOG_LEVEL``               ``DEBUG``, ``INFO``, ``WARNING``, ``ERROR`` (``WARNING``)
``PSNODE_SHM``                     ``1``: workers and servers on the same host exchange data
                                   through shared memory; ``0``: always over TCP (``1``)
``PSNODE_CPU_POLICY``              ``batch``: the process runs under Linux's SCHED_BATCH (a
                                   woken process does not preempt a busy one; psnode.cpupolicy);
                                   ``normal``: the policy is left as it was (``batch``)
``PSNODE_ERROR_FILE``              where this process writes its failure record (JSON) when it
                                   fails, for the launcher to name the root cause (none)
``PSNODE_STALL_WARNING``           seconds a worker waits for other workers in one pull or
                                   barrier before the scheduler warns, naming them (``30``;
                                   ``0``: never; psnode.scheduler.slowness)
``PSNODE_BACKUP_WORKERS``          dist_sync stores' backup workers: a round completes when all
                                   but this many workers pushed; late pushes are dropped
                                   (``0``; ``kv.create(..., backup_workers=b)`` overrides it;
                                   psnode.server.rounds)
``PSNODE_TIMELINE``                a directory: every process appends its timeline events
                                   (compute, push, pull-wait, barrier-wait, apply, ...) to its
                                   own file there, for the launcher to merge into one trace
                                   (psnode.timeline; unset: none recorded)
=================================  ==========================================================

Workers additionally receive torchrun's variables from the launcher (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``,
``TORCHELASTIC_*``...; ``mxdist``'s ``torchenv`` module lists them); psnode itself does not read
them.
"""
from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from enum import Enum
from typing import Any

from psnode.errors import ConfigError


class Role(str, Enum):
    SCHEDULER = "scheduler"
    SERVER = "server"
    WORKER = "worker"


class CpuPolicy(str, Enum):
    """The CPU scheduling policy psnode's processes run under (psnode.cpupolicy)."""

    BATCH = "batch"
    NORMAL = "normal"


class RelayMode(str, Enum):
    """Whether a node's heartbeats go through its host's relay (psnode.net.relay)."""

    AUTO = "auto"
    ON = "on"
    OFF = "off"


#: ``auto`` relays heartbeats on a host with at least this many of the job's processes
RELAY_FROM = 8


class Distribution(str, Enum):
    """How work is split: by instance (data), by parameter (param), or both (hybrid)."""

    DATA = "data"
    PARAM = "param"
    HYBRID = "hybrid"


_PREFIX = "PSNODE_"
_JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_HOST_RE = re.compile(r"^[A-Za-z0-9_.:\[\]-]{1,253}$")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def parse_address(text: str, what: str) -> tuple[str, int]:
    """Split ``host:port`` (``[v6]:port`` too); raise ConfigError naming ``what``."""
    host, sep, port_s = text.rpartition(":")
    if not sep or not host:
        raise ConfigError(f"{what}={text!r} is not host:port (example: 127.0.0.1:9091)")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    check_host(host, what)
    return host, _port(port_s, what, allow_zero=False)


def check_host(host: str, what: str) -> str:
    """A host name or address with no shell or zmq metacharacters; never a wildcard."""
    if not _HOST_RE.match(host) or host.startswith("-"):
        raise ConfigError(f"{what}: {host!r} is not a valid host name or address")
    if host in ("*", "0.0.0.0", "::"):
        raise ConfigError(f"{what}: {host!r} is a wildcard; give the host's own address")
    return host


def _port(text: str, what: str, allow_zero: bool) -> int:
    try:
        port = int(text)
    except ValueError:
        raise ConfigError(f"{what}: port {text!r} is not a number") from None
    low = 0 if allow_zero else 1
    if not low <= port <= 65535:
        raise ConfigError(f"{what}: port {port} is outside {low}..65535")
    return port


def _int(env: Mapping[str, str], name: str, default: int | None, low: int) -> int | None:
    raw = env.get(_PREFIX + name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{_PREFIX}{name}={raw!r} is not an integer") from None
    if value < low:
        raise ConfigError(f"{_PREFIX}{name}={value} must be >= {low}")
    return value


def _float(env: Mapping[str, str], name: str, default: float, positive: bool = True) -> float:
    raw = env.get(_PREFIX + name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{_PREFIX}{name}={raw!r} is not a number") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ConfigError(f"{_PREFIX}{name}={raw!r} must be a finite number > 0")
    return value


def _flag(env: Mapping[str, str], name: str, default: bool = False) -> bool:
    raw = (env.get(_PREFIX + name) or ("1" if default else "0")).lower()
    if raw not in ("0", "1", "true", "false", "yes", "no"):
        raise ConfigError(f"{_PREFIX}{name}={raw!r}: use 1 or 0")
    return raw in ("1", "true", "yes")


def _enum(env: Mapping[str, str], name: str, cls: type[Enum], default: Enum | None) -> Enum:
    raw = env.get(_PREFIX + name)
    if raw is None or raw == "":
        if default is None:
            raise ConfigError(f"{_PREFIX}{name} is not set")
        return default
    try:
        return cls(raw.lower())
    except ValueError:
        accepted = ", ".join(m.value for m in cls)  # type: ignore[attr-defined]
        raise ConfigError(f"{_PREFIX}{name}={raw!r} is not one of: {accepted}") from None


@dataclass(frozen=True)
class NodeConfig:
    """Everything a psnode process needs to join a job (see the module docstring)."""

    role: Role
    scheduler_host: str
    scheduler_port: int
    num_workers: int
    num_servers: int
    job_id: str
    host: str = "127.0.0.1"
    port: int = 0
    rank: int | None = None
    heartbeat_interval: float = 1.0
    heartbeat_liveness: int = 5
    heartbeat_relay: RelayMode = RelayMode.AUTO
    host_processes: int = 0
    register_timeout: float = 120.0
    retry_timeout: float = 2.0
    max_retries: int = 3
    big_array_bound: int = 1_000_000
    slice_bytes: int = 0
    distribution: Distribution = Distribution.HYBRID
    key_file: str | None = None
    max_message_bytes: int = 4 * 2**30
    checkpoint_dir: str | None = None
    checkpoint_interval: float = 0.0
    checkpoint_rounds: int = 0
    resume: bool = False
    replicas: int = 1
    skip_nonfinite: bool = False
    max_restarts: int = 0
    restart_count: int = 0
    log_level: str = "WARNING"
    shm: bool = True
    cpu_policy: CpuPolicy = CpuPolicy.BATCH
    error_file: str | None = None
    stall_warning: float = 30.0
    backup_workers: int = 0
    timeline: str | None = None
    min_workers: int | None = None   # None: num_workers (workers_min)
    max_workers: int | None = None   # None: num_workers (workers_max)
    scheduler_standby: str | None = None   # "host:port" of the standby scheduler
    standby: bool = False
    primary: str | None = None   # the standby's "host:port" of the scheduler it stands by for
    address_file: str | None = None   # a scheduler: where it writes the address it bound

    def __post_init__(self) -> None:
        if not _JOB_ID_RE.match(self.job_id):
            raise ConfigError(
                f"{_PREFIX}JOB_ID={self.job_id!r}: use 1-64 letters, digits, '.', '_' or '-'"
            )
        check_host(self.host, f"{_PREFIX}HOST")
        check_host(self.scheduler_host, f"{_PREFIX}SCHEDULER")
        if self.num_workers < 1:
            raise ConfigError(f"{_PREFIX}NUM_WORKERS={self.num_workers} must be >= 1")
        if self.num_servers < 0:
            raise ConfigError(f"{_PREFIX}NUM_SERVERS={self.num_servers} must be >= 0")
        if not 1 <= self.workers_min <= self.num_workers <= self.workers_max:
            raise ConfigError(
                f"{_PREFIX}MIN_WORKERS={self.workers_min}, {_PREFIX}NUM_WORKERS={self.num_workers} and "
                f"{_PREFIX}MAX_WORKERS={self.workers_max}: need 1 <= min <= num <= max")
        if self.scheduler_standby is not None:
            parse_address(self.scheduler_standby, f"{_PREFIX}SCHEDULER_STANDBY")
        if self.primary is not None:
            parse_address(self.primary, f"{_PREFIX}PRIMARY")
        if self.replicas < 1 or (self.num_servers and self.replicas > self.num_servers):
            raise ConfigError(f"{_PREFIX}REPLICAS={self.replicas}: must be 1 or more and at most the "
                              f"number of servers ({self.num_servers})")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"{_PREFIX}LOG_LEVEL={self.log_level!r} is not one of {LOG_LEVELS}")

    @property
    def workers_min(self) -> int:
        """``min_workers``, or ``num_workers`` when unset."""
        return self.num_workers if self.min_workers is None else self.min_workers

    @property
    def workers_max(self) -> int:
        """``max_workers``, or ``num_workers`` when unset."""
        return self.num_workers if self.max_workers is None else self.max_workers

    @property
    def elastic(self) -> bool:
        """May the membership change while the job runs (joins, or losses it survives)?"""
        return self.workers_min < self.num_workers or self.workers_max > self.num_workers

    @property
    def servers_restartable(self) -> bool:
        """May a failed server be replaced inside the job?  When restarts are allowed and its
        state outlives it: a checkpoint directory, or replicas on other servers."""
        return self.max_restarts > 0 and (bool(self.checkpoint_dir) or self.replicas > 1)

    @property
    def scheduler_address(self) -> str:
        """The scheduler's ``host:port``."""
        return f"{self.scheduler_host}:{self.scheduler_port}"

    @property
    def relay(self) -> bool:
        """Do this node's heartbeats go through its host's relay (``heartbeat_relay``)?"""
        return self.heartbeat_relay is RelayMode.ON or (
            self.heartbeat_relay is RelayMode.AUTO and self.host_processes >= RELAY_FROM)

    @property
    def dead_after(self) -> float:
        """Seconds of silence after which a peer is declared dead."""
        return self.heartbeat_interval * self.heartbeat_liveness

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> NodeConfig:
        """Read and validate the ``PSNODE_*`` variables of ``env`` (default: os.environ).

        Unset variables take the field defaults above: each default is written once, there."""
        env = os.environ if env is None else env
        d = default
        role = _enum(env, "ROLE", Role, None)
        sched = env.get(_PREFIX + "SCHEDULER")
        if not sched:
            raise ConfigError(f"{_PREFIX}SCHEDULER is not set")
        s_host, s_port = parse_address(sched, _PREFIX + "SCHEDULER")
        job_id = env.get(_PREFIX + "JOB_ID")
        if not job_id:
            raise ConfigError(f"{_PREFIX}JOB_ID is not set")
        num_workers = _int(env, "NUM_WORKERS", None, 1)
        num_servers = _int(env, "NUM_SERVERS", None, 0)
        if num_workers is None or num_servers is None:
            raise ConfigError(f"{_PREFIX}NUM_WORKERS and {_PREFIX}NUM_SERVERS must both be set")
        host = env.get(_PREFIX + "HOST") or (s_host if role is Role.SCHEDULER else d("host"))
        port = s_port if role is Role.SCHEDULER else _port(env.get(_PREFIX + "PORT") or str(d("port")),
                                                           _PREFIX + "PORT", True)
        return cls(
            role=role,  # type: ignore[arg-type]
            scheduler_host=s_host,
            scheduler_port=s_port,
            num_workers=num_workers,
            num_servers=num_servers,
            job_id=job_id,
            host=host,
            port=port,
            rank=_int(env, "RANK", None, 0),
            heartbeat_interval=_float(env, "HEARTBEAT_INTERVAL", d("heartbeat_interval")),
            heartbeat_liveness=_int(env, "HEARTBEAT_LIVENESS", d("heartbeat_liveness"), 1) or 1,
            heartbeat_relay=_enum(env, "HEARTBEAT_RELAY", RelayMode, d("heartbeat_relay")),  # type: ignore[arg-type]
            host_processes=_int(env, "HOST_PROCESSES", d("host_processes"), 0) or 0,
            register_timeout=_float(env, "REGISTER_TIMEOUT", d("register_timeout")),
            retry_timeout=_float(env, "RETRY_TIMEOUT", d("retry_timeout")),
            max_retries=_int(env, "MAX_RETRIES", d("max_retries"), 0) or 0,
            big_array_bound=_int(env, "BIG_ARRAY_BOUND", d("big_array_bound"), 1) or 1,
            slice_bytes=_int(env, "SLICE_BYTES", d("slice_bytes"), 0) or 0,
            distribution=_enum(env, "DISTRIBUTION", Distribution, d("distribution")),  # type: ignore[arg-type]
            key_file=env.get(_PREFIX + "KEY_FILE") or None,
            max_message_bytes=_int(env, "MAX_MESSAGE_BYTES", d("max_message_bytes"), 1024) or 1024,
            checkpoint_dir=env.get(_PREFIX + "CHECKPOINT_DIR") or None,
            checkpoint_interval=_float(env, "CHECKPOINT_INTERVAL", d("checkpoint_interval"), positive=False),
            checkpoint_rounds=_int(env, "CHECKPOINT_ROUNDS", d("checkpoint_rounds"), 0) or 0,
            resume=_flag(env, "RESUME", d("resume")),
            replicas=_int(env, "REPLICAS", d("replicas"), 1) or 1,
            skip_nonfinite=_flag(env, "SKIP_NONFINITE", d("skip_nonfinite")),
            max_restarts=_int(env, "MAX_RESTARTS", d("max_restarts"), 0) or 0,
            restart_count=_int(env, "RESTART_COUNT", d("restart_count"), 0) or 0,
            log_level=(env.get(_PREFIX + "LOG_LEVEL") or d("log_level")).upper(),
            shm=_flag(env, "SHM", d("shm")),
            cpu_policy=_enum(env, "CPU_POLICY", CpuPolicy, d("cpu_policy")),  # type: ignore[arg-type]
            error_file=env.get(_PREFIX + "ERROR_FILE") or None,
            stall_warning=_float(env, "STALL_WARNING", d("stall_warning"), positive=False),
            backup_workers=_int(env, "BACKUP_WORKERS", d("backup_workers"), 0) or 0,
            timeline=env.get(_PREFIX + "TIMELINE") or None,
            min_workers=_int(env, "MIN_WORKERS", None, 1),
            max_workers=_int(env, "MAX_WORKERS", None, 1),
            scheduler_standby=env.get(_PREFIX + "SCHEDULER_STANDBY") or None,
            standby=_flag(env, "STANDBY", d("standby")),
            primary=env.get(_PREFIX + "PRIMARY") or None,
            address_file=env.get(_PREFIX + "ADDRESS_FILE") or None,
        )

    def to_env(self) -> dict[str, str]:
        """The ``PSNODE_*`` variables that make ``from_env`` return this config."""
        out: dict[str, str] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("scheduler_host", "scheduler_port") or value is None:
                continue
            if isinstance(value, Enum):
                value = value.value
            elif isinstance(value, bool):
                value = "1" if value else "0"
            out[_PREFIX + f.name.upper()] = str(value)
        out[_PREFIX + "SCHEDULER"] = self.scheduler_address
        return out


def default(name: str) -> Any:
    """The default of NodeConfig field ``name``: the one place each default is written.

    Launchers take their defaults from here (``mxdist launch``'s options), so a default is
    never repeated."""
    f = NodeConfig.__dataclass_fields__[name]
    if f.default is MISSING:
        raise KeyError(f"NodeConfig.{name} has no default")
    return f.default
