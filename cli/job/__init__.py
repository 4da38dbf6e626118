"""The job: its record and the pure rules of its life and its end.

``records`` (the record under ``MXDIST_HOME``, its transitions, the supervisor's lock: standard
library only), ``lifecycle`` and ``rootcause`` (pure: supervision rules, the root cause of a
failure).  A record is written by its supervisor only, or by whoever holds its lock once the
supervisor is provably gone (:mod:`mxdist.control.takeover`).

Its place among the rooms (pyproject.toml's layers contract): below every room that acts
(:mod:`mxdist.backends` keeps each process in a :class:`~mxdist.job.records.ProcRecord`;
:mod:`mxdist.control` and :mod:`mxdist.supervisor` drive backends and write records), above
:mod:`mxdist.elastic` and :mod:`mxdist.planning`, whose rules it applies; it imports no backend.
"""
