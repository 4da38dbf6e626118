"""Aggregation rules: how the pushes of one round of a key part fold into its aggregate (pure numpy).

A rule is chosen once per store (``psnode.kv.create(..., aggregator=name)``), travels in each key
part's init by its name (psnode.protocol.ops.Init), is applied by the servers' rounds
(psnode.server.rounds, psnode.server.buckets) and is saved by name in checkpoints.

Contract of :class:`Aggregation`: a round's aggregate is ``fold`` (an elementwise numpy ufunc,
associative and commutative, so the order pushes arrive in does not change it) over the pushes
of its contributors, then, for a ``mean`` rule, divided by their number.  For row_sparse keys
the fold runs per row over the pushes holding it; a mean divides by every contributor (rows a
push lacks count as zero for ``np.add``).  Each worker's push is what it gave (several arrays
for one key are summed on the worker, MXNet's rule); the rule combines workers' pushes.

Adding a rule is one line in :data:`RULES` (and its tests): the servers, the wire and the
checkpoints carry it by name.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from psnode.math.sparse import combine_rows, sorted_runs

CHUNK = 65536   # elements per step of fold_scaled (a few hundred KiB: the fold is still in cache)


@dataclass(frozen=True)
class Aggregation:
    """One rule: ``name`` (what users pass and the wire and checkpoints carry), ``fold`` (two
    pushes into one), ``mean`` (the fold divided by the round's contributors), ``about`` (one
    line for users)."""

    name: str
    fold: np.ufunc
    mean: bool = False
    about: str = ""

    @property
    def additive(self) -> bool:
        """Does the fold add (so a compressed push may be decoded straight into the sum)?"""
        return self.fold is np.add

    def scale(self, n: int) -> float:
        """The factor the fold of ``n`` pushes is multiplied by (1.0: none)."""
        return 1.0 / n if self.mean and n > 1 else 1.0

    def fold_scaled(self, a: np.ndarray, b: np.ndarray, out: np.ndarray, scale: float = 1.0,
                    to: np.ndarray | None = None) -> None:
        """``out = fold(a, b)``, then (``scale`` != 1) ``out *= scale`` -- or, with ``to``, ``to =
        out * scale`` -- chunk by chunk, so the second pass reads what the first just wrote
        from cache.  The result is bit-identical to the two whole-array passes."""
        fold = self.fold
        if scale == 1.0 and to is None:
            fold(a, b, out=out)
            return
        if out.size <= CHUNK and a.shape == b.shape == out.shape and (to is None or to.shape == out.shape):
            fold(a, b, out=out)       # (one chunk: no views to make)
            np.multiply(out, scale, out=out if to is None else to, casting="unsafe")
            return
        a, b, out = a.reshape(-1), b.reshape(-1), out.reshape(-1)
        dest = out if to is None else to.reshape(-1)
        for lo in range(0, out.size, CHUNK):
            hi = lo + CHUNK
            o = out[lo:hi]
            fold(a[lo:hi], b[lo:hi], out=o)
            np.multiply(o, scale, out=dest[lo:hi], casting="unsafe")

    def fold_rows(self, parts: list[tuple[np.ndarray, np.ndarray]],
                  buf: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Row_sparse pushes ``(rows, data)`` folded: sorted unique rows and their data (a fresh
        array, or for ``np.add`` possibly a view of ``buf``: psnode.math.sparse.combine_rows)."""
        if self.additive:
            return combine_rows(parts, buf)
        rows, data, order, starts = sorted_runs(parts)
        if not len(rows):
            return rows, data
        return rows[starts], self.fold.reduceat(data[order], starts, axis=0)


SUM = Aggregation("sum", np.add, about="the sum of the pushes (MXNet's kvstore)")
AVERAGE = Aggregation("average", np.add, mean=True, about="the sum divided by the pushes it holds (the default)")
MAX = Aggregation("max", np.maximum, about="the elementwise maximum of the pushes")

#: every rule by name (the order users see them in)
RULES: dict[str, Aggregation] = {r.name: r for r in (AVERAGE, SUM, MAX)}


def parse(name: object, where: str) -> Aggregation:
    """The rule named ``name``; a ValueError naming it, ``where`` it came from and the rules."""
    rule = RULES.get(name) if isinstance(name, str) else None
    if rule is None:
        raise ValueError(f"unknown aggregator {str(name)[:40]!r} ({where}): use one of "
                         f"{', '.join(repr(n) for n in RULES)}")
    return rule


__all__ = ["AVERAGE", "CHUNK", "MAX", "RULES", "SUM", "Aggregation", "parse"]
