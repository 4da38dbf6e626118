"""``mxdist``: launch parameter-server jobs on this machine, over SSH or in Slurm; status, stop,
logs, the job list and clean-up.

The only module importing typer.  Commands translate options, call the domain modules and map
errors to exit codes; users see a message and a fix, never a traceback.

Exit codes: 0 success; 1 the job failed (or no such job, or a stop that could not verify every
host); 2 bad usage (options, hosts file); 3 preflight or connection failure; 129 the terminal
closed (SIGHUP); 130 interrupted (Ctrl-C); 143 stopped (``mxdist stop`` or SIGTERM).
"""
from __future__ import annotations

import atexit
import functools
import gc
import os
import sys
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import typer

from psnode.config import Role

from . import ui
from .backends.base import BackendError
from .control import commands, history
from .job import records
from .planning.gpus import describe_worker
from .planning.hosts import HostsError
from .planning.options import LaunchOptions, launch_default
from .planning.plan import PASSTHROUGH, GpuShortageError, NodeOptions, Plan, PlanError, gpu_view, is_secret, with_gpus
from .supervisor.detach import detach, through_pipe
from .supervisor.setup import Prepared
from .supervisor.supervisor import EXIT_PREFLIGHT, Supervisor
from .view import PlanRow

EXIT_USAGE = 2
N = NodeOptions()          # the psnode options' defaults (NodeConfig's)
L = launch_default         # the launcher options' defaults


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("mxdist")
    except Exception:  # noqa: BLE001 - not installed: the source tree's
        return "0.1.0 (source tree)"


app = typer.Typer(
    name="mxdist", add_completion=True, no_args_is_help=True, rich_markup_mode=None,
    help="Launch psnode parameter-server jobs locally, over SSH or in Slurm; inspect and stop them.",
)


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"mxdist {_version()}")
        raise typer.Exit(0)


@app.callback()
def main(
    home: str | None = typer.Option(None, "--home", envvar="MXDIST_HOME", show_default="~/.mxdist",
                                    help="where jobs are recorded (records, logs, keys; private to you)"),
    version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True,
                                 help="print the version and exit"),
) -> None:
    """Launch psnode parameter-server jobs locally, over SSH or in Slurm; inspect and stop them."""
    ui.bind(sys.stdout, sys.stderr)
    records.use_home(home)
    # At exit the interpreter's last collections walk everything the command imported (numpy,
    # paramiko, rich: a quarter of a second on a busy machine, after Ctrl-C too) to free memory
    # the process hands back anyway; frozen, they skip it.
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)


def _fail(title: str, message: str, fix: str | None, code: int) -> typer.Exit:
    ui.error_panel(title, message, fix)
    return typer.Exit(code)


F = TypeVar("F", bound=Callable[..., Any])


def _guarded(fn: F) -> F:
    """A command whose permission errors (another user's MXDIST_HOME, job or files) are one panel."""
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PermissionError as exc:
            where = f" {exc.filename}" if exc.filename else ""
            raise _fail("permission denied", f"cannot access{where}: {exc.strerror or exc}",
                        "jobs and their files are private to the user who launched them", 1) from None
    return run  # type: ignore[return-value]


class _LaunchCommand(typer.core.TyperCommand):
    """``mxdist launch``'s usage line as users type the command: ``COMMAND [ARGS]...``."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return ["[OPTIONS]", "COMMAND [ARGS]..."]


@app.command(cls=_LaunchCommand,
             context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True})
@_guarded
def launch(
    ctx: typer.Context,
    command: list[str] = typer.Argument(..., metavar="COMMAND [ARGS]...",
                                        help="a .py script (run with Python), a module with -m, or any program"),
    module: bool = typer.Option(L("module"), "-m", "--module",
                                help="COMMAND is a Python module: every worker runs python -m COMMAND ARGS "
                                     "(as torchrun -m)"),
    hosts: str | None = typer.Option(None, "-H", "--hosts",
                                     help="hosts file, or inline list h1:2,h2,user@h3:port=2222 (inline HOST:N: N "
                                          "slots, as horovodrun -H; in a file: the SSH port, as MXNet's ip:port; "
                                          "fields slots=N port=N addr=ADDRESS)"),
    server_hosts: str | None = typer.Option(None, "--server-hosts", metavar="HOSTS",
                                            help="hosts that run only servers (a hosts file or inline list, "
                                                 "as -H): one server each by default; the workers' hosts "
                                                 "then run none"),
    nproc_per_node: int | None = typer.Option(
        L("nproc_per_node"), "--nproc-per-node", metavar="N",
        help="N workers on every host (its slots, as torchrun's --nproc-per-node; on this machine: N workers); "
             "refused if the hosts' slots or -n say otherwise"),
    num_workers: int | None = typer.Option(None, "-n", "-np", "--num-workers",
                                           help="workers (default: the hosts' slots in total with -H; the "
                                                "allocation's tasks in Slurm; 1 on this machine)"),
    num_servers: int | None = typer.Option(None, "-s", "--num-servers",
                                           help="servers (default: one per host; 0 allowed)"),
    launcher: str | None = typer.Option(None, "--launcher",
                                        help="local, ssh or slurm (default: local without -H, ssh "
                                             "with; slurm: inside salloc/sbatch, nodes from the allocation)"),
    engine: str = typer.Option(L("engine"), "--engine", metavar="psnode|mxnet",
                               help="what runs as the scheduler and servers: psnode's (python -m psnode), or "
                                    "MXNet's own ps-lite processes (python -c 'import mxnet', the DMLC_* "
                                    "variables) for scripts that call mx.kv.create('dist_sync'); psnode-only "
                                    "options are refused with mxnet"),
    python: str = typer.Option(L("python"), "--python", help="Python on remote hosts"),
    env: list[str] = typer.Option([], "-e", "--env", help="K=V for every process (repeatable)"),
    workdir: str | None = typer.Option(None, "--workdir", help="where the processes run (default: where --sync puts "
                                                              "the current directory, else the current one)"),
    sync: list[str] = typer.Option([], "--sync", help="DIR[:REMOTE_DIR] to copy to every host first"),
    scheduler: str | None = typer.Option(None, "--scheduler", help="host running the scheduler"),
    port: int | None = typer.Option(None, "--port", help="scheduler port (MASTER_PORT = port+1)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the plan, start nothing"),
    quiet: bool = typer.Option(False, "-q", "--quiet",
                               help="do not stream output (logs still saved; the job id and the closing "
                                    "line are still printed)"),
    ranks: str | None = typer.Option(None, "--ranks", metavar="LIST",
                                     help="stream only these workers, e.g. 0 or 0,2-3 (every log is saved)"),
    detach_: bool = typer.Option(False, "-d", "--detach",
                                 help="start the job's supervisor in the background and print the job id"),
    grace: float = typer.Option(L("grace"), "--grace", help="seconds between TERM and KILL"),
    finish_grace: float = typer.Option(L("finish_grace"), "--finish-grace",
                                       help="at most this long for servers to end after every worker exited 0"),
    heartbeat_interval: float = typer.Option(N.heartbeat_interval, "--heartbeat-interval"),
    heartbeat_liveness: int = typer.Option(N.heartbeat_liveness, "--heartbeat-liveness",
                                           help="missed heartbeats before a node is dead"),
    log_level: str = typer.Option(N.log_level, "--log-level", help="psnode log level"),
    timeline: bool = typer.Option(False, "--timeline",
                                  help="record a timeline of every process (compute, push, pull-wait, barrier-wait, "
                                       "apply, ...) and write it as a Chrome trace, timeline.json in the job's "
                                       "directory (mxdist logs --timeline says where); it opens in "
                                       "https://ui.perfetto.dev"),
    timeline_path: str | None = typer.Option(None, "--timeline-path", metavar="PATH",
                                             help="--timeline, the trace written to PATH"),
    stall_warning: float = typer.Option(N.stall_warning, "--stall-warning", metavar="SECONDS",
                                        help="warn when a worker has waited SECONDS for other workers in one "
                                             "pull or barrier, naming them (0: never)"),
    start_timeout: float = typer.Option(N.register_timeout, "--start-timeout", metavar="SECONDS",
                                        help="how long the scheduler waits for every process to start and "
                                             "register (a replacement too) before the job fails"),
    ssh_config: str | None = typer.Option(None, "--ssh-config", envvar="MXDIST_SSH_CONFIG",
                                          help="ssh config file (default ~/.ssh/config)"),
    known_hosts: str | None = typer.Option(None, "--known-hosts", envvar="MXDIST_KNOWN_HOSTS",
                                           help="known_hosts file (default: the ssh config's UserKnownHostsFile, else "
                                                "~/.ssh/known_hosts; GlobalKnownHostsFile is read too)"),
    accept_new_host_keys: bool = typer.Option(False, "--accept-new-host-keys",
                                              help="trust and record unknown host keys"),
    identity_file: str | None = typer.Option(L("identity_file"), "-i", "--identity-file", metavar="KEY",
                                             envvar="MXDIST_IDENTITY_FILE",
                                             help="SSH private key to log in with (as ssh -i; tried before the "
                                                  "ssh config's IdentityFile)"),
    connect_timeout: float = typer.Option(L("connect_timeout"), "--connect-timeout"),
    remote_dir: str = typer.Option(L("remote_dir"), "--remote-dir", envvar="MXDIST_REMOTE_DIR",
                                   help="where remote processes keep run files (removed when the job ends)"),
    distribution: str = typer.Option(N.distribution.value, "--distribution", metavar="data|param|hybrid",
                                     help="how work is split (scripts see kv.distribution)"),
    max_restarts: int = typer.Option(N.max_restarts, "--max-restarts", metavar="N",
                                     help="restart a failed worker (same rank and host) up to N times, and a "
                                          "failed server too when --checkpoint-dir is set (it restores "
                                          "its shard from the last checkpoint) or --replicas is 2 or more "
                                          "(it copies its state back from a replica, on any host that "
                                          "answers); the job keeps running"),
    replicas: int = typer.Option(N.replicas, "--replicas", metavar="K",
                                 help="copies of each server's state, held in memory by the next K-1 servers "
                                      "(1: none); 2 survives the loss of any one host; needs --max-restarts "
                                      "to replace a lost server"),
    checkpoint_dir: str | None = typer.Option(N.checkpoint_dir, "--checkpoint-dir", metavar="DIR",
                                              help="servers write DIR/server-<rank>.npz (on their "
                                                   "host; relative to --workdir), also when the job ends well"),
    checkpoint_interval: float = typer.Option(N.checkpoint_interval, "--checkpoint-interval", metavar="SECONDS",
                                              help="checkpoint every SECONDS (0: not by time)"),
    checkpoint_rounds: int = typer.Option(N.checkpoint_rounds, "--checkpoint-rounds", metavar="N",
                                          help="checkpoint (with --replicas: copy to the replicas) every N completed "
                                               "rounds (0: not by rounds)"),
    resume: bool = typer.Option(N.resume, "--resume", help="servers start from the checkpoints in --checkpoint-dir"),
    skip_nonfinite: bool = typer.Option(N.skip_nonfinite, "--skip-nonfinite",
                                        help="skip a round whose gradient holds NaN/Inf (reported)"),
    backup_workers: int = typer.Option(N.backup_workers, "--backup-workers", metavar="B",
                                       help="dist_sync stores: a round completes when all but B workers pushed; "
                                            "the B slowest pushes of each round are dropped (counted as late in "
                                            "mxdist status); kv.create(..., backup_workers=b) overrides it"),
    no_shm: bool = typer.Option(not N.shm, "--no-shm",
                                help="workers and servers on one host exchange data over TCP, not shared memory"),
    cpu_policy: str = typer.Option(N.cpu_policy.value, "--cpu-policy", metavar="batch|normal",
                                   help="batch: scheduler, servers and psnode workers run under SCHED_BATCH "
                                        "(a process woken by a message does not preempt a busy one: fewer "
                                        "context switches when processes outnumber cores); normal: left as is"),
    slice_bytes: int = typer.Option(N.slice_bytes, "--slice-bytes", metavar="N",
                                    help="arrays sliced over the servers go in parts of at most N bytes, dealt "
                                         "round-robin (0: one part per server; default 262144 with "
                                         "--server-hosts, so that answers flow back while pushes still go)"),
    insecure: bool = typer.Option(L("insecure"), "--insecure",
                                  help="no secret: anyone who reaches a port can join, read or stop the job "
                                       "(trusted networks only)"),
    encrypt: bool = typer.Option(L("encrypt"), "--encrypt",
                                 help="encrypt every link (CURVE) besides authenticating it: for networks "
                                      "where others can read traffic; costs speed"),
    keep_jobs: int = typer.Option(L("keep_jobs"), "--keep-jobs", envvar="MXDIST_KEEP_JOBS", metavar="N",
                                  help="keep the records and logs of the last N finished jobs (0: all)"),
    gpus_per_worker: int | None = typer.Option(
        L("gpus_per_worker"), "--gpus-per-worker", metavar="N",
        help="give each worker N GPUs of its own: CUDA_VISIBLE_DEVICES = GPUs l*N..l*N+N-1 of its host "
             "for local rank l (the host's GPUs: its CUDA_VISIBLE_DEVICES if set, else nvidia-smi's), "
             "seen as cuda:0..N-1; too few GPUs fails before anything starts. Default: visibility left "
             "alone, as torchrun does: every GPU visible and LOCAL_RANK -> cuda:LOCAL_RANK, which "
             "DDP(model, device_ids=[args.local_rank]) needs"),
    min_workers: int | None = typer.Option(
        L("min_workers"), "--min-workers", metavar="M",
        help="elastic: the job goes on while at least M workers live (a worker lost with no restart left "
             "is a warning, not the job's end); default -n"),
    max_workers: int | None = typer.Option(
        L("max_workers"), "--max-workers", metavar="N",
        help="elastic: mxdist scale may grow the job up to N workers (the hosts' slots must fit them); "
             "default -n"),
    host_discovery_script: str | None = typer.Option(
        L("host_discovery_script"), "--host-discovery-script", metavar="PATH",
        help="instead of -H: an executable printing the SSH hosts available now, one host[:slots] per line; "
             "polled while the job runs (new hosts add free slots for mxdist scale; a host that vanishes: "
             "its workers are lost)"),
    standby_scheduler: bool | None = typer.Option(
        L("standby_scheduler"), "--standby-scheduler/--no-standby-scheduler", show_default=False,
        help="psnode jobs on 2+ hosts: a standby scheduler on the second host (at --port + 2) takes the "
             "job over when the scheduler or its host is lost (the nodes go over to it within the "
             "heartbeat timeout); the scheduler is then not restarted [default: on with --replicas 2 "
             "or more on 2+ hosts, else off]"),
    pass_local_rank: bool = typer.Option(
        L("pass_local_rank"), "--pass-local-rank",
        help="also pass --local_rank=LOCAL_RANK to each worker, where torch.distributed.launch did (right "
             "after a .py script; at the end of another command): scripts reading args.local_rank run "
             "unchanged (LOCAL_RANK is always set)"),
) -> None:
    """Start a job: scheduler, servers and workers running COMMAND, supervised to its end."""
    from .supervisor.setup import known_gpus, prepare

    try:
        node = NodeOptions(
            distribution=distribution, heartbeat_interval=heartbeat_interval,  # type: ignore[arg-type]
            heartbeat_liveness=heartbeat_liveness, log_level=log_level, checkpoint_dir=checkpoint_dir,
            checkpoint_interval=checkpoint_interval, checkpoint_rounds=checkpoint_rounds, resume=resume,
            replicas=replicas,
            skip_nonfinite=skip_nonfinite, max_restarts=max_restarts, shm=not no_shm,
            cpu_policy=cpu_policy,  # type: ignore[arg-type]
            stall_warning=stall_warning, register_timeout=start_timeout, slice_bytes=slice_bytes,
            backup_workers=backup_workers)
        opts = LaunchOptions(
            command=command, node=node, hosts=hosts, server_hosts=server_hosts, num_workers=num_workers,
            num_servers=num_servers,
            launcher=launcher, python=python, env=env, workdir=workdir, sync=sync, scheduler=scheduler,
            port=port, quiet=quiet, detach=detach_, ranks=ranks, grace=grace, finish_grace=finish_grace,
            ssh_config=ssh_config, known_hosts=known_hosts, accept_new_host_keys=accept_new_host_keys,
            connect_timeout=connect_timeout, identity_file=identity_file, remote_dir=remote_dir,
            insecure=insecure, encrypt=encrypt,
            keep_jobs=keep_jobs, gpus_per_worker=gpus_per_worker, pass_local_rank=pass_local_rank,
            standby_scheduler=standby_scheduler,
            engine=engine, min_workers=min_workers, max_workers=max_workers,
            timeline=timeline_path if timeline_path else ("" if timeline else None),
            host_discovery_script=host_discovery_script, module=module, nproc_per_node=nproc_per_node,
            known_options=tuple(name for param in ctx.command.params for name in param.opts))
        prepared = prepare(opts)
    except (HostsError, PlanError, BackendError, ValueError) as exc:
        raise _fail("invalid launch options", str(exc), None, EXIT_USAGE) from None
    except KeyboardInterrupt:       # nothing was started
        raise typer.Exit(130) from None
    if dry_run:
        try:
            plan = with_gpus(prepared.plan, known_gpus(prepared))
        except GpuShortageError as exc:
            raise _fail("not enough GPUs (the launch would fail at preflight)", "\n".join(
                f"{s.host}: {s.reason}" for s in exc.shortages), exc.shortages[0].fix, EXIT_PREFLIGHT) from None
        _show_plan(plan, _where(prepared), prepared.how)
        return
    plan, job = prepared.plan, prepared.record.id
    for warning in plan.warnings:
        ui.warn(warning)
    supervisor = Supervisor(plan, prepared.backend, prepared.record, prepared.settings)
    try:
        if detach_:
            detach(supervisor)
            ui.plain(job)
            ui.info(f"job {job} started in the background: mxdist status {job} | mxdist logs {job} -f | "
                    f"mxdist stop {job}")
            raise typer.Exit(0)
        if ui.stdout_is_pipe():   # (| head: the job goes on detached when the reader goes away)
            code = through_pipe(supervisor, lambda: ui.info(
                f"mxdist: the output's reader went away; job {job} goes on in the background (its output in "
                f"its logs): mxdist logs {job} -f | mxdist status {job} | mxdist stop {job}"))
        else:
            code = supervisor.run()     # (it says where the job runs once preflight passed)
    except BackendError as exc:
        raise _fail("launch failed", str(exc), None, EXIT_PREFLIGHT) from None
    history.prune(keep_jobs)
    raise typer.Exit(code)


def _masked(env: dict[str, str]) -> dict[str, str]:
    return {k: ("****" if is_secret(k) else v) for k, v in env.items()}


def _where(prepared: Prepared) -> list[str]:
    """The dry run's lines on files: each ``--sync`` copy, the working directory of the processes."""
    lines = [f"--sync copies {local} to {remote} on every host first" for local, remote in prepared.settings.sync]
    return [*lines, f"working directory of every process: {prepared.record.workdir}"]


def _show_plan(plan: Plan, where: Sequence[str] = (), how: str = "") -> None:
    envs = [dict(p.env) for p in plan.procs]
    common = {k: v for k, v in envs[0].items() if all(e.get(k) == v for e in envs)}
    rows: list[PlanRow] = []
    for p, env in zip(plan.procs, envs, strict=True):
        address = plan.scheduler_address if p.rank is None else (
            f"{p.host.address}:auto" if p.role is Role.SERVER else
            f"{p.host.address}:{env.get('PSNODE_PORT', 'auto')}" if p.role is Role.SCHEDULER else p.host.address)
        own = {k: v for k, v in env.items() if k not in common}
        gpus, device = ("", "") if p.role is not Role.WORKER else describe_worker(
            p.local_rank, env, plan.gpus_per_worker, p.gpus, plan.gpus.get(p.host.label))
        rows.append(PlanRow(host=p.host.label, role=p.role.value, rank=p.rank, address=address,
                            command=plan.engine.show_argv(p.argv), env=_masked(own), gpus=gpus, device=device))
    hosts, _, gpu_warnings = gpu_view(plan)
    ui.plan_table(rows, _masked(common), [*plan.warnings, *gpu_warnings], hosts, where, how)


def _load(job: str | None) -> records.JobRecord:
    try:
        return records.resolve(job)
    except records.JobNotFound as exc:
        raise _fail("no such job", str(exc), None, 1) from None
    except records.DamagedRecord as exc:
        raise _fail("damaged job record", str(exc),
                    "mxdist jobs lists every record; mxdist clean JOB removes this one", 1) from None


def _jobs(limit: int | None, as_json: bool) -> None:
    try:
        rows = commands.job_list(limit)
    except records.JobNotFound as exc:
        raise _fail("no jobs", str(exc), None, 1) from None
    if as_json:
        ui.print_json({"jobs": [r.to_dict() for r in rows]})
    elif not rows:
        ui.info(f"no jobs recorded in {records.jobs_dir()}")
    else:
        ui.jobs_table(rows, f"{len(rows)} most recent job{'s' if len(rows) != 1 else ''} ({records.jobs_dir()})")


@app.command("jobs")
@_guarded
def jobs_command(
    limit: int = typer.Option(20, "-n", "--limit", help="how many of the most recent jobs (0: all)"),
    as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
) -> None:
    """List recent jobs: id, state, start, duration, hosts, command."""
    _jobs(limit or None, as_json)


@app.command()
@_guarded
def status(
    job: str | None = typer.Argument(None, help="job id (default: the latest)"),
    all_jobs: bool = typer.Option(False, "--all", help="list recent jobs (as mxdist jobs)"),
    watch: bool = typer.Option(False, "-w", "--watch", help="refresh until Ctrl-C, with a throughput trend"),
    as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
    interval: float = typer.Option(1.0, "--interval", help="seconds between refreshes"),
) -> None:
    """Show a job's processes (live from the scheduler, else checked on the hosts) and its outcome."""
    if all_jobs:
        _jobs(20, as_json)
        return
    if job is None:
        active = [j for j in records.all_jobs() if j.state.active] if records.jobs_dir().is_dir() else []
        if len(active) > 1:
            rows = [commands.summary(commands.refresh(j)) for j in active]
            if as_json:
                ui.print_json({"jobs": [r.to_dict() for r in rows]})
            else:
                ui.jobs_table(rows, f"{len(active)} jobs running (mxdist status JOB for one)")
            return
    record = _load(job)
    try:
        if as_json:
            ui.print_json(commands.job_status(record).to_dict())
        elif watch:
            history: dict[str, deque[float]] = {}
            with ui.watch_status() as watching, commands.status_frames(record.id) as frame:
                while True:
                    view = frame()
                    for n in view.nodes:
                        history.setdefault(n.name, deque(maxlen=16)).append(n.rate or 0.0)
                    watching.show(view, {name: ui.sparkline(list(v)) for name, v in history.items()})
                    if not view.active or watching.wait(interval):
                        break
        else:
            ui.print_status(commands.job_status(record))
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
    except BackendError as exc:
        raise _fail("status unavailable", str(exc), "check that the hosts are reachable", EXIT_PREFLIGHT) from None


def _to_stop(job: str | None, all_jobs: bool) -> list[records.JobRecord]:
    """The jobs ``mxdist stop`` ends: JOB, every running one (--all), or the one running; a job
    that already ended, or nothing running, is said and is not an error."""
    if job:
        before = _load(job)
        record = commands.refresh(before)   # (an ended job's unverified hosts are checked again)
        if not record.state.active:
            ui.info(f"job {record.id} already {record.state.value}: nothing to stop")
            if before.unverified:
                ui.stop_report({h: [] for h in before.unverified if h not in record.unverified}, record.unverified)
                if record.unverified:
                    raise typer.Exit(1)
            return []
        return [record]
    running = [commands.refresh(j) for j in records.all_jobs() if j.state.active]
    running = [j for j in running if j.state.active]
    if not running:
        latest = records.all_jobs()[-1:] if records.jobs_dir().is_dir() else []
        ui.info("no running jobs" + (f" (the latest, {latest[0].id}, {latest[0].state.value})" if latest else ""))
        return []
    if len(running) > 1 and not all_jobs:
        raise _fail("several jobs are running", f"{len(running)} jobs are running: "
                    f"{', '.join(j.id for j in running)}", "name one (mxdist stop JOB) or stop them all "
                    "(mxdist stop --all)", EXIT_USAGE)
    return running


@app.command()
@_guarded
def stop(
    job: str | None = typer.Argument(None, help="job id (default: the running one)"),
    all_jobs: bool = typer.Option(False, "--all", help="stop every running job"),
    grace: float = typer.Option(L("grace"), "--grace", help="seconds between TERM and KILL"),
) -> None:
    """Stop a job on every host (its supervisor does: TERM, grace, KILL) and check nothing is left."""
    clean = True
    for record in _to_stop(job, all_jobs):
        ui.info(f"stopping job {record.id} ({record.state.value})")
        try:
            final = commands.stop_job(record, grace)
            left, unverified = commands.verify_gone(final)
        except KeyboardInterrupt:
            ui.warn(f"interrupted: the stop request stays; job {record.id}'s supervisor ends it "
                    f"(mxdist status {record.id})")
            raise typer.Exit(130) from None
        except TimeoutError as exc:
            ui.error_panel("stop did not complete", str(exc), "check the supervisor (ps), then run mxdist stop again")
            clean = False
            continue
        except BackendError as exc:
            ui.error_panel("stop incomplete", str(exc), "check that the hosts are reachable, then stop again")
            clean = False
            continue
        unverified = {**final.unverified, **unverified}
        ui.stop_report(left, unverified)
        ui.closing_line(final.id, final.state.value, final.duration, final.stopped_by or "")
        clean = clean and not any(left.values()) and not unverified
    if not clean:
        raise typer.Exit(1)


class _ScaleCommand(typer.core.TyperCommand):
    """``mxdist scale``'s usage line as users type the command: ``[JOB] N``."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return ["[OPTIONS]", "[JOB] N"]


@app.command(cls=_ScaleCommand)
@_guarded
def scale(
    args: list[str] = typer.Argument(..., metavar="[JOB] N", show_default=False,
                                     help="job id (default: the running one) and how many workers it is to run"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print where new workers would go, change nothing"),
) -> None:
    """Grow or shrink an elastic job (launched with --min-workers/--max-workers) to N workers:
    new workers take free slots and the lowest free ranks; the highest ranks leave at their next
    round boundary (exit code 0)."""
    if len(args) > 2 or not args[-1].isdigit():
        raise _fail("invalid scale arguments", f"expected [JOB] N, got {' '.join(args)!r}",
                    "mxdist scale 3, or mxdist scale JOB 3", EXIT_USAGE)
    job, target = (args[0] if len(args) == 2 else None), int(args[-1])
    if job is None:
        running = [j for j in records.all_jobs() if j.state.active]
        if len(running) > 1:
            raise _fail("several jobs are running", f"{len(running)} jobs are running: "
                        f"{', '.join(j.id for j in running)}", "name one: mxdist scale JOB N", EXIT_USAGE)
        job = running[0].id if running else None
    record = _load(job)
    try:
        answer = commands.scale_job(record, target, dry_run)
    except commands.ScaleRefused as exc:
        raise _fail("cannot scale", str(exc), None, 1) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    if answer.error:
        raise _fail("scale refused" if answer.refused else "scale failed", answer.error, None,
                    EXIT_USAGE if answer.refused else 1)
    for line in answer.lines():
        ui.plain(line)


def _who(p: records.ProcRecord) -> str:
    return ui.who(p.role, p.rank)


@app.command()
@_guarded
def logs(
    job: str | None = typer.Argument(None, help="job id (default: the latest; name one when several run)"),
    role: Role | None = typer.Option(None, "--role", case_sensitive=False, help="only this role's processes"),
    rank: int | None = typer.Option(None, "--rank", help="only the processes of this rank (with --role: one)"),
    follow: bool = typer.Option(False, "-f", "--follow", help="keep printing until the processes end"),
    timeline: bool = typer.Option(False, "--timeline", help="print where the job's timeline (--timeline) is"),
) -> None:
    """Print the logs of a job's processes."""
    if job is None:
        running = [r for r in (commands.refresh(j) for j in records.all_jobs() if j.state.active) if r.state.active]
        if len(running) > 1:
            raise _fail("several jobs are running", f"{len(running)} jobs are running: "
                        f"{', '.join(j.id for j in running)}", "name one: mxdist logs JOB", EXIT_USAGE)
    record = _load(job)
    if timeline:
        if not record.timeline:
            raise _fail("no timeline", f"job {record.id} was launched without --timeline",
                        "launch it with mxdist launch --timeline (the trace: timeline.json in the job's "
                        "directory) or --timeline-path PATH", EXIT_USAGE)
        if not os.path.exists(record.timeline):
            state = "is still running: its trace is written when it ends" if record.state.active else \
                "ended without writing its trace (its launcher's output says why)"
            raise _fail("no timeline yet", f"job {record.id} {state}: {record.timeline}", None, EXIT_USAGE)
        ui.plain(record.timeline)
        return
    procs = commands.select(record, role.value if role else None, rank)
    if not procs:
        wanted = " ".join(x for x in (role.value if role else "process", None if rank is None else str(rank)) if x)
        raise _fail("no such process", f"job {record.id} has no {wanted}; its processes: "
                    f"{', '.join(_who(p) for p in record.procs)}", "mxdist status shows the processes", EXIT_USAGE)
    raw = len(procs) == 1
    printer = ui.LogPrinter()
    printed: set[str] = set()

    def emit(p: records.ProcRecord, data: bytes) -> None:
        if ui.output_closed():
            raise BrokenPipeError("stdout's reader went away")
        printed.add(p.name)
        if raw:
            ui.raw_bytes(data)
        else:
            printer.feed(p.name, p.role, p.rank, p.host, data)

    def done(p: records.ProcRecord) -> None:
        printer.flush(p.name, p.role, p.rank, p.host)

    try:
        commands.stream_logs(record, procs, follow, emit, done)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except BrokenPipeError:
        return
    except BackendError as exc:
        raise _fail("logs unavailable", str(exc), "check that the hosts are reachable", EXIT_PREFLIGHT) from None
    if ui.output_closed():
        return
    for p in procs:
        if p.name not in printed:
            ui.info(f"{_who(p)}: " + ("not started (no log)" if not p.pid else f"the log is empty ({p.log})"))


@app.command()
@_guarded
def clean(
    job: list[str] = typer.Argument(None, help="only these jobs (default: every finished job)"),
    older_than: float | None = typer.Option(None, "--older-than", metavar="DAYS",
                                            help="only jobs that ended more than DAYS days ago"),
    yes: bool = typer.Option(False, "-y", "--yes", help="do not ask before removing every finished job"),
    forget_unreachable: bool = typer.Option(
        False, "--forget-unreachable",
        help="remove the records of jobs whose hosts do not answer too (what they left there stays)"),
) -> None:
    """Remove finished jobs: their records and logs here, and their run files on remote hosts."""
    unknown = [j for j in job or () if not records.record_path(j).is_file()]
    if unknown:
        names = ", ".join(repr(j) for j in unknown)
        raise _fail("no such job", f"no job {names} in {records.jobs_dir()} (mxdist jobs lists them); nothing removed",
                    None, 1)
    if not job and not yes:
        finished = history.finished(older_than)
        if not finished:
            days = f" older than {older_than:g} day{'s' if older_than != 1 else ''}" if older_than else ""
            ui.info(f"no finished job to remove{days}")
            return
        what = (f"{len(finished)} finished job{'s' if len(finished) != 1 else ''} (records, logs, and run "
                f"files on their hosts): {', '.join(finished[:10])}{', ...' if len(finished) > 10 else ''}")
        if not ui.stdin_is_terminal():
            raise _fail("clean needs a confirmation", f"this removes {what}",
                        "pass --yes (stdin is not a terminal to ask), or name the jobs: mxdist clean JOB...",
                        EXIT_USAGE)
        if not typer.confirm(f"remove {what}?", default=False, err=True):
            ui.info("nothing removed")
            return
    done = history.clean(older_than, job or (), forget_unreachable=forget_unreachable)
    removed = done.removed
    ui.info(f"removed {len(removed)} job{'s' if len(removed) != 1 else ''}" +
            (f": {', '.join(removed)}" if removed and len(removed) <= 10 else ""))
    for job_id, why in done.kept.items():
        fix = (f" (mxdist clean --forget-unreachable {job_id} forgets it; what it left there stays)"
               if job_id in done.unreachable else "")
        ui.warn(f"kept {job_id}: {why}{fix}")
    for job_id, hosts in done.forgotten.items():
        names = ", ".join(hosts)
        ui.warn(f"forgot {job_id}: {names} did not answer; what the job left there stays (its run directory "
                f"{done.run_dirs.get(job_id) or 'unknown'})")


@app.command("env-allowlist", hidden=True)
def env_allowlist() -> None:
    """Print the environment variables passed through to every process."""
    for name in PASSTHROUGH:
        typer.echo(name)


if __name__ == "__main__":
    app(prog_name="mxdist")
