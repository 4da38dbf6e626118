"""``mxdist``: launch parameter-server jobs on this machine or over SSH; status, stop, logs.

The only module importing typer.  Commands translate options, call the domain modules and map
errors to exit codes; users see a message and a fix, never a traceback.

Exit codes: 0 success; 1 the job failed (or no such job); 2 bad usage (options, hosts file);
3 preflight or connection failure; 130 interrupted (Ctrl-C); 143 stopped by ``mxdist stop``.
"""
from __future__ import annotations

import shlex
import sys
import time
from typing import Any

import typer

from cli import control, jobs, ui
from cli.backends import BackendError
from cli.hosts import HostsError
from cli.launch import Launcher, PreflightFailed
from cli.plan import PASSTHROUGH, Plan, PlanError, is_secret

EXIT_USAGE, EXIT_PREFLIGHT = 2, 3

app = typer.Typer(
    name="mxdist", add_completion=False, no_args_is_help=True, rich_markup_mode=None,
    help="Launch psnode parameter-server jobs locally or over SSH; inspect and stop them.",
)


def _fail(title: str, message: str, fix: str | None, code: int) -> typer.Exit:
    ui.error_panel(title, message, fix)
    return typer.Exit(code)


@app.command(context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True})
def launch(
    command: list[str] = typer.Argument(..., metavar="COMMAND [ARGS]...",
                                        help="a .py script (run with Python) or any program"),
    hosts: str | None = typer.Option(None, "-H", "--hosts",
                                        help="hosts file, or inline list a,b:2222,user@c"),
    num_workers: int | None = typer.Option(None, "-n", "--num-workers",
                                              help="workers (default: total slots)"),
    num_servers: int | None = typer.Option(None, "-s", "--num-servers",
                                              help="servers (default: one per host; 0 allowed)"),
    launcher: str | None = typer.Option(None, "--launcher",
                                           help="local, ssh or slurm (default: local without -H, ssh "
                                                "with; slurm: inside salloc/sbatch, nodes from the allocation)"),
    python: str = typer.Option(sys.executable, "--python", help="Python on remote hosts"),
    env: list[str] = typer.Option([], "-e", "--env", help="K=V for every process (repeatable)"),
    workdir: str | None = typer.Option(None, "--workdir",
                                          help="working directory (default: the current one)"),
    sync: list[str] = typer.Option([], "--sync", help="DIR[:REMOTE_DIR] to copy to every host first"),
    scheduler: str | None = typer.Option(None, "--scheduler", help="host running the scheduler"),
    port: int | None = typer.Option(None, "--port", help="scheduler port (MASTER_PORT = port+1)"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the plan, start nothing"),
    quiet: bool = typer.Option(False, "-q", "--quiet", help="do not stream output (logs still saved)"),
    detach: bool = typer.Option(False, "-d", "--detach", help="start the job and return"),
    grace: float = typer.Option(5.0, "--grace", help="seconds between TERM and KILL"),
    finish_grace: float = typer.Option(10.0, "--finish-grace",
                                       help="seconds servers get to exit after the workers"),
    heartbeat_interval: float = typer.Option(1.0, "--heartbeat-interval"),
    heartbeat_liveness: int = typer.Option(5, "--heartbeat-liveness",
                                           help="missed heartbeats before a node is dead"),
    log_level: str = typer.Option("WARNING", "--log-level", help="psnode log level"),
    ssh_config: str | None = typer.Option(None, "--ssh-config", envvar="MXDIST_SSH_CONFIG",
                                             help="ssh config file (default ~/.ssh/config)"),
    known_hosts: str | None = typer.Option(None, "--known-hosts", envvar="MXDIST_KNOWN_HOSTS",
                                              help="known_hosts file (default ~/.ssh/known_hosts)"),
    accept_new_host_keys: bool = typer.Option(False, "--accept-new-host-keys",
                                              help="trust and record unknown host keys"),
    connect_timeout: float = typer.Option(10.0, "--connect-timeout"),
    remote_dir: str = typer.Option("~/.mxdist/run", "--remote-dir", envvar="MXDIST_REMOTE_DIR",
                                   help="where remote processes keep logs (and the job's key file)"),
    distribution: str = typer.Option("hybrid", "--distribution", metavar="data|param|hybrid",
                                     help="how work is split (scripts see kv.distribution)"),
    max_restarts: int = typer.Option(0, "--max-restarts", metavar="N",
                                     help="restart a failed worker (same rank and host) up to N times, and a "
                                          "failed server too when --checkpoint-dir is set (it restores "
                                          "its shard from the last checkpoint); the job keeps running"),
    checkpoint_dir: str | None = typer.Option(None, "--checkpoint-dir", metavar="DIR",
                                                 help="servers write DIR/server-<rank>.npz (on their "
                                                      "host; relative to --workdir), also when the job ends well"),
    checkpoint_interval: float = typer.Option(0.0, "--checkpoint-interval", metavar="SECONDS",
                                              help="checkpoint every SECONDS (0: not by time)"),
    checkpoint_rounds: int = typer.Option(0, "--checkpoint-rounds", metavar="N",
                                          help="checkpoint every N completed rounds (0: not by rounds)"),
    resume: bool = typer.Option(False, "--resume", help="servers start from the checkpoints in --checkpoint-dir"),
    skip_nonfinite: bool = typer.Option(False, "--skip-nonfinite",
                                        help="skip a round whose gradient holds NaN/Inf (reported)"),
    insecure: bool = typer.Option(False, "--insecure",
                                  help="multi-host jobs without CURVE keys (plain TCP; trusted networks only)"),
) -> None:
    """Start a job: scheduler, servers and workers running COMMAND."""
    from cli.options import LaunchOptions, prepare

    opts = LaunchOptions(**{k: v for k, v in locals().items() if k in LaunchOptions.__dataclass_fields__})
    try:
        prepared = prepare(opts)
    except (HostsError, PlanError) as exc:
        raise _fail("invalid launch options", str(exc), None, EXIT_USAGE) from None
    except (BackendError, ValueError) as exc:
        raise _fail("invalid launch options", str(exc), None, EXIT_USAGE) from None
    if dry_run:
        _show_plan(prepared.plan)
        return
    job = Launcher(prepared.plan, prepared.backend, prepared.record, prepared.settings)
    for warning in prepared.plan.warnings:
        ui.warn(warning)
    if not quiet:
        ui.info(f"job {prepared.record.id}: {len(prepared.plan.procs)} processes on "
                f"{len(prepared.plan.hosts)} host(s); logs in {jobs.log_dir(prepared.record.id)}")
    try:
        code = job.run()
    except KeyboardInterrupt:  # during preflight or sync: nothing was started
        raise typer.Exit(130) from None
    except PreflightFailed as exc:
        ui.preflight_panel(exc.problems)
        raise typer.Exit(EXIT_PREFLIGHT) from None
    except BackendError as exc:
        raise _fail("launch failed", str(exc), "see the message; nothing of the job is left running",
                    EXIT_PREFLIGHT) from None
    if detach:
        ui.info(f"detached: mxdist status {prepared.record.id} | mxdist logs {prepared.record.id} -f | "
                f"mxdist stop {prepared.record.id}")
        typer.echo(prepared.record.id)
    raise typer.Exit(code)


def _masked(env: dict[str, str]) -> dict[str, str]:
    return {k: ("****" if is_secret(k) else v) for k, v in env.items()}


def _show_plan(plan: Plan) -> None:
    envs = [dict(p.env) for p in plan.procs]
    common = {k: v for k, v in envs[0].items() if all(e.get(k) == v for e in envs)}
    rows: list[dict[str, Any]] = []
    for p, env in zip(plan.procs, envs, strict=False):
        address = plan.scheduler_address if p.rank is None else (
            f"{p.host.address}:auto" if p.role.value == "server" else p.host.address)
        own = {k: v for k, v in env.items() if k not in common}
        rows.append({"host": p.host.label, "role": p.role.value, "rank": p.rank, "address": address,
                     "command": shlex.join(p.argv), "env": _masked(own)})
    ui.plan_table(rows, _masked(common), plan.warnings)


def _load(job: str | None) -> jobs.JobRecord:
    try:
        return jobs.resolve(job)
    except jobs.JobNotFound as exc:
        raise _fail("no such job", str(exc), None, 1) from None


@app.command()
def status(
    job: str | None = typer.Argument(None, help="job id (default: the latest)"),
    watch: bool = typer.Option(False, "-w", "--watch", help="refresh until Ctrl-C"),
    as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
    interval: float = typer.Option(1.0, "--interval", help="seconds between refreshes"),
) -> None:
    """Show a job's processes (live from the scheduler, else checked on the hosts)."""
    if job is None:
        active = [j for j in jobs.all_jobs() if j.state.active]
        if len(active) > 1:
            summaries = [control.summary(j) for j in active]
            if as_json:
                ui.print_json({"jobs": summaries})
            else:
                ui.jobs_table(summaries, f"{len(active)} jobs running (mxdist status JOB for one)")
            return
    record = _load(job)
    try:
        if as_json:
            ui.print_json(control.job_status(record))
        elif watch:
            with ui.watch_status() as show:
                while True:
                    show(control.job_status(jobs.load(record.id)))
                    time.sleep(interval)
        else:
            ui.print_status(control.job_status(record))
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
    except BackendError as exc:
        raise _fail("status unavailable", str(exc), "check that the hosts are reachable", EXIT_PREFLIGHT) from None


@app.command()
def stop(
    job: str | None = typer.Argument(None, help="job id (default: the latest)"),
    all_jobs: bool = typer.Option(False, "--all", help="stop every running job"),
    grace: float = typer.Option(5.0, "--grace", help="seconds between TERM and KILL"),
) -> None:
    """Stop a job on every host (graceful, then TERM, then KILL) and check nothing is left."""
    records = [j for j in jobs.all_jobs() if j.state.active] if all_jobs else [_load(job)]
    if all_jobs and not records:
        ui.info("no running jobs")
    clean = True
    for record in records:
        ui.info(f"stopping job {record.id} ({record.state.value})")
        result = control.stop_job(record, grace)
        if not result:
            ui.info("  no process of the job was started")
        ui.stop_report(result)
        clean = clean and not any(result.values())
    if not clean:
        raise typer.Exit(1)


@app.command()
def logs(
    job: str | None = typer.Argument(None, help="job id (default: the latest)"),
    role: str | None = typer.Option(None, "--role", help="scheduler, server or worker"),
    rank: int | None = typer.Option(None, "--rank", help="rank within the role"),
    follow: bool = typer.Option(False, "-f", "--follow", help="keep printing until the processes end"),
) -> None:
    """Print the logs of a job's processes (from the hosts where they run)."""
    record = _load(job)
    procs = control.select(record, role, rank)
    if not procs:
        raise _fail("no such process", f"job {record.id} has no process with role={role} rank={rank}",
                    "mxdist status shows the processes", EXIT_USAGE)
    raw = len(procs) == 1
    printer = ui.LogPrinter()

    def emit(p: jobs.ProcRecord, data: bytes) -> None:
        if raw:
            sys.stdout.buffer.write(data) if hasattr(sys.stdout, "buffer") else sys.stdout.write(data.decode())
            sys.stdout.flush()
        else:
            printer.feed(p.name, p.role, p.rank, p.host, data)

    def done(p: jobs.ProcRecord) -> None:
        printer.flush(p.name, p.role, p.rank, p.host)

    try:
        control.stream_logs(record, procs, follow, emit, done)
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except BackendError as exc:
        raise _fail("logs unavailable", str(exc), "check that the hosts are reachable", EXIT_PREFLIGHT) from None


@app.command("env-allowlist", hidden=True)
def env_allowlist() -> None:
    """Print the environment variables passed through to every process."""
    for name in PASSTHROUGH:
        typer.echo(name)


if __name__ == "__main__":
    app()
