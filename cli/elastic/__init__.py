"""Elastic membership: which ranks a job has, where newcomers start, where the hosts come from.

``rules`` (pure: bounds, scale plans, joiners, the new home of a lost host's worker),
``discovery`` (runs ``--host-discovery-script`` and polls it).  The supervisor applies them
(:mod:`mxdist.supervisor.membership`); the record keeps every change (:mod:`mxdist.job.records`).
"""
