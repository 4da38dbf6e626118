"""The end of a job on every host: stop what runs, collect what the processes left, clean up.

Used by the supervisor when a job ends, and by ``mxdist status``/``stop`` when they finalise
the record of a job whose supervisor is gone.  Every step runs per host in parallel and is
bounded in time: a host that does not answer a short probe (:data:`PROBE_TIMEOUT`) is not
waited on; it is reported as *not verified* (host label -> reason) and checked again later.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..backends.base import Backend, Evidence, HostTimeout, run_per_host
from ..job.records import JobRecord, ProcRecord
from ..job.rootcause import Outcome
from ..planning.hosts import Host

PROBE_TIMEOUT = 2.0     # seconds a host gets to answer before it is "not verified"
STEP_MARGIN = 10.0      # seconds on top of a step's own time (grace) before giving up on a host


@dataclass
class HostReport:
    """Per host: pids left after a stop, or why the host could not be checked."""

    left: dict[str, list[int]] = field(default_factory=dict)
    unverified: dict[str, str] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        return not any(self.left.values()) and not self.unverified

    def survivors(self) -> dict[str, str]:
        """The hosts where processes outlived KILL, with the pids: not verified either."""
        return {label: f"still running after KILL: pids {', '.join(map(str, pids))}"
                for label, pids in self.left.items() if pids}


def hosts_of(record: JobRecord) -> dict[str, Host]:
    hosts = [Host(**h) for h in record.hosts]
    return {h.label: h for h in hosts}


def by_host(procs: Sequence[ProcRecord]) -> dict[str, list[ProcRecord]]:
    out: dict[str, list[ProcRecord]] = {}
    for p in procs:
        if p.pid:
            out.setdefault(p.host, []).append(p)
    return out


def probe(backend: Backend, hosts: Sequence[Host], timeout: float = PROBE_TIMEOUT) -> dict[str, str]:
    """Hosts that do not answer within ``timeout``: label -> reason."""
    results = run_per_host(hosts, lambda h: backend.reachable(h, timeout), timeout=timeout + 1.0)
    return {label: _reason(r, label) for label, r in results.items() if isinstance(r, Exception)}


def _reason(exc: BaseException, label: str = "") -> str:
    """Why a host's step failed, without the host's name (the caller puts it first)."""
    if isinstance(exc, HostTimeout):
        return "did not answer (unreachable?)"
    text = str(exc) or type(exc).__name__
    return text[len(label) + 2:] if label and text.startswith(f"{label}: ") else text


def stop_everywhere(backend: Backend, hosts: Mapping[str, Host], procs: Sequence[ProcRecord],
                    grace: float, skip: Mapping[str, str] | None = None) -> HostReport:
    """TERM -> ``grace`` -> KILL the process groups on every host that answers."""
    groups = by_host(procs)
    report = HostReport(unverified=dict(skip or {}))
    targets = [hosts[label] for label in groups if label in hosts and label not in report.unverified]
    report.unverified.update(probe(backend, targets))
    targets = [h for h in targets if h.label not in report.unverified]
    results = run_per_host(targets, lambda h: backend.stop(h, groups[h.label], grace), timeout=grace + STEP_MARGIN)
    for label, result in results.items():
        if isinstance(result, Exception):
            report.unverified[label] = _reason(result, label)
        else:
            report.left[label] = list(result)
    return report


def check_everywhere(backend: Backend, hosts: Mapping[str, Host], procs: Sequence[ProcRecord],
                     skip: Mapping[str, str] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """Per process name: its ProcStatus; and the hosts that could not be checked."""
    groups = by_host(procs)
    unverified = dict(skip or {})
    targets = [hosts[label] for label in groups if label in hosts and label not in unverified]
    unverified.update(probe(backend, targets))
    targets = [h for h in targets if h.label not in unverified]
    results = run_per_host(targets, lambda h: backend.status(h, groups[h.label]), timeout=STEP_MARGIN)
    return _per_process(groups, results, unverified), unverified


def collect_everywhere(backend: Backend, hosts: Mapping[str, Host], procs: Sequence[ProcRecord],
                       run_dir: str, skip: Mapping[str, str]) -> tuple[dict[str, Evidence], dict[str, str]]:
    """Per process name: what it left (exit status, failure record, last exception)."""
    groups = by_host(procs)
    unverified = dict(skip)
    targets = [hosts[label] for label in groups if label in hosts and label not in unverified]
    results = run_per_host(targets, lambda h: backend.collect(h, groups[h.label], run_dir), timeout=STEP_MARGIN)
    return _per_process(groups, results, unverified), unverified


def _per_process(groups: Mapping[str, Sequence[ProcRecord]], results: Mapping[str, Any],
                 unverified: dict[str, str]) -> dict[str, Any]:
    """Each host's per-process answers by process name; a host whose step failed goes into
    ``unverified`` with the reason."""
    out: dict[str, Any] = {}
    for label, result in results.items():
        if isinstance(result, Exception):
            unverified[label] = _reason(result, label)
            continue
        for p, item in zip(groups[label], result, strict=False):
            out[p.name] = item
    return out


def cleanup_everywhere(backend: Backend, hosts: Mapping[str, Host], job_id: str, run_dir: str,
                       labels: Sequence[str], skip: Mapping[str, str]) -> dict[str, str]:
    """Remove secrets, run files and shared memory on ``labels``; the hosts where that failed."""
    targets = [hosts[label] for label in labels if label in hosts and label not in skip]
    results = run_per_host(targets, lambda h: backend.cleanup(h, job_id, run_dir), timeout=STEP_MARGIN)
    return {label: _reason(r, label) for label, r in results.items() if isinstance(r, Exception)}


def outcomes(record: JobRecord, evidence: Mapping[str, Evidence], stopped: set[str],
             unverified: Mapping[str, str], running: set[str] | None = None) -> list[Outcome]:
    """The root-cause inputs of every started process of ``record``."""
    out = []
    for p in record.procs:
        if not p.pid:
            continue
        ev = evidence.get(p.name)
        code = ev.code if ev is not None and ev.code is not None else p.exit_code
        out.append(Outcome(
            name=p.name, role=p.role, rank=p.rank, host=p.host, code=code,
            when=(ev.rc_time if ev else None) or p.ended, failure=ev.failure if ev else None,
            exception=ev.exception if ev else None, stopped=p.name in stopped,
            verified=p.host not in unverified, running=p.name in (running or set())))
    return out


def wait_until(pred: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    """Poll ``pred`` until true or ``timeout`` seconds passed; its last value."""
    deadline = time.monotonic() + timeout
    while True:
        if pred():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
