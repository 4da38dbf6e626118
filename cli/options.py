"""From ``mxdist launch`` options to a plan, a backend, a job record and launch settings.

This is the glue between the typer command (:mod:`cli.main`) and the pure modules: it reads
the hosts file, picks the launcher, resolves hosts through the backend (ssh config), chooses
ports, and computes the plan.  No process is started here.
"""
from __future__ import annotations

import os
import random
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

from cli import jobs
from cli.backends import Backend, make_backend
from cli.hosts import Host, HostsError, looks_like_file, parse_host_list, parse_hosts_file
from cli.jobs import JobRecord
from cli.launch import LaunchSettings, new_record
from cli.plan import Plan, PlanError, PlanRequest, make_plan, parse_env_assignments, passthrough_env

REMOTE_PORT_RANGE = (20000, 40000)


@dataclass
class LaunchOptions:
    """``mxdist launch`` options, as typed by the user (see ``mxdist launch --help``)."""

    command: list[str]
    hosts: str | None = None
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
    grace: float = 5.0
    finish_grace: float = 10.0
    heartbeat_interval: float = 1.0
    heartbeat_liveness: int = 5
    log_level: str = "WARNING"
    ssh_config: str | None = None
    known_hosts: str | None = None
    accept_new_host_keys: bool = False
    connect_timeout: float = 10.0
    remote_dir: str = "~/.mxdist/run"


@dataclass
class Prepared:
    plan: Plan
    backend: Backend
    record: JobRecord
    settings: LaunchSettings


def read_hosts(spec: str) -> list[Host]:
    """``-H`` value: an existing file (hosts file format), else an inline list."""
    path = Path(spec).expanduser()
    if path.is_file():
        try:
            text = path.read_text()
        except OSError as exc:
            raise HostsError(f"{spec}: cannot read: {exc}") from None
        return parse_hosts_file(text, str(spec))
    if looks_like_file(spec):
        raise HostsError(f"-H {spec}: no such hosts file")
    return parse_host_list(spec)


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on this machine now (bind to 0, read, close)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _ports(opts: LaunchOptions, local: bool) -> tuple[int, int]:
    if opts.port is not None:
        return opts.port, opts.port + 1
    if local:
        first = free_port()
        second = free_port()
        while second == first:
            second = free_port()
        return first, second
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


def prepare(opts: LaunchOptions, environ: dict[str, str] | None = None) -> Prepared:
    """Validate options and compute everything a launch needs; raise HostsError/PlanError."""
    environ = dict(os.environ if environ is None else environ)
    launcher = opts.launcher or ("ssh" if opts.hosts else "local")
    if launcher not in ("local", "ssh"):
        raise PlanError(f"--launcher {launcher!r}: choose local or ssh")
    user_env = parse_env_assignments(opts.env)
    workdir = os.path.abspath(opts.workdir or os.getcwd())
    if launcher == "local":
        if opts.hosts:
            raise PlanError("--launcher local runs on this machine only: drop -H or use --launcher ssh")
        if opts.sync:
            raise PlanError("--sync copies to remote hosts: it needs -H")
        slots = opts.num_workers if opts.num_workers and opts.num_workers > 0 else 1
        hosts = [Host("localhost", address="127.0.0.1", slots=slots)]
        backend = make_backend("local", {"workdir": workdir, "python": sys.executable})
        python = sys.executable
    else:
        if not opts.hosts:
            raise PlanError("--launcher ssh needs hosts: -H host1,host2 or -H hostsfile")
        parsed = read_hosts(opts.hosts)
        backend = make_backend("ssh", {
            "workdir": workdir, "python": opts.python, "ssh_config": opts.ssh_config,
            "known_hosts": opts.known_hosts, "accept_new_host_keys": opts.accept_new_host_keys,
            "connect_timeout": opts.connect_timeout})
        hosts = [backend.resolve(h) for h in parsed]  # type: ignore[attr-defined]
        python = opts.python
    scheduler_port, master_port = _ports(opts, launcher == "local")
    job_id = jobs.new_job_id()
    plan = make_plan(PlanRequest(
        job_id=job_id, command=opts.command, hosts=hosts, python=python,
        scheduler_port=scheduler_port, master_port=master_port,
        num_workers=opts.num_workers, num_servers=opts.num_servers,
        scheduler_host=opts.scheduler, user_env=user_env, base_env=passthrough_env(environ),
        heartbeat_interval=opts.heartbeat_interval, heartbeat_liveness=opts.heartbeat_liveness,
        log_level=opts.log_level.upper(),
    ))
    log_dir = jobs.log_dir(job_id)
    run_dir = str(log_dir) if launcher == "local" else f"{opts.remote_dir.rstrip('/')}/{job_id}"
    record = new_record(plan, backend, opts.command, workdir, log_dir)
    settings = LaunchSettings(run_dir=run_dir, grace=opts.grace, finish_grace=opts.finish_grace,
                              detach=opts.detach, quiet=opts.quiet, sync=_sync_pairs(opts.sync))
    return Prepared(plan, backend, record, settings)
