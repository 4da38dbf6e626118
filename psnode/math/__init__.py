"""The math of a parameter server, pure numpy and no I/O.

- :mod:`~psnode.math.optimizers`: server-side optimizers (MXNet 1.x update rules), as data specs.
- :mod:`~psnode.math.initializers`: weight initializers with MXNet semantics.
- :mod:`~psnode.math.compression`: gradient compression (MXNet's 2bit, 1bit, fp16).
- :mod:`~psnode.math.sparse`: row_sparse values.

Users reach these as ``psnode.optimizer``, ``psnode.init`` and ``psnode.sparse``.
May import: :mod:`psnode.errors` only.
"""
