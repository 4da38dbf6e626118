"""The scheduler: registration, ranks, the address book, barriers, liveness, membership, status.

- :mod:`~psnode.scheduler.loop`: the scheduler role.
- :mod:`~psnode.scheduler.roster`: its running indexes over the nodes (pure).
- :mod:`~psnode.scheduler.waitfor`: wait-for cycles among workers (pure).
- :mod:`~psnode.scheduler.client`: what ``mxdist status`` and ``mxdist stop`` ask a scheduler.

Never imports :mod:`psnode.worker` or :mod:`psnode.server`.
"""
