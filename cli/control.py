"""Operations on a recorded job: status, stop, logs (used by ``mxdist status|stop|logs``).

The backend of a job is rebuilt from its record (:func:`cli.backends.make_backend`), so these
work from any shell, whether the launcher is still attached, detached or gone.

Status asks the live scheduler first (``psnode.control.query_status``); when it does not
answer, it checks every process over the backend (alive, or its recorded exit code).

Stop is idempotent: ask the scheduler for a graceful shutdown, then TERM every process group
that is still alive, KILL after the grace period, and report per host that nothing is left.
It also deletes the job's key files (on the hosts and the local copy).

A job with CURVE keys is asked with the local copy of its key pair (``record.key_file``).
"""
from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from cli.backends import Backend, ExitStatus, make_backend, run_per_host
from cli.hosts import Host
from cli.jobs import JobRecord, JobState, ProcRecord, ProcState, load, save
from psnode.errors import PSError


def _psnode_control() -> Any:
    """``psnode.control`` if the runtime provides it, else None."""
    try:
        from psnode import control
    except ImportError:
        return None
    return control


def backend_for(record: JobRecord) -> Backend:
    return make_backend(record.backend, record.options)


def hosts_of(record: JobRecord) -> dict[str, Host]:
    hosts = [Host(**h) for h in record.hosts]
    return {h.label: h for h in hosts}


def by_host(procs: Sequence[ProcRecord]) -> dict[str, list[ProcRecord]]:
    out: dict[str, list[ProcRecord]] = {}
    for p in procs:
        if p.pid:
            out.setdefault(p.host, []).append(p)
    return out


def stop_processes(backend: Backend, hosts: Mapping[str, Host], procs: Sequence[ProcRecord],
                   grace: float) -> dict[str, Any]:
    """TERM -> grace -> KILL on every host in parallel; host label -> leftover pids or exception."""
    groups = by_host(procs)
    targets = [hosts[label] for label in groups]
    return run_per_host(targets, lambda h: backend.stop(h, groups[h.label], grace))


def key_file_of(record: JobRecord) -> str | None:
    """The local copy of the job's CURVE keys, if the job has one and it still exists."""
    return record.key_file if record.key_file and os.path.exists(record.key_file) else None


def remove_job_keys(record: JobRecord, backend: Backend) -> None:
    """Delete the job's key files on its hosts and the local copy (best effort, idempotent)."""
    remove = getattr(backend, "remove_files", None)
    if record.remote_keys and remove is not None:
        hosts = hosts_of(record)
        targets = [hosts[label] for label in record.remote_keys if label in hosts]
        run_per_host(targets, lambda h: remove(h, [record.remote_keys[h.label]]))
    record.remote_keys = {}
    if record.key_file:
        with contextlib.suppress(OSError):
            os.unlink(record.key_file)


def state_of(status_alive: bool, code: int | None, recorded: ProcState) -> ProcState:
    if status_alive:
        return ProcState.RUNNING
    if code is None:
        return recorded if recorded in (ProcState.STOPPED, ProcState.LOST) else ProcState.LOST
    return ProcState.EXITED if code == 0 else (
        ProcState.STOPPED if recorded is ProcState.STOPPED else ProcState.FAILED)


def check_processes(record: JobRecord, backend: Backend) -> list[dict[str, Any]]:
    """Per process: role, rank, host, pid, state, found over the backend (not the scheduler)."""
    hosts = hosts_of(record)
    groups = by_host(record.procs)
    results = run_per_host([hosts[h] for h in groups], lambda h: backend.status(h, groups[h.label]))
    nodes = []
    for label, procs in groups.items():
        result = results[label]
        for i, p in enumerate(procs):
            if isinstance(result, Exception):
                state, alive = f"unknown ({result})", False
            else:
                alive = result[i].alive
                state = state_of(alive, result[i].code, p.state).value
            nodes.append({"role": p.role, "rank": p.rank, "host": p.host, "pid": p.pid,
                          "state": state, "uptime": time.time() - record.created if alive else None})
    return nodes


def job_status(record: JobRecord, timeout: float = 2.0) -> dict[str, Any]:
    """The status view of a job: one row per recorded process.

    Rows come from the live scheduler when it answers (heartbeat age, pushes, pulls, bytes);
    processes it does not know (not registered yet, or a job that never uses psnode) and every
    process when the scheduler is gone are checked over the backend instead.
    """
    view: dict[str, Any] = {"id": record.id, "state": record.state.value, "scheduler": record.scheduler,
                            "backend": record.backend}
    live: dict[tuple[str, int | None], dict[str, Any]] = {}
    control = _psnode_control()
    if control is not None and record.state.active:
        try:
            answer = control.query_status(record.scheduler, record.id, key_file=key_file_of(record),
                                          timeout=timeout)
            live = match_nodes(record.procs, answer.get("nodes", []))
            view["uptime"] = answer.get("uptime")
        except (PSError, OSError):
            pass
    missing = [p for p in record.procs if (p.role, p.rank) not in live]
    checked: dict[str, dict[str, Any]] = {}
    if missing:
        backend = backend_for(record)
        try:
            partial = JobRecord(**{**record.__dict__, "procs": missing})
            checked = {f"{n['role']}-{n['rank']}": n for n in check_processes(partial, backend)}
        finally:
            backend.close()
    if live and checked:
        view["source"] = f"live from the scheduler; the rest checked over {record.backend}"
    elif live:
        view["source"] = "live from the scheduler"
    else:
        view["source"] = f"checked over {record.backend}"
    extra, per_proc = backend_details(record)
    nodes = []
    for p in record.procs:
        row = live.get((p.role, p.rank))
        node = {**row, "host": p.host} if row else checked[f"{p.role}-{p.rank}"]
        nodes.append({**node, **per_proc.get(p.name, {})})
    return {**view, **extra, "nodes": nodes}


def backend_details(record: JobRecord) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """What a backend adds to the status view: job-level fields and fields per process name
    (Slurm: ``slurm_job``, and the ``step`` id of each running process)."""
    backend = backend_for(record)
    try:
        describe = getattr(backend, "describe", None)
        return describe(record.procs) if describe is not None else ({}, {})
    finally:
        backend.close()


def match_nodes(procs: Sequence[ProcRecord], rows: Sequence[dict[str, Any]]
                ) -> dict[tuple[str, int | None], dict[str, Any]]:
    """Scheduler rows keyed by the recorded (role, rank) they describe.

    Rows with a rank (>= 0) match by (role, rank); rows without one yet (a node registered
    before ranks were assigned reports rank -1 or None) take the first unmatched recorded
    process of the same role on the same address.
    """
    out: dict[tuple[str, int | None], dict[str, Any]] = {}
    known = {(p.role, p.rank) for p in procs}
    pending = []
    for row in rows:
        key = (row.get("role"), row.get("rank"))
        if key in known and ((key[1] is not None and key[1] >= 0) or key[0] == "scheduler"):
            out[key] = row  # type: ignore[index]
        else:
            pending.append(row)
    for row in pending:
        for p in procs:
            if (p.role, p.rank) not in out and p.role == row.get("role") and p.address == row.get("host"):
                out[(p.role, p.rank)] = {**row, "rank": p.rank}
                break
    return out


def summary(record: JobRecord) -> dict[str, Any]:
    return {"id": record.id, "state": record.state.value, "created": record.created,
            "backend": record.backend, "hosts": list(hosts_of(record)), "processes": len(record.procs),
            "command": record.command, "scheduler": record.scheduler}


def stop_job(record: JobRecord, grace: float, timeout: float = 2.0) -> dict[str, Any]:
    """Stop every process of the job; mark it stopped; host label -> leftover pids or exception."""
    was_active = record.state.active
    if was_active:
        record.state = JobState.STOPPED
        record.ended = time.time()
        save(record)  # tells an attached launcher that the end is wanted
        control = _psnode_control()
        if control is not None:
            try:
                if control.request_stop(record.scheduler, record.id, key_file=key_file_of(record),
                                        timeout=timeout):
                    _wait_gone(record, grace)
            except (PSError, OSError):
                pass
    backend = backend_for(record)
    try:
        result = stop_processes(backend, hosts_of(record), record.procs, grace)
        record = load(record.id)
        if not any(result.values()):
            remove_job_keys(record, backend)
    finally:
        backend.close()
    for p in record.procs:
        if p.state in (ProcState.RUNNING, ProcState.PENDING):
            p.state = ProcState.STOPPED
    if record.state.active:
        record.state = JobState.STOPPED
    save(record)
    return result


def _wait_gone(record: JobRecord, grace: float, linger: float = 0.5) -> None:
    """After a stop request: wait (at most ``grace``) for the scheduler to exit, then at most
    ``linger`` more seconds for the other processes it told to stop."""
    backend = backend_for(record)
    try:
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            nodes = check_processes(record, backend)
            running = [n for n in nodes if n["state"] == ProcState.RUNNING.value]
            if not running:
                return
            if not any(n["role"] == "scheduler" for n in running):
                deadline = min(deadline, time.monotonic() + linger)
            time.sleep(0.2)
    finally:
        backend.close()


def select(record: JobRecord, role: str | None, rank: int | None) -> list[ProcRecord]:
    return [p for p in record.procs
            if (role is None or p.role == role) and (rank is None or p.rank == rank)]


def stream_logs(record: JobRecord, procs: Sequence[ProcRecord], follow: bool,
                emit: Callable[[ProcRecord, bytes], None], done: Callable[[ProcRecord], None]) -> None:
    """Print the logs of ``procs`` (from where they run); with ``follow`` until they end."""
    backend = backend_for(record)
    hosts = hosts_of(record)
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


def describe_exit(code: int | None) -> str:
    return ExitStatus(code).describe()
