"""Where servers run: at launch, and after the loss of a server's host (pure: no I/O).

With ``--replicas K`` (``PSNODE_REPLICAS``) server ``r``'s state is also held in memory by the
servers ``r+1 .. r+K-1`` (rank order, wrapping at ``-s``): its **copies**.  A copy protects the
state only from the loss of a host it is not on.

* **At launch** (:func:`place_servers`): the servers go round-robin over the hosts (server ``r``
  on host ``r mod H``).  With ``K`` > 1 and 2 or more hosts, ranks are then swapped (the hosts
  keep their server counts) while that spreads some server's state (its own and its copies)
  over more hosts, up to ``K`` hosts each: round-robin already does so when ``-s`` is a
  multiple of the hosts, except for the ranks that wrap around.  :func:`copies_at_home` names
  the servers whose every copy is on their own host (their state dies with it), for the plan's
  warning.
* **After a host loss** (:func:`server_home`): a server to restart whose host does not answer
  restarts with its rank on a host that answers: preferably one holding none of its copies and
  none of the servers it holds copies for, then the one with the fewest live servers of the job,
  ties in hosts-file order.
"""
from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TypeVar

H = TypeVar("H")


def copy_ranks(rank: int, servers: int, replicas: int) -> list[int]:
    """The servers holding copies of server ``rank``'s state: the next ``replicas``-1 ranks,
    wrapping at ``servers`` (never ``rank`` itself)."""
    return [(rank + j) % servers for j in range(1, min(replicas, servers))]


def _shortfall_at(placed: Sequence[object], replicas: int, width: int, ranks: Collection[int]) -> int:
    """Over the servers whose state (their own or a copy) is held by any of ``ranks``: how many
    hosts their state misses, each server's state being on at most ``width`` hosts."""
    n = len(placed)
    size = min(replicas, n)
    owners = {(r - j) % n for r in ranks for j in range(size)}
    return sum(width - len({placed[(o + j) % n] for j in range(size)}) for o in owners)


def place_servers(hosts: Sequence[H], count: int, replicas: int = 1) -> list[H]:
    """The host of each of ``count`` servers (index: rank): round-robin over ``hosts``, then,
    with ``replicas`` > 1 and 2 or more hosts, ranks swapped while a swap spreads the servers'
    states (each server's and its copies) over more hosts (module docstring)."""
    if not hosts:
        raise ValueError("no hosts to place servers on")
    placed = [hosts[r % len(hosts)] for r in range(count)]
    if replicas <= 1 or len(hosts) < 2 or count < 2:
        return placed
    width = min(replicas, count, len(hosts))
    while True:
        short = [r for r in range(count) if _shortfall_at(placed, replicas, width, {r}) > 0]
        best: tuple[int, int, int] | None = None
        for a in reversed(short):     # the highest ranks first: those that wrap around
            for b in range(count):
                if placed[a] == placed[b]:
                    continue
                before = _shortfall_at(placed, replicas, width, {a, b})
                placed[a], placed[b] = placed[b], placed[a]
                gain = before - _shortfall_at(placed, replicas, width, {a, b})
                placed[a], placed[b] = placed[b], placed[a]
                if gain > 0 and (best is None or gain > best[0]):
                    best = (gain, a, b)
        if best is None:
            return placed
        _, a, b = best
        placed[a], placed[b] = placed[b], placed[a]


def copies_at_home(hosts: Sequence[object], replicas: int) -> list[int]:
    """The servers (ranks; ``hosts[r]``: server ``r``'s host) whose every copy is on their own
    host: their state is lost with that host.  None with ``replicas`` 1 (no copies)."""
    n = len(hosts)
    return [r for r in range(n) if replicas > 1 and n > 1
            and all(hosts[c] == hosts[r] for c in copy_ranks(r, n, replicas))]


def server_home(rank: int, servers: int, replicas: int, hosts: Sequence[str], lost: Collection[str],
                server_hosts: Mapping[int, str]) -> str | None:
    """Where server ``rank`` (of ``servers``), whose host does not answer, restarts with its rank:
    a host label of ``hosts`` (hosts-file order) not in ``lost``; ``server_hosts`` maps the rank
    of every other live server to its host.  Preferred: a host holding no server that keeps a
    copy of ``rank``'s state or whose state ``rank`` keeps, then the fewest live servers, then
    hosts-file order.  None when every host is lost."""
    usable = [h for h in dict.fromkeys(hosts) if h not in lost]
    if not usable:
        return None
    others = {r: h for r, h in server_hosts.items() if r != rank}
    near = set(copy_ranks(rank, servers, replicas)) | {r for r in others if rank in copy_ranks(r, servers, replicas)}
    near_hosts = {others[r] for r in near if r in others}
    load = {h: sum(1 for x in others.values() if x == h) for h in usable}
    return min(usable, key=lambda h: (h in near_hosts, load[h], usable.index(h)))


__all__ = ["copies_at_home", "copy_ranks", "place_servers", "server_home"]
