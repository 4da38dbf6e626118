"""Backends by name: ``local``, ``ssh`` and ``slurm`` (the launcher's ``--launcher``).

The one place that knows every backend, so :mod:`mxdist.backends` (the contract) imports none
of them and no import cycle forms.  SSH and Slurm are imported only when used (paramiko is
not loaded for local jobs).
"""
from __future__ import annotations

from typing import Any

from .backends import Backend, BackendError, LocalBackend

NAMES = ("local", "ssh", "slurm")


def make_backend(name: str, options: dict[str, Any]) -> Backend:
    """Build a backend by name from :meth:`Backend.options`-style options."""
    if name == "local":
        return LocalBackend(**options)
    if name == "ssh":
        from .ssh import SshBackend

        return SshBackend(**options)
    if name == "slurm":
        from .slurm import SlurmBackend

        return SlurmBackend(**options)
    raise BackendError(f"unknown launcher {name!r} (choose {', '.join(NAMES)})")
