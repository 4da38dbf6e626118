"""Pure parts of lost-message recovery and server restore: the Store answers resent requests
exactly once, names pushes it never received, and rebases restored rounds."""
from __future__ import annotations

import numpy as np

from psnode import checkpoint
from psnode.aggregation import Store
from psnode.config import NodeConfig
from psnode.protocol import Failed, Flush, Init, Missing, Ok, Pull, Push, SetOptimizer, Wait

F = np.float32


def _init(s: Store, key, value, sync: bool = True) -> None:
    v = np.asarray(value)
    s.handle(0, Init(key, 0, v.dtype.name, v.shape, sync, True, False, v))


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


def test_restore_keeps_checkpointed_rounds_and_rebase_applies_each_round_once(tmp_path) -> None:
    s = Store(2)
    _init(s, "k", np.zeros(1, F))
    _sgd(s, learning_rate=1.0, momentum=0.5)
    for q in (1, 2):
        _push(s, 0, "k", q, [q])
        _push(s, 1, "k", q, [q])
    checkpoint.save_server(str(tmp_path), 0, s)       # written after round 2, before its replies
    want_value = s.entries[("k", 0)].value.copy()

    fresh = Store(2)
    assert checkpoint.load_server(str(tmp_path), 0, fresh, same_job=True) == 1
    entry = fresh.entries[("k", 0)]
    assert entry.round == 2 and np.array_equal(entry.value, want_value)
    # worker 0 saw round 1 complete, worker 1 only round 0; both resend push 2 (never confirmed)
    assert fresh.rebase({("k", 0): {0: 1, 1: 0}}, 2) == []
    _push(fresh, 0, "k", 2, [2])
    _push(fresh, 1, "k", 2, [2])
    assert entry.round == 2 and np.array_equal(entry.value, want_value)  # not applied twice
    assert _pull(fresh, 1, "k", 2)[0].answer.arrays[0].tolist() == want_value.tolist()
    _push(fresh, 0, "k", 3, [3])
    _push(fresh, 1, "k", 3, [3])
    s_ref = s
    _push(s_ref, 0, "k", 3, [3])
    _push(s_ref, 1, "k", 3, [3])
    assert entry.round == 3 and np.array_equal(entry.value, s_ref.entries[("k", 0)].value)


def test_rebase_reports_rounds_the_checkpoint_lacks(tmp_path) -> None:
    s = Store(1)
    _init(s, "k", np.zeros(1, F))
    checkpoint.save_server(str(tmp_path), 0, s)
    fresh = Store(1)
    checkpoint.load_server(str(tmp_path), 0, fresh, same_job=True)
    notes = fresh.rebase({("k", 0): {0: 4}}, 1)
    assert notes == ["key 'k': rounds 1..4 were not in the checkpoint; the value is that of round 0"]
    assert fresh.entries[("k", 0)].round == 4
    assert _push(fresh, 0, "k", 5, [1]) == [] and fresh.entries[("k", 0)].round == 5


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


def test_push_journal_keeps_unconfirmed_pushes_per_key_part_bounded() -> None:
    from psnode.journal import PushJournal

    j = PushJournal(depth=2)
    for q in (1, 2, 3):
        j.remember(0, Push("w", 0, q, np.full(1, q, F)))
    j.remember(1, Push("w", 1, 1, np.zeros(1, F)))
    assert j.check_list(0) == [("w", 0, [2, 3])]          # push 1 fell out (depth 2)
    assert not j.holds(("w", 0), 1) and j.holds(("w", 0), 3)
    assert [op.seq for op in j.replay(0)] == [2, 3]
    assert [op.seq for op in j.replay(0, {("w", 0): [3]})] == [3]
    j.confirm(("w", 0), 2)                                # a pull after push 2 returned
    assert j.check_list(0) == [("w", 0, [3])] and j.rounds == 2
    assert j.resync_parts(0) == [("w", 0, 2)] and j.resync_parts(1) == [("w", 1, 0)]
    j.confirm(("w", 0), 3)
    assert j.check_list(0) == [] and j.replay(0) == []
