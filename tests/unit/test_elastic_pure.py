"""Elastic membership, the pure parts: the env contract's worker bounds and the scheduler's
bookkeeping (psnode.config, psnode.scheduler.elastic)."""
from __future__ import annotations

import pytest

from psnode.config import NodeConfig, Role
from psnode.errors import ConfigError
from psnode.scheduler.elastic import ElasticRoster

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
    e = ElasticRoster(max_workers=4)
    assert e.admit(2, {0, 1}) == 2
    assert e.admit(None, {0, 2}) == 1
    assert e.admit(1, {0, 1}) == "rank 1 is in use by a member of the job"
    assert e.admit(4, {0, 1}) == "rank 4 is not below max_workers 4"
    assert e.admit(None, {0, 1, 2, 3}) == "the job already has 4 workers (max_workers 4)"


def test_generation_counts_joins_leaves_and_losses_not_finishes() -> None:
    e = ElasticRoster(max_workers=4)
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


# ------------------------------------------------------------------ a key part's rounds (psnode.server.store)
import numpy as np  # noqa: E402

from psnode.protocol import Init, Join, Ok, Pull, Push, PushPull, bucket_key  # noqa: E402
from psnode.server.store import Store  # noqa: E402


def _ask(st: Store, worker: int, op) -> list[tuple[int, int, list[float]]]:
    """(worker, seq, first value) of each Ok ``op`` causes."""
    out = []
    for r in st.handle(worker, op):
        assert isinstance(r.answer, Ok), r.answer
        out.append((r.worker, r.answer.seq, [float(a.reshape(-1)[0]) for a in r.answer.arrays]))
    return out


def _push(st: Store, worker: int, seq: int, key: str = "w") -> list[tuple[int, int, list[float]]]:
    return _ask(st, worker, Push(key, 0, seq, np.full(2, worker + 1, np.float32)))


def _store(key: str = "w", **init) -> Store:
    st = Store(2)
    _ask(st, 0, Init(key, 0, "float32", (2,), value=np.zeros(2, np.float32), id=1, **init))
    _ask(st, 1, Init(key, 0, "float32", (2,), id=2, **init))
    return st


def test_a_joiner_gets_the_completed_round_and_joins_from_its_start() -> None:
    st = _store()
    _push(st, 0, 1), _push(st, 1, 1)                 # round 1: {0, 1}
    _push(st, 0, 2)                                   # round 2 opened
    st.set_membership({0, 1, 2}, 1, {2})
    assert _ask(st, 2, Init("w", 0, "float32", (2,), id=3, join=True)) == [(2, 1, [1.5])]
    assert _ask(st, 2, Join("w", 0, 2, 1, id=4)) == [(2, 3, [])]   # round 2 opened: refused, "3"
    assert _ask(st, 2, Join("w", 0, 3, 1, id=5)) == [(2, 3, [])]   # accepted
    assert _push(st, 1, 2) == []                      # round 2 completes over {0, 1}
    assert _ask(st, 0, Pull("w", 0, 2, id=6)) == [(0, 2, [1.5])]
    _push(st, 0, 3), _push(st, 1, 3)
    assert _ask(st, 0, Pull("w", 0, 3, id=7)) == []   # round 3 waits for the joiner
    assert _push(st, 2, 3) == [(0, 3, [2.0])]         # (1 + 2 + 3) / 3
    assert st.entries[("w", 0)].start == {2: 3}


def test_a_start_moves_later_while_nothing_was_pushed_and_frees_its_round() -> None:
    st = _store()
    st.set_membership({0, 1, 2}, 1, {2})
    assert _ask(st, 2, Join("w", 0, 1, 1, id=3)) == [(2, 1, [])]
    _push(st, 0, 1), _push(st, 1, 1)
    assert _ask(st, 0, Pull("w", 0, 1, id=4)) == []   # round 1 waits for the joiner
    assert _ask(st, 2, Join("w", 0, 2, 1, id=5)) == [(2, 2, []), (0, 1, [1.5])]   # moved: round 1 completes


def test_a_removed_member_keeps_its_arrived_pushes_and_average_counts_contributors() -> None:
    st = Store(3)
    for w in range(3):
        _ask(st, w, Init("w", 0, "float32", (2,), value=np.zeros(2, np.float32) if w == 0 else None, id=w + 1))
    _push(st, 1, 1)                                   # worker 1 pushed round 1, then is lost
    _push(st, 0, 1)
    assert st.set_membership({0, 2}, 1) == []
    assert _push(st, 2, 1) == []
    assert _ask(st, 0, Pull("w", 0, 1, id=9)) == [(0, 1, [2.0])]   # (1 + 2 + 3) / 3: its push kept
    _push(st, 0, 2), _push(st, 2, 2)
    assert _ask(st, 0, Pull("w", 0, 2, id=10)) == [(0, 2, [2.0])]  # (1 + 3) / 2: over the rest


def test_a_stale_membership_never_drops_a_joiner_admitted_later() -> None:
    st = _store()
    assert _ask(st, 2, Join("w", 0, 1, 3, id=3)) == [(2, 1, [])]   # admitted in generation 3
    st.set_membership({0, 1}, 2)                      # older: it does not know worker 2 yet
    _push(st, 0, 1), _push(st, 1, 1)
    assert _ask(st, 0, Pull("w", 0, 1, id=4)) == []   # still waits for the joiner
    st.set_membership({0, 1}, 4)                      # removed after its admission
    assert _ask(st, 0, Pull("w", 0, 1, id=5)) == [(0, 1, [1.5])]


def test_bucket_members_join_one_by_one() -> None:
    st = _store(bucket=0, offset=0)
    b = bucket_key(0)
    _ask(st, 0, PushPull(b, 0, 1, np.full(2, 1, np.float32), id=10))
    assert _ask(st, 1, PushPull(b, 0, 1, np.full(2, 2, np.float32), id=11)) == [(0, 1, [1.5]), (1, 1, [1.5])]
    st.set_membership({0, 1, 2}, 1, {2})
    assert _ask(st, 2, Init("w", 0, "float32", (2,), id=3, join=True, bucket=0, offset=0)) == [(2, 1, [1.5])]
    assert _ask(st, 2, Join("w", 0, 3, 1, id=4)) == [(2, 3, [])]
    _ask(st, 0, PushPull(b, 0, 2, np.full(2, 1, np.float32), id=12))
    assert len(_ask(st, 1, PushPull(b, 0, 2, np.full(2, 2, np.float32), id=13))) == 2
    _ask(st, 0, PushPull(b, 0, 3, np.full(2, 1, np.float32), id=14))
    _ask(st, 1, PushPull(b, 0, 3, np.full(2, 2, np.float32), id=15))
    got = _ask(st, 2, PushPull(b, 0, 3, np.full(2, 3, np.float32), id=16))
    assert sorted(got) == [(0, 3, [2.0]), (1, 3, [2.0]), (2, 3, [2.0])]


# ------------------------------------------------------------------ the sampler (psnode.data)
from psnode.data import ShardSampler  # noqa: E402


class _Members:
    """A stand-in for an elastic kvstore: ``agreed_members`` answers each epoch's membership."""

    elastic = True

    def __init__(self, rank: int, epochs: list[list[int]]) -> None:
        self.rank, self.members, self.epochs, self.calls = rank, epochs[0], epochs, 0

    def agreed_members(self) -> tuple[int, list[int]]:
        self.calls += 1
        return self.calls, self.epochs[self.calls - 1]


def test_the_sampler_covers_each_epoch_once_over_that_epochs_members() -> None:
    epochs = [[0, 1], [0, 1, 2], [0, 2]]
    n = 12
    for epoch, members in enumerate(epochs):
        got = []
        for r in members:
            kv = _Members(r, epochs)
            sampler = ShardSampler(n, kv=kv, shuffle=True, seed=3)
            kv.calls = epoch                   # (the barriers of the epochs before)
            sampler.set_epoch(epoch)
            assert (sampler.num_replicas, sampler.generation) == (len(members), epoch + 1)
            got.extend(sampler.indices().tolist())
        assert sorted(got) == list(range(n)), (epoch, members)


def test_a_sampler_with_explicit_world_never_reshards() -> None:
    kv = _Members(1, [[0, 1, 2]])
    sampler = ShardSampler(10, num_replicas=2, rank=1, kv=kv)
    sampler.set_epoch(1)
    assert (sampler.num_replicas, sampler.rank, kv.calls) == (2, 1, 0)


def test_join_and_a_joiner_init_travel_and_are_checked() -> None:
    from psnode.errors import ProtocolError
    from psnode.protocol import Command, Message, decode, encode

    def wire(op):
        frames = [bytes(memoryview(f)) if not isinstance(f, bytes) else f
                  for f in encode(Message(Command.DATA, "j", "w", ops=[op]))]
        got = decode(frames, "j", 2**20).ops
        assert got is not None
        return got[0]
    assert wire(Join("w", 1, 7, 3, id=5)) == Join("w", 1, 7, 3, id=5)
    init = Init("w", 0, "float32", (2,), id=6, join=True)
    assert wire(init).join is True
    with pytest.raises(ProtocolError, match="join start"):
        wire(Join("w", 0, 0, 1, id=7))


def test_a_restored_server_keeps_its_joiners_start_rounds() -> None:
    from psnode.server import checkpoint
    st = _store()
    st.set_membership({0, 1, 2}, 1, {2})
    _ask(st, 2, Join("w", 0, 3, 1, id=3))
    meta, arrays = checkpoint.snapshot(st)
    back = Store(2)
    back.rules.active, back.rules.joiners = {0, 1, 2}, {2}
    checkpoint.restore(back, meta, {k: np.array(v) for k, v in arrays.items()}, same_job=True)
    assert back.entries[("w", 0)].start == {2: 3} and back.rules.admitted == {2: 1}
    assert back.entries[("w", 0)].pushed[2] == 2


def test_the_local_store_is_generation_0_of_one_member() -> None:
    import psnode
    kv = psnode.kv.create("local")
    calls: list[tuple[int, list[int]]] = []
    kv.on_membership_change(lambda g, m: calls.append((g, m)))
    kv.init("w", np.zeros(2, np.float32))
    kv.push("w", np.ones(2, np.float32))
    assert (kv.generation, kv.members, kv.num_workers, kv.leaving, kv.elastic) == (0, [0], 1, False, False)
    assert kv.agreed_members() == (0, [0]) and calls == []
    assert kv.pull("w").tolist() == [1.0, 1.0]
