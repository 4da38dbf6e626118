"""benchmarks/training/stragglers.py's pure parts: the sleeps-only wall time of each mode, and the goals."""
from __future__ import annotations

import argparse

import pytest

from benchmarks.training import stragglers


def ideal(kind: str, mode: str, workers: int = 3) -> float:
    args = argparse.Namespace(workers=workers, steps=150, step_ms=40.0)
    return stragglers.ideal_seconds(kind, mode, args, 0)


def test_without_stragglers_every_mode_takes_the_steps_time() -> None:
    assert [ideal("none", m) for m in ("sync", "ssp1", "ssp3", "async", "drop")] == [pytest.approx(6.0)] * 5


def test_transient_stragglers_order_the_modes() -> None:
    sync, ssp1, ssp3, asyn = (ideal("transient", m) for m in ("sync", "ssp1", "ssp3", "async"))
    assert asyn < ssp3 < ssp1 < sync


def test_a_persistent_straggler_sets_every_mode_s_pace_unless_dropped() -> None:
    assert ideal("persistent", "ssp3") == ideal("persistent", "sync") == pytest.approx(150 * 0.12)
    assert ideal("persistent", "drop") == pytest.approx(150 * 0.04)


def test_goals_read_the_summary() -> None:
    rows = [{"kind": "transient", "mode": "ssp3", "ratio": 0.65, "accuracy_delta_pts": -0.2},
            {"kind": "none", "mode": "ssp3", "ratio": 1.07, "accuracy_delta_pts": 0.0}]
    assert [met for _, met, _ in stragglers.goals(rows)] == [True, False]


def test_a_backup_worker_never_waits_and_is_never_waited_for() -> None:
    assert ideal("none", "backup1") == pytest.approx(6.0)
    assert ideal("persistent", "backup1") == pytest.approx(150 * 0.12)   # (the straggler's own steps)
    assert ideal("transient", "backup1") < ideal("transient", "sync")


def test_the_backup_goal_reads_time_and_final_loss() -> None:
    rows = [{"kind": "persistent", "mode": "backup1", "ratio": 0.45, "loss_ratio": 1.3}]
    assert [met for _, met, _ in stragglers.goals(rows)] == [True]
    rows[0]["loss_ratio"] = 2.5
    assert [met for _, met, _ in stragglers.goals(rows)] == [False]
