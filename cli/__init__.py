"""mxdist: the command-line launcher for psnode jobs (``mxdist launch|status|stop|logs|jobs|clean``).

Installed as the package ``mxdist`` from the ``cli/`` folder; modules import each other
relatively.  The rooms, top to bottom: each imports only rooms below it (pyproject.toml's
layers contract checks it; rooms on one row never import each other; each sub-package's
docstring states its contract):

=================  =========================================================================
room               modules
=================  =========================================================================
``main``           typer commands (the only importer of typer); ``__main__``: ``python -m mxdist``
``supervisor``     ``setup``, ``settings``, ``preflight``, ``supervisor``, ``membership``,
                   ``conclusion``, ``detach``
``control``        acting on a recorded job through its backend: ``teardown``, ``commands``
                   (status, stop, scale, logs, the job list), ``takeover``, ``history``
``ui``             rendering: the only importer of rich (beside ``control``)
``view``           pure: what status, jobs and the dry run show
``backends``       ``base`` (the Backend contract, capabilities), ``local``, ``ssh``,
                   ``slurm``, ``registry``, ``agent`` (host-side, standard library only;
                   imported by the backends alone)
                   (beside ``view``)
``job``            ``records`` (standard library only), ``lifecycle``, ``rootcause`` (pure)
``elastic``        ``rules`` (pure), ``discovery``
``planning``       pure: ``hosts``, ``plan``, ``bounds``, ``gpus``, ``torchenv``, ``engines``,
                   ``options``
=================  =========================================================================
"""
