"""The supervision rules of a running job (pure: no I/O, no clock).

The supervisor (:mod:`cli.launch`) feeds every process exit to :meth:`Supervision.exited` and
does what it answers:

* ``CONTINUE``: nothing to do;
* ``RESTART``: start the process again (same host, rank and environment; restart count + 1);
* ``FAIL``: the job failed: stop everything, name the root cause;
* ``WIND_DOWN``: every worker exited 0: the job succeeded; the scheduler and servers still
  running are given a short time to end by themselves (a psnode job's servers write their
  final checkpoints), or stopped at once when the job never used psnode
  (:meth:`Supervision.wait_for_rest`);
* ``DONE``: nothing of the job runs any more.

Rules:

1. A worker that exits 0 is finished.  When all workers have finished: ``WIND_DOWN``.
2. A worker that fails (non-zero, signal, vanished) is restarted while it has restarts left
   (``--max-restarts``, counted per process) and the job is not winding down; else ``FAIL``.
3. A server that fails is restarted when servers checkpoint (``--checkpoint-dir``) and it has
   restarts left; else ``FAIL``.  The scheduler failing is ``FAIL``.
4. The scheduler or a server exiting 0 is not an event (psnode's scheduler ends a job before
   its workers' interpreters exit); after ``WIND_DOWN`` their failures are reported but do not
   change the outcome: the workers' results are in.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum


class Action(str, Enum):
    CONTINUE = "continue"
    RESTART = "restart"
    FAIL = "fail"
    WIND_DOWN = "wind_down"
    DONE = "done"


@dataclass
class Supervision:
    """The state the rules need: which processes run, which workers are done, restarts used."""

    workers: set[str]
    others: set[str]                       # scheduler and servers
    max_restarts: int = 0
    servers_restart: bool = False          # --max-restarts with --checkpoint-dir
    running: set[str] = field(default_factory=set)
    finished: set[str] = field(default_factory=set)
    restarts: dict[str, int] = field(default_factory=dict)
    winding_down: bool = False

    @classmethod
    def of(cls, procs: Iterable[tuple[str, str]], max_restarts: int = 0,
           servers_restart: bool = False) -> Supervision:
        """From ``(name, role)`` pairs of processes that were started."""
        items = list(procs)
        workers = {n for n, role in items if role == "worker"}
        others = {n for n, role in items if role != "worker"}
        return cls(workers, others, max_restarts, servers_restart, running={n for n, _ in items})

    def exited(self, name: str, ok: bool) -> Action:
        """What to do now that ``name`` ended (``ok``: exit code 0)."""
        self.running.discard(name)
        if name in self.workers:
            if ok:
                self.finished.add(name)
            elif not self.winding_down and self._may_restart(name):
                return self._restart(name)
            else:
                return Action.FAIL
        elif not ok and not self.winding_down:
            if name.startswith("server") and self.servers_restart and self._may_restart(name):
                return self._restart(name)
            return Action.FAIL
        if not self.winding_down and self.finished == self.workers:
            self.winding_down = True
            return Action.WIND_DOWN if self.running else Action.DONE
        return Action.CONTINUE if self.running else Action.DONE

    def _may_restart(self, name: str) -> bool:
        return self.restarts.get(name, 0) < self.max_restarts

    def _restart(self, name: str) -> Action:
        self.restarts[name] = self.restarts.get(name, 0) + 1
        self.running.add(name)
        return Action.RESTART

    def restart_failed(self, name: str) -> Action:
        """The restart of ``name`` could not be started: the failure is final."""
        self.running.discard(name)
        return Action.FAIL

    @staticmethod
    def wait_for_rest(psnode_started: bool | None) -> bool:
        """After ``WIND_DOWN``: give the scheduler and servers time to end by themselves only
        when the job used psnode (the scheduler said the job started), so final checkpoints are
        written; a command that never used psnode (``hostname``) has nothing to wait for."""
        return bool(psnode_started)
