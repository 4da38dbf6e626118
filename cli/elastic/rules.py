"""Elastic membership, the launcher's rules (pure: no I/O, no clock).

A job launched with ``-n W --min-workers M --max-workers N`` (defaults ``M = N = W``: a job of
fixed size) may change its workers while it runs; :mod:`psnode` keeps the values exact across
every change (docs/python-api.md, "Elastic membership").  The launcher's part:

* **Bounds** (:func:`mxdist.planning.bounds.bounds`, checked when the job is planned):
  ``1 <= M <= W <= N``.  ``M = N = W`` is not elastic: every rule below is today's.
* **Scale** (:func:`plan_scale`): ``mxdist scale JOB T`` with ``M <= T <= N``.  Up: the new
  workers take the lowest free ranks (:func:`free_ranks`; a rank is free when no live worker
  holds it) and the free slots in host order (:func:`free_slots`; a host's free slots are its
  slots less the live workers there), each with the lowest local rank free on its host.  Down:
  the highest live ranks leave (at their next round boundary, psnode's graceful leave).
  Workers already leaving do not count as live.
* **Lost** (:func:`shortfall`): a worker that failed with no restart left is lost; the job goes
  on while at least ``M`` workers live, else it fails naming the reason.
* **Moved** (:func:`new_home`): a worker to restart (``--max-restarts``) whose host does not
  answer restarts with its rank in the first free slot of a host that answers, never on the
  host that does not.
* **Discovery** (:func:`parse_discovery`): a host discovery script prints one ``host[:slots]``
  per line (Horovod's contract; ``#`` comments and blank lines ignored; ``slots`` default 1);
  a line is a host entry as in a hosts file (:mod:`mxdist.planning.hosts`: ``user@``, ``port=``,
  ``addr=``).  :func:`discovery_changes` compares two answers: hosts that appeared (new free
  slots) and hosts that vanished (their workers are lost).
"""
from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field

from ..planning.bounds import Bounds, ElasticError
from ..planning.hosts import Host, HostsError, parse_host_entry


@dataclass(frozen=True)
class Live:
    """A live worker: its rank, its host's label and its local rank there."""

    rank: int
    host: str
    local_rank: int = 0


@dataclass(frozen=True)
class Joiner:
    """A worker to start: its rank, the host (label) and local rank it gets."""

    rank: int
    host: str
    local_rank: int


@dataclass(frozen=True)
class ScaleChange:
    """What ``mxdist scale`` does: from ``current`` live workers to ``target``; ``joiners`` to
    start, ``leavers`` (ranks) to ask to leave."""

    current: int
    target: int
    joiners: tuple[Joiner, ...] = ()
    leavers: tuple[int, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.joiners and not self.leavers

    def workers_after(self, live: Sequence[Live]) -> dict[str, int]:
        """Host label -> its workers once this change is done (the ``live`` ones that stay and
        the joiners): a joiner's ``LOCAL_WORLD_SIZE`` (:mod:`mxdist.planning.torchenv`)."""
        counts: dict[str, int] = {}
        for host in [w.host for w in live if w.rank not in self.leavers] + [j.host for j in self.joiners]:
            counts[host] = counts.get(host, 0) + 1
        return counts


def free_ranks(live: Iterable[int], count: int, maximum: int) -> list[int]:
    """The ``count`` lowest ranks in ``[0, maximum)`` that no live worker holds."""
    taken = set(live)
    out = [r for r in range(maximum) if r not in taken][:count]
    if len(out) < count:
        raise ElasticError(f"only {len(out)} free rank{'s' if len(out) != 1 else ''} below --max-workers {maximum}")
    return out


def free_slots(hosts: Sequence[Host], live: Sequence[Live], count: int) -> list[tuple[str, int]]:
    """``count`` free slots as (host label, local rank), in host order: each host's slots less
    its live workers, each new worker the lowest local rank free on its host."""
    out: list[tuple[str, int]] = []
    for host in hosts:
        here = [w for w in live if w.host == host.label]
        used = {w.local_rank for w in here}
        free = max(0, host.slots - len(here))
        local = 0
        while free and len(out) < count:
            while local in used:
                local += 1
            out.append((host.label, local))
            used.add(local)
            free -= 1
    if len(out) < count:
        total = sum(h.slots for h in hosts)
        raise ElasticError(f"{count} more worker{'s' if count != 1 else ''} need{'s' if count == 1 else ''} "
                           f"{count} free slot{'s' if count != 1 else ''}, the hosts have {len(out)} "
                           f"({total} slot{'s' if total != 1 else ''}, {len(live)} in use)")
    return out


def new_home(rank: int, hosts: Sequence[Host], live: Sequence[Live], lost: Collection[str]) -> Joiner:
    """Where worker ``rank``, whose host does not answer, restarts with its rank: the first free
    slot (:func:`free_slots`, host order) of a host not in ``lost`` (labels), the ``live``
    workers other than ``rank`` holding theirs; ElasticError saying why there is none."""
    usable = [h for h in hosts if h.label not in lost]
    try:
        [(label, local)] = free_slots(usable, [w for w in live if w.rank != rank], 1)
    except ElasticError:
        gone = ", ".join(sorted(lost)) or "none"
        raise ElasticError(f"no host that answers has a free slot for worker {rank} (hosts lost: {gone}; "
                           f"give spare slots in the hosts file, e.g. a host with slots=1 that runs nothing "
                           f"at launch)") from None
    return Joiner(rank, label, local)


def plan_scale(target: int, limits: Bounds, hosts: Sequence[Host], live: Sequence[Live]) -> ScaleChange:
    """The change from the ``live`` workers to ``target`` (module docstring); ElasticError when
    ``target`` is out of bounds or the free slots do not fit it."""
    limits.check(target)
    current = len(live)
    if target > current:
        ranks = free_ranks((w.rank for w in live), target - current, limits.maximum)
        slots = free_slots(hosts, live, target - current)
        joiners = tuple(Joiner(r, h, lr) for r, (h, lr) in zip(ranks, slots, strict=True))
        return ScaleChange(current, target, joiners=joiners)
    leavers = tuple(sorted((w.rank for w in live), reverse=True)[:current - target])
    return ScaleChange(current, target, leavers=tuple(sorted(leavers)))


def shortfall(live: int, minimum: int) -> str | None:
    """Why a job with ``live`` workers left cannot go on (None: it can)."""
    if live >= minimum:
        return None
    return (f"{live} worker{'s' if live != 1 else ''} live, at least {minimum} needed (--min-workers)")


# -- discovery ----------------------------------------------------------------------------------

def parse_discovery(text: str, where: str = "discovery script") -> list[Host]:
    """The hosts a discovery script printed: ``[user@]host[:slots]`` per line (module docstring).
    Errors name ``where:line``; a host listed twice is one error too."""
    hosts: list[Host] = []
    seen: set[str] = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        at = f"{where}:{number}"
        host = parse_host_entry(line, at)
        if host.label in seen:
            raise HostsError(f"{at}: {host.label} is listed twice")
        seen.add(host.label)
        hosts.append(host)
    return hosts


@dataclass(frozen=True)
class DiscoveryChanges:
    """Two answers of a discovery script compared: hosts that appeared, vanished, or kept their
    name with other slots (``resized``, as they are now)."""

    added: tuple[Host, ...] = ()
    removed: tuple[Host, ...] = ()
    resized: tuple[Host, ...] = field(default=())

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.resized)


def discovery_changes(before: Sequence[Host], after: Sequence[Host]) -> DiscoveryChanges:
    """What changed from ``before`` to ``after`` (hosts compared by label)."""
    old = {h.label: h for h in before}
    new = {h.label: h for h in after}
    return DiscoveryChanges(
        added=tuple(h for h in after if h.label not in old),
        removed=tuple(h for h in before if h.label not in new),
        resized=tuple(h for h in after if h.label in old and old[h.label].slots != h.slots))


# -- mxdist scale's answer ----------------------------------------------------------------------

@dataclass(frozen=True)
class ScaleAnswer:
    """The supervisor's answer to ``mxdist scale`` (a JSON object, :meth:`to_dict`): the change
    made (``change``; with ``dry_run`` only planned), or why none was (``error``; ``refused``:
    the request asks what the job cannot do)."""

    job: str
    change: ScaleChange | None = None
    error: str = ""
    dry_run: bool = False
    refused: bool = False     # the request itself cannot be honoured (out of bounds, no free slots)

    def to_dict(self) -> dict[str, object]:
        c = self.change
        return {"job": self.job, "error": self.error, "dry_run": self.dry_run, "refused": self.refused,
                "change": None if c is None else {
                    "current": c.current, "target": c.target, "leavers": list(c.leavers),
                    "joiners": [{"rank": j.rank, "host": j.host, "local_rank": j.local_rank} for j in c.joiners]}}

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> ScaleAnswer:
        c = data.get("change")
        change = None
        if isinstance(c, dict):
            change = ScaleChange(int(c["current"]), int(c["target"]),
                                 tuple(Joiner(int(j["rank"]), str(j["host"]), int(j["local_rank"]))
                                       for j in c.get("joiners") or ()),
                                 tuple(int(r) for r in c.get("leavers") or ()))
        return cls(str(data.get("job", "")), change, str(data.get("error") or ""), bool(data.get("dry_run")),
                   bool(data.get("refused")))

    def lines(self) -> list[str]:
        """What changed (would change, with ``dry_run``), in words."""
        c = self.change
        if c is None:
            return []
        if c.empty:
            return [f"job {self.job} runs {c.current} worker{'s' if c.current != 1 else ''} already: nothing to change"]
        verb = "would start" if self.dry_run else "started"
        out = [f"{verb} worker {j.rank} on {j.host} (local rank {j.local_rank})" for j in c.joiners]
        if c.leavers:
            ranks = ", ".join(map(str, c.leavers))
            out.append(f"{'would ask' if self.dry_run else 'asked'} worker{'s' if len(c.leavers) > 1 else ''} "
                       f"{ranks} to leave: {'they end' if len(c.leavers) > 1 else 'it ends'} at the next round "
                       "boundary, exit code 0")
        head = "would scale" if self.dry_run else "scaled"
        return [f"job {self.job}: {head} from {c.current} to {c.target} workers", *out]
