"""Before anything starts: ``--sync``, the preflight of every host, the job's keys.

:func:`prepare_hosts` runs the three in order and returns the problems (host, reason, fix);
with none, every host is ready and, for a job with CURVE keys, holds the job's key pair in a
0600 file of its run directory (delivered over the backend's channel: stdin over SSH, never a
command line) while the local copy is ``MXDIST_HOME/jobs/<id>/job.key``.  The supervisor runs
this in a thread, so a stop request or a signal does not wait for slow hosts.

GPUs: preflight's report of each host's GPUs goes into the plan (:func:`cli.gpus.with_gpus`);
with ``--gpus-per-worker`` every worker then has its ``CUDA_VISIBLE_DEVICES``, and a host with
too few GPUs is a problem like any other.  The report is shown when a host has GPUs or GPUs
were asked for (a CPU host is fine and quiet).
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from cli import jobs, ui
from cli.backends import (
    Backend,
    BackendError,
    HostProblem,
    Preflight,
    explainer,
    key_installer,
    run_per_host,
    syncer,
)
from cli.gpus import GpuShortageError, HostGpus, gpu_view, with_gpus
from cli.jobs import JobRecord
from cli.plan import Plan, with_key_files
from psnode.transport import CurveKeys


class PreflightFailed(Exception):
    def __init__(self, problems: list[HostProblem]) -> None:
        super().__init__(f"{len(problems)} preflight problem(s)")
        self.problems = problems


def prepare_hosts(plan: Plan, backend: Backend, record: JobRecord, run_dir: str, sync: list[tuple[str, str]],
                  modules: tuple[str, ...], secure: bool, save: Callable[[], None]) -> tuple[list[HostProblem], Plan]:
    """Sync, preflight, keys; the problems found and the plan (with the key files' paths)."""
    try:
        for local, remote in sync:   # first: the working directory may be what it copies
            _sync(plan, backend, local, remote)
        base_env = {k: v for k, v in plan.procs[0].env.items() if not k.startswith("PSNODE_")}
        hosts = plan.busy_hosts
        with ui.spinner(f"preflight: checking {len(hosts)} host(s)"):
            report = backend.preflight(hosts, modules, base_env)
        problems = report.problems
        if not problems:
            plan = _place_gpus(plan, backend, report)
        if not problems and secure:
            plan = _install_keys(plan, backend, record, run_dir, save)
        return problems, plan
    except PreflightFailed as exc:
        return exc.problems, plan


def _place_gpus(plan: Plan, backend: Backend, report: Preflight) -> Plan:
    """The plan with the GPUs each host reported (and each worker's, with --gpus-per-worker);
    shown when a host has GPUs or GPUs were asked for.  Too few: PreflightFailed, per host."""
    missing = HostGpus(problem=f"the {backend.name} launcher did not report this host's GPUs")
    found = {h.label: report.gpus.get(h.label, missing) for h in plan.busy_hosts}
    try:
        plan = with_gpus(plan, found)
    except GpuShortageError as exc:
        raise PreflightFailed([HostProblem(s.host, s.reason, s.fix) for s in exc.shortages]) from None
    if plan.gpus_per_worker or any(g.devices for g in found.values()):
        ui.gpu_report(*gpu_view(plan))
    return plan


def _install_keys(plan: Plan, backend: Backend, record: JobRecord, run_dir: str, save: Callable[[], None]) -> Plan:
    """Generate the job's CURVE keys, keep a local copy, deliver them to every host."""
    installer = key_installer(backend)
    hosts = plan.busy_hosts
    if installer is None:
        raise PreflightFailed([HostProblem(
            h.label, f"the {backend.name} launcher cannot deliver the job's CURVE keys",
            "pass --insecure to run without authentication and encryption") for h in hosts])
    keys = CurveKeys.generate()
    local = jobs.key_path(record.id)
    jobs.private_dir(local.parent)
    keys.save(str(local))
    record.key_file = str(local)
    save()
    text = keys.public + b"\n" + keys.secret + b"\n"
    results = run_per_host(hosts, lambda h: installer.install_key(h, run_dir, text))
    problems = [HostProblem(label, f"could not write the job's key file: {result}",
                            "check that the remote run directory (--remote-dir) is writable")
                for label, result in results.items() if isinstance(result, Exception)]
    record.remote_keys = {label: path for label, path in results.items() if not isinstance(path, Exception)}
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
