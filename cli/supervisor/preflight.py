"""Before anything starts: ``--sync``, the preflight of every host, the job's secret.

:func:`prepare_hosts` runs the three in order and returns the problems (host, reason, fix).
With none, every host is ready and, unless the job is ``insecure``, the job's secret
(:mod:`psnode.net.security`: a fresh token and CURVE key pair, the mode in the file) is where the
job's processes read it (``PSNODE_KEY_FILE``):

* always, first, in ``MXDIST_HOME/jobs/<id>/job.key`` (0600 in the 0700 job directory): the
  launcher's copy, named by the job record (``key_file``: the path, never the secret), which
  ``mxdist status`` and ``stop`` use;
* a backend whose processes see this machine's files (``shared_fs``: local jobs; Slurm, whose
  nodes see ``MXDIST_HOME`` over the shared file system, as they see the job's logs): the
  processes read that same file;
* a backend with the ``keys`` capability (SSH): sent on the SSH channel's stdin to every host,
  written 0600 in the job's 0700 remote run directory; never on a command line.

The supervisor removes every copy when the job ends, however it ends (:mod:`mxdist.control.teardown`,
:mod:`mxdist.control.takeover`).  This runs in a thread of the supervisor, so a stop request or a signal
does not wait for slow hosts.  Until its :class:`HostWrites` lets it go on, preflight writes
nothing of the job anywhere (``--sync`` copies the user's files, not the job's): a job ended
before that has nothing to clean up on its hosts, and is not kept waiting for a host that is
slow to answer.

GPUs: preflight's report of each host's GPUs goes into the plan (:func:`mxdist.planning.plan.with_gpus`);
with ``--gpus-per-worker`` every worker then has its ``CUDA_VISIBLE_DEVICES``, and a host with
too few GPUs is a problem like any other.  The report is shown when a host has GPUs or GPUs
were asked for (a CPU host is fine and quiet).
"""
from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from psnode import launcher as door
from psnode.launcher import Mode

from .. import ui
from ..backends.base import (
    Backend,
    BackendError,
    Capability,
    HostProblem,
    Preflight,
    explainer,
    key_installer,
    run_per_host,
    syncer,
)
from ..job import records
from ..job.records import JobRecord
from ..planning.gpus import HostGpus
from ..planning.hosts import Host
from ..planning.plan import GpuShortageError, Plan, command_target, gpu_view, with_gpus, with_key_files


class PreflightFailed(Exception):
    def __init__(self, problems: list[HostProblem]) -> None:
        super().__init__(f"{len(problems)} preflight problem(s)")
        self.problems = problems


class HostWrites:
    """Whether the job's own files (its secret, its run directory) may be written on its hosts,
    decided once between the preflight thread and the supervisor, whichever asks first: preflight
    :meth:`begin` s before it touches the record or a host, the supervisor :meth:`forbid` s when the
    job ends during preflight.  Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._begun = False
        self._forbidden = False

    def begin(self) -> bool:
        """Go on writing (True), unless the job has ended meanwhile (False: stop here)."""
        with self._lock:
            self._begun = not self._forbidden
            return self._begun

    def forbid(self) -> bool:
        """No write may begin from now on; True if some may have begun already."""
        with self._lock:
            self._forbidden = True
            return self._begun

    @property
    def begun(self) -> bool:
        with self._lock:
            return self._begun


def prepare_hosts(plan: Plan, backend: Backend, record: JobRecord, run_dir: str, sync: list[tuple[str, str]],
                  modules: tuple[str, ...], mode: Mode, save: Callable[[], None],
                  writes: HostWrites | None = None) -> tuple[list[HostProblem], Plan]:
    """Sync, preflight, secret; the problems found and the plan (with the secret files' paths).

    Nothing of the job is written (the record, the hosts) before ``writes`` lets it go on, which
    it asks only once every host passed preflight; forbidden, this returns no problems and the
    plan as it was."""
    writes = writes or HostWrites()
    # the job's secret is made meanwhile (pyzmq makes its key pair), kept until every host passed
    secret = None if mode is Mode.INSECURE else concurrent.futures.ThreadPoolExecutor(1, "secret")
    made = secret.submit(door.new_security, mode) if secret is not None else None
    try:
        for local, remote in sync:   # first: the working directory may be what it copies
            _sync(plan, backend, local, remote)
        hosts = plan.busy_hosts
        with ui.spinner(f"preflight: checking {len(hosts)} host(s)"):
            report = backend.preflight(hosts, modules, plan.base_env, command_target(record.command))
        problems = _in_host_order(report.problems, plan)
        if not problems and not writes.begin():
            return [], plan
        if not problems:
            plan = _place_gpus(plan, backend, report)
        if not problems and made is not None:
            plan = _install_secret(plan, backend, record, run_dir, made.result(), save)
        return problems, plan
    except PreflightFailed as exc:
        return _in_host_order(exc.problems, plan), plan
    finally:
        if secret is not None:
            secret.shutdown(wait=False)


def _in_host_order(problems: list[HostProblem], plan: Plan) -> list[HostProblem]:
    """``problems`` in the order of the hosts (hosts answer in any order)."""
    order = {h.label: i for i, h in enumerate(plan.hosts)}
    return sorted(problems, key=lambda p: order.get(p.host, len(order)))


def _place_gpus(plan: Plan, backend: Backend, report: Preflight) -> Plan:
    """The plan with the GPUs each host reported (and each worker's, with --gpus-per-worker);
    shown when a host has GPUs or GPUs were asked for.  Too few: PreflightFailed, per host."""
    found: dict[str, HostGpus] = {}
    for h in plan.busy_hosts:
        got = report.gpus.get(h.label)
        found[h.label] = got if got is not None else \
            HostGpus(problem=f"the {backend.name} launcher did not report this host's GPUs")
    try:
        plan = with_gpus(plan, found)
    except GpuShortageError as exc:
        raise PreflightFailed([HostProblem(s.host, s.reason, s.fix) for s in exc.shortages]) from None
    if plan.gpus_per_worker or any(g.devices for g in found.values()):
        ui.gpu_report(*gpu_view(plan))
    return plan


def _install_secret(plan: Plan, backend: Backend, record: JobRecord, run_dir: str, security: door.Security,
                    save: Callable[[], None]) -> Plan:
    """The job's fresh secret: the launcher's copy, then (SSH) one on every host."""
    local = records.key_path(record.id)
    records.private_dir(local.parent)
    security.save(str(local))
    record.keep_key(str(local))
    save()
    installer = key_installer(backend)
    hosts = plan.busy_hosts
    if installer is None:
        if Capability.SHARED_FS in backend.capabilities:   # the processes read the launcher's copy
            return plan
        raise PreflightFailed([HostProblem(
            h.label, f"the {backend.name} launcher cannot deliver the job's secret",
            "pass --insecure to run without authentication (trusted networks only)") for h in hosts])
    text = security.dumps()
    results = run_per_host(hosts, lambda h: installer.install_key(h, run_dir, text))
    problems = [HostProblem(label, f"could not write the job's secret file: {result}",
                            "check that the remote run directory (--remote-dir) is writable")
                for label, result in results.items() if isinstance(result, Exception)]
    record.keys_on_hosts({label: path for label, path in results.items() if not isinstance(path, Exception)})
    save()
    if problems:
        raise PreflightFailed(problems)
    return with_key_files(plan, record.remote_keys)


def _sync(plan: Plan, backend: Backend, local: str, remote: str) -> None:
    sync = syncer(backend)
    if sync is None:
        return
    total = sum(f.stat().st_size for f in Path(local).rglob("*") if f.is_file())
    hosts = plan.busy_hosts
    by_label = {h.label: h for h in hosts}
    with ui.progress_bar(f"sync {local} -> {remote}", total * len(hosts)) as advance:
        results = run_per_host(hosts, lambda h: sync.sync(h, local, remote, advance))
    explain = explainer(backend)
    problems = []
    for label, result in results.items():
        if not isinstance(result, Exception):
            continue
        if explain is not None and not isinstance(result, BackendError):  # could not connect
            problems.append(explain.explain(label, by_label[label], result))
        else:
            problems.append(HostProblem(label, f"sync of {local} to {remote} failed: {result}",
                                        "check the remote path and its permissions"))
    if problems:
        raise PreflightFailed(problems)


def prepare_host(host: Host, backend: Backend, record: JobRecord, run_dir: str, sync: list[tuple[str, str]],
                 modules: tuple[str, ...], env: Mapping[str, str]) -> str | None:
    """A host that runs nothing of the job yet, before a worker joins the running job there (an
    elastic job's ``mxdist scale``): ``--sync``, its preflight, and the job's secret delivered as
    at the start (the launcher's copy, on the SSH channel).  The secret file's path there (None:
    its processes read the launcher's copy, or the job is insecure); BackendError naming the
    problem and its fix."""
    copy = syncer(backend)
    for local, remote in sync if copy is not None else ():
        assert copy is not None
        copy.sync(host, local, remote, lambda _: None)
    report = backend.preflight([host], modules, env, command_target(record.command))
    if report.problems:
        raise BackendError("; ".join(f"{p.reason} ({p.fix})" for p in report.problems))
    installer = key_installer(backend)
    if installer is None or not record.key_file:
        return None
    path = installer.install_key(host, run_dir, Path(record.key_file).read_bytes())
    record.keys_on_hosts({**record.remote_keys, host.label: path})
    return path
