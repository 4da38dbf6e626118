"""Bounded history: ``mxdist clean`` and the pruning after each launch.

Only finished jobs are removed (their records and logs here, and whatever they may have left
on their hosts: run directories, keys, shared-memory segments); a job whose supervisor is gone
is finalised first (:func:`mxdist.control.takeover.refresh`); active jobs are never touched.
A job with a host that does not answer is kept (what it left there stays), unless the caller
forgets such jobs (``mxdist clean --forget-unreachable``): then its record and logs here go, and
the result says what stays on which host.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..job import records
from ..job.records import JobRecord
from . import teardown
from .takeover import backend_for, refresh


@dataclass
class Cleaned:
    """What :func:`clean` did: the jobs ``removed``; those ``kept`` (job id -> why: still active, or
    per host its problem); and of the removed, those ``forgotten`` with hosts that did not answer
    (job id -> host label -> why), whose files there stay."""

    removed: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)
    unreachable: dict[str, dict[str, str]] = field(default_factory=dict)   # kept for unreachable hosts only
    forgotten: dict[str, dict[str, str]] = field(default_factory=dict)
    run_dirs: dict[str, str] = field(default_factory=dict)                 # job id -> its run directory on its hosts


def finished(older_than_days: float | None = None, now: float | None = None) -> list[str]:
    """The finished jobs :func:`clean` would remove (damaged records too), oldest first."""
    now = time.time() if now is None else now
    out: list[str] = []
    if not records.jobs_dir().is_dir():
        return out
    for job_id, rec in records.listing():
        if isinstance(rec, JobRecord):
            rec = refresh(rec)
            if rec.state.active:
                continue
        if older_than_days is None or now - _ended(job_id, rec) >= older_than_days * 86400:
            out.append(job_id)
    return out


def _ended(job_id: str, rec: JobRecord | Exception) -> float:
    return rec.ended or rec.created if isinstance(rec, JobRecord) else _mtime(records.record_path(job_id))


def clean(older_than_days: float | None = None, only: Sequence[str] = (), now: float | None = None,
          forget_unreachable: bool = False) -> Cleaned:
    """Remove finished jobs (here, and their run directories on remote hosts); never active ones.
    A job with a host that does not answer is kept, or with ``forget_unreachable`` removed here
    (the module docstring)."""
    now = time.time() if now is None else now
    out = Cleaned()
    if not records.jobs_dir().is_dir():
        return out
    for job_id, rec in records.listing():
        if only and job_id not in only:
            continue
        if older_than_days is not None and now - _ended(job_id, rec) < older_than_days * 86400:
            continue
        if isinstance(rec, JobRecord):
            rec = refresh(rec)
            if rec.state.active:
                out.kept[job_id] = f"still {rec.state.value}"
                continue
            failed, unreachable = _clean_hosts(rec)
            out.run_dirs[job_id] = rec.run_dir
            if failed or (unreachable and not forget_unreachable):
                out.kept[job_id] = "; ".join(f"{h}: {why}" for h, why in {**unreachable, **failed}.items())
                if unreachable and not failed:
                    out.unreachable[job_id] = unreachable
                continue
            if unreachable:
                out.forgotten[job_id] = unreachable
        records.remove(job_id)
        out.removed.append(job_id)
    return out


def _clean_hosts(record: JobRecord) -> tuple[dict[str, str], dict[str, str]]:
    """Remove what the job may have left on its hosts (run files, shared memory): the job's end
    did already, unless a host was not verified or an older version ran it.  Returns (the hosts
    that answered but failed -> why, the hosts that did not answer -> why)."""
    if not any(p.pid for p in record.procs):
        return {}, {}
    backend = backend_for(record)
    try:
        hosts = teardown.hosts_of(record)
        labels = sorted({p.host for p in record.procs if p.pid})
        skip = teardown.probe(backend, [hosts[label] for label in labels if label in hosts])
        failed = teardown.cleanup_everywhere(backend, hosts, record.id, record.run_dir, labels, skip)
        return failed, skip
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
    if keep <= 0 or not records.jobs_dir().is_dir():
        return []
    items = [(i, r) for i, r in records.listing() if isinstance(r, JobRecord)]
    finished = [r for _, r in items if not r.state.active]
    extra = finished[:-keep] if len(finished) > keep else []
    removed = []
    for rec in extra:
        if rec.unverified:
            continue
        records.remove(rec.id)
        removed.append(rec.id)
    return removed
