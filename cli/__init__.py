"""mxdist: the command-line launcher for psnode jobs (``mxdist launch|status|stop|logs|jobs|clean``).

Installed as the package ``mxdist`` from the ``cli/`` folder; modules import each other
relatively.  Modules: ``main`` (typer commands), ``hosts`` and ``plan`` (pure: hosts,
placement, the NodeOptions of a job), ``gpus`` (pure: the hosts' GPUs and each worker's),
``options`` (options -> plan, backend, record), ``jobs`` (job records and their transitions,
the supervisor's lock), ``backends`` (Backend protocol, capabilities, LocalRunner,
LocalBackend), ``registry`` (backends by name), ``ssh`` (SshBackend), ``slurm``
(SlurmBackend), ``agent`` (host-side operations), ``launch`` (the job's supervisor),
``preflight`` (sync, host checks, keys), ``detach`` (``launch -d``), ``lifecycle`` and
``rootcause`` (pure: supervision rules, root cause), ``teardown`` (the end of a job on every
host), ``control`` (status/stop/logs/jobs of recorded jobs), ``takeover`` (when a supervisor is
gone), ``history`` (clean, bounded history), ``view`` (pure: what status, jobs and the dry run
show), ``ui`` (rendering).
"""
