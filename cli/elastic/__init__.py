"""Elastic membership: which ranks a job has, where newcomers start, where the hosts come from.

``rules`` (pure: scale plans, joiners, the new home of a lost host's worker, within the bounds
of :mod:`mxdist.planning.bounds`), ``discovery`` (runs ``--host-discovery-script`` and polls it).
The supervisor applies them (:mod:`mxdist.supervisor.membership`); the record keeps every change
(:mod:`mxdist.job.records`).

Its place among the rooms (pyproject.toml's layers contract): above :mod:`mxdist.planning` only
(hosts and bounds are planning's: a launch checks them before anything runs), below the job
whose lifecycle rules ask it (:func:`~mxdist.elastic.rules.shortfall`).
"""
