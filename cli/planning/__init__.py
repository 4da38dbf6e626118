"""Planning: from what the user asked to what runs where (pure: no I/O, no clock, no process).

``hosts`` (the hosts file and ``-H``), ``plan`` (placement, ports, argv, environment, the
NodeOptions of a job), ``gpus`` (the hosts' GPUs and each worker's), ``torchenv`` (torchrun's
environment), ``engines`` (what runs as scheduler and servers), ``options`` (the launch options,
their defaults and checks).  Inputs are values (file texts, what preflight found, chosen ports);
whatever reads files, opens sockets or asks hosts lives in :mod:`mxdist.supervisor.setup` or a
backend and hands its answers in.
"""
