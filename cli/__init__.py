"""mxdist: the command-line launcher for psnode jobs (``mxdist launch|status|stop|logs|jobs|clean``).

Modules: ``main`` (typer commands), ``hosts`` and ``plan`` (pure: hosts, placement, the
NodeOptions of a job), ``options`` (options -> plan, backend, record), ``jobs`` (job records,
the supervisor's lock), ``backends`` (Backend protocol, capabilities, LocalRunner,
LocalBackend), ``registry`` (backends by name), ``ssh`` (SshBackend), ``slurm``
(SlurmBackend), ``agent`` (host-side operations), ``launch`` (the job's supervisor),
``preflight`` (sync, host checks, keys), ``detach`` (``launch -d``), ``lifecycle`` and
``rootcause`` (pure: supervision rules, root cause), ``teardown`` (the end of a job on every
host), ``control`` (status/stop/logs/jobs of recorded jobs), ``takeover`` (when a supervisor is
gone), ``history`` (clean, bounded history), ``ui`` (rendering).
"""
