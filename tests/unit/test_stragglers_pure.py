"""Stragglers on a server, driven op by op under a fake clock: whom the others waited for
(psnode.server.awaited, from sync rounds, fused buckets and dist_ssp pulls) and backup workers
(psnode.server.rounds: a round completes without the last ``b`` pushes, late ones are dropped
once and counted, across a checkpoint and restore)."""
from __future__ import annotations

import numpy as np
import pytest

from psnode import kv as kv_mod
from psnode.errors import ConfigError
from psnode.protocol import Failed, Init, Ok, Pull, Push, PushPull, bucket_key
from psnode.scheduler.slowness import Slowness
from psnode.server import checkpoint
from psnode.server.awaited import Awaited
from psnode.server.store import Store

W = 3


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def store_with(clock: Clock, backup: int = 0, sync: bool = True, staleness: int = -1, keys: str = "w") -> Store:
    store = Store(W)
    store.key_rounds.awaited.clock = clock
    for i, k in enumerate(keys):
        out = store.handle(0, Init(k, 0, "float64", (2,), sync=sync, value=np.zeros(2), id=1 + i,
                                   staleness=staleness, backup=backup))
        assert isinstance(out[0].answer, Ok), out
    return store


def push(store: Store, w: int, seq: int, value: float, key: str = "w") -> list:
    return store.handle(w, Push(key, 0, seq, np.full(2, value), id=1000 * w + seq))


def value_of(store: Store, key: str = "w") -> float:
    return float(store.entries[(key, 0)].value[0])


# ------------------------------------------------------------------ attribution
def test_credits_are_a_union_per_worker() -> None:
    clock = Clock()
    a = Awaited(clock)
    clock.t = 10.0
    a.credit(2, 4.0)            # 4..10
    a.credit(2, 6.0)            # inside it: nothing more
    clock.t = 12.0
    a.credit(2, 8.0)            # 10..12
    a.credit(1, 11.0)
    assert a.seconds == {2: pytest.approx(8.0), 1: pytest.approx(1.0)}


def test_a_sync_round_credits_the_last_pusher_from_when_it_alone_was_missing() -> None:
    clock = Clock()
    store = store_with(clock, keys="wv")
    awaited = store.key_rounds.awaited
    for key in "wv":                 # two key parts wait for worker 2 over the same 3 s: counted once
        push(store, 0, 1, 1.0, key)
    clock.t += 1.0
    for key in "wv":
        push(store, 1, 1, 2.0, key)  # now both lack worker 2 alone
    clock.t += 3.0
    assert awaited.totals() == {2: pytest.approx(3.0)}   # (a wait in progress counts: worker 2 is named now)
    for key in "wv":
        push(store, 2, 1, 3.0, key)
    assert awaited.seconds == {2: pytest.approx(3.0)} and awaited.totals() == awaited.seconds
    clock.t += 1.0
    push(store, 2, 2, 0.0)
    push(store, 0, 2, 0.0)           # worker 1 alone missing for 0.5 s
    clock.t += 0.5
    push(store, 1, 2, 0.0)
    assert awaited.seconds == {2: pytest.approx(3.0), 1: pytest.approx(0.5)}
    assert value_of(store) == 0.0 and value_of(store, "v") == 2.0


@pytest.mark.parametrize("bare", [False, True])
def test_a_round_completed_by_a_loss_credits_nobody_and_a_replacement_counts_from_its_init(bare: bool) -> None:
    """``bare``: the replacement has no array to take the value (a row_sparse table's init)."""
    clock = Clock()
    store = store_with(clock)
    awaited = store.key_rounds.awaited
    push(store, 0, 1, 1.0)
    push(store, 1, 1, 1.0)
    clock.t += 5.0                   # worker 2 dies; the round waits; its replacement starts
    out = store.handle(2, Init("w", 0, "float64", (2,), value=None, id=9, bare=bare))
    assert isinstance(out[0].answer, Ok) and out[0].answer.seq == 0
    # (a first init, count 0, is no restart: the replacement of a worker that had pushed is)
    push(store, 2, 1, 1.0)
    assert awaited.seconds == {2: pytest.approx(5.0)}
    push(store, 0, 2, 1.0)
    push(store, 1, 2, 1.0)
    clock.t += 4.0                   # worker 2 (count 1) dies and comes back: 4 s are the failover's
    out = store.handle(2, Init("w", 0, "float64", (2,), value=None, id=10, bare=bare))
    assert out[0].answer.seq == 1
    clock.t += 0.25
    push(store, 2, 2, 1.0)
    assert awaited.seconds[2] == pytest.approx(5.25) and awaited.failover == pytest.approx(4.0)
    push(store, 0, 3, 1.0)
    push(store, 1, 3, 1.0)
    clock.t += 2.0
    assert awaited.totals()[2] == pytest.approx(7.25)
    store.set_active({0, 1})         # worker 2 is lost for good: the round completes, nobody credited
    assert awaited.seconds[2] == pytest.approx(5.25) and store.entries[("w", 0)].round == 3
    assert awaited.totals() == awaited.seconds   # (no wait left open)


def test_a_fused_bucket_credits_the_same_way() -> None:
    clock = Clock()
    store = Store(W)
    store.key_rounds.awaited.clock = clock
    key = bucket_key(0)
    for w in range(W):
        for i, k in enumerate("ab"):
            op = Init(k, 0, "float32", (2,), value=np.zeros(2, np.float32) if w == 0 else None, id=10 * w + i,
                      bucket=0, offset=2 * i)
            store.handle(w, op)
    for seq in (1, 2):
        for w in (0, 1):
            store.handle(w, PushPull(key, 0, seq, np.ones(4, np.float32), id=100 * seq + w))
        clock.t += 2.0
        store.handle(2, PushPull(key, 0, seq, np.ones(4, np.float32), id=100 * seq + 2))
    assert store.fused.all[0].fused
    assert store.key_rounds.awaited.seconds == {2: pytest.approx(4.0)}
    for w in (0, 1):                 # round 3 waits for worker 2; a member's own push splits the bucket
        store.handle(w, PushPull(key, 0, 3, np.ones(4, np.float32), id=300 + w))
    clock.t += 1.0
    store.handle(0, Pull("a", 0, 3, id=400))
    assert not store.fused.all[0].fused and store.key_rounds.awaited.totals() == {2: pytest.approx(5.0)}
    store.handle(2, PushPull(key, 0, 3, np.ones(4, np.float32), id=302))
    assert store.key_rounds.awaited.totals() == {2: pytest.approx(5.0)} and not store.key_rounds.awaited._open


def test_a_dist_ssp_pull_parked_on_the_bound_credits_the_push_that_lets_it_through() -> None:
    clock = Clock()
    store = store_with(clock, sync=False, staleness=1)
    for seq in (1, 2, 3):
        push(store, 0, seq, 1.0)
    push(store, 1, 1, 1.0)
    push(store, 1, 2, 1.0)
    push(store, 2, 1, 1.0)
    assert store.handle(0, Pull("w", 0, 3, id=77)) == []     # worker 2 at clock 1 < 3 - 1
    clock.t += 1.5
    assert store.key_rounds.awaited.totals() == {2: pytest.approx(1.5)}
    out = push(store, 2, 2, 1.0)
    assert [r.answer.id for r in out] == [77]
    assert store.key_rounds.awaited.seconds == {2: pytest.approx(1.5)}


def test_the_scheduler_shares_a_servers_waits_over_the_window() -> None:
    s = Slowness(window=10.0)
    for t in range(21):   # the server waited for worker 2 0.3 s of every second
        s.server(0, [(2, 0.3 * t), (1, 0.01 * t)], float(t))
    assert s.shares(20.0) == {2: pytest.approx(0.3), 1: pytest.approx(0.01)}
    assert s.totals() == {2: pytest.approx(6.0), 1: pytest.approx(0.2)}
    s.restarted(1, 30.0)             # a replacement: barrier waits for it count from its registration
    s.barrier({0: 25.0, 1: 36.0}, 36.0)
    assert s.totals()[1] == pytest.approx(6.0)


def test_a_server_reports_its_open_waits_apart_from_what_it_credited() -> None:
    clock = Clock()
    store = store_with(clock)
    awaited = store.key_rounds.awaited
    push(store, 0, 1, 1.0)
    push(store, 1, 1, 1.0)
    clock.t += 2.5
    assert awaited.waiting() == {2: pytest.approx(2.5)} and awaited.seconds == {}
    push(store, 2, 1, 1.0)
    assert awaited.waiting() == {} and awaited.seconds == {2: pytest.approx(2.5)}
    push(store, 0, 2, 1.0)
    push(store, 1, 2, 1.0)
    clock.t += 1.0                   # counted from the end of what was credited, as totals() does
    assert awaited.waiting() == {2: pytest.approx(1.0)} and awaited.totals() == {2: pytest.approx(3.5)}


def test_a_wait_for_a_dead_worker_past_its_death_is_the_failovers() -> None:
    s = Slowness(window=10.0)
    s.server(0, [(2, 0.5)], 10.0, waiting=[(2, 0.5)])     # the server waits for worker 2 since t=9.5
    s.lost(2, 11.0)                                       # worker 2 died at 11: a replacement is awaited
    for t in (12.0, 13.0, 14.0):                          # the server waits on, for the replacement
        s.server(0, [(2, t - 9.5)], t, waiting=[(2, t - 9.5)])
    assert s.totals() == {2: pytest.approx(1.5)}          # 9.5..11: the rest is the failover's
    s.restarted(2, 14.5)                                  # the replacement registers; it inits at 15
    s.server(0, [(2, 6.0)], 15.5, waiting=[(2, 6.0)])     # (its init not seen by this server yet)
    assert s.totals() == {2: pytest.approx(1.5)}
    s.server(0, [(2, 0.4)], 16.0, waiting=[(2, 0.4)])     # after its init: a wait from 15.6, its own
    assert s.totals() == {2: pytest.approx(0.4)}
    for t in (17.0, 18.0, 19.0, 20.0, 21.0, 22.0):        # it is waited for 0.1 s of every second
        s.server(0, [(2, 0.4 + 0.1 * (t - 16.0))], t)
    assert s.shares(22.0) == {2: pytest.approx(0.1)}


def test_a_worker_taken_for_dead_that_speaks_again_was_waited_for_all_along() -> None:
    s = Slowness(window=10.0)
    s.lost(2, 11.0)                                       # stopped, taken for silent at 11
    s.server(0, [(2, 4.0)], 13.0, waiting=[(2, 4.0)])
    assert s.totals() == {2: pytest.approx(2.0)}
    s.returned(2)                                         # it speaks again: the waits were its own
    s.server(0, [(2, 5.0)], 14.0, waiting=[(2, 5.0)])
    assert s.totals() == {2: pytest.approx(5.0)}


# ------------------------------------------------------------------ backup workers
def test_a_round_completes_without_the_last_push_which_is_dropped_once_and_counted() -> None:
    clock = Clock()
    store = store_with(clock, backup=1)
    push(store, 0, 1, 2.0)
    assert value_of(store) == 0.0
    out = push(store, 1, 1, 4.0)      # 2 of 3: the round completes, the average of those two
    assert value_of(store) == 3.0 and store.entries[("w", 0)].round == 1 and out == []
    assert push(store, 2, 1, 100.0) == []        # late: dropped
    assert value_of(store) == 3.0 and store.key_rounds.awaited.late == {2: 1}
    push(store, 2, 1, 100.0)                      # a resend of it: a duplicate
    assert store.key_rounds.awaited.late == {2: 1}
    out = store.handle(2, Pull("w", 0, 1, id=5))  # its pull: the round's value
    assert isinstance(out[0].answer, Ok) and float(out[0].answer.arrays[0][0]) == 3.0
    push(store, 2, 2, 10.0)                       # on time for round 2: it counts
    push(store, 0, 2, 20.0)
    assert value_of(store) == 15.0
    push(store, 1, 2, 99.0)
    assert value_of(store) == 15.0 and store.key_rounds.awaited.late == {2: 1, 1: 1}
    assert store.key_rounds.awaited.seconds == {}  # a round with backups waits for nobody alone


def test_a_late_push_behind_a_gap_is_dropped_when_the_gap_comes() -> None:
    store = store_with(Clock(), backup=1)
    for seq in (1, 2):
        push(store, 0, seq, 1.0)
        push(store, 1, seq, 1.0)
    push(store, 2, 2, 9.0)                        # push 1 of worker 2 is still on its way
    assert store.key_rounds.awaited.late == {}
    push(store, 2, 1, 9.0)
    assert store.key_rounds.awaited.late == {2: 2} and store.entries[("w", 0)].pushed[2] == 2
    assert value_of(store) == 1.0


def test_late_pushes_stay_dropped_across_a_checkpoint_and_restore() -> None:
    store = store_with(Clock(), backup=1)
    push(store, 0, 1, 2.0)
    push(store, 1, 1, 4.0)
    push(store, 2, 1, 100.0)
    push(store, 0, 2, 1.0)
    meta, arrays = checkpoint.snapshot(store)
    back = Store(W)
    checkpoint.restore(back, meta, arrays, same_job=True)
    for w, seq, v in ((2, 1, 100.0), (0, 2, 1.0), (1, 2, 3.0)):   # the workers' journals, resent
        push(back, w, seq, v)
    assert value_of(back) == 2.0 and back.entries[("w", 0)].backup == 1
    push(back, 2, 2, 50.0)                                          # late for round 2
    assert value_of(back) == 2.0 and back.entries[("w", 0)].pushed[2] == 2


def test_zero_backups_is_dist_sync_bit_for_bit() -> None:
    rng = np.random.default_rng(7)
    plain, zero = store_with(Clock()), store_with(Clock(), backup=0)
    for seq in range(1, 20):
        for w in rng.permutation(W):
            g = rng.standard_normal(2)
            for s in (plain, zero):
                s.handle(int(w), Push("w", 0, seq, g.copy(), id=seq * 10 + int(w)))
    assert plain.entries[("w", 0)].value.tobytes() == zero.entries[("w", 0)].value.tobytes()


def test_every_worker_must_use_the_same_backups_and_the_wire_checks_them() -> None:
    store = store_with(Clock(), backup=1)
    out = store.handle(1, Init("w", 0, "float64", (2,), id=4))
    assert isinstance(out[0].answer, Failed) and "backup_workers=1" in out[0].answer.message
    op = Init("w", 0, "float64", (2,), id=4, backup=2)
    flags, part, _, key, arrays, extra = op.wire()
    assert extra is not None and Init.unwire(flags, part, 4, 0, key, arrays, extra).backup == 2


@pytest.mark.parametrize("bad", [-1, 1.5, "1"])
def test_kv_create_names_a_bad_backup_count(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"backup_workers=.*kv.create\('dist_sync', backup_workers=b\)"):
        kv_mod.create("dist_sync", backup_workers=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="has no backup workers"):
        kv_mod.create("dist_async", backup_workers=1)


def test_a_worker_is_slow_beyond_what_the_others_are_waited_for() -> None:
    from psnode.launcher import SLOW_SHARE, excess
    busy = {0: 0.09, 1: 0.05, 2: 0.10}     # every worker keeps the others waiting now and then
    assert all(excess(busy, r, range(3)) < SLOW_SHARE for r in range(3))
    straggler = {0: 0.02, 1: 0.06, 2: 0.15}
    assert excess(straggler, 2, range(3)) == pytest.approx(0.11) and excess(straggler, 1, range(3)) < 0
    assert excess({}, 1, range(3)) == 0.0 and excess({0: 0.5}, 0, [0]) == 0.5


def test_every_workers_excess_in_one_pass_is_each_ones_excess() -> None:
    from psnode.protocol.status import excess, excesses
    waited = {0: 0.02, 1: 0.06, 2: 0.15, 5: 0.4}
    workers = [0, 1, 2, 3, 5]                  # worker 3 kept nobody waiting
    all_at_once = excesses(waited, workers)
    assert set(all_at_once) == set(workers)
    for r in workers:
        assert all_at_once[r] == pytest.approx(excess(waited, r, workers))
    assert excesses({0: 0.5}, [0]) == {0: 0.5} and excesses({}, []) == {}


def test_status_marks_the_slow_and_counts_the_late() -> None:
    from cli.view import slow_lines, slowest
    from psnode.launcher import NodeRow
    rows = [NodeRow("worker", 0, "h", "alive", waited_for=0.09, waited_for_total=1.0, slow=False),
            NodeRow("worker", 2, "h", "alive", waited_for=0.21, waited_for_total=3.6, late=0, slow=True),
            NodeRow("worker", 1, "h", "alive", late=7, slow=False)]
    assert slow_lines(rows) == [
        "worker 2  slow: the others waited for it 21% of the last 30 s",
        "worker 1  late: 7 pushes came after their round completed and were dropped (backup workers)"]
    assert slowest(rows, 20.0) == "the others waited most for worker 2 (18% of the job)"   # (3.1 s beyond)
    assert slowest(rows, 60.0) is None
