"""The ``embedding`` case of benchmarks/kvstore/run.py: benchmarks/training/embedding.py's workload
(psnode W2 S2, the table on the servers, against DDP + gloo, W2) as two steps of run.py's
interleaved runs, each job started by embedding.py's own job functions.

A job gives one record per rank in run.py's form: ``system`` ``psnode`` (config "2,2") or
``ddp`` (config "2"), case ``embedding``, ``median`` the rank's seconds per timed step (1 /
its steps/s), ``steps_per_s`` as the rank measured it.  A job that fails or passes embedding.py's
memory cap gives no records (the run then has no ratio) and a line saying why.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

from benchmarks.report import DDP, DDP_CONFIG, EMBEDDING
from benchmarks.training import embedding as job

__all__ = ["EMBEDDING", "QUICK_EMBEDDING", "EmbeddingCase", "records_of"]


def records_of(system: str, config: str, got: list[dict]) -> list[dict]:
    """embedding_worker's result lines -> run.py records (seconds per step as ``median``)."""
    return [{"system": system, "config": config, "case": EMBEDDING, "rank": r["rank"],
             "median": 1.0 / r["steps_per_s"], "steps_per_s": r["steps_per_s"], "rows": r["rows"],
             "steps": r["steps"], "cpu_ms_per_step": r["cpu_ms_per_step"], "loss_last": r["loss_last"]}
            for r in got]


@dataclass(frozen=True)
class EmbeddingCase:
    """The workload's size and length, and the limits embedding.py puts on a job."""

    rows: int = 20_000_000
    steps: int = job.FULL["steps"]
    warmup: int = job.FULL["warmup"]
    timeout: float = 600.0
    cap_gib: float = 12.0     # embedding.py's defaults: a job's total PSS, the machine's floor
    floor_gib: float = 3.0

    def config(self) -> dict:
        return dict(job.FULL, rows=self.rows, steps=self.steps, warmup=self.warmup,
                    loss_window=min(job.FULL["loss_window"], self.steps))

    def describe(self) -> str:
        return f"embedding={self.rows / 1e6:g}M x 16 rows, {self.warmup}+{self.steps} steps"

    def _done(self, name: str, o: job.Outcome, system: str, config: str) -> list[dict]:
        if not o.fits:
            print(f"  embedding {name}: no result: {o.watch.killed or o.problem or 'a rank gave no result'}",
                  file=sys.stderr, flush=True)
            return []
        return records_of(system, config, o.records)

    def run_psnode(self, h) -> list[dict]:
        cfg = self.config()
        o = job.run_psnode(h, self.rows, cfg, self.timeout, self.cap_gib * job.GiB, self.floor_gib * job.GiB)
        return self._done("psnode", o, "psnode", "2,2")

    def run_ddp(self) -> list[dict]:
        cfg = self.config()
        o = job.run_ddp(self.rows, cfg, self.timeout, self.cap_gib * job.GiB, self.floor_gib * job.GiB)
        return self._done("DDP", o, DDP, DDP_CONFIG)


#: run.py --quick: embedding.py's --quick size and length
QUICK_EMBEDDING = EmbeddingCase(rows=200_000, steps=job.QUICK["steps"], warmup=job.QUICK["warmup"])
