"""Orchestration of ``mxdist launch``: preflight, start in order, watch, first failure, stop.

Sequence:

1. record the job (state ``starting``);
2. optional ``--sync`` of directories (SFTP, unchanged files skipped);
3. preflight every host in parallel; any problem -> :class:`PreflightFailed`, nothing started;
4. jobs with CURVE (``settings.secure``: any non-local host, unless ``--insecure``): generate the
   job's key pair, keep it in ``MXDIST_HOME/jobs/<id>/job.key`` (0600) and deliver it to every
   host over the backend's channel (``install_key``: stdin over SSH, never a command line) as a
   0600 file in the run directory; every process gets ``PSNODE_KEY_FILE`` = the path on its host;
5. start the scheduler, then the servers, then the workers (each stage per host in parallel);
5. ``--detach``: return; else stream every process's output (prefixed, and saved to
   ``MXDIST_HOME/jobs/<id>/<name>.log``) and wait for exits:

   * every worker exited 0 -> the job succeeded: the scheduler and servers get ``finish_grace``
     seconds to exit by themselves (with ``-s 0`` none: nothing tells the scheduler the
     workers are done), then the rest is stopped; exit 0;
   * a worker failed and has restarts left (``--max-restarts N``, counted per process): start it
     again on the same host with the same rank and env plus ``PSNODE_RESTART_COUNT=k``; the job
     goes on (the scheduler, told ``PSNODE_MAX_RESTARTS``, waits for the replacement).  The same
     for a server when servers checkpoint (``--checkpoint-dir``): the replacement restores its
     shard and optimizer state from its last checkpoint and the workers resend what it missed;
   * any process failed first (non-zero, signal, vanished) -> stop everything on every host,
     report that first failure with the tail of its log; exit 1;
   * Ctrl-C (or SIGTERM to the launcher) -> stop everything; exit 130;
   * ``mxdist stop`` from elsewhere -> exit 143.

Stopping is TERM to every process group, KILL after ``grace`` seconds, then a check per host
that nothing is left.  When an attached job is over, the key files are deleted on every host.

The processes never depend on the launcher (own sessions, logs in files): a launcher killed with
``kill -9`` leaves a job that still ends by itself -- the workers finish, or psnode's heartbeats
fail it -- and ``mxdist stop`` cleans up whatever is left.
"""
from __future__ import annotations

import os
import queue
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from cli import ui
from cli.backends import Backend, BackendError, ExitStatus, HostProblem, Started, run_per_host
from cli.control import remove_job_keys, stop_processes
from cli.hosts import Host
from cli.jobs import JobRecord, JobState, ProcRecord, ProcState, key_path, load, save
from cli.plan import Plan, ProcSpec, restarted, with_key_files
from psnode.config import Role
from psnode.transport import CurveKeys

EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_STOPPED = 0, 1, 130, 143


class PreflightFailed(Exception):
    def __init__(self, problems: Sequence[HostProblem]) -> None:
        super().__init__(f"{len(problems)} preflight problem(s)")
        self.problems = list(problems)


@dataclass
class LaunchSettings:
    """How to run a planned job (everything but the plan and the backend)."""

    run_dir: str                     # where processes write logs and rc files, on their host
    grace: float = 5.0               # TERM -> KILL
    finish_grace: float = 10.0       # after all workers succeeded
    detach: bool = False
    quiet: bool = False
    sync: list[tuple[str, str]] = field(default_factory=list)  # (local dir, remote dir)
    check_modules: tuple[str, ...] = ("psnode",)
    max_restarts: int = 0            # per worker, and per server with checkpoints (--max-restarts)
    secure: bool = False             # CURVE: generate and deliver the job's keys


class Launcher:
    """Runs one job; :meth:`run` returns the process exit code."""

    def __init__(self, plan: Plan, backend: Backend, record: JobRecord, settings: LaunchSettings) -> None:
        self.plan = plan
        self.backend = backend
        self.record = record
        self.settings = settings
        self.hosts: dict[str, Host] = {h.label: h for h in plan.hosts}
        self.events: queue.Queue[tuple[ProcRecord, ExitStatus]] = queue.Queue()
        self.printer = ui.LogPrinter(quiet=settings.quiet)
        self.threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    # -- phases ----------------------------------------------------------------------------------

    def run(self) -> int:
        save(self.record)
        try:
            for local, remote in self.settings.sync:  # first: the workdir may be what it copies
                self._sync(local, remote)
            base_env = {k: v for k, v in self.plan.procs[0].env.items() if not k.startswith("PSNODE_")}
            problems = self.backend.preflight(list(self.plan.hosts), self.settings.check_modules, base_env)
            if problems:
                raise PreflightFailed(problems)
            if self.settings.secure:
                self._install_keys()
        except PreflightFailed:
            remove_job_keys(self.record, self.backend)
            self._finish(JobState.FAILED)
            self.backend.close()
            raise
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            try:
                self._start_all()
            except BackendError:
                self._stop_all(ProcState.STOPPED)
                self._finish(JobState.FAILED)
                raise
            if self.settings.detach:
                self._finish(JobState.RUNNING)
                return EXIT_OK
            return self._watch()
        except KeyboardInterrupt:
            ui.warn("interrupted: stopping the job on every host")
            self._stop_all(ProcState.STOPPED)
            self._finish(JobState.STOPPED)
            return EXIT_INTERRUPTED
        finally:
            signal.signal(signal.SIGTERM, previous)
            if not self.settings.detach:
                remove_job_keys(self.record, self.backend)
                self._save()
            self.backend.close()

    def _install_keys(self) -> None:
        """Generate the job's CURVE keys, keep a local copy, deliver them to every host."""
        install = getattr(self.backend, "install_key", None)
        if install is None:
            raise PreflightFailed([HostProblem(
                h.label, f"the {self.backend.name} launcher cannot deliver the job's CURVE keys",
                "pass --insecure to run without authentication and encryption") for h in self.plan.hosts])
        keys = CurveKeys.generate()
        local = key_path(self.record.id)
        local.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        keys.save(str(local))
        self.record.key_file = str(local)
        self._save()
        text = keys.public + b"\n" + keys.secret + b"\n"
        results = run_per_host(list(self.plan.hosts), lambda h: install(h, self.settings.run_dir, text))
        problems = [HostProblem(label, f"could not write the job's key file: {result}",
                                "check that the remote run directory (--remote-dir) is writable")
                    for label, result in results.items() if isinstance(result, Exception)]
        self.record.remote_keys = {label: path for label, path in results.items()
                                   if not isinstance(path, Exception)}
        self._save()
        if problems:
            raise PreflightFailed(problems)
        self.plan = with_key_files(self.plan, self.record.remote_keys)

    def _sync(self, local: str, remote: str) -> None:
        total = sum(f.stat().st_size for f in Path(local).rglob("*") if f.is_file())
        sync = getattr(self.backend, "sync", None)
        if sync is None:
            return
        with ui.progress_bar(f"sync {local} -> {remote}", total * len(self.hosts)) as advance:
            results = run_per_host(list(self.plan.hosts), lambda h: sync(h, local, remote, advance))
        explain = getattr(self.backend, "explain", None)
        problems = []
        for label, result in results.items():
            if not isinstance(result, Exception):
                continue
            if explain is not None and not isinstance(result, BackendError):  # could not connect
                problems.append(explain(label, self.hosts[label], result))
            else:
                problems.append(HostProblem(label, f"sync of {local} to {remote} failed: {result}",
                                            "check the remote path and its permissions"))
        if problems:
            raise PreflightFailed(problems)

    def _start_all(self) -> None:
        for role in (Role.SCHEDULER, Role.SERVER, Role.WORKER):
            specs = self.plan.of_role(role)
            per_host: dict[str, list[ProcSpec]] = {}
            for spec in specs:
                per_host.setdefault(spec.host.label, []).append(spec)
            results = run_per_host([self.hosts[h] for h in per_host], partial(self._start_on, per_host))
            errors = []
            for label, result in results.items():
                if isinstance(result, Exception):
                    errors.append(f"{label}: {result}")
                    continue
                for started in result:
                    rec = self.record.proc(started.name)
                    rec.pid, rec.run_log, rec.rc_file = started.pid, started.run_log, started.rc_file
                    rec.state = ProcState.RUNNING
            self._save()
            if errors:
                raise BackendError("could not start processes: " + "; ".join(errors))
            if not self.settings.detach:
                for spec in specs:
                    self._follow_in_thread(self.record.proc(spec.name))
        self.record.state = JobState.RUNNING
        self._save()

    def _start_on(self, per_host: dict[str, list[ProcSpec]], host: Host) -> list[Started]:
        return self.backend.start(host, per_host[host.label], self.settings.run_dir)

    def _follow_in_thread(self, rec: ProcRecord, offset: int = 0) -> None:
        host = self.hosts[rec.host]
        copy_log = rec.log != rec.run_log  # remote: keep a local copy of the output

        def run() -> None:
            sink = open(rec.log, "ab") if copy_log else None  # noqa: SIM115 - closed in finally

            def emit(data: bytes) -> None:
                if sink:
                    sink.write(data)
                    sink.flush()
                self.printer.feed(rec.name, rec.role, rec.rank, host.label, data)

            try:
                status = self.backend.follow(host, rec, emit, wait=True, offset=offset) or ExitStatus(None)
            except Exception as exc:  # noqa: BLE001 - connection lost: the process's fate is unknown here
                emit(f"mxdist: lost the output stream of {rec.name}: {exc}\n".encode())
                status = ExitStatus(None)
            finally:
                if sink:
                    sink.close()
                self.printer.flush(rec.name, rec.role, rec.rank, host.label)
            self.events.put((rec, status))

        thread = threading.Thread(target=run, name=f"follow-{rec.name}", daemon=True)
        thread.start()
        self.threads.append(thread)

    def _watch(self) -> int:
        workers = {p.name for p in self.record.procs if p.role == Role.WORKER.value}
        running = {p.name for p in self.record.procs}
        finish_by: float | None = None
        while running:
            try:
                rec, status = self.events.get(timeout=0.2)
            except queue.Empty:
                if finish_by is not None and time.monotonic() > finish_by:
                    break
                continue
            running.discard(rec.name)
            if self._stopped_elsewhere():
                ui.warn("the job was stopped with mxdist stop")
                self._stop_all(ProcState.STOPPED)
                return EXIT_STOPPED
            self._set_exit(rec, status)
            if rec.name in workers:
                if (not status.ok and finish_by is None and rec.restarts < self.settings.max_restarts
                        and self._restart(rec, status)):
                    running.add(rec.name)
                    continue
                workers.discard(rec.name)
                if not status.ok:
                    return self._fail(rec, status)
                if not workers:
                    grace = 0.0 if self.plan.num_servers == 0 else self.settings.finish_grace
                    finish_by = time.monotonic() + grace
            elif not status.ok:
                if finish_by is None and self._server_restartable(rec) and self._restart(rec, status):
                    running.add(rec.name)
                    continue
                if finish_by is None:
                    return self._fail(rec, status)
                ui.warn(f"{rec.name} on {rec.host} {status.describe()} after the workers finished")
        self._stop_all(ProcState.STOPPED)
        self._finish(JobState.SUCCEEDED)
        return EXIT_OK

    def _server_restartable(self, rec: ProcRecord) -> bool:
        """A failed server is restarted when restarts are left and servers checkpoint (the
        replacement restores its shard from the last checkpoint)."""
        if rec.role != Role.SERVER.value or rec.restarts >= self.settings.max_restarts:
            return False
        spec = next((p for p in self.plan.procs if p.name == rec.name), None)
        return spec is not None and bool(spec.env.get("PSNODE_CHECKPOINT_DIR"))

    def _restart(self, rec: ProcRecord, status: ExitStatus) -> bool:
        """Start ``rec`` again (same host, rank, env + PSNODE_RESTART_COUNT); False if that failed."""
        count = rec.restarts + 1
        ui.warn(f"{rec.name} on {rec.host} {status.describe()}: restarting it with rank {rec.rank} "
                f"(restart {count} of {self.settings.max_restarts})")
        spec = restarted(next(p for p in self.plan.procs if p.name == rec.name), count)
        try:
            offset = os.path.getsize(rec.log)  # the local log (or local copy) holds all output so far
        except OSError:
            offset = 0
        try:
            started = self.backend.start(self.hosts[rec.host], [spec], self.settings.run_dir)[0]
        except Exception as exc:  # noqa: BLE001 - reported, then the failure counts as final
            ui.warn(f"could not restart {rec.name} on {rec.host}: {exc}")
            return False
        rec.pid, rec.run_log, rec.rc_file = started.pid, started.run_log, started.rc_file
        rec.restarts, rec.state, rec.exit_code = count, ProcState.RUNNING, None
        self._save()
        self._follow_in_thread(rec, offset)
        return True

    def _fail(self, rec: ProcRecord, status: ExitStatus) -> int:
        self._stop_all(ProcState.STOPPED)
        self._finish(JobState.FAILED)
        how = status.describe()
        if rec.restarts:
            how += f" (after {rec.restarts} restart{'s' if rec.restarts > 1 else ''})"
        ui.failure_panel(rec.role, rec.rank, rec.host, how, rec.log, _tail(rec.log))
        return EXIT_FAILED

    # -- helpers ---------------------------------------------------------------------------------

    def _set_exit(self, rec: ProcRecord, status: ExitStatus) -> None:
        rec.exit_code = status.code
        rec.state = (ProcState.EXITED if status.ok else
                     ProcState.LOST if status.code is None else ProcState.FAILED)
        self._save()

    def _stop_all(self, state: ProcState) -> None:
        """Stop whatever still runs, wait for the output threads, report leftovers per host."""
        live = [p for p in self.record.procs if p.pid and p.state in (ProcState.RUNNING, ProcState.PENDING)]
        if live:
            result = stop_processes(self.backend, self.hosts, live, self.settings.grace)
            if any(r for r in result.values()):
                ui.stop_report(result)
            for p in live:
                p.state = state
        deadline = time.monotonic() + 5.0
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self._save()

    def _stopped_elsewhere(self) -> bool:
        try:
            return load(self.record.id).state is JobState.STOPPED
        except Exception:  # noqa: BLE001 - an unreadable record says nothing
            return False

    def _finish(self, state: JobState) -> None:
        self.record.state = state
        if not state.active:
            self.record.ended = time.time()
        self._save()

    def _save(self) -> None:
        with self._lock:
            save(self.record)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _tail(path: str, lines: int = 20) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    return text.splitlines()[-lines:]


def new_record(plan: Plan, backend: Backend, command: Sequence[str], workdir: str,
               log_dir: Path) -> JobRecord:
    """The initial job record of a plan (no pids yet)."""
    from dataclasses import asdict

    procs = [
        ProcRecord(name=p.name, role=p.role.value, rank=p.rank, host=p.host.label,
                   address=p.host.address, log=str(log_dir / f"{p.name}.log"))
        for p in plan.procs
    ]
    return JobRecord(id=plan.job_id, command=list(command), backend=backend.name,
                     scheduler=plan.scheduler_address, workdir=workdir,
                     hosts=[asdict(h) for h in plan.hosts], options=backend.options(), procs=procs)
