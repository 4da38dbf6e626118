"""The server side: a shard of the keys, their rounds and their optimizer.

- :mod:`~psnode.server.loop`: the server role (one poll loop over the workers and the scheduler).
- :mod:`~psnode.server.store`: the key store (sync rounds, async applies, parked pulls);
  :mod:`~psnode.server.rounds` one key part's rounds, :mod:`~psnode.server.buckets` many small
  keys answered as one, :mod:`~psnode.server.parts` a key part's state, :mod:`~psnode.server.arith`
  the dense arithmetic (all pure).
- :mod:`~psnode.server.checkpoint`: a server's whole state, written atomically.
- :mod:`~psnode.server.samehost`: the server's side of the same-host links.

Never imports :mod:`psnode.worker` or :mod:`psnode.scheduler`.
"""
