"""Acting for a job whose supervisor is gone (``kill -9`` of ``mxdist launch``).

Only here does anyone but the supervisor write a job's record, and only while holding the
job's lock (:func:`mxdist.job.records.takeover`) after proving the supervisor gone
(:func:`supervisor_gone`): the lock is free and its recorded pid with its start time is gone;
for version 1 records (no lock), the launcher's pid is dead or younger than the record.

* :func:`refresh` (``status``, ``jobs``, ``stop``, ``clean``): a job still running is marked
  ``supervisor_lost`` (the processes run on unsupervised); once none runs, the record is
  finalised from what they left (every worker exited 0: ``succeeded``; else ``failed`` with the
  root cause) and every host is cleaned up.  A final record's hosts that were not verified are
  checked and cleaned again.
* :func:`stop_orphan` (``stop``): stop the processes, finalise ``stopped``, clean up.
"""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from ..backends.base import Backend, ProcStatus
from ..backends.registry import make_backend
from ..job import records
from ..job.records import JobOutcome, JobRecord, JobState, ProcState
from ..job.rootcause import decide
from . import teardown


def backend_for(record: JobRecord) -> Backend:
    return make_backend(record.backend, record.options)


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
    lock = records.try_lock(record.id)
    if lock is None:
        return False
    lock.release()
    # the lock is free; a supervisor that still runs (same pid, same start time) is ending now
    return not sup.alive


def refresh(record: JobRecord) -> JobRecord:
    """The record, finalised if its supervisor died first; unverified hosts checked again."""
    if record.state.active and supervisor_gone(record):
        with records.takeover(record.id) as current:
            if current is not None and current.state.active:
                return _orphaned(current)
            return current or records.load(record.id)
    if not record.state.active and record.unverified:
        with records.takeover(record.id) as current:
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
        record.lose_supervisor()
        if running or unverified:
            for p in started:
                p.seen(ProcState.UNKNOWN if p.host in unverified else state_from_check(states.get(p.name), p.state))
            record.run_unsupervised(unverified)
            records.save(record)
            return record
        evidence, _ = teardown.collect_everywhere(backend, hosts, started, record.run_dir, {})
        for p in started:
            ev = evidence.get(p.name)
            p.seen(state_from_check(states.get(p.name), p.state), ev.code if ev else None, ev.rc_time if ev else None)
        workers = [p for p in started if p.role == "worker"]
        ended = max((p.ended for p in started if p.ended), default=None) or time.time()
        labels = sorted({p.host for p in record.procs if p.pid})
        failed = teardown.cleanup_everywhere(backend, hosts, record.id, record.run_dir, labels, {})
        records.discard_key(record.id)
        if workers and all(p.exit_code == 0 for p in workers):
            record.finish(JobOutcome(JobState.SUCCEEDED, 0, failed, ended=ended))
        else:
            cause = decide(teardown.outcomes(record, evidence, set(), {}))
            record.finish(JobOutcome(JobState.FAILED, 1, failed, cause=cause, ended=ended))
        records.save(record)
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
        fresh = {label: why for label, why in record.unverified.items() if label in report.unverified}
        fixed = [label for label in record.unverified if label not in fresh]
        fresh.update(teardown.cleanup_everywhere(backend, hosts, record.id, record.run_dir, fixed, {}))
        record.rechecked(fixed, fresh)
        records.save(record)
        return record
    finally:
        backend.close()


def state_from_check(status: ProcStatus | None, recorded: ProcState) -> ProcState:
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


def stop_orphan(record: JobRecord, grace: float) -> JobRecord:
    backend = backend_for(record)
    try:
        hosts = teardown.hosts_of(record)
        live = [p for p in record.procs if p.pid]
        report = teardown.stop_everywhere(backend, hosts, live, grace)
        for p in live:
            p.stopped(verified=p.host not in report.unverified)
        ended = time.time()
        labels = [label for label in hosts if label not in report.unverified]
        failed = teardown.cleanup_everywhere(backend, hosts, record.id, record.run_dir, labels, report.unverified)
        records.discard_key(record.id)
        lost = record.supervisor is not None or bool(record.launcher_pid)
        record.finish(JobOutcome(JobState.STOPPED, 143, {**report.unverified, **failed, **report.survivors()},
                             stopped_by="mxdist stop", ended=ended, supervisor_lost=lost))
        records.save(record)
        return record
    finally:
        backend.close()
