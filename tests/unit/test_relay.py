"""The host's heartbeat relay as pure state machines (psnode.net.relay): what is batched,
who is answered, when a node stops using the relay, when a host's barrier entries go; the
HEARTBEATS and BARRIERS bodies on the wire."""
from __future__ import annotations

import pytest

from psnode.config import NodeConfig, RelayMode, Role
from psnode.errors import ConfigError, ProtocolError
from psnode.net.relay import (
    BARRIER_HOLD,
    BARRIER_WAIT,
    FALLBACK_INTERVALS,
    FORGET_INTERVALS,
    GONE_INTERVALS,
    KEPT_BATCHES,
    REFRESH_BATCHES,
    RETRY_INTERVALS,
    Relay,
    RelayUse,
    endpoint,
)
from psnode.protocol import Command
from psnode.protocol.control import MAX_BEATS, Beats, BeatsAck, Counters, Entries, decode_body


def test_one_batch_per_interval_with_each_nodes_latest_counters() -> None:
    r = Relay(1.0)
    assert r.batch(0.0) is None                    # nothing heard yet: nothing sent
    r.beat(b"a", Counters(pushes=1))
    r.beat(b"b", Counters(pushes=5))
    r.beat(b"a", Counters(pushes=2))               # the latest of a node replaces its earlier one
    assert r.batch(0.5) is None                    # not due before the interval
    got = r.batch(1.0)
    assert got == Beats(1, ((b"b", Counters(pushes=5)), (b"a", Counters(pushes=2))))
    assert r.batch(2.0) is None                    # a node not heard from since is not forwarded
    r.beat(b"b", Counters(pushes=6))
    assert r.batch(3.0) == Beats(2, ((b"b", Counters(pushes=6)),))
    assert r.timeout(3.25) == 0.75


def test_unchanged_counters_go_as_the_identity_alone_and_whole_again_now_and_then() -> None:
    r = Relay(1.0)
    sent = []
    for t in range(REFRESH_BATCHES + 6):
        if t != 3:                                 # (it misses batch 3: whole again in the next)
            r.beat(b"idle", Counters(pushes=1))
        r.beat(b"busy", Counters(pushes=t))
        got = r.batch(float(t))
        assert got is not None and got.n == t + 1
        sent.append(dict(got.beats))
    assert all(s[b"busy"] == Counters(pushes=t) for t, s in enumerate(sent))
    assert [t for t, s in enumerate(sent) if s.get(b"idle", 0) is not None] == [0, 3, 4, 4 + REFRESH_BATCHES]
    assert b"idle" not in sent[3] and sent[4][b"idle"] == Counters(pushes=1)


def test_the_scheduler_answer_is_fanned_out_to_the_nodes_of_that_batch_once() -> None:
    r = Relay(1.0)
    r.beat(b"a", Counters())
    r.beat(b"b", Counters())
    first = r.batch(0.0)
    r.beat(b"c", Counters())
    second = r.batch(1.0)
    assert first is not None and second is not None
    assert r.acked(second.n) == (b"c",)
    assert r.acked(first.n) == (b"a", b"b")
    assert r.acked(first.n) == () and r.acked(99) == ()   # repeated or unknown: nobody
    r.beat(b"d", Counters())
    r.beat(b"e", Counters())
    third = r.batch(2.0)
    assert third is not None and r.acked(third.n, (b"d", b"x")) == (b"e",)   # not the scheduler's unknown


def test_unanswered_batches_are_forgotten_after_a_few() -> None:
    r = Relay(1.0)
    for t in range(KEPT_BATCHES + 2):
        r.beat(b"a", Counters())
        r.batch(float(t))
    assert sorted(r.sent) == list(range(3, KEPT_BATCHES + 3))
    assert r.acked(1) == ()


def test_a_batch_is_bounded() -> None:
    r = Relay(1.0)
    for i in range(MAX_BEATS + 10):
        r.beat(f"n{i}".encode(), Counters())
    got = r.batch(0.0)
    assert got is not None and len(got.beats) == MAX_BEATS and got.beats[0][0] == b"n10"


def test_a_node_falls_back_after_its_oldest_unanswered_heartbeat_waited_the_bound() -> None:
    u = RelayUse(1.0)
    assert not u.fall_back(100.0)                  # nothing sent: nothing to miss
    u.sent(0.0)
    u.sent(1.0)                                    # the oldest unanswered one counts
    assert not u.fall_back(FALLBACK_INTERVALS)
    assert u.fall_back(FALLBACK_INTERVALS + 0.01) and not u.on
    assert not u.fall_back(10.0)                   # once


def test_a_fallen_back_node_tries_the_relay_again_and_resumes_when_answered() -> None:
    u = RelayUse(1.0)
    u.sent(0.0)
    assert u.fall_back(3.0)
    assert not u.probe(3.0 + RETRY_INTERVALS - 0.1)
    assert u.probe(3.0 + RETRY_INTERVALS) and not u.probe(3.0 + RETRY_INTERVALS + 1)   # one try per period
    assert u.probe(3.0 + 2 * RETRY_INTERVALS)
    assert u.answered() and u.on and u.unanswered is None                              # back on the relay
    assert not u.answered()                                                            # (already on)
    assert not u.probe(1000.0)                                                         # on: nothing to try


def test_a_node_gone_over_to_a_standby_never_uses_the_relay_again() -> None:
    u = RelayUse(1.0)
    u.stop()
    assert not u.on and not u.probe(1000.0) and not u.answered() and not u.on


def test_an_answer_resets_the_wait_and_a_held_loop_does_not_count() -> None:
    u = RelayUse(1.0)
    u.sent(0.0)
    u.answered()
    u.sent(2.0)
    assert not u.fall_back(4.0)
    u.held(3.0)                                    # the node's own loop was held 3 s
    assert not u.fall_back(7.0) and u.on
    assert u.fall_back(7.6)


def test_off_never_falls_back_and_endpoint_is_per_job() -> None:
    u = RelayUse(1.0, on=False)
    u.sent(0.0)
    assert not u.fall_back(100.0)
    assert endpoint("job-1") == "ipc://@psnode-job-1-relay" != endpoint("job-2")


def test_beats_round_trip_and_malformed_batches_name_the_field() -> None:
    b = Beats(3, ((b"worker-1-ab", Counters(pushes=2, rounds=1)), (b"server-2-cd", Counters()), (b"w-3", None)))
    assert decode_body(Command.HEARTBEATS, b.to_body()) == b
    assert b.to_body()["beats"][2] == ["w-3"]
    assert decode_body(Command.HEARTBEATS_ACK, BeatsAck(3).to_body()) == BeatsAck(3)
    for body, word in [({"beats": []}, "n is missing"), ({"n": 1}, "beats is missing"),
                       ({"n": 1, "beats": {}}, "beats must be a list"), ({"n": 1, "beats": [[]]}, "entry"),
                       ({"n": 1, "beats": [["a", {}, {}]]}, "entry"),
                       ({"n": 1, "beats": [[3, {}]]}, "entry"), ({"n": 1, "beats": [["a", []]]}, "stats"),
                       ({"n": -1, "beats": []}, "n must be"),
                       ({"n": 1, "beats": [["a", {}]] * (MAX_BEATS + 1)}, "more than")]:
        with pytest.raises(ProtocolError, match=word):
            decode_body(Command.HEARTBEATS, body)


def test_the_relay_knob_auto_is_on_from_eight_processes_on_the_host() -> None:
    base = {"PSNODE_ROLE": "worker", "PSNODE_SCHEDULER": "127.0.0.1:9000", "PSNODE_JOB_ID": "j",
            "PSNODE_NUM_WORKERS": "8", "PSNODE_NUM_SERVERS": "1"}
    assert not NodeConfig.from_env(base).relay
    assert not NodeConfig.from_env({**base, "PSNODE_HOST_PROCESSES": "7"}).relay
    assert NodeConfig.from_env({**base, "PSNODE_HOST_PROCESSES": "8"}).relay
    assert not NodeConfig.from_env({**base, "PSNODE_HOST_PROCESSES": "9", "PSNODE_HEARTBEAT_RELAY": "off"}).relay
    on = NodeConfig.from_env({**base, "PSNODE_HEARTBEAT_RELAY": "ON"})
    assert on.relay and on.heartbeat_relay is RelayMode.ON
    assert NodeConfig.from_env(on.to_env()) == on
    with pytest.raises(ConfigError, match="PSNODE_HEARTBEAT_RELAY='maybe' is not one of: auto, on, off"):
        NodeConfig.from_env({**base, "PSNODE_HEARTBEAT_RELAY": "maybe"})
    assert NodeConfig(Role.WORKER, "127.0.0.1", 9000, 1, 0, "j").heartbeat_relay is RelayMode.AUTO


# ------------------------------------------------------------------ barrier entries, per host

def test_the_first_barrier_is_held_then_a_host_sends_once_its_last_known_worker_entered() -> None:
    r = Relay(1.0)
    assert r.batch(10.0) is None                                 # (the next heartbeat batch: at 11)
    r.enter(b"a", 1, 10.0)
    r.enter(b"b", 1, 10.01)
    assert r.barrier_entries(10.02) is None                      # the first barrier: its workers unknown yet
    assert r.timeout(10.02) == pytest.approx(BARRIER_HOLD - 0.02)
    assert r.barrier_entries(10.0 + BARRIER_HOLD) == Entries(((b"a", 1), (b"b", 1)))
    assert r.barrier_entries(10.1) is None                       # nothing held: nothing sent
    r.enter(b"b", 2, 11.0)
    assert r.barrier_entries(11.01) is None                      # a is known and not in barrier 2 yet
    r.enter(b"a", 2, 11.02)
    assert r.barrier_entries(11.02) == Entries(((b"b", 2), (b"a", 2)))   # the last one: at once
    r.enter(b"a", 2, 11.5)                                       # sent again (unanswered): forwarded again
    assert r.barrier_entries(11.5) == Entries(((b"a", 2),))


def test_a_known_worker_is_waited_for_at_most_half_an_interval_and_not_once_it_finished() -> None:
    r = Relay(1.0)
    for ident in (b"a", b"b", b"c"):
        r.enter(ident, 1, 0.0)
    assert r.barrier_entries(BARRIER_HOLD) is not None
    assert r.batch(1.0) is None                                  # (the next heartbeat batch: at 2)
    r.enter(b"a", 2, 1.0)
    r.enter(b"b", 2, 1.1)
    assert r.barrier_entries(1.0 + BARRIER_WAIT - 0.01) is None  # c is known and heard from: waited for
    assert r.timeout(1.2) == pytest.approx(1.0 + BARRIER_WAIT - 1.2)
    assert r.barrier_entries(1.0 + BARRIER_WAIT) == Entries(((b"a", 2), (b"b", 2)))
    r.leaves(b"c")                                               # c's FINISH
    r.enter(b"a", 3, 2.0)
    r.enter(b"b", 3, 2.01)
    assert r.barrier_entries(2.01) == Entries(((b"a", 3), (b"b", 3)))


def test_a_worker_gone_silent_is_not_waited_for_and_is_forgotten_later() -> None:
    r = Relay(1.0)
    for ident in (b"a", b"b"):
        r.enter(ident, 1, 0.0)
    assert r.barrier_entries(BARRIER_HOLD) is not None
    r.beat(b"a", Counters(), 1.0)
    r.beat(b"b", Counters(), 1.0)
    r.enter(b"a", 2, 1.0 + GONE_INTERVALS - 0.01)
    assert r.barrier_entries(1.0 + GONE_INTERVALS - 0.01) is None    # b heard from lately: waited for
    assert r.barrier_entries(1.0 + GONE_INTERVALS + 0.001) == Entries(((b"a", 2),))   # b silent: not
    r.beat(b"a", Counters(), 20.0)
    r.enter(b"a", 3, 20.0)
    assert r.barrier_entries(20.0) == Entries(((b"a", 3),))
    assert set(r.enterers) == {b"a"}                              # b forgotten after FORGET_INTERVALS
    assert 20.0 - 1.0 > FORGET_INTERVALS


def test_entries_are_bounded_and_their_message_round_trips() -> None:
    r = Relay(1.0)
    r.enter(b"x", 1, 0.0)
    r.barrier_entries(1.0)
    for i in range(MAX_BEATS):
        r.enter(f"w{i}".encode(), 2, 2.0)
    got = r.barrier_entries(2.0)   # (x is known and not in barrier 2, but a message is full)
    assert got is not None and len(got.entries) == MAX_BEATS
    e = Entries(((b"worker-1-ab", 3), (b"worker-2-cd", 4)))
    assert decode_body(Command.BARRIERS, e.to_body()) == e
    assert e.to_body() == {"entries": [["worker-1-ab", 3], ["worker-2-cd", 4]]}
    for body, word in [({}, "entries is missing"), ({"entries": {}}, "entries must be a list"),
                       ({"entries": [["a"]]}, "entry"), ({"entries": [["a", 0]]}, "entry"),
                       ({"entries": [["a", 1.5]]}, "entry"), ({"entries": [[3, 1]]}, "entry"),
                       ({"entries": [["a", True]]}, "entry"),
                       ({"entries": [["a", 1]] * (MAX_BEATS + 1)}, "more than")]:
        with pytest.raises(ProtocolError, match=word):
            decode_body(Command.BARRIERS, body)
