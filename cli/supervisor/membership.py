"""An elastic job's membership while it runs: the supervisor's collaborator for every change of who works where.

It answers ``mxdist scale`` (:meth:`JobMembers.serve_scale_requests`: workers leave on the
scheduler's acknowledgement, joiners start on free slots, :func:`mxdist.elastic.rules.plan_scale`
decides), applies the discovery script's answers (:meth:`JobMembers.apply_discovery`: new hosts
add slots, the workers of a vanished host are stopped and lost), records a worker that left or is
lost for good (:meth:`JobMembers.left`, :meth:`JobMembers.lose`), knows which hosts do not answer
(:meth:`JobMembers.answers`: a host lost once is never used again) and moves a lost host's worker
to a free slot elsewhere (:meth:`JobMembers.relocate`), and a lost host's server, whose state has
replicas (``--replicas``), to the host that answers with the fewest of the job's servers
(:meth:`JobMembers.move_server`).  After a failover it starts a new standby scheduler on another
host that answers (:meth:`JobMembers.start_standby`), so the job survives one host loss after
another.

It acts on the running job through :class:`Running` (the supervisor: its plan, hosts, record,
backend and settings; following a started process, saving the record, waking its loop) and never
ends the job: what to do with an exit stays the supervisor's (:mod:`mxdist.job.lifecycle`).
"""
from __future__ import annotations

import contextlib
import json
import os
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Protocol

from psnode import launcher as door
from psnode.config import Role
from psnode.files import write_atomic

from .. import ui
from ..backends.base import Backend, BackendError, ExitStatus, Started, resolver
from ..elastic.discovery import DiscoveryError, DiscoveryPoller
from ..elastic.rules import Joiner, Live, ScaleAnswer, discovery_changes, new_home, plan_scale
from ..job import records
from ..job.lifecycle import Supervision
from ..job.records import JobRecord, ProcRecord, ProcState
from ..planning.bounds import ElasticError
from ..planning.hosts import Host
from ..planning.options import LaunchSettings
from ..planning.plan import (
    Plan,
    moved_server,
    next_standby,
    restarted,
    with_gpus,
    with_proc,
    with_schedulers,
    with_standby_scheduler,
    with_worker,
)
from ..planning.plan import joiner as joiner_spec
from ..planning.servers import server_home
from .preflight import prepare_host

ASK_TIMEOUT = 2.0        # seconds the scheduler is given to acknowledge a leave request or a lost worker
REACH_TIMEOUT = 10.0     # seconds a host is given to answer before a process that vanished there restarts


class Running(Protocol):
    """What membership changes act on: the supervisor of the running job."""

    plan: Plan
    hosts: dict[str, Host]
    record: JobRecord
    backend: Backend
    settings: LaunchSettings

    def follow(self, rec: ProcRecord, offset: int = 0) -> None: ...

    def save(self) -> None: ...

    def wake(self) -> None: ...


class JobMembers:
    """Who is in one running job and where: its elastic membership and its lost hosts (module docstring)."""

    def __init__(self, job: Running) -> None:
        self.job = job
        self.rules: Supervision | None = None     # the supervision rules, once the job runs (watch)
        self.lost_hosts: dict[str, float] = {}    # hosts that did not answer (label -> when): never used again
        # the discovery script's latest hosts (None: the plan's), its outcomes as the poller hands
        # them over, the last problem it warned of; why a stopped worker is lost
        self._poller: DiscoveryPoller | None = None
        self._discovered: list[Host] | None = None
        self._discovery_outcomes: queue.SimpleQueue[list[Host] | DiscoveryError] = queue.SimpleQueue()
        self._discovery_problem: str | None = None
        self._why_lost: dict[str, str] = {}

    def watch(self, rules: Supervision) -> None:
        """The job runs under ``rules``: poll its discovery script, if it has one."""
        self.rules = rules
        elastic = self.job.record.elastic
        if elastic is not None and elastic.discovery:
            workdir = self.job.record.workdir
            here = workdir if workdir and os.path.isdir(workdir) else None   # (--sync: a remote workdir)
            self._poller = DiscoveryPoller(elastic.discovery, self._on_discovery, cwd=here)
            self._poller.start()

    def _prepare(self, host: Host) -> str | None:
        """Prepare ``host`` for a worker if nothing of the job runs there yet; its key file."""
        if host.label in {h.label for h in self.job.plan.busy_hosts}:
            return None
        s = self.job.settings
        return prepare_host(host, self.job.backend, self.job.record, s.run_dir, s.sync, s.check_modules,
                            self.job.plan.base_env)

    def stop(self) -> None:
        """The job ended: stop polling the discovery script."""
        if self._poller is not None:
            self._poller.stop()

    def _live(self, rules: Supervision) -> list[Live]:
        """The workers that run and stay (not asked to leave), with their hosts and local ranks."""
        specs = {p.name: p for p in self.job.plan.of_role(Role.WORKER)}
        names = (rules.running & rules.workers) - rules.leaving
        return sorted((Live(specs[n].rank or 0, specs[n].host.label, specs[n].local_rank) for n in names),
                      key=lambda w: w.rank)

    def serve_scale_requests(self, rules: Supervision) -> None:
        """Answer every ``mxdist scale`` request waiting (module docstring of :mod:`mxdist.job.records`)."""
        for path in records.scale_requests(self.job.record.id):
            try:
                asked = records.ScaleRequest.from_json(json.loads(path.read_text()))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                answer = ScaleAnswer(self.job.record.id, error=f"unreadable request {path.name}: {exc}", refused=True)
            else:
                answer = self._scale(rules, asked.target, asked.dry_run)
            with contextlib.suppress(OSError):
                write_atomic(records.scale_answer_path(path), json.dumps(answer.to_dict()))
                path.unlink()

    def _scale(self, rules: Supervision, target: int, dry_run: bool) -> ScaleAnswer:
        """Take the job to ``target`` workers (``dry_run``: only say how)."""
        job = self.job.record.id
        if self.job.plan.bounds is None or self.job.record.elastic is None:
            return ScaleAnswer(job, error=f"job {job} was launched without --min-workers/--max-workers: "
                                          f"it keeps its {self.job.plan.num_workers} workers", refused=True)
        if rules.winding_down:
            return ScaleAnswer(job, error=f"job {job} is ending (its workers finished)")
        try:
            change = plan_scale(target, self.job.plan.bounds, self._slot_hosts(), self._live(rules))
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
            self.job.record.leaving(change.leavers)
        started: list[Joiner] = []
        after = change.workers_after(self._live(rules))
        for joiner in change.joiners:
            try:
                self._join(rules, joiner, target, after[joiner.host])
            except Exception as exc:  # noqa: BLE001 - reported to mxdist scale; the job goes on
                self.job.record.scale_to(len(self._live(rules)))
                self.job.save()
                done = f"; started {', '.join(str(j.rank) for j in started)}" if started else ""
                return ScaleAnswer(job, error=f"could not start worker {joiner.rank} on {joiner.host}: {exc}{done}")
            started.append(joiner)
        self.job.record.scale_to(target)
        self.job.save()
        for line in ScaleAnswer(job, change).lines():
            ui.info(line)
        return ScaleAnswer(job, change)

    def _slot_hosts(self) -> list[Host]:
        """The hosts offering worker slots now (the discovery script's latest, else the plan's)."""
        return list(self._discovered) if self._discovered is not None else list(self.job.plan.hosts)

    def _ask_to_leave(self, ranks: Sequence[int]) -> bool:
        try:
            return bool(door.request_leave(self.job.record.scheduler, self.job.record.id, list(ranks),
                                             key_file=self.job.record.key_file, timeout=ASK_TIMEOUT))
        except Exception as exc:  # noqa: BLE001 - no answer: nothing changed
            ui.warn(f"could not ask workers {', '.join(map(str, ranks))} to leave: {exc}")
            return False

    def _join(self, rules: Supervision, joiner: Joiner, world_size: int, local_world_size: int) -> None:
        """Start worker ``joiner.rank`` on its host (prepared first if nothing of the job runs
        there yet; ``local_world_size``: the workers there once the change is done) and follow it."""
        host = self.job.hosts[joiner.host]
        key_file = self._prepare(host)
        spec = joiner_spec(self.job.plan, joiner.rank, host, joiner.local_rank, world_size, local_world_size, key_file)
        self.job.plan = with_worker(self.job.plan, spec, host)
        if self.job.plan.gpus_per_worker and host.label in self.job.plan.gpus:
            self.job.plan = with_gpus(self.job.plan, {host.label: self.job.plan.gpus[host.label]})
            spec = next(p for p in self.job.plan.procs if p.name == spec.name)
        rec = self.job.record.join(spec.name, joiner.rank, host.label, host.address,
                               str(records.log_dir(self.job.record.id) / f"{spec.name}.log"), time.time())
        try:
            offset = os.path.getsize(rec.log)   # a rank taken again: its log goes on
        except OSError:
            offset = 0
        started = self.job.backend.start(host, [spec], self.job.settings.run_dir)[0]
        rec.started(started.pid, started.run_log, started.rc_file)
        rules.add_worker(spec.name)
        self.job.follow(rec, offset)
        self.job.save()

    def left(self, rec: ProcRecord) -> None:
        self.job.record.left(rec, time.time())
        self.job.save()
        ui.info(f"{rec.name} left the job (asked to by mxdist scale)")

    def lose(self, rec: ProcRecord, status: ExitStatus, rules: Supervision) -> None:
        """``rec`` failed for good in an elastic job that goes on: recorded, told to the
        scheduler (it completes the open rounds over the others), one warning line."""
        why = self._why_lost.pop(rec.name, None) or status.describe()
        self.job.record.lost(rec, why, time.time())
        self.job.save()
        try:
            told = door.report_lost(self.job.record.scheduler, self.job.record.id, rec.rank or 0,
                                      key_file=self.job.record.key_file, timeout=ASK_TIMEOUT, reason=why)
        except Exception:  # noqa: BLE001 - the scheduler notices the loss by heartbeats too
            told = False
        live = rules.live_workers
        ui.warn(f"{rec.name} on {rec.host} {why}, no restart left: lost; the job goes on with {live} "
                f"worker{'s' if live != 1 else ''} (--min-workers {rules.minimum})"
                + ("" if told else " (the scheduler did not acknowledge; it notices by heartbeats)"))

    def _on_discovery(self, outcome: list[Host] | DiscoveryError) -> None:
        """The discovery poller's thread: hand the outcome to the supervisor's loop."""
        self._discovery_outcomes.put(outcome)
        self.job.wake()

    def apply_discovery(self, rules: Supervision) -> None:
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
            resolve = resolver(self.job.backend)
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
                self.job.hosts.setdefault(host.label, host)
            self.job.record.discovered([asdict(h) for h in {**{h.label: h for h in self.job.plan.hosts},
                                                        **{h.label: h for h in now}}.values()])
            self.job.save()
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
                 if self.job.record.proc(n).host == host.label]
        many = len(names) > 1
        ui.warn(f"host discovery: {host.label} is gone" + (f": its worker{'s' if many else ''} {', '.join(names)} "
                                                          f"{'are' if many else 'is'} lost" if names else ""))
        procs = [self.job.record.proc(n) for n in names]
        for name in names:
            rules.leave(name)      # never restarted there
            self._why_lost[name] = f"stopped: its host {host.label} left the discovered hosts"
        if procs:
            target = self.job.hosts[host.label]
            threading.Thread(target=self.job.backend.stop, args=(target, procs, self.job.settings.grace),
                             name=f"stop-{host.label}", daemon=True).start()

    def answers(self, host: Host, timeout: float = REACH_TIMEOUT) -> bool:
        """Does ``host`` answer (the backend's check, at most ``timeout`` s)?  One that does not
        is lost for the rest of the job: said once, never started on again."""
        if host.label in self.lost_hosts:
            return False
        try:
            self.job.backend.reachable(host, timeout)
            return True
        except Exception as exc:  # noqa: BLE001 - any failure to reach it is the same answer
            self.lost_hosts[host.label] = time.time()
            if self.job.record.scheduler.rpartition(":")[0].strip("[]") == host.address:   # the scheduler's
                self.job.plan = with_standby_scheduler(self.job.plan)   # (what starts now goes there)
            said = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            ui.warn(f"host {host.label} does not answer ({said}): lost; nothing of the job starts there again")
            return False

    def relocate(self, rec: ProcRecord, count: int) -> bool:
        """Restart worker ``rec``, whose host does not answer, with its rank in a free slot of a
        host that does (:func:`mxdist.elastic.rules.new_home`); False when there is none or it failed."""
        assert self.rules is not None
        old = rec.host
        try:
            home = new_home(rec.rank or 0, self._slot_hosts(), self._live(self.rules), self.lost_hosts)
        except ElasticError as exc:
            ui.warn(f"cannot restart {rec.name}: {old} does not answer and {exc}")
            self._why_lost[rec.name] = f"its host {old} did not answer, and no host that answers had a free slot"
            return False
        host = self.job.hosts[home.host]
        planned = next(p for p in self.job.plan.procs if p.name == rec.name)
        world = int(planned.env.get("WORLD_SIZE", self.job.plan.num_workers))
        here = 1 + sum(1 for w in self._live(self.rules) if w.host == host.label and w.rank != rec.rank)
        try:
            key_file = self._prepare(host)
            spec = restarted(joiner_spec(self.job.plan, rec.rank or 0, host, home.local_rank, world, here, key_file),
                             count)
            self.job.plan = with_worker(self.job.plan, spec, host)
            started = self.job.backend.start(host, [spec], self.job.settings.run_dir)[0]
        except Exception as exc:  # noqa: BLE001 - reported, then the failure counts as final
            ui.warn(f"could not restart {rec.name} on {host.label} (its host {old} does not answer): {exc}")
            return False
        self._moved(rec, host, old, started, f"{rec.name} restarts with rank {rec.rank} on {host.label} (local rank "
                                             f"{home.local_rank}): its host {old} does not answer")
        return True

    def start_standby(self, primary: str, avoid: set[str]) -> ProcRecord | None:
        """A standby took the job over at ``primary``: start a new standby scheduler for it on a
        host that answers and is not in ``avoid`` (the hosts of the schedulers lost and of
        ``primary``), the job's busy hosts first, in host order; its record, or None (said) when
        no host serves."""
        assert self.rules is not None
        busy = {h.label for h in self.job.plan.busy_hosts}
        hosts = sorted((h for h in self.job.hosts.values() if h.label not in avoid),
                       key=lambda h: h.label not in busy)
        rank = 1 + max(p.rank or 0 for p in self.job.record.procs if p.role == Role.SCHEDULER.value)
        for host in hosts:
            if not self.answers(host):
                continue
            try:
                key_file = self._prepare(host)
                spec = next_standby(self.job.plan, host, rank, primary, key_file)
                started = self.job.backend.start(host, [spec], self.job.settings.run_dir)[0]
            except Exception as exc:  # noqa: BLE001 - said; the next host is tried
                ui.warn(f"could not start a new standby scheduler on {host.label}: {exc}")
                continue
            address = spec.env["PSNODE_SCHEDULER"]
            self.job.plan = with_schedulers(with_proc(self.job.plan, spec), primary, address)
            rec = self.job.record.add_standby(spec.name, rank, host.label, host.address,
                                              str(records.log_dir(self.job.record.id) / f"{spec.name}.log"))
            rec.started(started.pid, started.run_log, started.rc_file)
            self.rules.add_standby(spec.name)
            ui.warn(f"a new standby scheduler starts on {host.label} at {address}: the nodes go over to it "
                    "if this scheduler's host is lost too")
            self.job.follow(rec, started.log_offset)
            self.job.save()
            return rec
        ui.warn("no other host answers for a new standby scheduler: the job goes on without one")
        return None

    def _moved(self, rec: ProcRecord, host: Host, old: str, started: Started, said: str) -> None:
        """``rec`` started on ``host`` (``started``), its own host ``old`` lost: record, say, follow."""
        self.job.record.moved(rec, host.label, host.address, f"{old} did not answer", time.time())
        rec.restarted(started.pid, started.run_log, started.rc_file)
        ui.warn(said)
        self.job.follow(rec, started.log_offset)   # (its log there may hold another run's output: a shared disk)
        self.job.save()

    def move_server(self, rec: ProcRecord, count: int) -> bool:
        """Restart server ``rec``, whose host does not answer and whose state has replicas on other
        servers, with its rank on a host that answers (:func:`mxdist.planning.servers.server_home`;
        a server host of ``--server-hosts`` while one answers), where it copies its state back from
        a replica; False when there is none or it failed."""
        old = rec.host
        plan = self.job.plan
        lost = {*self.lost_hosts, old}
        live = {p.rank: p.host for p in self.job.record.procs
                if p.role == Role.SERVER.value and p.rank is not None and p.name != rec.name
                and p.state is ProcState.RUNNING and p.host not in lost}
        own = [h.label for h in plan.request.server_hosts] if plan.request is not None else []   # --server-hosts
        label = next((found for hosts in (own, list(self.job.hosts)) if hosts and (found := server_home(
            rec.rank or 0, plan.num_servers, plan.node.replicas, hosts, lost, live)) is not None), None)
        if label is None:
            ui.warn(f"cannot restart {rec.name}: its host {old} does not answer, and no other host does")
            return False
        host = self.job.hosts[label]
        try:
            key_file = self._prepare(host)
            spec = restarted(moved_server(self.job.plan, rec.name, host, key_file), count)   # (the plan now)
            started = self.job.backend.start(host, [spec], self.job.settings.run_dir)[0]
        except Exception as exc:  # noqa: BLE001 - reported, then the failure counts as final
            ui.warn(f"could not restart {rec.name} on {host.label} (its host {old} does not answer): {exc}")
            return False
        self.job.plan = with_proc(self.job.plan, spec)
        self._moved(rec, host, old, started, f"{rec.name} restarts with rank {rec.rank} on {host.label}, its state "
                                             f"copied back from a replica (--replicas {plan.node.replicas}): its "
                                             f"host {old} does not answer")
        return True
