"""Recorded jobs from any shell: status, stop, logs, the job list, clean-up, history.

The backend of a job is rebuilt from its record (:func:`cli.registry.make_backend`), so these
work whether the supervisor is attached, detached or gone.

**Who writes.**  A job's supervisor is the only writer of its record while it lives
(:mod:`cli.jobs`).  ``stop`` asks it (a stop request in the job's private directory) and waits
for the final state; only when the supervisor is provably gone (its lock is free, or for old
records its pid is dead or younger than the record) do these commands write, holding the lock:

* :func:`refresh` (run by ``status``, ``jobs`` and ``stop``) notices a lost supervisor (``kill
  -9`` of ``mxdist launch``): while processes still run it marks the record
  ``supervisor_lost`` (the job runs on unsupervised; ``mxdist stop`` ends it); once none runs it
  finalises the record from what the processes left (every worker exited 0: ``succeeded``,
  else ``failed`` with the root cause) and cleans up on every host.  For a final record it
  checks again the hosts that were not verified.
* :func:`stop_job` with a lost supervisor stops the processes itself and finalises ``stopped``.

Status asks the live scheduler first (``psnode.control.query_status``); processes it does not
know are checked on their hosts.  A final record is shown as recorded.
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from cli import jobs, teardown
from cli.backends import Backend, ProcStatus, describer
from cli.jobs import DamagedRecord, JobRecord, JobState, ProcRecord, ProcState
from cli.launch import proc_start_ticks
from cli.registry import make_backend
from cli.rootcause import decide
from psnode.errors import PSError
from psnode.status import NodeRow

STOP_MARGIN = 30.0      # seconds a supervisor gets beyond --grace to end the job when asked


def backend_for(record: JobRecord) -> Backend:
    return make_backend(record.backend, record.options)


def _psnode_control() -> Any:
    try:
        from psnode import control
    except ImportError:
        return None
    return control


def key_file_of(record: JobRecord) -> str | None:
    """The local copy of the job's CURVE keys, if the job has one and it still exists."""
    return record.key_file if record.key_file and os.path.exists(record.key_file) else None


# -- the supervisor ---------------------------------------------------------------------------------

def _pid_started(pid: int) -> float | None:
    """Wall-clock start time of a live pid, or None if it is gone (zombies count as gone)."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
        fields = data[data.rindex(")") + 2:].split()
        if fields[0] == "Z":
            return None
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - uptime + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def supervisor_gone(record: JobRecord) -> bool:
    """True only when the job's supervisor is provably gone (see the module docstring)."""
    sup = record.supervisor
    if sup is None:    # a version 1 record: the launcher's pid, checked against its start time
        pid = record.launcher_pid
        if not pid:
            return True
        started = _pid_started(pid)
        return started is None or started > record.created + 1.0
    if sup.host != socket.gethostname():
        return False   # its lock may not be visible from here: ask it, never take over
    lock = jobs.try_lock(record.id)
    if lock is None:
        return False
    lock.release()
    # the lock is free; a supervisor that still runs (same pid, same start time) is ending now
    return sup.start_ticks is None or proc_start_ticks(sup.pid) != sup.start_ticks


def refresh(record: JobRecord) -> JobRecord:
    """The record, finalised if its supervisor died first; unverified hosts checked again."""
    if record.state.active and supervisor_gone(record):
        with jobs.takeover(record.id) as current:
            if current is not None and current.state.active:
                return _orphaned(current)
            return current or jobs.load(record.id)
    if not record.state.active and record.unverified:
        with jobs.takeover(record.id) as current:
            if current is not None:
                return _recheck(current)
    return record


def _orphaned(record: JobRecord) -> JobRecord:
    """A job whose supervisor is gone: still running (marked), or finalised from what is left."""
    backend = backend_for(record)
    try:
        hosts = teardown.hosts_of(record)
        started = [p for p in record.procs if p.pid]
        states, unverified = teardown.check_everywhere(backend, hosts, started)
        running = {name for name, st in states.items() if st.alive}
        note = "the supervisor was lost (killed?): the processes ran on unsupervised"
        if note not in record.notes:
            record.notes.append(note)
        record.supervisor_lost = True
        if running or unverified:
            for p in started:
                p.state = _state(states.get(p.name), p.state) if p.host not in unverified else ProcState.UNKNOWN
            record.unverified = unverified
            record.state = JobState.RUNNING
            jobs.save(record)
            return record
        evidence, _ = teardown.collect_everywhere(backend, hosts, started, record.run_dir, {})
        for p in started:
            ev = evidence.get(p.name)
            if ev is not None and ev.code is not None:
                p.exit_code, p.ended = ev.code, ev.rc_time
            p.state = _state(states.get(p.name), p.state)
        workers = [p for p in started if p.role == "worker"]
        ok = bool(workers) and all(p.exit_code == 0 for p in workers)
        if ok:
            record.state, record.exit_code = JobState.SUCCEEDED, 0
        else:
            record.state, record.exit_code = JobState.FAILED, 1
            cause = decide(teardown.outcomes(record, evidence, set(), {}))
            if cause is not None:
                record.root_cause, record.consequences = cause.to_dict(), list(cause.consequences)
        record.ended = max((p.ended for p in started if p.ended), default=None) or time.time()
        _cleanup_after(record, backend, hosts)
        jobs.save(record)
        return record
    finally:
        backend.close()


def _recheck(record: JobRecord) -> JobRecord:
    """A final job with hosts not verified at its end: check them again, clean up what answers."""
    backend = backend_for(record)
    try:
        hosts = teardown.hosts_of(record)
        procs = [p for p in record.procs if p.pid and p.host in record.unverified]
        report = teardown.stop_everywhere(backend, hosts, procs, 1.0)
        for p in procs:
            if p.host not in report.unverified and p.state is ProcState.UNKNOWN:
                p.state = ProcState.STOPPED
        fresh = {label: why for label, why in record.unverified.items() if label in report.unverified}
        fixed = [label for label in record.unverified if label not in fresh]
        fresh.update(teardown.cleanup_everywhere(backend, hosts, record.id, record.run_dir, fixed, {}))
        record.unverified = fresh
        jobs.save(record)
        return record
    finally:
        backend.close()


def _cleanup_after(record: JobRecord, backend: Backend, hosts: dict[str, Any]) -> None:
    labels = sorted({p.host for p in record.procs if p.pid})
    record.unverified = teardown.cleanup_everywhere(backend, hosts, record.id, record.run_dir, labels, {})
    record.remote_keys = {}
    with contextlib.suppress(OSError):
        jobs.key_path(record.id).unlink()


def _state(status: ProcStatus | None, recorded: ProcState) -> ProcState:
    """A process's state from a check on its host."""
    if status is None:
        return recorded if recorded is not ProcState.RUNNING else ProcState.LOST
    if status.alive:
        return ProcState.RUNNING
    if status.code is None:
        return recorded if recorded in (ProcState.STOPPED, ProcState.LOST) else ProcState.LOST
    if status.code == 0:
        return ProcState.EXITED
    return ProcState.STOPPED if recorded is ProcState.STOPPED else ProcState.FAILED


# -- status -----------------------------------------------------------------------------------------

def job_status(record: JobRecord, timeout: float = 2.0) -> dict[str, Any]:
    """The status view of a job: ``nodes`` (NodeRow, one per recorded process) and the job's
    state, outcome and notes."""
    record = refresh(record)
    view: dict[str, Any] = {"id": record.id, "state": record.state.value, "scheduler": record.scheduler,
                            "backend": record.backend, "exit_code": record.exit_code,
                            "created": record.created, "ended": record.ended, "duration": record.duration,
                            "root_cause": (record.root_cause or {}).get("headline"),
                            "consequences": record.consequences, "notes": _notes(record)}
    if not record.state.active:
        view["source"] = "as recorded at its end"
        view["nodes"] = [_recorded_row(p) for p in record.procs]
        view["ended_line"] = _ended_line(record)
        return view
    live: dict[tuple[str, int | None], NodeRow] = {}
    control = _psnode_control()
    if control is not None and record.scheduler:
        try:
            answer = control.query_status(record.scheduler, record.id, key_file=key_file_of(record),
                                          timeout=timeout)
            live = match_nodes(record.procs, [NodeRow.from_dict(r) for r in answer.get("nodes", [])])
        except (PSError, OSError):
            pass
    missing = [p for p in record.procs if (p.role, p.rank) not in live and p.pid]
    checked: dict[str, NodeRow] = {}
    backend = backend_for(record)
    try:
        if missing:
            states, unverified = teardown.check_everywhere(backend, teardown.hosts_of(record), missing)
            for p in missing:
                why = unverified.get(p.host)
                state = f"unknown ({why})" if why else _state(states.get(p.name), p.state).value
                alive = p.name in states and states[p.name].alive
                checked[p.name] = NodeRow(role=p.role, rank=p.rank, host=p.host, state=state, pid=p.pid,
                                          restarts=p.restarts, uptime=time.time() - record.created if alive else None,
                                          source="host")
        describe = describer(backend)
        extra, per_proc = describe.describe(record.procs) if describe else ({}, {})
    finally:
        backend.close()
    view.update(extra)
    where = "on this machine" if record.backend == "local" else f"over {record.backend}"
    view["source"] = ("live from the scheduler" + (f"; the rest checked {where}" if checked else "")
                      if live else f"checked {where}")
    nodes = []
    for p in record.procs:
        row = live.get((p.role, p.rank))
        if row is not None:
            row.host = p.host
        else:
            row = checked.get(p.name) or _recorded_row(p)
        row.step = (per_proc.get(p.name) or {}).get("step")
        nodes.append(row)
    view["nodes"] = nodes
    return view


def _recorded_row(p: ProcRecord) -> NodeRow:
    state = p.state.value if p.pid or p.state is not ProcState.PENDING else "not started"
    return NodeRow(role=p.role, rank=p.rank, host=p.host, state=state, pid=p.pid, restarts=p.restarts,
                   source="record")


def _notes(record: JobRecord) -> list[str]:
    notes = list(record.notes)
    for host, why in record.unverified.items():
        notes.append(f"{host}: not verified: {why} (checked again by mxdist status / stop)")
    if record.version < jobs.RECORD_VERSION:
        notes.append(f"a version {record.version} record (an older mxdist): shown as far as it goes")
    return notes


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


def summary(record: JobRecord) -> dict[str, Any]:
    return {"id": record.id, "state": record.state.value + (" (supervisor lost)" if record.supervisor_lost
                                                            and record.state.active else ""),
            "created": record.created, "duration": record.duration if record.ended else time.time() - record.created,
            "backend": record.backend, "hosts": list(teardown.hosts_of(record)),
            "processes": len(record.procs), "command": record.command, "exit_code": record.exit_code,
            "root_cause": (record.root_cause or {}).get("headline")}


def job_list(limit: int | None = 20) -> list[dict[str, Any]]:
    """The most recent jobs (damaged records included), oldest first; lost supervisors noticed."""
    items = jobs.listing() if jobs.jobs_dir().is_dir() else []
    if limit:
        items = items[-limit:]
    rows = []
    for job_id, rec in items:
        if isinstance(rec, DamagedRecord):
            rows.append({"id": job_id, "state": "damaged", "problem": str(rec)})
            continue
        with contextlib.suppress(DamagedRecord, jobs.JobNotFound):
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
        path = jobs.stop_request_path(record.id)
        jobs.write_private(path, json.dumps({"grace": grace, "time": time.time(), "pid": os.getpid()}))
        deadline = time.monotonic() + grace + STOP_MARGIN
        while time.monotonic() < deadline:
            current = jobs.load(record.id)
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
    with jobs.takeover(record.id) as owned:
        if owned is None:
            return jobs.load(record.id)
        if not owned.state.active:
            return owned
        return _stop_orphan(owned, grace)


def _stop_orphan(record: JobRecord, grace: float) -> JobRecord:
    backend = backend_for(record)
    try:
        hosts = teardown.hosts_of(record)
        live = [p for p in record.procs if p.pid]
        report = teardown.stop_everywhere(backend, hosts, live, grace)
        for p in live:
            if p.host in report.unverified:
                p.state = ProcState.UNKNOWN
            elif p.state in (ProcState.RUNNING, ProcState.PENDING):
                p.state = ProcState.STOPPED
        record.supervisor_lost = record.supervisor_lost or record.supervisor is not None or bool(record.launcher_pid)
        record.state, record.exit_code, record.stopped_by = JobState.STOPPED, 143, "mxdist stop"
        record.ended = time.time()
        labels = [label for label in hosts if label not in report.unverified]
        failed = teardown.cleanup_everywhere(backend, hosts, record.id, record.run_dir, labels, report.unverified)
        with contextlib.suppress(OSError):
            jobs.key_path(record.id).unlink()
        record.remote_keys = {}
        record.unverified = {**report.unverified, **failed}
        for label, pids in report.left.items():
            if pids:
                record.unverified[label] = f"still running after KILL: pids {', '.join(map(str, pids))}"
        jobs.save(record)
        return record
    finally:
        backend.close()


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


# -- logs -----------------------------------------------------------------------------------------

def select(record: JobRecord, role: str | None, rank: int | None) -> list[ProcRecord]:
    return [p for p in record.procs if (role is None or p.role == role) and (rank is None or p.rank == rank)]


def stream_logs(record: JobRecord, procs: Sequence[ProcRecord], follow: bool,
                emit: Callable[[ProcRecord, bytes], None], done: Callable[[ProcRecord], None]) -> None:
    """Print the logs of ``procs``: the local copies once the job is over (remote run files are
    gone by then), else from where the processes run; with ``follow`` until they end."""
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

            def one(p: ProcRecord) -> None:
                try:
                    backend.follow(hosts[p.host], p, lambda d: emit(p, d), wait=True)
                finally:
                    done(p)

            threads = [threading.Thread(target=one, args=(p,), daemon=True) for p in procs if p.pid]
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():
                    t.join(0.2)
        else:
            for p in procs:
                if p.pid:
                    backend.follow(hosts[p.host], p, partial(emit, p), wait=False)
                    done(p)
    finally:
        backend.close()


# -- clean and history ------------------------------------------------------------------------------

def clean(older_than_days: float | None = None, only: Sequence[str] = (),
          now: float | None = None) -> tuple[list[str], dict[str, str]]:
    """Remove finished jobs (here, and their run directories on remote hosts); never active ones.
    Returns (removed job ids, job id -> why it was kept)."""
    now = time.time() if now is None else now
    removed: list[str] = []
    kept: dict[str, str] = {}
    if not jobs.jobs_dir().is_dir():
        return removed, kept
    for job_id, rec in jobs.listing():
        if only and job_id not in only:
            continue
        when = rec.ended or rec.created if isinstance(rec, JobRecord) else _mtime(jobs.record_path(job_id))
        if older_than_days is not None and now - when < older_than_days * 86400:
            continue
        if isinstance(rec, JobRecord):
            rec = refresh(rec)
            if rec.state.active:
                kept[job_id] = f"still {rec.state.value}"
                continue
            problem = _clean_hosts(rec)
            if problem:
                kept[job_id] = problem
                continue
        jobs.remove(job_id)
        removed.append(job_id)
    return removed, kept


def _clean_hosts(record: JobRecord) -> str | None:
    """Remove what the job may have left on its hosts (run files, shared memory): the job's end
    did already, unless a host was not verified or an older version ran it."""
    if not any(p.pid for p in record.procs):
        return None
    backend = backend_for(record)
    try:
        hosts = teardown.hosts_of(record)
        labels = sorted({p.host for p in record.procs if p.pid})
        skip = teardown.probe(backend, [hosts[label] for label in labels if label in hosts])
        failed = teardown.cleanup_everywhere(backend, hosts, record.id, record.run_dir, labels, skip)
        failed.update(skip)
        return "; ".join(f"{h}: {why}" for h, why in failed.items()) or None
    finally:
        backend.close()


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def prune(keep: int) -> list[str]:
    """Bounded history: remove the oldest finished local jobs beyond the newest ``keep``
    (jobs with hosts not verified are kept: status checks them again)."""
    if keep <= 0 or not jobs.jobs_dir().is_dir():
        return []
    items = [(i, r) for i, r in jobs.listing() if isinstance(r, JobRecord)]
    finished = [r for _, r in items if not r.state.active]
    extra = finished[:-keep] if len(finished) > keep else []
    removed = []
    for rec in extra:
        if rec.unverified:
            continue
        jobs.remove(rec.id)
        removed.append(rec.id)
    return removed
