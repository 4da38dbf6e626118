"""The supervisor: the one owner of a running job and the only writer of its record.

``setup`` (options -> plan, backend, record: the I/O of a launch's preparation: free ports, the
discovery script's first answer, the backend finding its hosts), ``preflight`` (sync, host
checks, the job's secret), ``supervisor`` (the :class:`~mxdist.supervisor.supervisor.Supervisor`:
start, watch, apply the lifecycle rules), ``membership`` (elastic changes of a running job),
``conclusion`` (the end: :mod:`mxdist.control.teardown`, root cause, final record, report),
``detach`` (``launch -d``).  The supervisor composes its collaborators; they share its state
through it, never by inheritance, and read how to run the job from planning's
:class:`~mxdist.planning.options.LaunchSettings`, never from the supervisor's module.

Its place among the rooms (pyproject.toml's layers contract): above every room but
:mod:`mxdist.main`, which alone enters it.
"""
