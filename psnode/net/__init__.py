"""The network: sockets, a job's secret, and a node's link to the scheduler.

- :mod:`~psnode.net.transport`: every ZeroMQ socket of psnode (the only module that imports zmq).
- :mod:`~psnode.net.security`: the job's secret, its modes, the credentials derived from it.
- :mod:`~psnode.net.link`: a node's link to the scheduler (registration, heartbeats, liveness).

May import: :mod:`psnode.protocol`, :mod:`psnode.config`, :mod:`psnode.errors`.
"""
