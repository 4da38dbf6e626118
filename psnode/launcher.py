"""The door for launchers: what a launcher (``mxdist``) uses of psnode beyond its public API.

**psnode's public API** is :mod:`psnode` (the error types, ``__version__``), :mod:`psnode.errors`,
:mod:`psnode.config` (:class:`~psnode.config.NodeConfig`, :class:`~psnode.config.Role`, the
``PSNODE_*`` environment contract), :mod:`psnode.files` (atomic 0600 file writes; standard library
only, so a launcher's code that must run on any Python may use it) and, for training scripts,
:mod:`psnode.kv`, ``psnode.init``, ``psnode.initializer``, ``psnode.optimizer``,
``psnode.sparse``, ``psnode.data``, ``psnode.torch`` and ``psnode.mxnet``. A launcher imports
those and this module, nothing else of psnode: the import-linter contract "mxdist enters psnode
only through psnode.launcher and the public API" (pyproject.toml) keeps it so. Every other module
of psnode is internal and may change shape without notice; the names here stay.

What a launcher finds here:

* **The job's secret** (:mod:`psnode.net.security` says what each :class:`Mode` protects):
  :func:`new_security` makes a fresh one; its ``save(path)`` writes the file every process of the
  job reads (``PSNODE_KEY_FILE``), ``dumps()`` its text for another host.
* **Checkpoints**: :func:`checkpoint_path` is the file server ``rank`` writes in a checkpoint
  directory (``--checkpoint-dir``); a restore needs one per server.
* **The control client** (each call opens a short-lived link to the job's scheduler, with the
  job's secret file when it has one, and waits at most ``timeout`` seconds): :func:`status`
  returns the scheduler's node table as a :class:`StatusAnswer` (rows: :class:`NodeRow`, their
  ``state`` a :class:`NodeState`; no
  answer raises :class:`~psnode.errors.PeerLost`); :func:`request_leave` asks workers to leave
  gracefully; :func:`report_lost` tells the scheduler a worker's process died.  Stopping a job is
  the launcher's own business (it signals the processes); the scheduler needs no request for it.
* **The failure record** each process writes when it fails (``PSNODE_ERROR_FILE``):
  :func:`path_in` names the file of process ``name`` in its run directory, :class:`FailureRecord`
  and :class:`FailureKind` read it (:func:`record_of` reads its JSON object as a host returned it);
  :func:`torch_path_in` names a worker's ``TORCHELASTIC_ERROR_FILE`` (what torch's ``@record``
  writes) and :func:`from_torch` reads it as a failure record.
* **The timeline**: :func:`merge_timeline` merges the processes' event files (names ending in
  :data:`TIMELINE_SUFFIX`) into one Chrome trace.

Every name loads its module on first use (:data:`_HOMES`): importing this module costs nothing,
and a launcher that only plans (``mxdist launch --dry-run``) never loads pyzmq or numpy
(tests/unit/test_lazy_door.py checks it in a fresh interpreter).
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from psnode.net.security import Mode, Security
    from psnode.net.transport import new_security
    from psnode.protocol.control import StatusAnswer
    from psnode.protocol.failure import FailureKind, FailureRecord, from_torch, path_in, record_of, torch_path_in
    from psnode.protocol.status import SLOW_SHARE, SLOW_WINDOW, NodeRow, NodeState, excess
    from psnode.scheduler.client import report_lost, request_leave, status
    from psnode.server.checkpoint import path_for as checkpoint_path
    from psnode.timeline import SUFFIX as TIMELINE_SUFFIX
    from psnode.timeline import merge as merge_timeline

#: each name's home and its name there.  A name loads its module on first use, so a launcher
#: pays only for what it uses: planning a job (``mxdist launch --dry-run``, ``mxdist --help``)
#: loads neither pyzmq nor numpy; the control client, the secret's maker and the checkpoint
#: paths do when first called for
_HOMES: dict[str, tuple[str, str]] = {
    "Mode": ("psnode.net.security", "Mode"),
    "Security": ("psnode.net.security", "Security"),
    "new_security": ("psnode.net.transport", "new_security"),
    "StatusAnswer": ("psnode.protocol.control", "StatusAnswer"),
    **{n: ("psnode.protocol.failure", n) for n in ("FailureKind", "FailureRecord", "from_torch", "path_in",
                                                     "record_of", "torch_path_in")},
    **{n: ("psnode.protocol.status", n) for n in ("SLOW_SHARE", "SLOW_WINDOW", "NodeRow", "NodeState", "excess")},
    **{n: ("psnode.scheduler.client", n) for n in ("report_lost", "request_leave", "status")},
    "checkpoint_path": ("psnode.server.checkpoint", "path_for"),
    "TIMELINE_SUFFIX": ("psnode.timeline", "SUFFIX"),
    "merge_timeline": ("psnode.timeline", "merge"),
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'psnode.launcher' has no attribute {name!r}")
    module, attr = _HOMES[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


__all__ = [
    "SLOW_SHARE",
    "SLOW_WINDOW",
    "TIMELINE_SUFFIX",
    "FailureKind",
    "FailureRecord",
    "Mode",
    "NodeRow",
    "NodeState",
    "Security",
    "StatusAnswer",
    "checkpoint_path",
    "excess",
    "from_torch",
    "merge_timeline",
    "new_security",
    "path_in",
    "record_of",
    "report_lost",
    "request_leave",
    "status",
    "torch_path_in",
]
