"""mxdist: the command-line launcher for psnode jobs (``mxdist launch|status|stop|logs|jobs|clean``).

Installed as the package ``mxdist`` from the ``cli/`` folder; modules import each other
relatively.  The rooms (each sub-package's docstring states its contract):

=================  =========================================================================
room               modules
=================  =========================================================================
``mxdist``         ``main`` (typer commands: the only importer of typer), ``ui`` (rendering:
                   the only importer of rich), ``view`` (pure: what status, jobs and the dry
                   run show), ``__main__`` (``python -m mxdist``)
``planning``       pure: ``hosts``, ``plan``, ``gpus``, ``torchenv``, ``engines``, ``options``
``backends``       ``base`` (the Backend contract, capabilities), ``local``, ``ssh``,
                   ``slurm``, ``registry``, ``agent`` (host-side, standard library only)
``job``            ``records``, ``lifecycle``, ``rootcause``, ``teardown``, ``control``,
                   ``takeover``, ``history``
``supervisor``     ``setup``, ``preflight``, ``supervisor``, ``membership``, ``conclusion``,
                   ``detach``
``elastic``        ``rules`` (pure), ``discovery``
=================  =========================================================================
"""
