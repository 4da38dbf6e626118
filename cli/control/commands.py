"""Recorded jobs from any shell: status, stop, scale, logs and the job list.

The backend of a job is rebuilt from its record (:func:`mxdist.backends.registry.make_backend`), so these
work whether the supervisor is attached, detached or gone.

**Who writes.**  A job's supervisor is the only writer of its record while it lives
(:mod:`mxdist.job.records`).  ``stop`` asks it (a stop request in the job's private directory) and waits
for the final state; only when the supervisor is provably gone do these commands write, through
:mod:`mxdist.control.takeover` (which also finalises the record of a job whose supervisor was lost).

Status asks the live scheduler first (:func:`psnode.launcher.status`); processes it does not
know are checked on their hosts.  A job whose engine has no status to ask (MXNet's ps-lite:
:mod:`mxdist.planning.engines`) is checked on its hosts only, and its view says so.  A final record is
shown as recorded.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial

from psnode import launcher as door
from psnode.errors import PSError
from psnode.files import write_atomic
from psnode.launcher import NodeRow

from ..backends.base import Backend, BackendStatus, Capability, describer
from ..elastic.rules import ScaleAnswer
from ..job import records
from ..job.records import Change, DamagedRecord, JobRecord, ProcRecord, ProcState
from ..planning.engines import ENGINES
from ..view import JobRow, JobView, MembershipView
from . import teardown
from .takeover import backend_for, refresh, state_from_check, stop_orphan, supervisor_gone

STOP_MARGIN = 30.0      # seconds a supervisor gets beyond --grace to end the job when asked


def key_file_of(record: JobRecord) -> str | None:
    """The launcher's copy of the job's secret, if the job has one and it still exists."""
    return record.key_file if record.key_file and os.path.exists(record.key_file) else None


# -- status -----------------------------------------------------------------------------------------

def job_status(record: JobRecord, timeout: float = 2.0, backend: Backend | None = None) -> JobView:
    """The status view of a job: a NodeRow per recorded process and the job's state, outcome
    and notes.  Its hosts are asked through ``backend`` (kept open) if given, else through a
    backend of its own."""
    record = refresh(record)
    view = JobView(id=record.id, state=record.state, scheduler=record.scheduler, backend=record.backend,
                   security=record.security or None, exit_code=record.exit_code, created=record.created,
                   ended=record.ended, duration=record.duration,
                   root_cause=record.root_cause.headline if record.root_cause else None,
                   consequences=record.consequences,
                   notes=_notes(record), engine=record.engine, membership=_membership(record, None))
    if not record.state.active:
        view.source = "as recorded at its end"
        view.nodes = [_recorded_row(p) for p in record.procs]
        view.ended_line = _ended_line(record)
        return view
    live: dict[tuple[str, int | None], NodeRow] = {}
    sched_gap: float | None = None   # the scheduler's own loop's longest gap (its STATUS answer)
    engine = ENGINES.get(record.engine)
    if engine is None or not engine.live_status:     # never send psnode's queries to another scheduler
        view.notes.append(engine.status_note if engine else f"engine {record.engine!r}: no status to ask")
    if engine is not None and engine.live_status and record.scheduler:
        try:
            answer = door.status(record.scheduler, record.id, key_file=key_file_of(record), timeout=timeout)
            live = match_nodes(record.procs, answer.nodes)
            view.membership = _membership(record, answer)
            sched_gap = answer.loop_gap
        except (PSError, OSError):
            pass
    missing = [p for p in record.procs if (p.role, p.rank) not in live and p.pid]
    checked: dict[str, NodeRow] = {}
    own = backend is None
    backend = backend or backend_for(record)
    try:
        if missing:
            states, unverified = teardown.check_everywhere(backend, teardown.hosts_of(record), missing)
            for p in missing:
                why = unverified.get(p.host)
                state = f"unknown ({why})" if why else state_from_check(states.get(p.name), p.state).value
                alive = p.name in states and states[p.name].alive
                checked[p.name] = NodeRow(role=p.role, rank=p.rank, host=p.host, state=state, pid=p.pid,
                                          restarts=p.restarts, uptime=time.time() - record.created if alive else None,
                                          source="host")
        describe = describer(backend)
        extra = describe.describe(record.procs) if describe else BackendStatus()
    finally:
        if own:
            backend.close()
    view.backend_fields, view.backend_title = extra.fields, extra.title
    where = "on this machine" if Capability.THIS_MACHINE in backend.capabilities else f"over {record.backend}"
    view.source = ("live from the scheduler" + (f"; the rest checked {where}" if checked else "")
                   if live else f"checked {where}")
    for p in record.procs:
        row = live.get((p.role, p.rank))
        if row is not None:     # (its pid: the process group mxdist started, as recorded and as stop ends it)
            row.host = p.host
            row.pid = p.pid or row.pid
        else:
            row = checked.get(p.name) or _recorded_row(p)
        row.step = extra.steps.get(p.name)
        if p.name == "scheduler" and sched_gap is not None:   # (the primary: it answered)
            row.loop_gap = sched_gap
        view.nodes.append(row)
    return view


@contextlib.contextmanager
def status_frames(job_id: str) -> Iterator[Callable[[], JobView]]:
    """``mxdist status --watch``: each call, the job's status view as it is now, its hosts asked
    through one backend kept for the whole watch (its connections and host agents: a frame costs
    a round trip per host, not a login)."""
    backend = backend_for(records.load(job_id))
    try:
        yield lambda: job_status(records.load(job_id), backend=backend)
    finally:
        backend.close()


def _membership(record: JobRecord, answer: door.StatusAnswer | None) -> MembershipView | None:
    """An elastic job's workers: live from the scheduler's ``answer`` when there is one, else
    as recorded (None: a job of fixed size)."""
    el = record.elastic
    if el is None:
        return None
    view = MembershipView(el.min_workers, el.max_workers, el.target, joined=record.count(Change.JOINED),
                          left=record.count(Change.LEFT), lost=record.count(Change.LOST), leaving=list(el.leaving))
    if answer is not None:
        view.generation, view.members = answer.generation, list(answer.members)
        view.joined, view.left, view.lost = answer.joined, answer.left, answer.lost
    return view


def _recorded_row(p: ProcRecord) -> NodeRow:
    state = p.state.value if p.pid or p.state is not ProcState.PENDING else "not started"
    return NodeRow(role=p.role, rank=p.rank, host=p.host, state=state, pid=p.pid, restarts=p.restarts,
                   source="record")


def _notes(record: JobRecord) -> list[str]:
    notes = list(record.notes)
    copies = replica_line(record)
    if copies:
        notes.append(copies)
    failovers = 0
    for c in record.changes:
        if c.change is Change.MOVED:
            at = time.strftime("%H:%M:%S", time.localtime(c.when))
            notes.append(f"{c.who} moved to {c.host} at {at}: {c.why}")
            failovers += c.role == "server"
    failovers += len(record.failovers) or record.failover is not None
    if failovers:
        notes.append(f"failovers so far: {failovers}")
    for host, why in record.unverified.items():
        notes.append(f"{host}: not verified: {why} (checked again by mxdist status / stop)")
    if record.version < records.RECORD_VERSION:
        notes.append(f"a version {record.version} record (an older mxdist): shown as far as it goes")
    return notes


def replica_line(record: JobRecord) -> str | None:
    """Where each server's state is copied (``--replicas``; None without): ``server 0 (node1) ->
    server 1 (node2)``, the holders' hosts as recorded now (a moved server's new host)."""
    servers = {p.rank: p.host for p in record.procs if p.role == "server" and p.rank is not None}
    if record.replicas < 2 or len(servers) < 2:
        return None
    n = len(servers)
    parts = []
    for r in sorted(servers):
        held = [(r + i) % n for i in range(1, min(record.replicas, n))]
        parts.append(f"server {r} ({servers[r]}) -> " + ", ".join(f"server {h} ({servers.get(h, '?')})" for h in held))
    return "replicas: " + "; ".join(parts)


def _ended_line(record: JobRecord) -> str:
    span = "" if record.duration is None else f" after {record.duration:.1f} s"
    code = "" if record.exit_code is None else f", exit code {record.exit_code}"
    by = f" ({record.stopped_by})" if record.stopped_by else ""
    return f"{record.state.value}{span}{code}{by}"


def match_nodes(procs: Sequence[ProcRecord], rows: Sequence[NodeRow]) -> dict[tuple[str, int | None], NodeRow]:
    """Scheduler rows keyed by the recorded (role, rank) they describe.

    Rows with a rank match by (role, rank); rows without one yet (a node registered before
    ranks were assigned) take the first unmatched recorded process of the same role on the
    same address.
    """
    out: dict[tuple[str, int | None], NodeRow] = {}
    known = {(p.role, p.rank) for p in procs}
    pending = []
    for row in rows:
        key = (row.role, row.rank)
        if key in known and row.rank is not None:
            out[key] = row
        else:
            pending.append(row)
    for row in pending:
        for p in procs:
            if (p.role, p.rank) not in out and p.role == row.role and p.address == row.host:
                row.rank = p.rank
                out[(p.role, p.rank)] = row
                break
    return out


def summary(record: JobRecord) -> JobRow:
    """The job's row in the job list."""
    lost = " (supervisor lost)" if record.supervisor_lost and record.state.active else ""
    return JobRow(id=record.id, state=record.state.value + lost, created=record.created,
                  duration=record.duration if record.ended else time.time() - record.created,
                  backend=record.backend, hosts=tuple(teardown.hosts_of(record)), processes=len(record.procs),
                  command=tuple(record.command), exit_code=record.exit_code,
                  root_cause=record.root_cause.headline if record.root_cause else None)


def job_list(limit: int | None = 20) -> list[JobRow]:
    """The most recent jobs (damaged records included), oldest first; lost supervisors noticed."""
    items = records.listing() if records.jobs_dir().is_dir() else []
    if limit:
        items = items[-limit:]
    rows = []
    for job_id, rec in items:
        if isinstance(rec, DamagedRecord):
            rows.append(JobRow.damaged(job_id, str(rec)))
            continue
        with contextlib.suppress(DamagedRecord, records.JobNotFound):
            rec = refresh(rec)
        rows.append(summary(rec))
    return rows


# -- stop -----------------------------------------------------------------------------------------

def stop_job(record: JobRecord, grace: float, wait: Callable[[float], None] = time.sleep) -> JobRecord:
    """End a job: ask its supervisor (and wait for its final state), or, when it is provably
    gone, stop the processes here and finalise the record as ``stopped``."""
    record = refresh(record)
    if not record.state.active:
        return record
    if not supervisor_gone(record):
        path = records.stop_request_path(record.id)
        write_atomic(path, json.dumps(records.StopRequest(grace, time.time(), os.getpid()).to_json()))
        deadline = time.monotonic() + grace + STOP_MARGIN
        while time.monotonic() < deadline:
            current = records.load(record.id)
            if not current.state.active:
                return current
            if supervisor_gone(current):
                break
            wait(0.1)
        else:
            sup = record.supervisor
            where = f"pid {sup.pid} on {sup.host}" if sup else f"pid {record.launcher_pid}"
            raise TimeoutError(f"the supervisor of job {record.id} ({where}) did not end it within "
                               f"{grace + STOP_MARGIN:.0f} s")
    with records.takeover(record.id) as owned:
        if owned is None:
            return records.load(record.id)
        if not owned.state.active:
            return owned
        return stop_orphan(owned, grace)


def verify_gone(record: JobRecord) -> tuple[dict[str, list[int]], dict[str, str]]:
    """Per host: pids of the job still alive (should be none), and hosts that could not be checked."""
    backend = backend_for(record)
    try:
        procs = [p for p in record.procs if p.pid]
        states, unverified = teardown.check_everywhere(backend, teardown.hosts_of(record), procs)
        left: dict[str, list[int]] = {label: [] for label in teardown.by_host(procs) if label not in unverified}
        for p in procs:
            st = states.get(p.name)
            if st is not None and st.alive and p.host in left:
                left[p.host].extend(st.members)
        return left, unverified
    finally:
        backend.close()


# -- scale ----------------------------------------------------------------------------------------

SCALE_WAIT = 120.0      # seconds mxdist scale waits for the supervisor's answer (new hosts are prepared first)


class ScaleRefused(RuntimeError):
    """``mxdist scale`` cannot ask this job (not running, no supervisor, no answer)."""


def scale_job(record: JobRecord, target: int, dry_run: bool = False, timeout: float = SCALE_WAIT,
              wait: Callable[[float], None] = time.sleep) -> ScaleAnswer:
    """Ask the job's supervisor (its one writer) to run ``target`` workers, or with ``dry_run``
    how it would; its answer.  ScaleRefused when the job is not running or has no supervisor."""
    record = refresh(record)
    if not record.state.active:
        raise ScaleRefused(f"job {record.id} is not running ({record.state.value})")
    if supervisor_gone(record):
        raise ScaleRefused(f"the supervisor of job {record.id} is gone: nobody can add or remove its workers "
                           f"(mxdist stop {record.id} ends it)")
    token = f"{os.getpid()}-{secrets.token_hex(3)}"
    path = records.scale_request_path(record.id, token)
    write_atomic(path, json.dumps(records.ScaleRequest(target, dry_run, time.time()).to_json()))
    answer_path = records.scale_answer_path(path)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                answer = ScaleAnswer.from_dict(json.loads(answer_path.read_text()))
                answer_path.unlink()
                return answer
            current = records.load(record.id)
            if not current.state.active or supervisor_gone(current):
                raise ScaleRefused(f"job {record.id} ended ({current.state.value}) before its supervisor answered")
            wait(0.1)
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
    raise ScaleRefused(f"the supervisor of job {record.id} did not answer within {timeout:.0f} s")


# -- logs -----------------------------------------------------------------------------------------

def select(record: JobRecord, role: str | None, rank: int | None) -> list[ProcRecord]:
    return [p for p in record.procs if (role is None or p.role == role) and (rank is None or p.rank == rank)]


def stream_logs(record: JobRecord, procs: Sequence[ProcRecord], follow: bool,
                emit: Callable[[ProcRecord, bytes], None], done: Callable[[ProcRecord], None]) -> None:
    """Print the logs of ``procs``: the local copies once the job is over (remote run files are
    gone by then), else from where the processes run; with ``follow`` until they end.  ``emit``
    raises BrokenPipeError when nobody reads any more: that ends the streaming (raised here)."""
    if not record.state.active:
        for p in procs:
            with contextlib.suppress(OSError), open(p.log, "rb") as f:
                while chunk := f.read(65536):
                    emit(p, chunk)
            done(p)
        return
    backend = backend_for(record)
    hosts = teardown.hosts_of(record)
    try:
        if follow:
            import threading

            gone = threading.Event()    # the reader went away: every follower stops
            errors: list[BaseException] = []   # a follower's failure, raised here (not in its thread)

            def one(p: ProcRecord) -> None:
                try:
                    backend.follow(hosts[p.host], p, lambda d: emit(p, d), wait=True)
                    done(p)
                except BrokenPipeError:
                    gone.set()
                except Exception as exc:  # noqa: BLE001 - reported by the caller's thread
                    if not gone.is_set():   # after the reader left, the connections close under it
                        errors.append(exc)

            threads = [threading.Thread(target=one, args=(p,), daemon=True) for p in procs if p.pid]
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive() and not gone.is_set():
                    t.join(0.2)
            if gone.is_set():
                raise BrokenPipeError("the reader of the logs went away")
            if errors:
                raise errors[0]
        else:
            for p in procs:
                if p.pid:
                    backend.follow(hosts[p.host], p, partial(emit, p), wait=False)
                    done(p)
    finally:
        backend.close()
