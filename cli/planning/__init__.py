"""Planning: from what the user asked to what runs where (pure: no I/O, no clock, no process).

``hosts`` (the hosts file and ``-H``), ``plan`` (placement, ports, argv, environment, the
NodeOptions of a job), ``bounds`` (the workers' bounds: ``-n``, ``--min-workers``,
``--max-workers``), ``gpus`` (the hosts' GPUs and each worker's), ``torchenv`` (torchrun's
environment), ``engines`` (what runs as scheduler and servers), ``options`` (the launch options,
their defaults and checks).  Inputs are values (file texts, what preflight found, chosen ports,
what a backend answered); whatever reads files, opens sockets or asks hosts lives in
:mod:`mxdist.supervisor.setup` or a backend and hands its answers in.

The bottom room (pyproject.toml's layers contract): it imports no other room of mxdist.  It
knows no backend and no wire: a backend reads its host agent's GPU report into a
:class:`~mxdist.planning.gpus.HostGpus` (:func:`mxdist.backends.base.host_gpus`), and what
depends on a backend's capabilities is handed in as a value.
"""
