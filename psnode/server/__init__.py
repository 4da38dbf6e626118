"""The server side: a shard of the keys, their rounds and their optimizer.

- :mod:`~psnode.server.loop`: the server role (one poll loop over the workers and the scheduler).
- :mod:`~psnode.server.store`: the key store: every operation of a worker in, the replies it
  causes out (key creation, compression settings, flushes, optimizer states, membership) and
  when a checkpoint is due; it states the server's half of the exactly-once invariant.  It is
  composed of :mod:`~psnode.server.rounds` (the rules every round follows, and a key part's
  rounds: pushes taken once, folded by the part's aggregation rule (:mod:`psnode.math.aggregation`),
  completed, applied; pulls answered) and
  :mod:`~psnode.server.buckets` (many small keys pushed and pulled as one; a split bucket's
  members go through the rounds of single key parts).
- :mod:`~psnode.server.keypart`: a key part's state and the rules of its push numbers;
  :mod:`~psnode.server.replies`: what the store answers and the zero-copy send rule;
  :mod:`~psnode.server.compressed`: compressed
  pushes (one setting for all workers, checked, decoded where summed).
- :mod:`~psnode.server.checkpoint`: a server's whole state, written atomically, and restored.
- :mod:`~psnode.server.samehost`: the server's side of the same-host links; it alone decides
  which workers are on this host, and tells :mod:`~psnode.server.routes` (each worker's route:
  TCP, or its link with TCP behind it), through which the loop sends every reply.

All but loop, checkpoint, routes and samehost are pure (no I/O).  Imports go one way, no circles:
replies <- keypart <- rounds <- buckets <- store <- checkpoint <- loop (compressed below
rounds).  Never imports :mod:`psnode.worker` or :mod:`psnode.scheduler`.
"""
