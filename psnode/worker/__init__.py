"""The worker side: what a training process runs under ``psnode.kv.create``.

The API and what it was given:

- :mod:`~psnode.worker.kvstore`: the KVStore API (MXNet-style); holds a data path over the
  engine it is given (its :class:`~psnode.worker.kvstore.KVBackend`).
- :mod:`~psnode.worker.forms`, :mod:`~psnode.worker.items`, :mod:`~psnode.worker.routes`:
  the arrays a call was given (MXNet's calling conventions, checks, the hook through which
  other libraries' values pass: torch's route is :mod:`psnode.torch.values`).
- :mod:`~psnode.worker.keys`: what the worker knows of each key (shape, placement, push count);
  :mod:`~psnode.worker.placement` and :mod:`~psnode.worker.bucketing` decide where a key lives.
- :mod:`~psnode.worker.compressor`: gradient compression's residuals;
  :mod:`~psnode.worker.states`: the file of ``kv.save_optimizer_states``.

Requests and their transport:

- :mod:`~psnode.worker.datapath`: keys into parts and buckets, parts into requests, answers
  into arrays (no I/O; talks to the engine through :class:`~psnode.worker.datapath.Requests`).
- :mod:`~psnode.worker.engine`: the connection to the job (requests become futures), and
  :mod:`~psnode.worker.ioloop` its I/O thread; both share one
  :class:`~psnode.worker.state.EngineState` (:mod:`~psnode.worker.state`).  The loop makes one
  connection per server (:mod:`~psnode.worker.connection`: TCP or same-host, the one place that
  decides whether a server is near); both send through it.  :mod:`~psnode.worker.samehost`
  reads the same-host links.
- :mod:`~psnode.worker.tracker`, :mod:`~psnode.worker.journal` and :mod:`~psnode.worker.futures`
  follow each request until it is answered (pure).

Two stacks, imports going one way, no circle: the API (kvstore -> datapath -> compressor, keys,
...) knows an engine only as the protocols it declares, and the transport (engine -> ioloop ->
connection -> samehost; ioloop -> state -> tracker -> journal) knows nothing of the API; :mod:`psnode.kv` joins them.
Never imports :mod:`psnode.server` or :mod:`psnode.scheduler`: a worker knows them only through
:mod:`psnode.protocol`.
"""
