"""The same-host data plane: a worker and a server on one machine exchange data through shared
memory instead of TCP.

- :mod:`~psnode.samehost.segments`: shared-memory segments and arenas, and their safety checks.
- :mod:`~psnode.samehost.link`: the link itself (a Unix SOCK_SEQPACKET connection plus segments).
- :mod:`~psnode.samehost.handshake`: joining a server's link, and who may join.
- :mod:`~psnode.samehost.staging`: a worker's shared-memory buffers for outgoing arrays.

Each side composes these: the worker in :mod:`psnode.worker.samehost`, the server in
:mod:`psnode.server.samehost`.  May import: :mod:`psnode.protocol`, :mod:`psnode.net`,
:mod:`psnode.config`, :mod:`psnode.errors`.
"""
