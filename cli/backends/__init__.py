"""Backends: how a job's processes start, are watched, signalled, checked and cleaned up on a host.

``base`` (the :class:`~mxdist.backends.base.Backend` contract, its capabilities, what every
backend shares), ``local`` (this machine), ``ssh`` (remote hosts: the only importer of
paramiko), ``slurm`` (job steps of an allocation: the only runner of ``srun``/``scontrol``),
``registry`` (backends by name: the one module that knows them all), ``agent`` (the host-side
operations).  ``agent`` is self-contained (standard library only, no import from ``mxdist``): the
SSH backend sends its source file to remote Pythons and the Slurm backend sends pieces of it.
Callers depend on the contract and ask capabilities, never a backend's name.
"""
