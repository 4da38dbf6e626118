"""The restart storm, bounded for CI: 300 rounds of two keys (one in a bucket of small keys,
one split over both servers) while a seeded schedule kills eight random workers and servers
with SIGKILL, ``mxdist launch -n 3 -s 2 --max-restarts 50 --checkpoint-dir D
--checkpoint-rounds 1`` (tests/support/storm.py; benchmarks/faults/soak.py runs the long storm again and again).

Every rank checks the exact closed-form value after every round and at the end (a push
applied twice or lost changes it), the launcher exits 0, the same-host links are back to
every server at the end (shared-memory path), and nothing of the job is left on the host.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.storm import Storm, run_storm


@pytest.mark.parametrize("shm", [True, False], ids=["shm", "tcp"])
def test_a_kill_storm_ends_with_exact_values_on_every_rank(tmp_path: Path, shm: bool) -> None:
    storm = Storm(rounds=300, kills=8, interval=1.5, first_kill=1.0, seed=27 if shm else 72, shm=shm,
                  timeout=240, pace=0.03)
    out = run_storm(storm, tmp_path / "storm")
    assert out.ok, f"{out.line()}; kills: {out.kills}; logs in {out.workdir}"
    assert len(out.kills) == 8, out.kills
