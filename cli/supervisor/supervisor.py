"""The job's supervisor: the one owner of a job's life and the only writer of its record.

``mxdist launch`` is the supervisor (attached); ``mxdist launch -d`` runs the same supervisor
detached (:func:`mxdist.supervisor.detach.detach`: its own session, output to ``jobs/<id>/supervisor.log``).  It holds
the job's lock (:mod:`mxdist.job.records`) for as long as it lives.

Sequence (:meth:`Supervisor.run`):

1. record the job (``starting``) with who supervises it (pid, start time, host);
2. ``--sync``, preflight of every host, and (unless ``--insecure``) the job's secret, fresh,
   on every host (:mod:`mxdist.supervisor.preflight`): any problem -> ``failed`` with the reason
   per host, exit 3, nothing started;
   a signal or a stop request meanwhile ends the job at once (nothing of the job is on any host
   before preflight passed: :class:`mxdist.supervisor.preflight.HostWrites`);
3. start the scheduler, the servers, the workers (each stage per host in parallel); stream
   every process's output (prefixed; ``--ranks`` filters; every line saved to
   ``jobs/<id>/<name>.log``);
4. watch: process exits go through the rules of :mod:`mxdist.job.lifecycle` (restart, after a back
   off when it failed quickly; fail, a crash loop included; wind down; a killed scheduler is
   restarted at its address and rebuilds the job from the live nodes); a stop request
   (``mxdist stop``: ``jobs/<id>/stop.request``) or a signal ends it;
5. the end, always the same way (:meth:`Supervisor._conclude`): stop what still runs on every
   host (TERM, ``--grace``, KILL; a host that does not answer within seconds is *not
   verified*, never waited on), collect what the processes left, name the root cause
   (:mod:`mxdist.job.rootcause`), remove the job's secrets, run files and shared-memory segments on
   every host, write the final state once, print the closing line.

Exit codes and final states:

=====  ===========  =========================================================================
code   state        when
=====  ===========  =========================================================================
0      succeeded    every worker exited 0 (with ``-d``: the job was started)
1      failed       a process failed (the root cause is named) or could not be restarted
3      failed       preflight or start failed (per host, with the reason and the fix)
129    stopped      SIGHUP: the terminal closed
130    stopped      SIGINT: Ctrl-C
143    stopped      SIGTERM, or ``mxdist stop``
=====  ===========  =========================================================================

Supervision never depends on the terminal: output to a closed pipe or terminal is dropped
(:mod:`mxdist.ui`), the job runs on and ends as it would have; signals only set a flag that the
loop acts on.  A signal that was ignored when mxdist started (``nohup`` ignores SIGHUP) stays
ignored.  Job processes run in their own sessions, so the terminal's signals reach the
supervisor only.
"""
from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from psnode import launcher as door
from psnode.config import Role
from psnode.files import write_atomic
from psnode.launcher import Mode

from .. import ui
from ..backends.agent import last_exception
from ..backends.base import (
    Backend,
    BackendError,
    ExitStatus,
    HostProblem,
    Started,
    fetcher,
    resolver,
    run_per_host,
)
from ..elastic.discovery import DiscoveryError, DiscoveryPoller
from ..elastic.rules import ElasticError, Joiner, Live, ScaleAnswer, discovery_changes, new_home, plan_scale
from ..job import records, teardown
from ..job.lifecycle import QUICK, SCHEDULER_RESTARTS, Action, Failure, Supervision
from ..job.records import Change, Elastic, JobOutcome, JobRecord, JobState, ProcRecord, ProcState
from ..job.rootcause import RootCause, decide, describe_code
from ..planning.hosts import Host
from ..planning.plan import Plan, ProcSpec, restarted, with_gpus, with_worker
from ..planning.plan import joiner as joiner_spec
from .preflight import HostWrites, prepare_host, prepare_hosts

EXIT_OK, EXIT_FAILED, EXIT_PREFLIGHT = 0, 1, 3
EXIT_HANGUP, EXIT_INTERRUPTED, EXIT_STOPPED = 129, 130, 143
SIGNAL_EXIT = {signal.SIGHUP: (EXIT_HANGUP, "hangup (the terminal closed)"),
               signal.SIGINT: (EXIT_INTERRUPTED, "Ctrl-C"),
               signal.SIGTERM: (EXIT_STOPPED, "SIGTERM")}
POLL = 0.2
STATUS_TIMEOUT = 0.5     # asking the scheduler whether psnode started, when the workers are done
TIMELINE_LIMIT = 512 << 20   # bytes of --timeline events read from one host
TIMELINE_FETCH = 120.0       # seconds a host is given to send its --timeline events
SLOW_POLL = 2.0          # seconds between the supervisor's questions to the scheduler about slow workers
REACH_TIMEOUT = 10.0     # seconds a host is given to answer before a process that vanished there restarts


@dataclass
class LaunchSettings:
    """How to run a planned job (everything but the plan and the backend)."""

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


@dataclass(frozen=True)
class EndRequest:
    code: int
    why: str      # "Ctrl-C", "mxdist stop", ...
    grace: float | None = None


class Supervisor:
    """Runs one job to its end; :meth:`run` returns the exit code (module docstring)."""

    def __init__(self, plan: Plan, backend: Backend, record: JobRecord, settings: LaunchSettings) -> None:
        self.plan = plan
        self.backend = backend
        self.record = record
        self.settings = settings
        self.hosts: dict[str, Host] = {h.label: h for h in plan.hosts}
        # exits as the followers report them; None wakes the loop (a signal, the end of preflight)
        self.events: queue.SimpleQueue[tuple[str, ExitStatus] | None] = queue.SimpleQueue()
        self.printer = ui.LogPrinter(quiet=settings.quiet, ranks=settings.ranks)
        self.threads: list[tuple[str, threading.Thread]] = []   # (host label, follower)
        self._since: dict[str, tuple[float, int]] = {}   # name -> (when it started, its log's size then)
        self._signal: int | None = None
        self._lock: records.Lock | None = None
        self._stopped: set[str] = set()
        self._writes = HostWrites()     # whether anything of the job may be on its hosts
        self._on_save: list[Callable[[], None]] = []
        # elastic jobs: the discovery script's latest hosts (None: the plan's), its outcomes as the
        # poller hands them over, the last problem it warned of, why a stopped worker is lost
        self._poller: DiscoveryPoller | None = None
        self._discovered: list[Host] | None = None
        self._discovery_outcomes: queue.SimpleQueue[list[Host] | DiscoveryError] = queue.SimpleQueue()
        self._discovery_problem: str | None = None
        self._why_lost: dict[str, str] = {}
        self._lost_hosts: dict[str, float] = {}   # hosts that did not answer (label -> when): never used again
        self._slowest: str | None = None     # the closing line's words on the slowest worker (_ask_slowness)
        self._ended = threading.Event()
        self._rules: Supervision | None = None

    def on_save(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` after every save of the record (``launch -d``: the parent returns
        once the record is on disk)."""
        self._on_save.append(callback)

    # -- the whole life -------------------------------------------------------------------------

    def run(self) -> int:
        # a signal ignored when mxdist started stays ignored (nohup; a background job of a script)
        previous = {s: signal.signal(s, self._on_signal) for s in SIGNAL_EXIT
                    if signal.getsignal(s) is not signal.SIG_IGN}
        self._lock = records.try_lock(self.record.id)
        if self._lock is None:
            raise BackendError(f"job {self.record.id} already has a supervisor")
        self.record.supervise(records.Owner.this_process(self.settings.detach), self.settings.run_dir)
        self._save()
        try:
            return self._life()
        except Exception as exc:
            if not self.record.state.active:
                raise
            # a bug in the supervisor must not leave a job behind: end it like any failure
            import traceback

            traceback.print_exc()
            return self._conclude(JobState.FAILED, EXIT_FAILED,
                                  headline=f"mxdist supervisor error: {type(exc).__name__}: {exc}")
        finally:
            for s, handler in previous.items():
                with contextlib.suppress(ValueError, TypeError):
                    signal.signal(s, handler)
            if self._poller is not None:
                self._poller.stop()
            with contextlib.suppress(OSError):
                records.stop_request_path(self.record.id).unlink()
            for path in records.scale_requests(self.record.id):   # nobody will serve them now
                with contextlib.suppress(OSError):
                    write_atomic(records.scale_answer_path(path), json.dumps(ScaleAnswer(
                        self.record.id, error=f"job {self.record.id} is {self.record.state.value}").to_dict()))
                    path.unlink()
            self.backend.close()
            self._lock.release()

    def _life(self) -> int:
        problems = self._preflight_unless_ended()
        if (req := self._end_request()) is not None:
            return self._conclude(JobState.STOPPED, req.code, stopped_by=req.why)
        if problems:
            ui.preflight_panel(problems)
            cause = "; ".join(f"{p.host}: {p.reason}" for p in problems)
            hosts = ", ".join(dict.fromkeys(p.host for p in problems))
            return self._conclude(JobState.FAILED, EXIT_PREFLIGHT, headline=f"preflight failed: {cause}",
                                  summary=f"preflight failed on {hosts} (the panel above)")
        try:
            self._start_all()
        except BackendError as exc:
            ui.error_panel("launch failed", str(exc), "see the message; the job is being stopped")
            return self._conclude(JobState.FAILED, EXIT_PREFLIGHT, headline=f"start failed: {exc}")
        if (req := self._end_request()) is not None:
            return self._conclude(JobState.STOPPED, req.code, stopped_by=req.why, grace=req.grace)
        return self._watch()

    # -- preflight ------------------------------------------------------------------------------

    def _preflight_unless_ended(self) -> list[HostProblem]:
        """Preflight in a thread; return early (nothing started yet) if the job is ended meanwhile.

        Ended before preflight began writing the job's files, it writes none: the end has
        nothing to remove on the hosts and does not wait for a slow one.  Ended after, its
        writes are waited for (at most :data:`mxdist.job.teardown.STEP_MARGIN`), so the end removes them."""
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = self._preflight()
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                box["error"] = exc
            finally:
                self.events.put(None)

        thread = threading.Thread(target=target, name="preflight", daemon=True)
        thread.start()
        while thread.is_alive() and self._end_request() is None:
            with contextlib.suppress(queue.Empty):
                self.events.get(timeout=POLL)
        if thread.is_alive() and self._writes.forbid():
            thread.join(teardown.STEP_MARGIN)
        if "error" in box:
            raise box["error"]
        return box.get("value", [])

    def _preflight(self) -> list[HostProblem]:
        problems, self.plan = prepare_hosts(self.plan, self.backend, self.record, self.settings.run_dir,
                                            self.settings.sync, self.settings.check_modules,
                                            self.settings.security, self._save, self._writes)
        return problems

    # -- start ----------------------------------------------------------------------------------

    def _start_all(self) -> None:
        for role in (Role.SCHEDULER, Role.SERVER, Role.WORKER):
            per_host: dict[str, list[ProcSpec]] = {}
            for spec in self.plan.of_role(role):
                per_host.setdefault(spec.host.label, []).append(spec)
            results = run_per_host([self.hosts[h] for h in per_host], partial(self._start_on, per_host))
            errors = []
            for label, result in results.items():
                if isinstance(result, Exception):
                    errors.append(f"{label}: {result}")
                    continue
                for started in result:
                    rec = self.record.proc(started.name)
                    rec.started(started.pid, started.run_log, started.rc_file)
                    self._follow(rec)
            self._save()
            if errors:
                raise BackendError("could not start processes: " + "; ".join(errors))
        self.record.mark_running()
        self._save()

    def _start_on(self, per_host: dict[str, list[ProcSpec]], host: Host) -> list[Started]:
        return self.backend.start(host, per_host[host.label], self.settings.run_dir)

    def _follow(self, rec: ProcRecord, offset: int = 0) -> None:
        """A thread streams the output of the process just started (and copies a remote log
        here) from ``offset`` of its log, then reports its exit."""
        host = self.hosts[rec.host]
        copy_log = rec.log != rec.run_log
        try:   # where this run's output begins in the log the launcher reads (_failure)
            here = os.path.getsize(rec.log) if copy_log else offset
        except OSError:
            here = 0
        self._since[rec.name] = (time.monotonic(), here)

        def run() -> None:
            sink = None
            if copy_log:
                fd = os.open(rec.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                sink = os.fdopen(fd, "ab")

            def emit(data: bytes) -> None:
                if sink:
                    sink.write(data)
                    sink.flush()
                self.printer.feed(rec.name, rec.role, rec.rank, host.label, data)

            try:
                status = self.backend.follow(host, rec, emit, wait=True, offset=offset) or ExitStatus(None)
            except Exception as exc:  # noqa: BLE001 - connection lost: its fate is checked at the end
                emit(f"mxdist: lost the output stream of {rec.name}: {exc}\n".encode())
                status = ExitStatus(None)
            finally:
                if sink:
                    sink.close()
                self.printer.flush(rec.name, rec.role, rec.rank, host.label)
            self.events.put((rec.name, status))

        thread = threading.Thread(target=run, name=f"follow-{rec.name}", daemon=True)
        thread.start()
        self.threads.append((rec.host, thread))

    # -- watch ----------------------------------------------------------------------------------

    def _ask_slowness(self) -> None:
        """Until the job ends, ask the scheduler every :data:`SLOW_POLL` seconds whom the
        workers waited for (psnode's slowness counters), for the closing line."""
        from ..view import slowest

        while not self._ended.wait(SLOW_POLL):
            try:
                answer = door.status(self.record.scheduler, self.record.id, key_file=self.record.key_file,
                                        timeout=STATUS_TIMEOUT)
            except Exception:  # noqa: BLE001 - no answer (yet, or any more): the last one stands
                continue
            if answer.started:
                self._slowest = slowest(list(answer.nodes), answer.uptime)

    def _watch(self) -> int:
        if self.plan.num_servers and self.plan.engine.name == "psnode":
            threading.Thread(target=self._ask_slowness, name="slowness", daemon=True).start()
        try:
            return self._supervise()
        finally:
            self._ended.set()

    def _supervise(self) -> int:
        elastic = self.record.elastic
        rules = Supervision.of(((p.name, p.role) for p in self.record.procs if p.pid),
                               self.plan.node.max_restarts, self.plan.node.servers_restart,
                               minimum=elastic.min_workers if elastic is not None else None,
                               scheduler_restarts=SCHEDULER_RESTARTS if self._psnode_job else 0)
        self._rules = rules
        wind_down_by: float | None = None
        later: list[tuple[float, ProcRecord]] = []   # restarts backing off (mxdist.job.lifecycle, rule 6)
        if elastic is not None and elastic.discovery:
            here = self.record.workdir if self.record.workdir and os.path.isdir(self.record.workdir) else None
            self._poller = DiscoveryPoller(elastic.discovery, self._on_discovery, cwd=here)  # (--sync: remote workdir)
            self._poller.start()
        while True:
            if (req := self._end_request()) is not None:
                if rules.winding_down:
                    return self._conclude(JobState.SUCCEEDED, EXIT_OK)
                return self._conclude(JobState.STOPPED, req.code, stopped_by=req.why, grace=req.grace)
            self._serve_scale_requests(rules)
            self._apply_discovery(rules)
            for item in [x for x in later if x[0] <= time.monotonic()]:
                later.remove(item)
                if not self._restart(item[1]) and rules.restart_failed(item[1].name) is Action.FAIL:
                    return self._conclude(JobState.FAILED, EXIT_FAILED, first_seen=item[1].name)
            try:
                event = self.events.get(timeout=POLL)
            except queue.Empty:
                event = None
            if event is None:
                if wind_down_by is not None and time.monotonic() >= wind_down_by:
                    return self._conclude(JobState.SUCCEEDED, EXIT_OK)
                continue
            name, status = event
            rec = self.record.proc(name)
            self._exited(rec, status)
            action = rules.exited(name, status.ok, None if status.ok else self._failure(rec, status))
            if status.ok and rules.leaving and name in rules.leaving:
                self._left(rec)
            elif name in rules.lost:
                self._lose(rec, status, rules)
            if action is Action.RESTART:
                delay = rules.delay(name)
                self._announce_restart(rec, status, delay)
                if delay:
                    later.append((time.monotonic() + delay, rec))
                elif not self._restart(rec):
                    action = rules.restart_failed(name)
            if action is Action.FAIL:
                return self._conclude(JobState.FAILED, EXIT_FAILED, first_seen=name,
                                      note=rules.crash_loop or rules.shortfall)
            if action is Action.DONE:
                return self._conclude(JobState.SUCCEEDED, EXIT_OK)
            if action is Action.WIND_DOWN:
                wait = rules.wait_for_rest(self.plan.engine.rest_ends_alone(self._psnode_started))
                wind_down_by = time.monotonic() + (self.settings.finish_grace if wait else 0.0)
            elif rules.winding_down and not status.ok:
                ui.warn(f"{rec.name} on {rec.host} {status.describe()} after the workers finished")

    # -- elastic membership (mxdist.elastic.rules) ----------------------------------------------------------

    def _live(self, rules: Supervision) -> list[Live]:
        """The workers that run and stay (not asked to leave), with their hosts and local ranks."""
        specs = {p.name: p for p in self.plan.of_role(Role.WORKER)}
        names = (rules.running & rules.workers) - rules.leaving
        return sorted((Live(specs[n].rank or 0, specs[n].host.label, specs[n].local_rank) for n in names),
                      key=lambda w: w.rank)

    def _serve_scale_requests(self, rules: Supervision) -> None:
        """Answer every ``mxdist scale`` request waiting (module docstring of :mod:`mxdist.job.records`)."""
        for path in records.scale_requests(self.record.id):
            try:
                asked = records.ScaleRequest.from_json(json.loads(path.read_text()))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                answer = ScaleAnswer(self.record.id, error=f"unreadable request {path.name}: {exc}", refused=True)
            else:
                answer = self._scale(rules, asked.target, asked.dry_run)
            with contextlib.suppress(OSError):
                write_atomic(records.scale_answer_path(path), json.dumps(answer.to_dict()))
                path.unlink()

    def _scale(self, rules: Supervision, target: int, dry_run: bool) -> ScaleAnswer:
        """Take the job to ``target`` workers (``dry_run``: only say how)."""
        job = self.record.id
        if self.plan.bounds is None or self.record.elastic is None:
            return ScaleAnswer(job, error=f"job {job} was launched without --min-workers/--max-workers: "
                                          f"it keeps its {self.plan.num_workers} workers", refused=True)
        if rules.winding_down:
            return ScaleAnswer(job, error=f"job {job} is ending (its workers finished)")
        try:
            change = plan_scale(target, self.plan.bounds, self._slot_hosts(), self._live(rules))
        except ElasticError as exc:
            return ScaleAnswer(job, error=str(exc), refused=True)
        if dry_run or change.empty:
            return ScaleAnswer(job, change, dry_run=dry_run)
        if change.leavers:
            if not self._ask_to_leave(change.leavers):
                return ScaleAnswer(job, error=f"the scheduler of job {job} did not acknowledge the leave request "
                                              f"for worker{'s' if len(change.leavers) > 1 else ''} "
                                              f"{', '.join(map(str, change.leavers))}; nothing changed")
            for rank in change.leavers:
                rules.leave(f"{Role.WORKER.value}-{rank}")
            self.record.leaving(change.leavers)
        started: list[Joiner] = []
        after = change.workers_after(self._live(rules))
        for joiner in change.joiners:
            try:
                self._join(rules, joiner, target, after[joiner.host])
            except Exception as exc:  # noqa: BLE001 - reported to mxdist scale; the job goes on
                self.record.scale_to(len(self._live(rules)))
                self._save()
                done = f"; started {', '.join(str(j.rank) for j in started)}" if started else ""
                return ScaleAnswer(job, error=f"could not start worker {joiner.rank} on {joiner.host}: {exc}{done}")
            started.append(joiner)
        self.record.scale_to(target)
        self._save()
        for line in ScaleAnswer(job, change).lines():
            ui.info(line)
        return ScaleAnswer(job, change)

    def _slot_hosts(self) -> list[Host]:
        """The hosts offering worker slots now (the discovery script's latest, else the plan's)."""
        return list(self._discovered) if self._discovered is not None else list(self.plan.hosts)

    def _ask_to_leave(self, ranks: Sequence[int]) -> bool:
        try:
            return bool(door.request_leave(self.record.scheduler, self.record.id, list(ranks),
                                             key_file=self.record.key_file, timeout=STATUS_TIMEOUT * 4))
        except Exception as exc:  # noqa: BLE001 - no answer: nothing changed
            ui.warn(f"could not ask workers {', '.join(map(str, ranks))} to leave: {exc}")
            return False

    def _join(self, rules: Supervision, joiner: Joiner, world_size: int, local_world_size: int) -> None:
        """Start worker ``joiner.rank`` on its host (prepared first if nothing of the job runs
        there yet; ``local_world_size``: the workers there once the change is done) and follow it."""
        host = self.hosts[joiner.host]
        key_file = None
        if host.label not in {h.label for h in self.plan.busy_hosts}:
            key_file = prepare_host(host, self.backend, self.record, self.settings.run_dir, self.settings.sync,
                                    self.settings.check_modules, self.plan.base_env)
        spec = joiner_spec(self.plan, joiner.rank, host, joiner.local_rank, world_size, local_world_size, key_file)
        self.plan = with_worker(self.plan, spec, host)
        if self.plan.gpus_per_worker and host.label in self.plan.gpus:
            self.plan = with_gpus(self.plan, {host.label: self.plan.gpus[host.label]})
            spec = next(p for p in self.plan.procs if p.name == spec.name)
        rec = self.record.join(spec.name, joiner.rank, host.label, host.address,
                               str(records.log_dir(self.record.id) / f"{spec.name}.log"), time.time())
        try:
            offset = os.path.getsize(rec.log)   # a rank taken again: its log goes on
        except OSError:
            offset = 0
        started = self.backend.start(host, [spec], self.settings.run_dir)[0]
        rec.started(started.pid, started.run_log, started.rc_file)
        rules.add_worker(spec.name)
        self._follow(rec, offset)
        self._save()

    def _left(self, rec: ProcRecord) -> None:
        self.record.left(rec, time.time())
        self._save()
        ui.info(f"{rec.name} left the job (asked to by mxdist scale)")

    def _lose(self, rec: ProcRecord, status: ExitStatus, rules: Supervision) -> None:
        """``rec`` failed for good in an elastic job that goes on: recorded, told to the
        scheduler (it completes the open rounds over the others), one warning line."""
        why = self._why_lost.pop(rec.name, None) or status.describe()
        self.record.lost(rec, why, time.time())
        self._save()
        try:
            told = door.report_lost(self.record.scheduler, self.record.id, rec.rank or 0,
                                      key_file=self.record.key_file, timeout=STATUS_TIMEOUT * 4, reason=why)
        except Exception:  # noqa: BLE001 - the scheduler notices the loss by heartbeats too
            told = False
        live = rules.live_workers
        ui.warn(f"{rec.name} on {rec.host} {why}, no restart left: lost; the job goes on with {live} "
                f"worker{'s' if live != 1 else ''} (--min-workers {rules.minimum})"
                + ("" if told else " (the scheduler did not acknowledge; it notices by heartbeats)"))

    def _on_discovery(self, outcome: list[Host] | DiscoveryError) -> None:
        """The discovery poller's thread: hand the outcome to the supervisor's loop."""
        self._discovery_outcomes.put(outcome)
        self.events.put(None)

    def _apply_discovery(self, rules: Supervision) -> None:
        """The discovery script's latest answers: new hosts add free slots; the workers of a host
        that vanished are stopped and lost; a failing script is a warning (once per message)."""
        while True:
            try:
                outcome = self._discovery_outcomes.get_nowait()
            except queue.Empty:
                return
            if isinstance(outcome, DiscoveryError):
                if str(outcome) != self._discovery_problem:
                    self._discovery_problem = str(outcome)
                    ui.warn(f"host discovery: {outcome}; the hosts stay as they were")
                continue
            self._discovery_problem = None
            resolve = resolver(self.backend)
            try:
                now = [resolve.resolve(h) if resolve else h for h in outcome]
            except BackendError as exc:
                ui.warn(f"host discovery: {exc}; the hosts stay as they were")
                continue
            changes = discovery_changes(self._slot_hosts(), now)
            if changes.empty:
                continue
            self._discovered = now
            for host in now:
                self.hosts.setdefault(host.label, host)
            self.record.discovered([asdict(h) for h in {**{h.label: h for h in self.plan.hosts},
                                                        **{h.label: h for h in now}}.values()])
            self._save()
            for host in changes.added:
                ui.info(f"host discovery: {host.label} added ({host.slots} slot{'s' if host.slots != 1 else ''})")
            for host in changes.resized:
                ui.info(f"host discovery: {host.label} has {host.slots} slot{'s' if host.slots != 1 else ''}")
            for host in changes.removed:
                self._host_gone(rules, host)

    def _host_gone(self, rules: Supervision, host: Host) -> None:
        """``host`` left the discovered hosts: its workers are stopped (in the background) and,
        once they ended, lost."""
        names = [n for n in (rules.running & rules.workers) - rules.leaving
                 if self.record.proc(n).host == host.label]
        many = len(names) > 1
        ui.warn(f"host discovery: {host.label} is gone" + (f": its worker{'s' if many else ''} {', '.join(names)} "
                                                          f"{'are' if many else 'is'} lost" if names else ""))
        procs = [self.record.proc(n) for n in names]
        for name in names:
            rules.leave(name)      # never restarted there
            self._why_lost[name] = f"stopped: its host {host.label} left the discovered hosts"
        if procs:
            target = self.hosts[host.label]
            threading.Thread(target=self.backend.stop, args=(target, procs, self.settings.grace),
                             name=f"stop-{host.label}", daemon=True).start()

    def _exited(self, rec: ProcRecord, status: ExitStatus) -> None:
        rec.exited(status.code, time.time())
        self._save()

    def _psnode_started(self) -> bool | None:
        """Did the job use psnode?  The scheduler exited 0 (it ended a psnode job), or it says so."""
        sched = next((p for p in self.record.procs if p.role == Role.SCHEDULER.value), None)
        if sched is None or self.plan.num_servers == 0:
            return False
        if sched.state is ProcState.EXITED:
            return True
        try:
            answer = door.status(self.record.scheduler, self.record.id, key_file=self.record.key_file,
                                    timeout=STATUS_TIMEOUT)
        except Exception:  # noqa: BLE001 - no answer: nothing to wait for
            return None
        return answer.started

    def _failure(self, rec: ProcRecord, status: ExitStatus) -> Failure:
        """How ``rec`` failed, for the crash-loop rule: its status, the last exception its log
        shows since it started, and how long it ran."""
        since, offset = self._since.get(rec.name, (time.monotonic(), 0))
        try:
            size = os.path.getsize(rec.log) - offset
        except OSError:
            size = 0
        exception = last_exception(rec.log, min(size, 16384)) if size > 0 else None
        return Failure(status.code, exception, time.monotonic() - since)

    @property
    def _psnode_job(self) -> bool:
        """Is the scheduler psnode's (it rebuilds the job when restarted)?"""
        return self.plan.engine.live_status and self.plan.num_servers > 0

    def _announce_restart(self, rec: ProcRecord, status: ExitStatus, delay: float) -> None:
        when = f" in {delay:g} s (it failed within {QUICK:g} s of its start)" if delay else ""
        limit = self._rules.limit(rec.name) if self._rules is not None else self.plan.node.max_restarts
        if rec.role == Role.SCHEDULER.value:
            ui.warn(f"{rec.name} on {rec.host} {status.describe()}: restarting it at {self.record.scheduler}{when}; "
                    f"the nodes rejoin it (restart {rec.restarts + 1} of {limit})")
            return
        ui.warn(f"{rec.name} on {rec.host} {status.describe()}: restarting it with rank {rec.rank}{when} "
                f"(restart {rec.restarts + 1} of {limit})")

    def _answers(self, host: Host) -> bool:
        """Does ``host`` answer (the backend's check, at most :data:`REACH_TIMEOUT` s)?  One that
        does not is lost for the rest of the job: said once, never started on again."""
        if host.label in self._lost_hosts:
            return False
        try:
            self.backend.reachable(host, REACH_TIMEOUT)
            return True
        except Exception as exc:  # noqa: BLE001 - any failure to reach it is the same answer
            self._lost_hosts[host.label] = time.time()
            said = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            ui.warn(f"host {host.label} does not answer ({said}): lost; nothing of the job starts there again")
            return False

    def _relocate(self, rec: ProcRecord, count: int) -> bool:
        """Restart worker ``rec``, whose host does not answer, with its rank in a free slot of a
        host that does (:func:`mxdist.elastic.rules.new_home`); False when there is none or it failed."""
        assert self._rules is not None
        old = rec.host
        try:
            home = new_home(rec.rank or 0, self._slot_hosts(), self._live(self._rules), self._lost_hosts)
        except ElasticError as exc:
            ui.warn(f"cannot restart {rec.name}: {old} does not answer and {exc}")
            return False
        host = self.hosts[home.host]
        planned = next(p for p in self.plan.procs if p.name == rec.name)
        world = int(planned.env.get("WORLD_SIZE", self.plan.num_workers))
        here = 1 + sum(1 for w in self._live(self._rules) if w.host == host.label and w.rank != rec.rank)
        try:
            key_file = None
            if host.label not in {h.label for h in self.plan.busy_hosts}:
                key_file = prepare_host(host, self.backend, self.record, self.settings.run_dir, self.settings.sync,
                                        self.settings.check_modules, self.plan.base_env)
            spec = restarted(joiner_spec(self.plan, rec.rank or 0, host, home.local_rank, world, here, key_file), count)
            self.plan = with_worker(self.plan, spec, host)
            started = self.backend.start(host, [spec], self.settings.run_dir)[0]
        except Exception as exc:  # noqa: BLE001 - reported, then the failure counts as final
            ui.warn(f"could not restart {rec.name} on {host.label} (its host {old} does not answer): {exc}")
            return False
        self.record.moved(rec, host.label, host.address, f"{old} did not answer", time.time())
        rec.restarted(started.pid, started.run_log, started.rc_file)
        ui.warn(f"{rec.name} restarts with rank {rec.rank} on {host.label} (local rank {home.local_rank}): "
                f"its host {old} does not answer")
        self._follow(rec, started.log_offset)   # (its log there may hold another run's output: a shared disk)
        self._save()
        return True

    def _restart(self, rec: ProcRecord) -> bool:
        """Start ``rec`` again (same host, rank, env + PSNODE_RESTART_COUNT); False if that failed.
        One that ended without an exit status (its reaper killed) may still run: its process
        group is stopped first.  When its host does not answer (:meth:`_answers`), a worker moves
        (:meth:`_relocate`); a server or the scheduler cannot (their state lives there)."""
        count = rec.restarts + 1
        if rec.state is ProcState.LOST and not self._answers(self.hosts[rec.host]):
            if rec.role == Role.WORKER.value:
                return self._relocate(rec, count)
            ui.warn(f"cannot restart {rec.name}: its host {rec.host} does not answer, and a {rec.role} "
                    f"restarts only on its own host")
            return False
        if rec.state is ProcState.LOST and rec.pid:
            with contextlib.suppress(Exception):
                self.backend.stop(self.hosts[rec.host], [rec], 0.0)
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
        rec.restarted(started.pid, started.run_log, started.rc_file)
        self._follow(rec, offset)
        self._save()
        return True

    # -- the end --------------------------------------------------------------------------------

    def _conclude(self, state: JobState, code: int, stopped_by: str | None = None,
                  first_seen: str | None = None, headline: str | None = None,
                  grace: float | None = None, summary: str | None = None, note: str | None = None) -> int:
        """Stop, collect, name the root cause (``note``: what the supervisor adds to it, e.g. a
        crash loop), clean up on every host; write the final state once."""
        if stopped_by:
            ui.warn(f"{stopped_by}: stopping the job on every host")
        live = [p for p in self.record.procs if p.pid and p.state is ProcState.RUNNING]
        self._stopped = {p.name for p in live}
        report = teardown.stop_everywhere(self.backend, self.hosts, live,
                                          self.settings.grace if grace is None else grace)
        for p in live:
            p.stopped(verified=p.host not in report.unverified)
        if any(report.left.values()) or report.unverified:
            ui.stop_report(report.left, report.unverified)
        report.unverified.update(report.survivors())
        self._join_followers(10.0, report.unverified)
        self._write_timeline(report.unverified)
        cause: RootCause | None = None
        if state is JobState.FAILED and headline is None:
            cause = self._root_cause(first_seen, report.unverified)
            if cause is not None and note:
                cause = replace(cause, headline=f"{cause.headline} ({note})")
        labels = [h.label for h in self.plan.busy_hosts] if self._writes.begun else []
        for label, when in self._lost_hosts.items():   # never waited on again: its files stay there
            report.unverified.setdefault(label, f"lost at {time.strftime('%H:%M:%S', time.localtime(when))} "
                                                f"(it did not answer); the job's files there were not removed")
        failed_cleanup = teardown.cleanup_everywhere(self.backend, self.hosts, self.record.id,
                                                     self.settings.run_dir, labels, report.unverified)
        records.discard_key(self.record.id)
        self.record.finish(JobOutcome(state, code, {**report.unverified, **failed_cleanup}, stopped_by, cause,
                                  headline))
        self._save()
        self._report(cause, summary)
        return code

    def _write_timeline(self, unverified: dict[str, str]) -> None:
        """``--timeline``: merge the processes' event files into the job's trace (psnode.launcher.merge_timeline);
        hosts that do not share this machine's files send theirs through the backend first
        (``unverified``: hosts not to ask)."""
        path, directory = self.record.timeline, self.settings.timeline_dir
        if not path or not directory:
            return
        with tempfile.TemporaryDirectory(prefix="mxdist-timeline-") as fetched:
            if self.settings.timeline_local:
                files = sorted(Path(directory).glob(f"*{door.TIMELINE_SUFFIX}"))
            else:
                got = self._fetch_timeline(directory, Path(fetched), unverified)
                if got is None:
                    return
                files = got
            if not files:
                if any(p.pid for p in self.record.procs):
                    ui.warn(f"--timeline: no process recorded events in {directory}; no trace written")
                return
            try:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                Path(path).write_text(json.dumps(door.merge_timeline(files)))
            except OSError as exc:
                ui.warn(f"--timeline: could not write {path}: {exc}")
                return
        if self.settings.timeline_local:
            for f in files:
                with contextlib.suppress(OSError):
                    f.unlink()
            with contextlib.suppress(OSError):
                Path(directory).rmdir()
        ui.info(f"timeline: {path} (open it in https://ui.perfetto.dev or chrome://tracing)")

    def _fetch_timeline(self, directory: str, into: Path, unverified: dict[str, str]) -> list[Path] | None:
        """Each busy host's event files in ``directory``, copied into ``into`` as
        ``<host>-<file>`` (a file that several hosts sharing a file system all read, once);
        None when the backend cannot read its hosts' files."""
        fetch = fetcher(self.backend)
        if fetch is None:
            ui.warn(f"--timeline: the processes' events stay on their hosts in {directory} "
                    f"({self.backend.name} hosts do not share this machine's files); no trace written")
            return None
        targets = [self.hosts[h.label] for h in self.plan.busy_hosts
                   if h.label in self.hosts and h.label not in unverified]
        results = run_per_host(targets, lambda h: fetch.fetch(h, directory, door.TIMELINE_SUFFIX, TIMELINE_LIMIT),
                               timeout=TIMELINE_FETCH)
        files = []
        seen: set[tuple[str, str]] = set()
        for label, got in sorted(results.items()):
            if isinstance(got, Exception):
                ui.warn(f"--timeline: could not read the events on {label} in {directory}: {got}; "
                        "its processes are left out of the trace")
                continue
            if got.left:
                ui.warn(f"--timeline: left out of the trace on {label}: {', '.join(got.left)} (more than "
                        f"{TIMELINE_LIMIT >> 20} MiB in all, or unreadable)")
            for name, text in got.files.items():
                if (name, text) in seen:   # (hosts sharing a file system: one file, read from each)
                    continue
                seen.add((name, text))
                safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in label)
                target = into / f"{safe}-{os.path.basename(name)}"
                target.write_text(text)
                files.append(target)
        for label in sorted(unverified):
            ui.warn(f"--timeline: {label} was not asked for its events ({unverified[label]})")
        return files

    def _root_cause(self, first_seen: str | None, unverified: dict[str, str]) -> RootCause | None:
        started = [p for p in self.record.procs if p.pid]
        evidence, skipped = teardown.collect_everywhere(self.backend, self.hosts, started,
                                                        self.settings.run_dir, unverified)
        outcomes = teardown.outcomes(self.record, evidence, self._stopped, skipped)
        return decide(outcomes, first_seen)

    def _report(self, cause: RootCause | None, summary: str | None = None) -> None:
        rec = self.record
        detail = ""
        if rec.state is JobState.FAILED:
            headline = cause.headline if cause else (rec.root_cause.headline if rec.root_cause else "failed")
            detail = summary or headline
            if cause is not None:
                proc = rec.proc(cause.name) if cause.name else None
                notes = [f"{h}: not verified: {why} (mxdist status / stop check again)"
                         for h, why in rec.unverified.items()]
                how = headline + (f" (after {proc.restarts} restart{'s' if proc.restarts > 1 else ''})"
                                  if proc and proc.restarts else "")
                shown = proc is not None and self.printer.shows(proc.role, proc.rank)  # its output, streamed above
                source = (cause.source, proc.host if proc else "its host", cause.time) if cause.source else None
                ui.failure_panel(how, cause.consequences, proc.log if proc else None,
                                 None if shown or proc is None else _tail(proc.log), notes, source)
        elif rec.state is JobState.STOPPED:
            detail = rec.stopped_by or ""
        if rec.elastic is not None:
            counts = ", ".join(f"{rec.count(c)} {c.value}" for c in (Change.JOINED, Change.LEFT, Change.LOST))
            detail = f"{detail} ({counts})" if detail else f"workers: {counts}"
        moves = [f"worker {c.rank} moved to {c.host} ({c.why})" for c in rec.changes if c.change is Change.MOVED]
        if moves:
            detail = f"{detail}; {', '.join(moves)}" if detail else ", ".join(moves)
        if self._slowest and rec.state is not JobState.STOPPED:
            detail = f"{detail}; {self._slowest}" if detail else self._slowest
        sched = next((p for p in rec.procs if p.role == Role.SCHEDULER.value), None)
        if sched is not None and sched.restarts:
            times = f"scheduler restarted {sched.restarts} time{'s' if sched.restarts > 1 else ''}"
            detail = f"{detail} ({times})" if detail else times
        ui.closing_line(rec.id, rec.state.value, rec.duration, detail)

    def _join_followers(self, timeout: float, skip: dict[str, str]) -> None:
        """Let the output threads drain the last lines (a remote log is copied before its run
        directory is removed); never wait on a host that did not answer."""
        deadline = time.monotonic() + timeout
        for host, t in self.threads:
            if host not in skip:
                t.join(max(0.0, deadline - time.monotonic()))

    # -- requests to end --------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._signal is None:
            self._signal = signum
        self.events.put(None)       # the loop acts at once (SimpleQueue.put is safe in a handler)

    def _end_request(self) -> EndRequest | None:
        """A signal received, or ``mxdist stop``'s request file: how the job is to end."""
        if self._signal is not None:
            code, why = SIGNAL_EXIT[signal.Signals(self._signal)]
            return EndRequest(code, why)
        path = records.stop_request_path(self.record.id)
        if path.exists():
            return EndRequest(EXIT_STOPPED, "mxdist stop", records.StopRequest.read(path).grace)
        return None

    def _save(self) -> None:
        records.save(self.record)
        for callback in self._on_save:
            callback()


def _tail(path: str, lines: int = 20) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    return text.splitlines()[-lines:]


def new_record(plan: Plan, backend: Backend, command: Sequence[str], workdir: str, log_dir: Path,
               security: Mode | None = None, discovery: str | None = None) -> JobRecord:
    """The initial job record of a plan (no pids yet), of a job in ``security`` mode; elastic
    when its bounds say so or its hosts come from a ``discovery`` script."""
    procs = [ProcRecord(name=p.name, role=p.role.value, rank=p.rank, host=p.host.label,
                        address=p.host.address, log=str(log_dir / f"{p.name}.log"))
             for p in plan.procs]
    b = plan.bounds
    elastic = Elastic(b.minimum, b.maximum, b.initial, discovery=discovery) \
        if b is not None and (b.elastic or discovery) else None
    return JobRecord(id=plan.job_id, command=list(command), backend=backend.name,
                     scheduler=plan.scheduler_address, workdir=workdir,
                     hosts=[asdict(h) for h in plan.hosts], options=backend.options(), procs=procs,
                     security=security.value if security is not None else "", engine=plan.engine.name,
                     elastic=elastic)


__all__ = ["EXIT_FAILED", "EXIT_HANGUP", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_PREFLIGHT", "EXIT_STOPPED",
           "LaunchSettings", "Supervisor", "describe_code", "new_record"]
