"""The worker side: what a training process runs under ``psnode.kv.create``.

- :mod:`~psnode.worker.kvstore`: the KVStore API (MXNet-style), over an engine it is given.
- :mod:`~psnode.worker.forms`, :mod:`~psnode.worker.items`, :mod:`~psnode.worker.torchvalues`:
  the arrays a call was given (MXNet's calling conventions, checks, torch tensors).
- :mod:`~psnode.worker.datapath`: keys into parts and buckets, and parts into requests (no I/O);
  :mod:`~psnode.worker.placement` and :mod:`~psnode.worker.bucketing` decide where a key lives.
- :mod:`~psnode.worker.engine`: the connection to the job: requests become futures;
  :mod:`~psnode.worker.ioloop` is its I/O thread, :mod:`~psnode.worker.samehost` its
  shared-memory links; :mod:`~psnode.worker.tracker`, :mod:`~psnode.worker.journal` and
  :mod:`~psnode.worker.futures` follow each request until it is answered (pure).

Never imports :mod:`psnode.server` or :mod:`psnode.scheduler`: a worker knows them only through
:mod:`psnode.protocol`.
"""
