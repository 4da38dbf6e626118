"""Placement of keys on servers: a pure function, identical on every worker.

Contract:

* A key with at most ``bound`` elements lives whole on one server: the server with the fewest
  bytes placed so far (ties: the lowest rank).  Workers place keys in the order they call
  ``init`` -- the same on every worker, as MXNet requires -- so every worker computes the same
  placement without talking to anyone.
* A key with more than ``bound`` elements is split into ``num_servers`` contiguous parts, part
  ``i`` on server ``i``.  Dense keys are split over the flattened array (equal element counts);
  row_sparse keys by ranges of rows, so a row lives on exactly one server.  A pulled big array is
  reassembled straight into the caller's ``out``.
* With ``slice_bytes`` > 0, a dense key of more than ``slice_bytes`` bytes is split too (below
  ``bound``), into ``m * num_servers`` parts of at most ``slice_bytes`` each (the least such
  ``m``), part ``i`` on server ``i % num_servers``: the parts of one array complete one after
  another, so answers flow back while later parts are pushed.
* ``bound=None`` (the ``data`` distribution) never splits.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Part:
    """One piece of a key: ``[lo, hi)`` over flat elements (dense) or rows (row_sparse)."""

    server: int
    index: int
    lo: int
    hi: int


@dataclass(frozen=True)
class Placement:
    key: int | str
    parts: tuple[Part, ...]
    by_rows: bool

    @property
    def split(self) -> bool:
        return len(self.parts) > 1


def split_ranges(n: int, k: int) -> list[tuple[int, int]]:
    """``k`` contiguous ranges covering ``[0, n)``, sizes differing by at most one."""
    base, extra = divmod(n, k)
    out, lo = [], 0
    for i in range(k):
        hi = lo + base + (1 if i < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


@dataclass
class Placer:
    """Places keys in init order; holds the bytes already placed on each server."""

    num_servers: int
    bound: int | None = 1_000_000
    slice_bytes: int = 0
    load: list[int] = field(default_factory=list)
    placed: dict[int | str, Placement] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.num_servers < 1:
            raise ValueError("placement needs at least one server")
        self.load = [0] * self.num_servers

    def place(self, key: int | str, shape: tuple[int, ...], itemsize: int,
              by_rows: bool = False) -> Placement:
        """The placement of ``key`` (computed once; later calls return the same)."""
        if key in self.placed:
            return self.placed[key]
        size = 1
        for d in shape:
            size *= d
        rows = shape[0] if shape else 1
        sliced = self.slice_bytes > 0 and not by_rows and size * itemsize > self.slice_bytes
        big = self.bound is not None and (size > self.bound or sliced) and self.num_servers > 1
        if big and by_rows and rows < self.num_servers:
            big = False
        if big:
            n = rows if by_rows else size
            row_elems = size // rows if by_rows and rows else 1
            count = self.num_servers
            if self.slice_bytes > 0 and not by_rows:
                per = self.num_servers * self.slice_bytes
                count *= max(1, -(-size * itemsize // per))
            parts = []
            for i, (lo, hi) in enumerate(split_ranges(n, count)):
                parts.append(Part(server=i % self.num_servers, index=i, lo=lo, hi=hi))
                self.load[i % self.num_servers] += (hi - lo) * row_elems * itemsize
        else:
            server = min(range(self.num_servers), key=lambda s: (self.load[s], s))
            self.load[server] += size * itemsize
            n = rows if by_rows else size
            parts = [Part(server=server, index=0, lo=0, hi=n)]
        placement = Placement(key=key, parts=tuple(parts), by_rows=by_rows)
        self.placed[key] = placement
        return placement
