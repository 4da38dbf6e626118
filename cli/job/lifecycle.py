"""The supervision rules of a running job (pure: no I/O, no clock).

The supervisor (:mod:`mxdist.supervisor.supervisor`) feeds every process exit to :meth:`Supervision.exited` and
does what it answers:

* ``CONTINUE``: nothing to do;
* ``RESTART``: start the process again (same host, rank and environment; restart count + 1);
* ``LOSE``: an elastic job's worker is lost for good and the job goes on without it (rule 7);
* ``FAIL``: the job failed: stop everything, name the root cause;
* ``WIND_DOWN``: every worker exited 0: the job succeeded; the scheduler and servers still
  running are given a short time to end by themselves (a psnode job's servers write their
  final checkpoints; MXNet's end when the workers' kvstores close), or stopped at once when
  the job never used psnode (:meth:`Supervision.wait_for_rest`);
* ``FAIL_OVER``: the scheduler is lost and the standby scheduler takes the job over (rule 8);
* ``DONE``: nothing of the job runs any more.

Rules:

1. A worker that exits 0 is finished.  When all workers have finished: ``WIND_DOWN``.
2. A worker that fails (non-zero, signal, vanished) is restarted while it has restarts left
   (``--max-restarts``, counted per process) and the job is not winding down; else ``FAIL``.
3. A server that fails is restarted when its state outlives it (``servers_restart``: servers
   checkpoint, ``--checkpoint-dir``, or are replicated, ``--replicas`` 2 or more) and it has
   restarts left; else ``FAIL``.  The scheduler killed by a signal or lost without an exit
   status (kill -9, the OOM killer) is restarted at its address up to ``scheduler_restarts``
   times (:data:`SCHEDULER_RESTARTS` for a psnode job, whatever ``--max-restarts``: it holds
   nothing the live nodes cannot give back, :mod:`psnode.scheduler.rebuild`); any other end of
   the scheduler before the workers finished (its exit code: the job's verdict) is ``FAIL``.
4. The scheduler or a server exiting 0 is not an event (psnode's scheduler ends a job before
   its workers' interpreters exit); after ``WIND_DOWN`` their failures are reported but do not
   change the outcome: the workers' results are in.
5. **Crash loops end.**  A failure within ``QUICK`` seconds of the process's start is quick.
   A replacement that fails quickly *the same way* as its predecessor (the same exit status
   and the same last exception: :class:`Failure`), ``CRASH_LOOP`` times in a row, is ``FAIL``
   with :attr:`Supervision.crash_loop` saying so, whatever restarts are left.  A death by a
   signal sent from outside (KILL, TERM, INT, HUP: an operator, the OOM killer, a test) is no
   failure of its own: it never counts towards a loop, and its restart is immediate.
6. **Restarts back off** (as Kubernetes' CrashLoopBackOff): after the second quick failure of
   its own in a row the restart waits :meth:`Supervision.delay` seconds, ``BACKOFF``, doubling
   with each further one up to ``BACKOFF_MAX``; after a first one, a process that ran longer
   than ``QUICK``, or one killed from outside, restarts at once (a back off would only hand the
   time to the next kill of a storm of them).
7. **Elastic jobs** (``minimum`` set: ``--min-workers``/``--max-workers`` other than ``-n``): a
   worker that fails with no restart left (rule 2) is ``LOSE`` while at least ``minimum`` workers
   still run (or some worker already finished its work: exit code 0, not asked to leave), and
   the job goes on without it; else ``FAIL`` with :attr:`Supervision.shortfall` saying why.
   Workers that joined while the job runs (:meth:`Supervision.add_worker`) follow the same
   rules; the job winds down when every worker has finished or is lost.
8. **A standby scheduler** (``standby``: ``--standby-scheduler``) is never restarted and never
   waited for: while the scheduler runs it idles, and the job is ``DONE`` once everything else
   ended (the supervisor stops it).  The scheduler failing before the workers finished, the
   standby running, is ``FAIL_OVER`` (never restarted at its address: two schedulers would
   split the job); from then on the standby is the job's scheduler (:attr:`Supervision.scheduler`),
   and its failure is ``FAIL`` unless a new standby runs by then (:meth:`Supervision.add_standby`:
   the supervisor starts one on another live host after each failover), which makes it
   ``FAIL_OVER`` again.  A standby that fails while idle is ``CONTINUE``: the job goes on without one.
"""
from __future__ import annotations

import signal
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

from ..elastic.rules import shortfall

QUICK = 10.0          # seconds: a failure this soon after the start is quick
CRASH_LOOP = 3        # quick failures the same way in a row, after the first failure, end the job
BACKOFF = 1.0         # seconds before the restart after a second quick failure in a row (doubling)
BACKOFF_MAX = 30.0
SCHEDULER_RESTARTS = 3  # restarts of a psnode job's scheduler (rule 3)
_OUTSIDE = {-signal.SIGKILL, -signal.SIGTERM, -signal.SIGINT, -signal.SIGHUP}


@dataclass(frozen=True)
class Failure:
    """How a process failed: its exit status (``code``: -N for signal N, None: unknown), the
    last exception its log shows since it started (None: none), and how long it ran."""

    code: int | None
    exception: str | None = None
    ran: float = 0.0

    @property
    def own(self) -> bool:
        """It failed by itself (not by a signal from outside)."""
        return self.code not in _OUTSIDE

    def same(self, other: Failure | None) -> bool:
        return other is not None and (self.code, self.exception) == (other.code, other.exception)


class Action(str, Enum):
    CONTINUE = "continue"
    RESTART = "restart"
    LOSE = "lose"
    FAIL = "fail"
    WIND_DOWN = "wind_down"
    FAIL_OVER = "fail_over"
    DONE = "done"


@dataclass
class Supervision:
    """The state the rules need: which processes run, which workers are done, restarts used."""

    workers: set[str]
    others: set[str]                       # scheduler and servers
    max_restarts: int = 0
    servers_restart: bool = False          # --max-restarts with --checkpoint-dir or --replicas 2+
    scheduler_restarts: int = 0            # rule 3: restarts of the scheduler when killed
    running: set[str] = field(default_factory=set)
    finished: set[str] = field(default_factory=set)
    restarts: dict[str, int] = field(default_factory=dict)
    winding_down: bool = False
    crash_loop: str | None = None          # why the job ended as a crash loop (rule 5)
    minimum: int | None = None             # an elastic job's --min-workers (rule 7; None: not elastic)
    lost: set[str] = field(default_factory=set)
    leaving: set[str] = field(default_factory=set)   # asked to leave: never restarted
    shortfall: str | None = None           # why an elastic job ended: too few workers (rule 7)
    standby: str | None = None             # the idle standby scheduler's name (rule 8)
    scheduler: str = "scheduler"           # the job's scheduler: the first, or the standby that took over
    failed_over: bool = False              # a standby took the job over (rule 8)
    _last: dict[str, Failure] = field(default_factory=dict)
    _loop: dict[str, int] = field(default_factory=dict)     # quick failures the same way in a row
    _quick: dict[str, int] = field(default_factory=dict)    # quick failures in a row

    @classmethod
    def of(cls, procs: Iterable[tuple[str, str]], max_restarts: int = 0,
           servers_restart: bool = False, minimum: int | None = None,
           scheduler_restarts: int = 0) -> Supervision:
        """From ``(name, role)`` pairs of processes that were started (``minimum``: rule 7;
        ``scheduler_restarts``: rule 3; a second scheduler is the standby: rule 8)."""
        items = list(procs)
        workers = {n for n, role in items if role == "worker"}
        others = {n for n, role in items if role != "worker"}
        standby = next((n for n, role in items if role == "scheduler" and n != "scheduler"), None)
        return cls(workers, others, max_restarts, servers_restart, running={n for n, _ in items},
                   minimum=minimum, scheduler_restarts=scheduler_restarts, standby=standby)

    @property
    def _waited_for(self) -> set[str]:
        """What runs and ends the job by itself: everything but an idle standby (rule 8)."""
        return self.running if self.standby is None else self.running - {self.standby}

    def add_standby(self, name: str) -> None:
        """A new standby scheduler ``name`` started (after a failover): idle, as the first (rule 8)."""
        self.others.add(name)
        self.running.add(name)
        self.standby = name

    def add_worker(self, name: str) -> None:
        """A worker started while the job runs (an elastic job's joiner; a rank taken again
        starts afresh: no restarts used, no failures remembered)."""
        self.workers.add(name)
        self.running.add(name)
        self.finished.discard(name)
        self.lost.discard(name)
        self.leaving.discard(name)
        for counts in (self.restarts, self._last, self._loop, self._quick):
            counts.pop(name, None)

    def leave(self, name: str) -> None:
        """``name`` was asked to leave: it ends (exit code 0) at its next round boundary, and is
        not restarted if it fails meanwhile."""
        self.leaving.add(name)

    @property
    def live_workers(self) -> int:
        """Workers running (or restarting) that stay: those asked to leave do not count."""
        return len((self.running & self.workers) - self.leaving)

    def exited(self, name: str, ok: bool, failure: Failure | None = None) -> Action:
        """What to do now that ``name`` ended (``ok``: exit code 0; ``failure``: how it failed)."""
        self.running.discard(name)
        if not ok and failure is not None and not self.winding_down and self._looping(name, failure):
            return Action.FAIL
        if name in self.workers:
            if ok:
                self.finished.add(name)
            elif not self.winding_down and name not in self.leaving and self._may_restart(name):
                return self._restart(name)
            elif self.minimum is not None and not self.winding_down:
                return self._lose(name)
            else:
                return Action.FAIL
        elif name == self.standby:
            pass                                  # rule 8: an idle standby's end is no event
        elif not ok and not self.winding_down:
            if name == self.scheduler and self.standby in self.running:
                self.scheduler, self.standby, self.failed_over = self.standby, None, True
                return Action.FAIL_OVER
            if name.startswith("server") and self.servers_restart and self._may_restart(name):
                return self._restart(name)
            if name == "scheduler" and (failure is None or failure.code is None or failure.code < 0) \
                    and self.restarts.get(name, 0) < self.scheduler_restarts:
                return self._restart(name)
            return Action.FAIL
        if not self.winding_down and self.finished | self.lost == self.workers:
            return self._wind_down()
        return Action.CONTINUE if self._waited_for else Action.DONE

    def _wind_down(self) -> Action:
        self.winding_down = True
        return Action.WIND_DOWN if self._waited_for else Action.DONE

    def _looping(self, name: str, failure: Failure) -> bool:
        """Rule 5: record ``failure``; True (and :attr:`crash_loop` set) when it ends a loop."""
        quick = failure.ran < QUICK and failure.own
        self._quick[name] = self._quick.get(name, 0) + 1 if quick else 0
        same = quick and failure.same(self._last.get(name))
        self._loop[name] = self._loop.get(name, 0) + 1 if same else 0
        self._last[name] = failure
        if self._loop[name] < CRASH_LOOP:
            return False
        how = f"exit code {failure.code}" if failure.code is not None and failure.code >= 0 else \
            "killed by a signal" if failure.code is not None else "lost"
        self.crash_loop = (f"crash loop: {name} failed the same way {CRASH_LOOP + 1} times in a row, each "
                           f"restart within {QUICK:g} s of its start ({failure.exception or how}); "
                           "restarting it again would not help")
        return True

    def delay(self, name: str) -> float:
        """Seconds to wait before restarting ``name`` (rule 6)."""
        n = self._quick.get(name, 0)
        return 0.0 if n < 2 else min(BACKOFF_MAX, BACKOFF * 2 ** (n - 2))

    def _may_restart(self, name: str) -> bool:
        return self.restarts.get(name, 0) < self.max_restarts

    def limit(self, name: str) -> int:
        """How many restarts ``name`` may have (rules 2 and 3)."""
        return self.scheduler_restarts if name == "scheduler" else self.max_restarts

    def _restart(self, name: str) -> Action:
        self.restarts[name] = self.restarts.get(name, 0) + 1
        self.running.add(name)
        return Action.RESTART

    def restart_failed(self, name: str) -> Action:
        """The restart of ``name`` could not be started (e.g. no host with a free slot answers):
        the failure is final, and a worker of an elastic job is lost as by rule 7."""
        self.running.discard(name)
        if name in self.workers and self.minimum is not None and not self.winding_down:
            return self._lose(name)
        return Action.FAIL

    def _lose(self, name: str) -> Action:
        """Rule 7: worker ``name`` failed for good in an elastic job: lost while enough live."""
        # workers that finished their work (exit 0, not asked to leave) still count
        done = len(self.finished - self.leaving)
        self.shortfall = None if done else shortfall(self.live_workers, self.minimum or 0)
        if self.shortfall:
            return Action.FAIL
        self.lost.add(name)
        if self.finished | self.lost == self.workers:
            return self._wind_down()
        return Action.LOSE

    @staticmethod
    def wait_for_rest(ends_alone: bool | None) -> bool:
        """After ``WIND_DOWN``: give the scheduler and servers time to end by themselves only
        when the engine says they do (:meth:`mxdist.planning.engines.JobEngine.rest_ends_alone`): psnode's
        when the job used psnode (the scheduler said the job started), so final checkpoints are
        written, and a command that never used psnode (``hostname``) has nothing to wait for;
        MXNet's always."""
        return bool(ends_alone)
