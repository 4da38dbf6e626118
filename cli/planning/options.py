"""``mxdist launch``'s options: their values, defaults and checks (pure: no I/O).

:class:`LaunchOptions` holds the options as the user typed them (filled once by the typer
command, :mod:`mxdist.main`, which reads each default from :func:`launch_default`); options that
become psnode configuration are one :class:`mxdist.planning.plan.NodeOptions` inside it;
:class:`LaunchSettings` the ones the supervisor and its collaborators read while the job runs.  The
functions here turn option values into plan inputs: the job's command (:func:`job_command`:
``-m`` makes it ``-m MODULE ARGS``; a first word that looks like an option is refused, never
run), the security mode (:func:`security_mode`: every job is ``authenticated`` by default, a
fresh secret per job; ``--encrypt`` makes it ``encrypted``, ``--insecure`` turns it off), the
ranks to stream, the run directory under ``--sync``, the checkpoint directory, the ports a job
listens on outside the ephemeral range.  Every error is a :class:`PlanError` (exit 2, no
traceback).  What reads files, opens sockets, runs the discovery script or asks a backend is
:mod:`mxdist.supervisor.setup`.
"""
from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from psnode.launcher import Mode

from .engines import JobEngine
from .hosts import looks_like_file
from .plan import NodeOptions, PlanError

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
    standby_scheduler: bool | None = None  # a standby scheduler on the second host (psnode, 2+ hosts;
    #                                        None: when the servers are replicated)
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


@dataclass
class LaunchSettings:
    """How the supervisor runs a planned job (everything but the plan and the backend): the
    launch options it and its collaborators read, made from :class:`LaunchOptions` by
    :func:`mxdist.supervisor.setup.prepare`."""

    run_dir: str                     # where processes write logs and rc files, on their host
    grace: float = 5.0               # TERM -> KILL
    finish_grace: float = 10.0       # at most this long for servers to end after the workers
    detach: bool = False
    quiet: bool = False
    ranks: frozenset[int] | None = None   # stream only these workers
    sync: list[tuple[str, str]] = field(default_factory=list)  # (local dir, remote dir)
    check_modules: tuple[str, ...] = ("psnode",)
    security: Mode = Mode.INSECURE   # authenticated/encrypted: write and deliver a fresh secret
    timeline_dir: str | None = None  # --timeline: where the processes append their events, on their host
    timeline_local: bool = True      # that directory is readable here (a shared file system)


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


def listen_range(ephemeral: tuple[int, int]) -> tuple[int, int]:
    """Ports to listen on outside ``ephemeral`` (at least 1000 of them): below it from 20000
    when there is room, else above it; the whole unprivileged range if it leaves no room."""
    lo, hi = ephemeral
    if lo - 20000 >= 1000:
        return 20000, lo - 1
    if 65535 - hi >= 1000:
        return hi + 1, 65535
    return 1024, 65535


def run_workdir(given: str | None, sync: list[tuple[str, str]], cwd: str) -> str:
    """Where the job's processes run: ``--workdir`` when given; else, with ``--sync``, where the
    directory launched from lands (the destination of the synced directory that holds ``cwd``,
    plus ``cwd``'s path inside it; with one ``--sync`` and ``cwd`` outside it, its destination);
    else ``cwd``."""
    if given:
        return os.path.normpath(os.path.join(cwd, given))
    for local, remote in sync:
        if cwd == local or cwd.startswith(local.rstrip(os.sep) + os.sep):
            inside = os.path.relpath(cwd, local)
            return remote if inside == "." else f"{remote.rstrip('/')}/{inside}"
    if len(sync) == 1:
        return sync[0][1]
    return cwd


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


def slots_from(opts: LaunchOptions, launcher: str, own_hosts: bool) -> str:
    """Where the hosts' slots come from, as an error names it (``own_hosts``: the launcher finds
    its own hosts rather than taking them from ``-H``, its backend's capabilities say)."""
    if opts.hosts:
        return "the hosts (-H)" if not looks_like_file(opts.hosts) else f"the hosts in {opts.hosts}"
    if own_hosts:
        return f"the {launcher} launcher's hosts" if launcher != "slurm" else "the allocation's nodes"
    return "the hosts"


