"""mxdist: the command-line launcher for psnode jobs (``mxdist launch|status|stop|logs``).

Modules: ``main`` (typer commands), ``hosts`` and ``plan`` (pure), ``options`` (options ->
plan), ``jobs`` (job records), ``backends`` (Backend protocol, LocalBackend), ``ssh``
(SshBackend), ``agent`` (host-side operations), ``launch`` (orchestration), ``control``
(status/stop/logs of recorded jobs), ``ui`` (rendering).
"""
