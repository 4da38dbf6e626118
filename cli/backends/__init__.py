"""Backends: how a job's processes start, are watched, signalled, checked and cleaned up on a host.

``base`` (the :class:`~mxdist.backends.base.Backend` contract, its capabilities, what every
backend shares: ``-H`` read, and which hosts are this machine), ``local`` (this machine),
``ssh`` (remote hosts: the only importer of paramiko), ``slurm`` (job steps of an allocation:
the only runner of ``srun``/``scontrol``), ``registry`` (backends by name: the one module that
knows them all), ``agent`` (the host-side operations).  ``agent`` is self-contained (standard
library only, no import from ``mxdist``): the SSH backend sends its source file to remote
Pythons and the Slurm backend sends pieces of it.
Only the backends import ``agent`` (pyproject.toml's contract): callers depend on the contract
and ask capabilities, never a backend's name, and never the agent.

Its place among the rooms (pyproject.toml's layers contract): above :mod:`mxdist.job` (a
backend keeps each process it starts in a :class:`~mxdist.job.records.ProcRecord`) and
:mod:`mxdist.planning` (it runs a plan's processes on its hosts, and reads the agent's reports
into planning's values: :func:`~mxdist.backends.base.host_gpus`); below :mod:`mxdist.control` and
:mod:`mxdist.supervisor`, which drive it.  It never imports :mod:`mxdist.view`.
"""
