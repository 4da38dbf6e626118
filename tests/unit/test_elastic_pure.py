"""Elastic membership, the pure parts: the env contract's worker bounds and the scheduler's
bookkeeping (psnode.config, psnode.scheduler.elastic)."""
from __future__ import annotations

import pytest

from psnode.config import NodeConfig, Role
from psnode.errors import ConfigError
from psnode.scheduler.elastic import Elastic

ENV = {"PSNODE_ROLE": "worker", "PSNODE_SCHEDULER": "127.0.0.1:9000", "PSNODE_NUM_WORKERS": "3",
       "PSNODE_NUM_SERVERS": "1", "PSNODE_JOB_ID": "j"}


# ------------------------------------------------------------------ config
def test_worker_bounds_default_to_the_first_generation() -> None:
    cfg = NodeConfig.from_env(ENV)
    assert (cfg.min_workers, cfg.max_workers) == (None, None)
    assert (cfg.workers_min, cfg.workers_max, cfg.elastic) == (3, 3, False)
    assert "PSNODE_MIN_WORKERS" not in cfg.to_env()


def test_worker_bounds_round_trip() -> None:
    cfg = NodeConfig.from_env({**ENV, "PSNODE_MIN_WORKERS": "2", "PSNODE_MAX_WORKERS": "5"})
    assert (cfg.workers_min, cfg.workers_max, cfg.elastic) == (2, 5, True)
    env = cfg.to_env()
    assert (env["PSNODE_MIN_WORKERS"], env["PSNODE_MAX_WORKERS"]) == ("2", "5")
    assert NodeConfig.from_env(env) == cfg
    assert NodeConfig.from_env({**ENV, "PSNODE_MIN_WORKERS": "2"}).elastic


@pytest.mark.parametrize("extra,words", [
    ({"PSNODE_MIN_WORKERS": "4"}, ["PSNODE_MIN_WORKERS=4", "1 <= min <= num <= max"]),
    ({"PSNODE_MAX_WORKERS": "2"}, ["PSNODE_MAX_WORKERS=2", "PSNODE_NUM_WORKERS=3"]),
    ({"PSNODE_MIN_WORKERS": "0"}, ["PSNODE_MIN_WORKERS=0", ">= 1"]),
    ({"PSNODE_MAX_WORKERS": "x"}, ["PSNODE_MAX_WORKERS='x'"]),
])
def test_worker_bounds_are_validated(extra: dict[str, str], words: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        NodeConfig.from_env({**ENV, **extra})
    for w in words:
        assert w in str(err.value)


def test_node_config_checks_bounds_when_built_directly() -> None:
    with pytest.raises(ConfigError, match="need 1 <= min <= num <= max"):
        NodeConfig(role=Role.WORKER, scheduler_host="h", scheduler_port=1, num_workers=2, num_servers=1,
                   job_id="j", max_workers=1)


# ------------------------------------------------------------------ scheduler bookkeeping
def test_admit_honours_the_launchers_rank_and_refuses_one_in_use() -> None:
    e = Elastic(max_workers=4)
    assert e.admit(2, {0, 1}) == 2
    assert e.admit(None, {0, 2}) == 1
    assert e.admit(1, {0, 1}) == "rank 1 is in use by a member of the job"
    assert e.admit(4, {0, 1}) == "rank 4 is not below max_workers 4"
    assert e.admit(None, {0, 1, 2, 3}) == "the job already has 4 workers (max_workers 4)"


def test_generation_counts_joins_leaves_and_losses_not_finishes() -> None:
    e = Elastic(max_workers=4)
    e.join(2)
    assert (e.generation, e.joiners, e.joined) == (1, {2}, 1)
    assert e.ask_leave([2, 3], {0, 1, 2}) and e.leaving == {2}
    assert not e.ask_leave([2], {0, 1, 2})            # asked already
    e.gone(2, "finished")                               # a leaver finishing: it left
    assert (e.generation, e.left, e.leaving, e.joiners) == (2, 1, set(), set())
    e.gone(1, "lost")
    assert (e.generation, e.lost) == (3, 1)
    e.gone(0, "finished")                               # the script ended: no new generation
    assert (e.generation, e.left) == (3, 1)
