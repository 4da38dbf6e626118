"""The benchmark workload: case definitions and round counts (shared by every role).

A dense case is K keys of B bytes of float32.  One round on each worker: push the K gradients,
pull the K aggregated values.  Per-worker throughput = 2*K*B / round time.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
from dataclasses import asdict, dataclass

KiB = 1024
MiB = 1024 * KiB


@dataclass(frozen=True)
class Case:
    name: str
    keys: int          # K (dense) / unused for row_sparse
    nbytes: int        # B: bytes per key
    warmup: int
    rounds: int        # timed rounds (full run)
    quick_rounds: int  # timed rounds (--quick)
    kind: str = "dense"  # dense | sparse

    def timed(self, quick: bool) -> int:
        return self.quick_rounds if quick else self.rounds

    def warm(self, quick: bool) -> int:
        return max(1, self.warmup // 3) if quick else self.warmup

    @property
    def elems(self) -> int:
        return self.nbytes // 4


DENSE = [
    Case("1x4KiB", 1, 4 * KiB, 50, 1000, 100),
    Case("1x1MiB", 1, 1 * MiB, 10, 200, 20),
    Case("1x16MiB", 1, 16 * MiB, 3, 30, 4),
    Case("1x64MiB", 1, 64 * MiB, 2, 10, 3),
    Case("16x1MiB", 16, 1 * MiB, 3, 30, 4),
    Case("200x16KiB", 200, 16 * KiB, 5, 60, 6),
]
SPARSE_ROWS, SPARSE_COLS, SPARSE_FRACTION = 200_000, 64, 0.01
SPARSE = [
    # row_sparse push + row_sparse_pull of 1% random rows (fresh each round)
    Case("rowsparse1%", 1, SPARSE_ROWS * SPARSE_COLS * 4, 5, 40, 5, kind="sparse"),
    # dense push + pull of the whole table, same cluster
    Case("densetable", 1, SPARSE_ROWS * SPARSE_COLS * 4, 2, 8, 2, kind="dense"),
]
ALL = {c.name: c for c in DENSE + SPARSE}


def select(names: list[str] | None) -> list[Case]:
    if not names:
        return list(ALL.values())
    unknown = [n for n in names if n not in ALL]
    if unknown:
        raise SystemExit(f"unknown case(s) {unknown}; known: {', '.join(ALL)}")
    return [ALL[n] for n in names]


def encode_cases(cases: list[Case]) -> str:
    return json.dumps([asdict(c) for c in cases])


def decode_cases(text: str) -> list[Case]:
    return [Case(**d) for d in json.loads(text)]


MARK = "BENCHRESULT "
RESULT_FILE: list[str] = []   # set by a worker told to write its results to a file too


def report(**fields) -> None:
    """One result line on stdout for the driver (and appended to RESULT_FILE[0] when set:
    through ``mxdist launch`` the streamed lines are prefixed and may be wrapped)."""
    line = MARK + json.dumps(fields)
    print(line, flush=True)
    if RESULT_FILE:
        with open(RESULT_FILE[0], "a") as fh:
            fh.write(line + "\n")


def summarize(times: list[float]) -> dict[str, float]:
    return {"median": statistics.median(times), "min": min(times), "n": len(times)}


def leave_gloo(dist) -> None:
    """End a ``torch.distributed`` peer after its results: a barrier, then the process ends
    without tearing gloo down.  With torch 2.13 on Python 3.11 a rank whose group is torn down
    (``destroy_process_group``, freeing DDP, or the interpreter's own exit) can die by SIGABRT
    ("terminate called without an active exception") after reporting; under ``mxdist launch``
    psnode's exit guard prevents that, and these peers run as torchrun would start them."""
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def fail(msg: str) -> None:
    print(f"benchmark check failed: {msg}", file=sys.stderr, flush=True)
    raise SystemExit(3)
