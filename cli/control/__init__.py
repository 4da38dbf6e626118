"""Acting on a job through its backend: its end on every host, and its commands from any shell.

``teardown`` (the end of a job on every host: stop, collect what the processes left, clean
up), ``commands`` (status, stop, scale, logs, the job list), ``takeover`` (acting for a job
whose supervisor is gone), ``history`` (clean, bounded history).  The backend of a job is
rebuilt from its record, so these work whether the supervisor is attached, detached or gone.

Its place among the rooms (pyproject.toml's layers contract): above :mod:`mxdist.backends`,
which it drives, and :mod:`mxdist.view`, which it fills; below :mod:`mxdist.supervisor`, which
ends its job with ``teardown``.  It reads and writes records through :mod:`mxdist.job` (the
record, its lock and its rules), which imports no backend: a backend's process record lives there.
"""
