"""A directory for ``PYTHONPATH``, holding only :mod:`sitecustomize` (see there).

``mxdist``'s host agent puts this directory first on the ``PYTHONPATH`` of every process it
starts, so every Python of a job imports the guard at start-up.  Nothing imports this package.
"""
