"""``psnode.kv``: the KVStore entry point (``psnode.kv.create('dist_sync')``).

:func:`create` makes a :class:`~psnode.worker.kvstore.KVStore`: ``'local'`` in this process, or
``'dist_sync'``/``'dist_async'``/``'dist_ssp'`` joining the job this process was launched in (its
``PSNODE_*`` environment, psnode.config) as a worker; a distributed store installs the
worker's ``sys.excepthook`` (:func:`_report_uncaught`) and closes at exit.  Every store shows an
uncaught psnode error without psnode's own frames.  MXNet's type names (``'device'``,
``'local_allreduce_cpu'``, ``'dist_device_sync'``, ...) name one of these
(:data:`psnode.worker.kvstore.MXNET_TYPES`); ``kv.type`` is the name given.
"""
from __future__ import annotations

import atexit
import os
import sys
from typing import Any

from psnode import cpupolicy, timeline
from psnode.config import NodeConfig, Role
from psnode.errors import ConfigError, DataLost, PeerLost, PSError, user_traceback
from psnode.local import LocalEngine
from psnode.math.aggregation import parse as parse_aggregator
from psnode.protocol import failure
from psnode.server.staleness import check_staleness
from psnode.worker.engine import Engine
from psnode.worker.kvstore import AGGREGATORS, MXNET_TYPES, TYPES, KVStore, PendingRows, resolve_type, template


def create(name: str = "local", num_workers: int | None = None, aggregator: str = "average",
           staleness: int | None = None, backup_workers: int | None = None) -> KVStore:
    """Create a KVStore: ``'local'``, ``'dist_sync'``, ``'dist_async'`` or ``'dist_ssp'`` (or an
    MXNet name of one).  ``aggregator``: how a round's pushes combine, a name of
    psnode.math.aggregation's ``RULES`` (``'average'``, ``'sum'``, ``'max'``).  ``staleness``
    (``'dist_ssp'`` only, required there): how many clocks a worker may run ahead of the
    slowest (psnode.server.staleness; 0 is dist_sync).
    ``backup_workers`` (``'dist_sync'`` only; default ``mxdist launch --backup-workers``, 0): a
    round completes when all but that many workers pushed, late pushes are dropped
    (psnode.server.rounds); 0 is dist_sync exactly.

    A psnode error raised here (a misspelt type, a process no launcher started) is about the
    caller's code: uncaught, it is shown with the caller's frames only (:func:`_show`)."""
    try:
        return _create(name, num_workers, aggregator, staleness, backup_workers)
    except PSError:
        _show_psnode_errors()
        raise


def _create(name: str, num_workers: int | None, aggregator: str, staleness: int | None,
            backup_workers: int | None) -> KVStore:
    mode = resolve_type(name)
    try:
        parse_aggregator(aggregator, "kv.create(aggregator=...)")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    staleness = _staleness(name, mode, staleness)
    if backup_workers is not None and (mode != "dist_sync" or type(backup_workers) is not int or backup_workers < 0):
        raise ConfigError(f"backup_workers={backup_workers!r}: use kv.create('dist_sync', backup_workers=b) with an "
                          f"int b >= 0 (fewer than the workers); a {name!r} store has no backup workers")
    if mode == "local":
        if num_workers not in (None, 1):
            raise ConfigError(f"a {name!r} KVStore has one worker, not num_workers={num_workers}")
        kv = KVStore(mode, LocalEngine(), None, aggregator, name)
        _install(kv, lambda kind, exc, tb, previous: _show(previous, kind, exc, tb))
        return kv
    if not os.environ.get("PSNODE_ROLE"):
        raise ConfigError(f"kv.create({name!r}) needs a running job, and this process was not "
                          "started by a launcher. Run it with: mxdist launch -n 2 -s 1 <script.py>")
    cfg = NodeConfig.from_env()
    if cfg.role is not Role.WORKER:
        raise ConfigError(f"this process has PSNODE_ROLE={cfg.role.value}; only workers create a KVStore")
    if num_workers is not None and num_workers != cfg.num_workers:
        raise ConfigError(f"num_workers={num_workers} but the job was launched with "
                          f"{cfg.num_workers} workers (mxdist launch -n {num_workers})")
    if cfg.num_servers < 1:
        raise ConfigError("this job has no servers (-s 0); launch with -s 1 or more to use a KVStore")
    cpupolicy.apply(cfg.cpu_policy, whole_process=True)   # (the engine's threads inherit it)
    backup = _backup(mode, backup_workers, cfg)
    engine = Engine(cfg)
    kv = KVStore(mode, engine, cfg, aggregator, name, staleness, backup)
    if timeline.start(cfg.timeline, "worker", engine.rank, cfg.restart_count) is not None:
        timeline.trace_calls(kv, timeline.CALLS)
    _report_uncaught(kv, engine, cfg)
    atexit.register(_close_at_exit, kv, engine, cfg)
    return kv


def _staleness(name: str, mode: str, staleness: object) -> int | None:
    """``staleness`` checked for a store of ``mode``: an int for 'dist_ssp', None otherwise."""
    if mode != "dist_ssp":
        if staleness is not None:
            raise ConfigError(f"staleness={staleness!r} is for kv.create('dist_ssp', staleness=s); "
                              f"a {name!r} store has no staleness bound")
        return None
    if staleness is None:
        raise ConfigError("kv.create('dist_ssp') needs a bound: kv.create('dist_ssp', staleness=s) with s >= 0 "
                          "(0 is dist_sync; 1 to 3 lets a worker run that many steps ahead of the slowest)")
    try:
        return check_staleness(staleness, "kv.create('dist_ssp')")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _backup(mode: str, backup_workers: int | None, cfg: NodeConfig) -> int:
    """The backup workers of a store of ``mode``: the argument, else the launcher's
    (``PSNODE_BACKUP_WORKERS``, dist_sync only), checked against the job's workers."""
    if mode != "dist_sync":
        return 0
    b, where = (backup_workers, "kv.create('dist_sync', backup_workers=...)") if backup_workers is not None \
        else (cfg.backup_workers, "mxdist launch --backup-workers (PSNODE_BACKUP_WORKERS)")
    if b and b >= cfg.num_workers:
        raise ConfigError(f"backup_workers={b} from {where}: a round needs at least one push, and the job has "
                          f"{cfg.num_workers} workers; use 0 to {cfg.num_workers - 1}")
    return b


def _close_at_exit(kv: KVStore, engine: Engine, cfg: NodeConfig) -> None:
    """``kv.close()`` when the script did not close it; never raises.  A psnode error there is
    said in one line, as an uncaught one in the script would be: after the job ended elsewhere
    (a consequence: the engine said why; a ``job_ended`` failure record), or this worker's own
    (its pushes may not all be applied: ``psnode worker N: kv.close() at exit: ...``)."""
    try:
        kv.close()
    except PSError as exc:
        fatal = engine.fatal
        if isinstance(exc, PeerLost) and fatal is not None:
            failure.write(cfg.error_file, "job_ended", "worker", engine.rank, cfg.host, exc=exc)
            if str(fatal) != str(exc):
                print(f"psnode worker {engine.rank}: {exc}", file=sys.stderr, flush=True)
            return
        print(f"psnode worker {engine.rank}: kv.close() at exit: {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)


def _report_uncaught(kv: KVStore, engine: Engine, cfg: NodeConfig) -> None:
    """Install the worker's ``sys.excepthook`` (replacing one an earlier store installed).

    * An uncaught :class:`PeerLost` after the job ended elsewhere (a node failed or went silent,
      the job was stopped, the scheduler is gone: the engine has its fatal error) is a
      consequence: one line on stderr (``psnode worker 0: job ... ended: worker 1 on ...
      failed``), no traceback, and a ``job_ended`` failure record.
    * Any other uncaught exception -- a PeerLost this worker ran into itself (a server that
      stopped answering its requests) included -- is this worker's own failure: a record (kind
      ``exception``, with the time, type, message and traceback: :mod:`psnode.protocol.failure`), the
      scheduler is told (with restarts left, ``mxdist launch --max-restarts``, the job waits
      for the replacement; otherwise, or for a :class:`DataLost` that no restart can mend, it
      fails naming this worker), then the usual traceback.
    * ``kv.close()`` puts the previous hook back (a finished worker's later exception is not a
      psnode failure); until then a closed store's hook passes everything to the previous one.
    * A psnode error (ShapeMismatch, KeyNotInitialized, ...) is printed without psnode's own
      frames (:func:`psnode.errors.user_traceback`), as in a ``'local'`` store's process.
    """
    def hook(kind: type[BaseException], exc: BaseException, tb: Any, previous: Any) -> None:
        if not isinstance(exc, Exception):
            previous(kind, exc, tb)
            return
        fatal = engine.fatal   # set once the job ended (or the scheduler is gone)
        if isinstance(exc, PeerLost) and fatal is not None:
            failure.write(cfg.error_file, "job_ended", "worker", engine.rank, cfg.host, exc=exc)
            if str(fatal) != str(exc):       # else the engine said it when the job ended
                print(f"psnode worker {engine.rank}: {exc}", file=sys.stderr, flush=True)
            return
        try:
            failure.write(cfg.error_file, "exception", "worker", engine.rank, cfg.host, exc=exc)
            # (a push lost for good ends the job: a replacement would fail the same way)
            restart = cfg.restart_count < cfg.max_restarts and not isinstance(exc, DataLost)
            engine.fail(f"{kind.__name__}: {exc}", restart=restart)
        finally:
            _show(previous, kind, exc, tb)

    _install(kv, hook)


def _install(kv: KVStore, handle: Any) -> None:
    """Make ``handle(kind, exc, tb, previous)`` the process's ``sys.excepthook`` while ``kv`` is
    open (``kv.close()`` puts ``previous`` back; a closed store's hook passes everything on)."""
    previous = getattr(sys.excepthook, "_psnode_previous", sys.excepthook)

    def hook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
        if kv._closed and exc is not kv.close_error:
            previous(kind, exc, tb)
        else:
            handle(kind, exc, tb, previous)

    hook._psnode_previous = previous  # type: ignore[attr-defined]
    hook._psnode_store = kv  # type: ignore[attr-defined]
    sys.excepthook = hook


def _show_psnode_errors() -> None:
    """Make ``sys.excepthook`` show an uncaught psnode error without psnode's frames (a store's
    hook does already; installed once)."""
    current = sys.excepthook
    if hasattr(current, "_psnode_previous"):
        return

    def hook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
        _show(current, kind, exc, tb)

    hook._psnode_previous = current  # type: ignore[attr-defined]
    sys.excepthook = hook


def _show(previous: Any, kind: type[BaseException], exc: BaseException, tb: Any) -> None:
    """Print an uncaught exception as ``previous`` would; a psnode error (about the caller's
    code) without psnode's own frames when ``previous`` is Python's hook."""
    if isinstance(exc, PSError) and previous is sys.__excepthook__:
        sys.stderr.write(user_traceback(kind, exc, tb))
        sys.stderr.flush()
    else:
        previous(kind, exc, tb)


__all__ = ["AGGREGATORS", "MXNET_TYPES", "TYPES", "KVStore", "PendingRows", "create", "template"]
