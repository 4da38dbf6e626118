"""Pure parts of lost-message recovery and server restore: the Store answers resent requests
exactly once, names pushes it never received, restores exactly the state it checkpointed
(rounds in progress included) and reports durable watermarks; the journal keeps pushes
until they are durable.  (Randomised kill schedules: tests/unit/test_exactly_once.py.)"""
from __future__ import annotations

import numpy as np

from psnode.config import NodeConfig
from psnode.protocol import Failed, Flush, Init, Missing, Ok, Pull, Push, SetOptimizer, Wait
from psnode.server import chain as disk
from psnode.server.store import Store

F = np.float32


def _init(s: Store, key, value, sync: bool = True) -> None:
    v = np.asarray(value)
    s.handle(0, Init(key, 0, v.dtype.name, v.shape, sync, "average", False, v))


def _push(s: Store, w: int, key, seq: int, value) -> list:
    return s.handle(w, Push(key, 0, seq, np.asarray(value, F), id=100 + seq))


def _pull(s: Store, w: int, key, after: int, rid: int = 7, re: bool = False) -> list:
    return s.handle(w, Pull(key, 0, after, id=rid, re=re))


def _sgd(s: Store, **params) -> None:
    s.handle(0, SetOptimizer({"name": "sgd", "params": params}, id=1))


def test_resent_pull_still_parked_is_answered_wait_and_not_parked_twice() -> None:
    s = Store(2)
    _init(s, "k", np.zeros(2, F))
    _push(s, 0, "k", 1, [2, 2])
    assert _pull(s, 0, "k", 1) == []
    assert [r.answer for r in _pull(s, 0, "k", 1, re=True)] == [Wait(7, 0, [1])]
    out = _push(s, 1, "k", 1, [4, 4])
    assert [(r.worker, r.answer.arrays[0].tolist()) for r in out] == [(0, [3.0, 3.0])]  # answered once


def test_resent_pull_whose_answer_was_lost_is_answered_again() -> None:
    s = Store(1)
    _init(s, "k", np.zeros(2, F))
    _push(s, 0, "k", 1, [5, 5])
    assert _pull(s, 0, "k", 1)[0].answer.arrays[0].tolist() == [5, 5]
    assert _pull(s, 0, "k", 1, re=True)[0].answer.arrays[0].tolist() == [5, 5]


def test_flush_names_pushes_never_received_and_a_resent_push_counts_once() -> None:
    s = Store(1)
    _init(s, "k", np.zeros(1, F))
    _push(s, 0, "k", 1, [1])
    # push 2 was lost on the way; 3 arrived and waits for round 3
    _push(s, 0, "k", 3, [3])
    flush = s.handle(0, Flush([("k", 0, [1, 2, 3])], id=9))
    assert flush[0].answer == Missing(9, [("k", 0, [2])])
    _push(s, 0, "k", 2, [2])
    _push(s, 0, "k", 2, [2])  # sent twice: applied once
    assert s.entries[("k", 0)].round == 3 and s.entries[("k", 0)].value.tolist() == [3]
    assert s.handle(0, Flush([("k", 0, [2, 3])], id=9))[0].answer == Ok(9)


def test_async_pushes_out_of_order_apply_once_and_pulls_wait_for_the_gap() -> None:
    s = Store(1)
    _init(s, "k", np.zeros(1, F), sync=False)
    _sgd(s, learning_rate=1.0)
    _push(s, 0, "k", 1, [1])
    _push(s, 0, "k", 3, [4])          # 2 lost for now
    assert _pull(s, 0, "k", 3) == []  # push 2 not applied yet: the pull waits
    out = _push(s, 0, "k", 2, [2])
    assert [r.answer.arrays[0].tolist() for r in out if r.answer.arrays] == [[-7.0]]
    _push(s, 0, "k", 3, [4])          # a resend of 3: not applied again
    assert s.entries[("k", 0)].value.tolist() == [-7] and s.entries[("k", 0)].pushed[0] == 3


def test_error_of_a_fire_and_forget_request_is_marked_so() -> None:
    s = Store(1)
    out = _push(s, 0, "nokey", 1, [1])
    assert isinstance(out[0].answer, Failed)
    assert out[0].answer.kind == "KeyNotInitialized" and out[0].answer.na


def test_restore_is_the_checkpointed_state_rounds_in_progress_included(tmp_path) -> None:
    s = Store(3)
    _init(s, "k", np.zeros(1, F))
    _init(s, "r", np.zeros(1, F), sync=False)
    _sgd(s, learning_rate=1.0, momentum=0.5)
    for q in (1, 2):
        for w in range(3):
            _push(s, w, "k", q, [q * (w + 1)])
    _push(s, 0, "k", 3, [7])                   # round 3 in progress: workers 0 and 2 pushed
    _push(s, 2, "k", 3, [9])
    _push(s, 2, "k", 4, [11])                  # waits for round 4
    _push(s, 1, "r", 1, [1])
    _push(s, 1, "r", 3, [3])                   # async: applied past the gap at 2
    disk.Chain(str(tmp_path), 0, "job").point(s, whole=True).result()

    fresh = Store(3)
    assert disk.load(str(tmp_path), 0, fresh, same_job=True) == (2, "job", 0)
    got, ref = fresh.entries[("k", 0)], s.entries[("k", 0)]
    assert (got.round, got.contributors, got.pushed) == (2, {0, 2}, {0: 3, 1: 2, 2: 3})
    assert [q for q, *_ in got.early[2]] == [4] and np.array_equal(got.value, ref.value)
    assert fresh.entries[("r", 0)].ahead == {1: {3}} and fresh.entries[("r", 0)].pushed == {1: 1}
    # the workers resend what they hold; duplicates count once, and both stores go on alike
    for store in (s, fresh):
        _push(store, 0, "k", 3, [7])
        _push(store, 1, "k", 3, [8])
        for w in (0, 1):
            _push(store, w, "k", 4, [12])
        _push(store, 1, "r", 2, [2])
    for key in ("k", "r"):
        assert fresh.entries[(key, 0)].round == s.entries[(key, 0)].round
        assert np.array_equal(fresh.entries[(key, 0)].value, s.entries[(key, 0)].value), key
    assert fresh.entries[("k", 0)].round == 4 and fresh.entries[("r", 0)].pushed == {1: 3}


def test_a_restartable_store_reveals_only_what_a_checkpoint_holds() -> None:
    s = Store(2, restartable=True)
    saves = []

    def reply(replies: list) -> list:
        return s.release(replies, 0, lambda: (saves.append(1), s.mark_durable()))
    s.mark_durable()
    reply(s.handle(0, Init("k", 0, "float32", (1,), True, "average", False, np.zeros(1, F), id=1)))
    assert len(saves) == 1                                   # a new key: checkpointed first
    for w in (0, 1):
        reply(_push(s, w, "k", 1, [1]))
    assert len(saves) == 1                                   # (rounds: none by rounds)
    (ans,) = reply(_pull(s, 0, "k", 1))
    assert ans.answer.seq == 0                               # applied, not durable yet
    (ok,) = reply(s.handle(0, Flush([("k", 0, [1])], id=9)))
    assert ok.answer == Ok(9) and len(saves) == 2            # a flush's pushes: made durable
    (ans,) = reply(_pull(s, 1, "k", 1, rid=8))
    assert ans.answer.seq == 1
    _push(s, 1, "k", 2, [2])                                 # then worker 1 dies; its replacement:
    (init,) = reply(s.handle(1, Init("k", 0, "float32", (1,), id=3)))
    assert init.answer.seq == 2 and len(saves) == 3          # the count it resumes from: durable
    check = reply(s.handle(0, Flush([("k", 0, [1])], id=10, durable=False)))
    assert check[0].answer == Ok(10) and len(saves) == 3     # a check needs no checkpoint


def test_a_replacement_resumes_at_the_first_gap_and_its_predecessors_later_pushes_are_dropped() -> None:
    s = Store(2)
    _init(s, "k", np.zeros(1, F))
    _push(s, 0, "k", 1, [1])
    _push(s, 1, "k", 1, [1])
    _push(s, 0, "k", 3, [3])                   # push 2 lost; then worker 0 died
    (init,) = s.handle(0, Init("k", 0, "float32", (1,), id=3))
    assert init.answer.seq == 1 and not s.entries[("k", 0)].early
    _push(s, 0, "k", 2, [2])                   # its replacement pushes steps 2 and 3 again
    _push(s, 1, "k", 2, [2])
    assert s.entries[("k", 0)].round == 2 and _pull(s, 0, "k", 2)[0].answer.arrays[0].tolist() == [2]


def test_retry_settings_are_part_of_the_env_contract() -> None:
    env = {"PSNODE_ROLE": "worker", "PSNODE_SCHEDULER": "127.0.0.1:9", "PSNODE_NUM_WORKERS": "1",
           "PSNODE_NUM_SERVERS": "1", "PSNODE_JOB_ID": "j", "PSNODE_RETRY_TIMEOUT": "0.5",
           "PSNODE_MAX_RETRIES": "7"}
    cfg = NodeConfig.from_env(env)
    assert (cfg.retry_timeout, cfg.max_retries) == (0.5, 7)
    assert NodeConfig.from_env(cfg.to_env()) == cfg


def test_resent_pull_waiting_for_a_lost_push_of_its_own_worker_names_the_gap() -> None:
    s = Store(2)
    _init(s, "k", np.zeros(1, F))
    _push(s, 0, "k", 1, [1])
    _push(s, 1, "k", 1, [1])
    _push(s, 0, "k", 3, [3])           # push 2 of worker 0 lost; 3 waits as early
    assert _pull(s, 0, "k", 3) == []
    assert [r.answer for r in _pull(s, 0, "k", 3, re=True)] == [Wait(7, 2, [0, 1])]
    _push(s, 0, "k", 2, [2])           # resent: now the pull waits only for worker 1
    assert [r.answer for r in _pull(s, 0, "k", 3, re=True)] == [Wait(7, 0, [1])]


def test_push_journal_keeps_pushes_until_durable() -> None:
    from psnode.worker.journal import PushJournal

    j = PushJournal()
    for q in (1, 2, 3):
        j.remember(0, Push("w", 0, q, np.full(1, q, F)))
    j.remember(1, Push("w", 1, 1, np.zeros(1, F)))
    assert j.check_list(0) == [("w", 0, [1, 2, 3])] and j.servers() == {0, 1}
    assert [op.seq for op in j.replay(0, {("w", 0): [3]})] == [3]
    j.settle(("w", 0), 2, 0)                              # applied up to 2, nothing durable
    assert j.check_list(0) == [("w", 0, [1, 2, 3])] and j.rounds == 2 and j.released(("w", 0)) == 0
    j.settle(("w", 0), 2, 1)                              # the server's checkpoint holds push 1
    assert j.check_list(0) == [("w", 0, [2, 3])] and j.released(("w", 0)) == 1
    assert not j.holds(("w", 0), 1) and j.holds(("w", 0), 3)
    j.settle(("w", 0), 3, 3)
    assert j.check_list(0) == [] and j.replay(0) == [] and j.servers() == {1}
