"""Ends ``torch.distributed`` before the interpreter does, in every Python of an mxdist job.

Why: with gloo on Python < 3.13, a script that finished its work can still die by SIGABRT
at interpreter exit ("terminate called without an active exception"), under torchrun as under
any launcher.  A gloo thread frees a finished collective that holds a Python object (the
context autograd stashes during ``backward``); taking the GIL for that during finalization ends
the thread by ``pthread_exit``, whose unwinding through a C++ destructor calls
``std::terminate``.  The process group outlives the script whenever something still holds it
(DDP does), ``destroy_process_group()`` called by the script or not.

What: at exit, after the script's own ``atexit`` functions (this one was registered first, so
it runs last), when ``torch.distributed`` was imported: the default process group is destroyed
if it is still there, and a garbage collection frees what held the group, whose destructor then
joins gloo's threads while the interpreter is whole.  That runs in a helper thread, waited for
at most :data:`WAIT` seconds, so a collective that never completes (a peer gone) delays the exit
by that much and no more.  Nothing else changes: a process that never imported
``torch.distributed`` is untouched, and every error of the guard is swallowed (it must never
turn an exit into a failure).  ``MXDIST_EXIT_GUARD=0`` turns it off.

Then the next ``sitecustomize`` on ``sys.path`` (a distribution's, a virtual environment's, the
user's) is run, as Python would have run it without this one.
"""
from __future__ import annotations

import atexit
import os
import sys

#: Seconds the exit waits for the process group's teardown at most.
WAIT = 10.0


def _teardown() -> None:
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    import gc

    try:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - never fail an exit
        pass
    gc.collect()


def _guard() -> None:
    if "torch.distributed" not in sys.modules:
        return
    import threading

    try:
        t = threading.Thread(target=_teardown, name="mxdist-exit-guard", daemon=True)
        t.start()
        t.join(WAIT)
    except Exception:  # noqa: BLE001 - never fail an exit
        pass


def _chain() -> None:
    """Run the ``sitecustomize`` this module hides (the next one on ``sys.path``), if any."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or spec.origin == __file__:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


if os.environ.get("MXDIST_EXIT_GUARD", "1") != "0":
    atexit.register(_guard)
_chain()
