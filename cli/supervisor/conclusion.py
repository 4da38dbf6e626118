"""The end of a job, the supervisor's collaborator that concludes it: always the same way.

:meth:`Conclusion.conclude`: stop what still runs on every host (TERM, the grace, KILL; a host
that does not answer within seconds is *not verified*, never waited on), let the output threads
drain, merge the ``--timeline`` events into the job's trace, collect what the processes left and
name the root cause (:mod:`mxdist.job.rootcause`), remove the job's secrets, run files and
shared-memory segments on every host (:mod:`mxdist.control.teardown`), write the final state once and
print the closing line (or the failure panel).

It reads the job through :class:`Ending` (the supervisor: its plan, hosts, record, backend,
settings, output threads and printer, whether preflight began writing on the hosts, the hosts
lost meanwhile, the closing line's words on the slowest worker) and writes the record only to
finish it.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from psnode import launcher as door
from psnode.config import Role

from .. import ui
from ..backends.base import Backend, fetcher, run_per_host
from ..control import teardown
from ..job import records
from ..job.records import Change, JobOutcome, JobRecord, JobState, ProcState
from ..job.rootcause import RootCause, decide
from ..planning.hosts import Host
from ..planning.options import LaunchSettings
from ..planning.plan import Plan
from .preflight import HostWrites

TIMELINE_LIMIT = 512 << 20   # bytes of --timeline events read from one host
TIMELINE_FETCH = 120.0       # seconds a host is given to send its --timeline events


class Ending(Protocol):
    """What the end of a job reads: the supervisor of the job."""

    plan: Plan
    hosts: dict[str, Host]
    record: JobRecord
    backend: Backend
    settings: LaunchSettings
    threads: list[tuple[str, threading.Thread]]
    printer: ui.LogPrinter
    writes: HostWrites
    slowest: str | None

    @property
    def lost_hosts(self) -> Mapping[str, float]: ...

    def save(self) -> None: ...


class Conclusion:
    """Concludes one job (module docstring)."""

    def __init__(self, job: Ending) -> None:
        self.job = job
        self._stopped: set[str] = set()   # the processes the end stopped (not failures of their own)

    def conclude(self, state: JobState, code: int, stopped_by: str | None = None,
                  first_seen: str | None = None, headline: str | None = None,
                  grace: float | None = None, summary: str | None = None, note: str | None = None,
                  forget: bool = False) -> int:
        """Stop, collect, name the root cause (``note``: what the supervisor adds to it, e.g. a
        crash loop), clean up on every host; write the final state once (``forget``: a job that
        started nothing leaves no record, and its closing line says so)."""
        if stopped_by:
            ui.warn(f"{stopped_by}: stopping the job on every host")
        live = [p for p in self.job.record.procs if p.pid and p.state is ProcState.RUNNING]
        self._stopped = {p.name for p in live}
        report = teardown.stop_everywhere(self.job.backend, self.job.hosts, live,
                                          self.job.settings.grace if grace is None else grace)
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
        labels = [h.label for h in self.job.plan.busy_hosts] if self.job.writes.begun else []
        for label, when in self.job.lost_hosts.items():   # never waited on again: its files stay there
            report.unverified.setdefault(label, f"lost at {time.strftime('%H:%M:%S', time.localtime(when))} "
                                                f"(it did not answer); the job's files there were not removed")
        failed_cleanup = teardown.cleanup_everywhere(self.job.backend, self.job.hosts, self.job.record.id,
                                                     self.job.settings.run_dir, labels, report.unverified)
        records.discard_key(self.job.record.id)
        self.job.record.finish(JobOutcome(state, code, {**report.unverified, **failed_cleanup}, stopped_by, cause,
                                  headline))
        if forget and not any(p.pid for p in self.job.record.procs) and not failed_cleanup:
            records.remove(self.job.record.id)
            ui.fail_line(f"{summary or headline}: nothing was started, no job recorded")
            return code
        self.job.save()
        self._report(cause, summary)
        return code

    def _write_timeline(self, unverified: dict[str, str]) -> None:
        """``--timeline``: merge the processes' event files into the job's trace (psnode.launcher.merge_timeline);
        hosts that do not share this machine's files send theirs through the backend first
        (``unverified``: hosts not to ask)."""
        path, directory = self.job.record.timeline, self.job.settings.timeline_dir
        if not path or not directory:
            return
        with tempfile.TemporaryDirectory(prefix="mxdist-timeline-") as fetched:
            if self.job.settings.timeline_local:
                files = sorted(Path(directory).glob(f"*{door.TIMELINE_SUFFIX}"))
            else:
                got = self._fetch_timeline(directory, Path(fetched), unverified)
                if got is None:
                    return
                files = got
            if not files:
                if any(p.pid for p in self.job.record.procs):
                    ui.warn(f"--timeline: no process recorded events in {directory}; no trace written")
                return
            try:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                Path(path).write_text(json.dumps(door.merge_timeline(files)))
            except OSError as exc:
                ui.warn(f"--timeline: could not write {path}: {exc}")
                return
        if self.job.settings.timeline_local:
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
        fetch = fetcher(self.job.backend)
        if fetch is None:
            ui.warn(f"--timeline: the processes' events stay on their hosts in {directory} "
                    f"({self.job.backend.name} hosts do not share this machine's files); no trace written")
            return None
        targets = [self.job.hosts[h.label] for h in self.job.plan.busy_hosts
                   if h.label in self.job.hosts and h.label not in unverified]
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
        started = [p for p in self.job.record.procs if p.pid]
        evidence, skipped = teardown.collect_everywhere(self.job.backend, self.job.hosts, started,
                                                        self.job.settings.run_dir, unverified)
        outcomes = teardown.outcomes(self.job.record, evidence, self._stopped, skipped)
        return decide(outcomes, first_seen)

    def _report(self, cause: RootCause | None, summary: str | None = None) -> None:
        rec = self.job.record
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
                shown = proc is not None and self.job.printer.shows(proc.role, proc.rank)  # its output, streamed above
                source = (cause.source, proc.host if proc else "its host", cause.time) if cause.source else None
                ui.failure_panel(how, cause.consequences, proc.log if proc else None,
                                 None if shown or proc is None else _tail(proc.log), notes, source)
        elif rec.state is JobState.STOPPED:
            detail = rec.stopped_by or ""
        if rec.elastic is not None:
            counts = ", ".join(f"{rec.count(c)} {c.value}" for c in (Change.JOINED, Change.LEFT, Change.LOST))
            detail = f"{detail} ({counts})" if detail else f"workers: {counts}"
        moves = [f"{c.who} moved to {c.host} ({c.why})" for c in rec.changes if c.change is Change.MOVED]
        if moves:
            detail = f"{detail}; {', '.join(moves)}" if detail else ", ".join(moves)
        if self.job.slowest and rec.state is not JobState.STOPPED:
            detail = f"{detail}; {self.job.slowest}" if detail else self.job.slowest
        if len(rec.failovers) > 1:
            over = f"the standby schedulers on {', then '.join(rec.failovers)} took the job over in turn"
            detail = f"{detail}; {over}" if detail else over
        elif rec.failover:
            over = f"the standby scheduler on {rec.failover} took the job over"
            detail = f"{detail}; {over}" if detail else over
        sched = next((p for p in rec.procs if p.role == Role.SCHEDULER.value), None)
        if sched is not None and sched.restarts:
            times = f"scheduler restarted {sched.restarts} time{'s' if sched.restarts > 1 else ''}"
            detail = f"{detail} ({times})" if detail else times
        ui.closing_line(rec.id, rec.state.value, rec.duration, detail)

    def _join_followers(self, timeout: float, skip: dict[str, str]) -> None:
        """Let the output threads drain the last lines (a remote log is copied before its run
        directory is removed); never wait on a host that did not answer."""
        deadline = time.monotonic() + timeout
        for host, t in self.job.threads:
            if host not in skip:
                t.join(max(0.0, deadline - time.monotonic()))


def _tail(path: str, lines: int = 20) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    return text.splitlines()[-lines:]
