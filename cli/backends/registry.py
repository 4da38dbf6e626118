"""Backends by name: ``local``, ``ssh`` and ``slurm`` (the launcher's ``--launcher``).

The one place that knows every backend, so :mod:`mxdist.backends.base` (the contract) imports none
of them and no import cycle forms.  SSH and Slurm are imported only when used (paramiko is
not loaded for local jobs).  Everything else asks a backend what it is
(:class:`mxdist.backends.base.Capability`), never its name.
"""
from __future__ import annotations

from typing import Any

from ..planning.hosts import Host
from .base import Backend, BackendClass, BackendError, Capability, LaunchRequest
from .local import LocalBackend

NAMES = ("local", "ssh", "slurm")


def _backend_class(name: str) -> BackendClass:
    if name == "local":
        return LocalBackend
    if name == "ssh":
        from .ssh import SshBackend

        return SshBackend
    if name == "slurm":
        from .slurm import SlurmBackend

        return SlurmBackend
    raise BackendError(f"unknown launcher {name!r} (choose {', '.join(NAMES)})")


def capabilities(name: str) -> frozenset[Capability]:
    """What the backend called ``name`` is and can do (before one is made)."""
    return _backend_class(name).capabilities


def make_backend(name: str, options: dict[str, Any]) -> Backend:
    """Build a backend by name from :meth:`Backend.options`-style options."""
    return _backend_class(name)(**options)


def for_launch(name: str, request: LaunchRequest) -> tuple[Backend, list[Host]]:
    """The backend called ``name`` for a new job, and the job's hosts (PlanError, HostsError or
    BackendError when the options do not fit it)."""
    return _backend_class(name).for_launch(request)
