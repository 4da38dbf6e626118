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
"""
from __future__ import annotations

from psnode.net.security import Mode, Security
from psnode.net.transport import new_security
from psnode.protocol.control import StatusAnswer
from psnode.protocol.failure import FailureKind, FailureRecord, from_torch, path_in, record_of, torch_path_in
from psnode.protocol.status import SLOW_SHARE, SLOW_WINDOW, NodeRow, NodeState, excess
from psnode.scheduler.client import report_lost, request_leave, status
from psnode.server.checkpoint import path_for as checkpoint_path
from psnode.timeline import SUFFIX as TIMELINE_SUFFIX
from psnode.timeline import merge as merge_timeline

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
