"""Status rows: one typed row per process of a job, whoever produced it.

Two producers, one row type:

* the scheduler (:mod:`psnode.scheduler.loop`) answers STATUS with a row per registered node,
  states from :class:`NodeState`, counters from the nodes' heartbeats;
* the launcher (``mxdist status``) checks processes the scheduler does not know (not
  registered yet, a job without psnode, a scheduler that is gone) on their hosts, states from
  the job record's process states (``running``, ``exited``, ``failed``, ``stopped``, ``lost``,
  ``unknown``).

Rows travel as JSON objects (:meth:`NodeRow.to_dict`); :meth:`NodeRow.from_dict` accepts
partial or foreign objects (missing fields are None, unknown ones ignored).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from enum import Enum
from typing import Any

#: seconds over which a worker's ``waited_for`` share is measured (psnode.scheduler.slowness)
SLOW_WINDOW = 30.0
#: how much more of that window the others waited for a worker than, on average, for each of
#: the others, from which it is marked slow (:func:`excess`; ``NodeRow.slow``; ``mxdist status``
#: and the job's closing line name it).  Measured beyond the others' mean, so the waits every
#: worker causes now and then on a busy machine (about 5-10% each on 2 loaded cores) name
#: nobody, while a worker a few milliseconds slower per step (10-20% beyond them) is named.
SLOW_SHARE = 0.07


def excess(waited: Mapping[int, float], rank: int, workers: Iterable[int]) -> float:
    """How much more the others waited for worker ``rank`` than for each other worker of
    ``workers`` on average (``waited``: per worker, a share or seconds; absent: 0)."""
    others = [waited.get(w, 0.0) for w in workers if w != rank]
    return waited.get(rank, 0.0) - (sum(others) / len(others) if others else 0.0)


def excesses(waited: Mapping[int, float], workers: Iterable[int]) -> dict[int, float]:
    """:func:`excess` of every worker of ``workers`` (distinct ranks), in one pass over them."""
    ranks = list(workers)
    values = [waited.get(w, 0.0) for w in ranks]
    total, n = sum(values), len(ranks)
    if n < 2:
        return dict.fromkeys(ranks, waited.get(ranks[0], 0.0) if ranks else 0.0)
    return {w: v - (total - v) / (n - 1) for w, v in zip(ranks, values, strict=True)}


class NodeState(str, Enum):
    """A node as the scheduler sees it."""

    REGISTERED = "registered"   # registered, the job not complete yet
    ALIVE = "alive"             # welcomed, heartbeating
    FINISHED = "finished"       # a worker that called kv.close() (or whose script ended)
    DEAD = "dead"               # silent for longer than the heartbeat timeout
    RESTARTING = "restarting"   # failed or silent; its replacement is awaited (a worker stays a
                                # member of the rounds meanwhile: psnode.scheduler.roster)
    EXITED = "exited"           # said goodbye
    LOST = "lost"               # a worker removed from the membership for good (its process died,
                                # or went silent, in an elastic job); the job goes on without it


@dataclass
class NodeRow:
    """One process in ``mxdist status`` (``rate``: rounds per second for servers, pushes per
    second for workers, over the last heartbeats; a worker's ``waited_for``: the largest share
    of the last :data:`SLOW_WINDOW` seconds one other worker spent waiting for it, 0..1, and
    ``waited_for_total``: the most seconds one other worker waited for it over the job;
    psnode.scheduler.slowness; ``late``: its pushes dropped for coming after their round
    completed, backup workers, psnode.server.rounds; ``slow``: ``waited_for`` exceeds the other
    workers' mean by at least :data:`SLOW_SHARE`, :func:`excess`)."""

    role: str
    rank: int | None
    host: str
    state: str
    pid: int | None = None
    port: int | None = None
    heartbeat_age: float | None = None
    uptime: float | None = None
    restarts: int | None = None
    pushes: int | None = None
    pulls: int | None = None
    bytes_in: int | None = None
    bytes_out: int | None = None
    rounds: int | None = None
    rate: float | None = None
    dropped: int | None = None
    refused: int | None = None
    retries: int | None = None
    waited_for: float | None = None
    waited_for_total: float | None = None
    # big state (servers): values and optimizer state, bytes; bytes copied to the holders of its
    # replicas and written to checkpoints, in all and per round over the last heartbeats; per
    # holder, how many copies it is behind ([[holder, copies], ...]; a holder getting the state
    # whole: [holder, copies, bytes of it acknowledged, its bytes])
    state_bytes: int | None = None
    copied: int | None = None
    checkpointed: int | None = None
    copied_per_round: float | None = None
    checkpointed_per_round: float | None = None
    lag: list[list[int]] | None = None
    tables: list[list[Any]] | None = None   # tables without a row count: [[key, rows, admitted, evicted, dropped]]
    loop_gap: float | None = None   # the longest gap between two turns of its loop, last window, seconds
    late: int | None = None
    slow: bool | None = None
    step: str | None = None      # Slurm: the step running the process
    source: str = "scheduler"    # scheduler | host

    def to_dict(self) -> dict[str, Any]:
        """Its fields by name (shallow: the lists are the row's own)."""
        return dict(vars(self))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NodeRow:
        raw = {k: v for k, v in data.items() if k in _ROW_FIELDS}
        raw.setdefault("role", "?")
        raw.setdefault("rank", None)
        raw.setdefault("host", "?")
        raw.setdefault("state", "unknown")
        if isinstance(raw["rank"], int) and raw["rank"] < 0:
            raw["rank"] = None
        return cls(**raw)

    @property
    def name(self) -> str:
        return self.role if self.rank is None else f"{self.role}-{self.rank}"


_ROW_FIELDS = frozenset(f.name for f in fields(NodeRow))
