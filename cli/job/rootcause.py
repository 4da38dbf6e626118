"""The root cause of a failed job, named once (pure: no I/O).

Evidence per process (:class:`Outcome`): how it ended (exit status, and when its exit status
was written), its failure record (:mod:`psnode.protocol.failure`: written by the process itself, with a
timestamp, when it failed; for a script decorated with torch elastic's ``@record``, the error
file torch wrote, read as such a record), the last exception line of its log, and whether the supervisor
stopped it.  The scheduler's failure record carries its verdict: the node it blames (one that
reported a failure, or one silent past the heartbeat timeout) and since when.

Rules (:func:`decide`):

1. A process failed *for its own reason* when its failure record says ``exception``, or, with no
   record saying it ended because of the job (``job_ended``), it exited non-zero or by a signal
   the supervisor did not send.  The scheduler's non-zero exit after a verdict is not a reason
   of its own.
2. The scheduler's culprit is a candidate too, at the time of its verdict (for a silent node:
   when it was last heard from), with the scheduler's words (``stopped responding ...``) unless
   the culprit's own record says more.
3. The root cause is the candidate that failed **first** (by those timestamps, never by the
   order in which the supervisor learnt of the exits); ties go to workers, then servers.
4. Everything else that did not end well is a consequence, one line each (``ended with the
   job`` for every process that ended because of the failure, by itself or stopped by the
   supervisor); processes on hosts that could not be reached are "not verified".  A process
   whose log ends with an exception of its own (not the job's end, not an interrupt) ``failed
   too`` with it, stopped or not: the supervisor's stop may only have cut its exit short.

Headline: ``worker 1 on host-b: ValueError: bad batch`` (the exception when a Python script
raised; else the exit status or the scheduler's words).  When the root cause's exception comes
from a torch elastic error file, :attr:`RootCause.source` names that file (on its host) and
:attr:`RootCause.time` is when it was written.
"""
from __future__ import annotations

import math
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field

from psnode.launcher import FailureKind, FailureRecord, record_of

from .records import UNVERIFIED, Cause

_ROLE_ORDER = {"worker": 0, "server": 1, "scheduler": 2}


@dataclass(frozen=True)
class Outcome:
    """One process at the end of a job (see the module docstring)."""

    name: str
    role: str
    rank: int | None
    host: str
    code: int | None = None           # exit status: code, -N for signal N, None unknown
    when: float | None = None         # when its exit status was written (wall clock)
    failure: FailureRecord | None = None  # (its JSON object is read as the record, or None)
    exception: str | None = None      # "Type: message" from its log
    stopped: bool = False             # ended by the supervisor (or mxdist stop)
    verified: bool = True             # False: its host could not be reached
    running: bool = False             # still running when last checked

    def __post_init__(self) -> None:
        object.__setattr__(self, "failure", record_of(self.failure))

    @property
    def who(self) -> str:
        return f"{self.role if self.rank is None else f'{self.role} {self.rank}'} on {self.host}"


@dataclass(frozen=True)
class RootCause:
    """The verdict on a failed job."""

    headline: str                      # "worker 1 on host-b: ValueError: bad batch"
    name: str | None = None            # the root cause's process name, if one
    reason: str = ""                   # "ValueError: bad batch" / "exit code 3" / "stopped responding ..."
    time: float | None = None
    consequences: tuple[str, ...] = field(default_factory=tuple)
    source: str | None = None          # the torch elastic error file the reason was read from

    def recorded(self) -> Cause:
        """As the job record keeps it."""
        return Cause(self.headline, self.name, self.reason, self.time, self.source)


def describe_code(code: int | None) -> str:
    if code is None:
        return "ended without an exit status"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _kind(o: Outcome) -> FailureKind | None:
    return o.failure.kind if o.failure else None


def _own(o: Outcome, verdict_given: bool) -> tuple[float, str] | None:
    """(time, reason) if ``o`` failed for its own reason (rule 1), else None."""
    if o.failure is not None and o.failure.kind is FailureKind.EXCEPTION:
        reason = o.failure.exception or o.exception or describe_code(o.code)
        return o.failure.time, reason
    if _kind(o) in (FailureKind.JOB_ENDED, FailureKind.VERDICT) or o.stopped or o.running or not o.verified:
        return None
    if o.role == "scheduler" and verdict_given:
        return None
    if o.code == 0:
        return None
    reason = o.exception or describe_code(o.code)
    if o.exception and o.code not in (None, 1):
        reason += f" ({describe_code(o.code)})"
    return (o.when if o.when is not None else math.inf), reason


def _culprit(outcomes: Sequence[Outcome], verdict: FailureRecord) -> Outcome | None:
    who = verdict.culprit
    if who is None:
        return None
    for o in outcomes:
        if o.role == who.role and o.rank == who.rank:
            return o
    return None


def decide(outcomes: Sequence[Outcome], first_seen: str | None = None) -> RootCause | None:
    """The root cause among ``outcomes`` (rules in the module docstring), or None when nothing
    failed.  ``first_seen``: the process whose failure the supervisor saw first, used only when
    no evidence names anything else."""
    verdict = next((o.failure for o in outcomes if o.role == "scheduler" and _kind(o) is FailureKind.VERDICT), None)
    candidates: dict[str, tuple[float, str]] = {}
    for o in outcomes:
        own = _own(o, verdict is not None)
        if own is not None:
            candidates[o.name] = own
    if verdict is not None:
        culprit = _culprit(outcomes, verdict)
        if culprit is None and verdict.reason:   # a verdict on the job itself (registration...)
            sched = next(o for o in outcomes if o.role == "scheduler" and _kind(o) is FailureKind.VERDICT)
            candidates[sched.name] = (verdict.time or math.inf, verdict.reason)
        if culprit is not None:
            when = verdict.time or math.inf
            mine = candidates.get(culprit.name)
            reason = mine[1] if mine and _kind(culprit) is FailureKind.EXCEPTION else (verdict.reason or "failed")
            if reason.startswith("failed: ") and mine:
                reason = mine[1]
            candidates[culprit.name] = (min(when, mine[0]) if mine else when, reason)
    by_name = {o.name: o for o in outcomes}
    if not candidates and first_seen in by_name:
        o = by_name[first_seen]
        candidates[o.name] = (o.when or math.inf, o.exception or describe_code(o.code))
    if not candidates:
        return None
    name = min(candidates, key=lambda n: (candidates[n][0], _ROLE_ORDER.get(by_name[n].role, 3), n))
    when, reason = candidates[name]
    cause = by_name[name]
    consequences = tuple(_consequence(o, reason) for o in outcomes if o.name != name and _consequence(o, reason))
    source = cause.failure.source if cause.failure is not None and _kind(cause) is FailureKind.EXCEPTION else None
    return RootCause(headline=f"{cause.who}: {reason}", name=name, reason=reason,
                     time=None if math.isinf(when) else when, consequences=consequences, source=source)


#: Exceptions that say a process was interrupted, not that it failed.
_INTERRUPTS = ("KeyboardInterrupt", "SystemExit")


def _failed_too(o: Outcome) -> str | None:
    """The error a process other than the root cause failed with by itself (rule 4), or None."""
    if _kind(o) is FailureKind.EXCEPTION and o.failure is not None:
        return o.failure.exception or o.exception or describe_code(o.code)
    if _kind(o) in (FailureKind.JOB_ENDED, FailureKind.VERDICT) or not o.exception or o.code == 0:
        return None
    return None if o.exception.split(":")[0].strip() in _INTERRUPTS else o.exception


def _consequence(o: Outcome, cause: str = "") -> str:
    """One line for a process that did not end well because of the root cause (its reason:
    ``cause``), '' if it did."""
    if not o.verified:
        return f"{o.who}: {UNVERIFIED}"
    if o.running:
        return f"{o.who}: still running"
    error = _failed_too(o)
    if error is not None:
        same = error == cause
        return f"{o.who}: failed too, with the same error ({error})" if same else f"{o.who}: failed too: {error}"
    if _kind(o) is FailureKind.JOB_ENDED or o.stopped:   # by itself or stopped by the supervisor: the same reason
        return f"{o.who}: ended with the job"
    if o.code == 0:
        return ""
    if _kind(o) is FailureKind.VERDICT:
        return f"{o.who}: ended the job ({describe_code(o.code)})"
    return f"{o.who}: {describe_code(o.code)}" + (f" ({o.exception})" if o.exception else "")
