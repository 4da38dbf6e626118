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
3. start the scheduler (and a standby), each alone, at the address it announces (a port found
   taken is replaced: :meth:`Supervisor._start_all`), then the servers and workers together
   (each stage per host in parallel); stream
   every process's output (prefixed; ``--ranks`` filters; every line saved to
   ``jobs/<id>/<name>.log``);
4. watch: process exits go through the rules of :mod:`mxdist.job.lifecycle` (restart, after a back
   off when it failed quickly; fail, a crash loop included; wind down; a killed scheduler is
   restarted at its address and rebuilds the job from the live nodes); a stop request
   (``mxdist stop``: ``jobs/<id>/stop.request``) or a signal ends it;
5. the end, always the same way (:meth:`mxdist.supervisor.conclusion.Conclusion.conclude`): stop
   what still runs on every host (TERM, ``--grace``, KILL; a host that does not answer within seconds is *not
   verified*, never waited on), collect what the processes left, name the root cause
   (:mod:`mxdist.job.rootcause`), remove the job's secrets, run files and shared-memory segments on
   every host, write the final state once, print the closing line.

The supervisor composes two collaborators, each reading the job through a small protocol of
what it needs: :class:`mxdist.supervisor.membership.JobMembers` (an elastic job's changes:
``mxdist scale``, the discovery script's hosts, workers that leave or are lost, hosts that do not
answer, a lost host's worker or replicated server moved) and :class:`mxdist.supervisor.conclusion.Conclusion` (step
5).  The supervisor keeps the loop: starting and following processes, the lifecycle rules,
restarts, requests to end.

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
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

from psnode import launcher as door
from psnode.config import Role
from psnode.files import write_atomic
from psnode.launcher import Mode

from .. import ui
from ..backends.base import (
    Backend,
    BackendError,
    ExitStatus,
    HostProblem,
    Started,
    log_exception,
    run_per_host,
)
from ..control import teardown
from ..elastic.rules import ScaleAnswer
from ..job import records
from ..job.lifecycle import QUICK, SCHEDULER_RESTARTS, Action, Failure, Supervision
from ..job.records import Elastic, JobRecord, JobState, ProcRecord, ProcState
from ..job.rootcause import describe_code
from ..planning.hosts import Host
from ..planning.options import LaunchSettings
from ..planning.plan import (
    Plan,
    ProcSpec,
    placement,
    restarted,
    with_scheduler_port,
    with_schedulers,
)
from .conclusion import Conclusion
from .hostwatch import HostWatch, late_after
from .membership import JobMembers
from .preflight import HostWrites, prepare_hosts

EXIT_OK, EXIT_FAILED, EXIT_PREFLIGHT = 0, 1, 3
EXIT_HANGUP, EXIT_INTERRUPTED, EXIT_STOPPED = 129, 130, 143
SIGNAL_EXIT = {signal.SIGHUP: (EXIT_HANGUP, "hangup (the terminal closed)"),
               signal.SIGINT: (EXIT_INTERRUPTED, "Ctrl-C"),
               signal.SIGTERM: (EXIT_STOPPED, "SIGTERM")}
POLL = 0.2
STATUS_TIMEOUT = 0.5     # asking the scheduler whether psnode started, when the workers are done
RESTART_TELL_TIMEOUT = 2.0   # seconds the scheduler is given to acknowledge a worker being restarted
SLOW_POLL = 2.0          # seconds between the supervisor's questions to the scheduler about slow workers


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
        self.writes = HostWrites()     # whether anything of the job may be on its hosts
        self._on_save: list[Callable[[], None]] = []
        self.slowest: str | None = None     # the closing line's words on the slowest worker (_ask_slowness)
        self._ended = threading.Event()
        self._rules: Supervision | None = None
        # its collaborators: an elastic job's membership changes, the end of the job
        self.membership = JobMembers(self)
        self.conclusion = Conclusion(self)

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
        self.save()
        try:
            return self._life()
        except Exception as exc:
            if not self.record.state.active:
                raise
            # a bug in the supervisor must not leave a job behind: end it like any failure
            import traceback

            traceback.print_exc()
            return self.conclusion.conclude(JobState.FAILED, EXIT_FAILED,
                                  headline=f"mxdist supervisor error: {type(exc).__name__}: {exc}")
        finally:
            for s, handler in previous.items():
                with contextlib.suppress(ValueError, TypeError):
                    signal.signal(s, handler)
            self.membership.stop()
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
            return self.conclusion.conclude(JobState.STOPPED, req.code, stopped_by=req.why)
        if problems:
            ui.preflight_panel(problems)
            cause = "; ".join(f"{p.host}: {p.reason}" for p in problems)
            hosts = ", ".join(dict.fromkeys(p.host for p in problems))
            # in the foreground nothing started and the panel said why: no job to keep a record
            # of; a detached job keeps it, for mxdist status to say why it ended
            return self.conclusion.conclude(JobState.FAILED, EXIT_PREFLIGHT, headline=f"preflight failed: {cause}",
                                            summary=f"preflight failed on {hosts} (the panel above)",
                                            forget=not self.settings.detach)
        if not self.settings.detach:
            ui.info(f"job {self.record.id}: {placement(self.plan)}; logs in {records.log_dir(self.record.id)}")
        try:
            self._start_all()
        except BackendError as exc:
            ui.error_panel("launch failed", str(exc), "see the message; the job is being stopped")
            return self.conclusion.conclude(JobState.FAILED, EXIT_PREFLIGHT, headline=f"start failed: {exc}")
        if (req := self._end_request()) is not None:
            return self.conclusion.conclude(JobState.STOPPED, req.code, stopped_by=req.why, grace=req.grace)
        return self._watch()

    # -- preflight ------------------------------------------------------------------------------

    def _preflight_unless_ended(self) -> list[HostProblem]:
        """Preflight in a thread; return early (nothing started yet) if the job is ended meanwhile.

        Ended before preflight began writing the job's files, it writes none: the end has
        nothing to remove on the hosts and does not wait for a slow one.  Ended after, its
        writes are waited for (at most :data:`mxdist.control.teardown.STEP_MARGIN`), so the end removes them."""
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
        if thread.is_alive() and self.writes.forbid():
            thread.join(teardown.STEP_MARGIN)
        if "error" in box:
            raise box["error"]
        return box.get("value", [])

    def _preflight(self) -> list[HostProblem]:
        problems, self.plan = prepare_hosts(self.plan, self.backend, self.record, self.settings.run_dir,
                                            self.settings.sync, self.settings.check_modules,
                                            self.settings.security, self.save, self.writes)
        return problems

    # -- start ----------------------------------------------------------------------------------

    def _start_all(self) -> None:
        """Start the job's processes stage by stage, each stage's hosts in parallel: each
        scheduler alone (the primary first: the standby is told its address), then the servers
        and the workers together (they wait for each other at the scheduler).  A scheduler
        announces the address it bound (its first act, before its imports) and every process
        started after it is given that address (:meth:`_moved`): a planned port found taken
        never fails the job."""
        stages = [[p.name] for p in self.plan.of_role(Role.SCHEDULER)]
        stages.append([p.name for p in self.plan.procs if p.role is not Role.SCHEDULER])
        for names in stages:
            per_host: dict[str, list[ProcSpec]] = {}
            for spec in self.plan.procs:
                if spec.name in names:
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
                    self.follow(rec)
                    if started.address:
                        self._moved(started.name, started.address)
            self.save()
            if errors:
                raise BackendError("could not start processes: " + "; ".join(errors))
        self.record.mark_running()
        self.save()

    def _moved(self, name: str, address: str) -> None:
        """The scheduler ``name`` listens at ``address``: when its planned port was taken, the
        processes started from now on (and ``mxdist status``) are given this address."""
        spec = next(p for p in self.plan.procs if p.name == name)
        planned = spec.env.get("PSNODE_SCHEDULER", "")
        port = address.rpartition(":")[2]
        if address == planned or not port.isdigit():
            return
        self.plan = with_scheduler_port(self.plan, spec.rank, int(port))
        self.record.scheduler = self.plan.scheduler_address
        ui.warn(f"{name} on {spec.host.label}: port {planned.rpartition(':')[2]} was taken, so it listens at "
                f"{address}; the job's other processes are given that address")

    def _start_on(self, per_host: dict[str, list[ProcSpec]], host: Host) -> list[Started]:
        return self.backend.start(host, per_host[host.label], self.settings.run_dir)

    def follow(self, rec: ProcRecord, offset: int = 0) -> None:
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
                self.slowest = slowest(list(answer.nodes), answer.uptime)

    def _watch(self) -> int:
        if self.plan.num_servers and self.plan.engine.name == "psnode":
            threading.Thread(target=self._ask_slowness, name="slowness", daemon=True).start()
            if self.plan.node.max_restarts > 0 and len(self.hosts) > 1:
                HostWatch(self.record, self.hosts, self.backend, self.membership.answers, self._ended,
                          late_after(self.plan)).start()
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
        self.membership.watch(rules)
        while True:
            if (req := self._end_request()) is not None:
                if rules.winding_down:
                    return self.conclusion.conclude(JobState.SUCCEEDED, EXIT_OK)
                return self.conclusion.conclude(JobState.STOPPED, req.code, stopped_by=req.why, grace=req.grace)
            self.membership.serve_scale_requests(rules)
            self.membership.apply_discovery(rules)
            for item in [x for x in later if x[0] <= time.monotonic()]:
                later.remove(item)
                if not self._restart(item[1]):
                    after = rules.restart_failed(item[1].name)
                    if after is Action.FAIL:
                        return self.conclusion.conclude(JobState.FAILED, EXIT_FAILED, first_seen=item[1].name,
                                                        note=rules.shortfall)
                    if item[1].name in rules.lost:
                        self.membership.lose(item[1], ExitStatus(item[1].exit_code), rules)
                    if after is Action.WIND_DOWN:
                        wind_down_by = time.monotonic() + self.settings.finish_grace
            try:
                event = self.events.get(timeout=POLL)
            except queue.Empty:
                event = None
            if event is None:
                if wind_down_by is not None and time.monotonic() >= wind_down_by:
                    return self.conclusion.conclude(JobState.SUCCEEDED, EXIT_OK)
                continue
            name, status = event
            rec = self.record.proc(name)
            self._exited(rec, status)
            action = rules.exited(name, status.ok, None if status.ok else self._failure(rec, status))
            if status.ok and rules.leaving and name in rules.leaving:
                self.membership.left(rec)
            elif name in rules.lost:
                self.membership.lose(rec, status, rules)
            if action is Action.RESTART:
                delay = rules.delay(name)
                self._announce_restart(rec, status, delay)
                self._tell_restarting(rec, status)
                if delay:
                    later.append((time.monotonic() + delay, rec))
                elif not self._restart(rec):
                    action = rules.restart_failed(name)
                    if name in rules.lost:
                        self.membership.lose(rec, status, rules)
            if action is Action.FAIL_OVER:
                self._fail_over(rec, status)
            elif name == rules.standby and not status.ok and not rules.winding_down:
                ui.warn(f"the standby scheduler on {rec.host} {status.describe()}: the job goes on without one")
            if action is Action.FAIL:
                return self.conclusion.conclude(JobState.FAILED, EXIT_FAILED, first_seen=name,
                                                note=rules.crash_loop or rules.shortfall)
            if action is Action.DONE:
                return self.conclusion.conclude(JobState.SUCCEEDED, EXIT_OK)
            if action is Action.WIND_DOWN:
                wait = rules.wait_for_rest(self.plan.engine.rest_ends_alone(self._psnode_started))
                wind_down_by = time.monotonic() + (self.settings.finish_grace if wait else 0.0)
            elif rules.winding_down and not status.ok:
                ui.warn(f"{rec.name} on {rec.host} {status.describe()} after the workers finished")

    def _fail_over(self, rec: ProcRecord, status: ExitStatus) -> None:
        """The scheduler ``rec`` is lost; the standby takes the job over (lifecycle rule 8): the
        nodes go over to it within the heartbeat timeout, and the launcher's questions too; a new
        standby starts on another host that answers (:meth:`JobMembers.start_standby`)."""
        assert self._rules is not None
        standby = self.record.proc(self._rules.scheduler)   # (the rules made it the scheduler)
        spec = next(p for p in self.plan.procs if p.name == standby.name)
        address = spec.env["PSNODE_SCHEDULER"]
        self.plan = with_schedulers(self.plan, address, None)   # (a node started from now on registers there)
        self.record.failed_over(standby, address, f"on {rec.host} {status.describe()}", time.time())
        self.save()
        ui.warn(f"{rec.name} on {rec.host} {status.describe()}: the standby scheduler on {standby.host} takes the "
                f"job over at {address} (the nodes go over to it within the heartbeat timeout)")
        ended = {p.host for p in self.record.procs
                 if p.role == Role.SCHEDULER.value and p.state is not ProcState.RUNNING}
        self.membership.start_standby(address, ended | {rec.host, standby.host})

    def _exited(self, rec: ProcRecord, status: ExitStatus) -> None:
        rec.exited(status.code, time.time())
        self.save()

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
        return Failure(status.code, log_exception(rec.log, offset), time.monotonic() - since)

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

    def _tell_restarting(self, rec: ProcRecord, status: ExitStatus) -> None:
        """A psnode worker died and is restarted: tell the scheduler at once, beside the loop
        (it awaits the replacement, and counts the others' waits for it from now as the
        failover's, instead of when the heartbeats stop; unanswered, the heartbeats tell it)."""
        if rec.role != Role.WORKER.value or rec.rank is None or not self._psnode_job:
            return
        record, rank, restarts, why = self.record, rec.rank, rec.restarts, status.describe()

        def tell() -> None:
            with contextlib.suppress(Exception):   # (no answer: the heartbeats tell it)
                door.report_lost(record.scheduler, record.id, rank, key_file=record.key_file,
                                 timeout=RESTART_TELL_TIMEOUT, reason=why, restarts=restarts)

        threading.Thread(target=tell, name=f"restarting-{rec.name}", daemon=True).start()

    def _restart(self, rec: ProcRecord) -> bool:
        """Start ``rec`` again (same host, rank, env + PSNODE_RESTART_COUNT); False if that failed.
        One that ended without an exit status (its reaper killed) may still run: its process
        group is stopped first.  When its host does not answer
        (:meth:`mxdist.supervisor.membership.JobMembers.answers`), a worker moves
        (:meth:`~mxdist.supervisor.membership.JobMembers.relocate`), and so does a server whose
        state has replicas (``--replicas`` 2 or more:
        :meth:`~mxdist.supervisor.membership.JobMembers.move_server`); a server without replicas
        (its checkpoint is on that host) or the scheduler (its address) cannot."""
        count = rec.restarts + 1
        if rec.state is ProcState.LOST and not self.membership.answers(self.hosts[rec.host]):
            if rec.role == Role.WORKER.value:
                return self.membership.relocate(rec, count)
            if rec.role == Role.SERVER.value and self.plan.node.replicas > 1:
                return self.membership.move_server(rec, count)
            why = ("a server without replicas restarts only on its own host, where its checkpoint is "
                   "(launch with --replicas 2 to restart it on another host from a copy of its state)"
                   if rec.role == Role.SERVER.value else
                   "the scheduler restarts only at its address (launch with --standby-scheduler for a "
                   "standby on another host to take the job over)")
            ui.warn(f"cannot restart {rec.name}: its host {rec.host} does not answer, and {why}")
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
        self.follow(rec, offset)
        self.save()
        return True

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

    def wake(self) -> None:
        """Wake the loop (a discovery outcome, the end of preflight)."""
        self.events.put(None)

    @property
    def lost_hosts(self) -> dict[str, float]:
        """Hosts that did not answer (label -> when): never used again."""
        return self.membership.lost_hosts

    def save(self) -> None:
        records.save(self.record)
        for callback in self._on_save:
            callback()


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
                     elastic=elastic, replicas=plan.node.replicas)


__all__ = ["EXIT_FAILED", "EXIT_HANGUP", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_PREFLIGHT", "EXIT_STOPPED",
           "Supervisor", "describe_code", "new_record"]
