"""The job: its record, the rules of its life, its end, and acting on it from any shell.

``records`` (the record under ``MXDIST_HOME``, its transitions, the supervisor's lock),
``lifecycle`` and ``rootcause`` (pure: supervision rules, the root cause of a failure),
``teardown`` (the end of a job on every host), ``control`` (status, stop, logs, the job list),
``takeover`` (acting for a job whose supervisor is gone), ``history`` (clean, bounded history).
A record is written by its supervisor only, or by whoever holds its lock once the supervisor is
provably gone (``takeover``).
"""
