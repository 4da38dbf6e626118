"""psnode.server.replicas over real sockets on 127.0.0.1: a keeper thread, the primaries' copies
to it, and a replacement's fetch."""
from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from psnode.config import NodeConfig, Role
from psnode.net.security import Mode, Security
from psnode.net.transport import Transport, new_security
from psnode.protocol import Command
from psnode.protocol.control import Replica, ServerAddress
from psnode.server.chunks import Assembly
from psnode.server.image import Image
from psnode.server.replicas import FetchedCopy, Keeper, Replicator, _Held, fetch, resend_due, unpack_state
from tests.support import wait_for

JOB = "job-replicas"


@dataclass
class Holder:
    """Server 0's keeper (it holds server 1's copies), the address book naming it, and the
    transports the test opened (closed at the end)."""

    security: Security
    cfg: NodeConfig
    book: list[ServerAddress]
    keeper: Keeper
    transports: list[Transport] = field(default_factory=list)

    def transport(self, name: str) -> Transport:
        t = Transport(JOB, name, self.cfg.max_message_bytes, self.security)
        self.transports.append(t)
        return t

    def primary(self, restart_count: int) -> Replicator:
        """Server 1 (its ``restart_count``-th process), connected to the keeper."""
        primary = Replicator(self.transport(f"server:1/{restart_count}"), 1, 2, 2, restart_count=restart_count)
        primary.repoint(self.book)
        return primary

    def fetched(self) -> FetchedCopy:
        return fetch(self.transport("server:1/fetch"), 1, self.book, 2, 2, lambda: None, timeout=5.0)

    def fetch(self) -> tuple[dict, dict, int]:
        """The fetched copy's index, arrays and holder."""
        got = self.fetched()
        return got.meta, got.arrays, got.holder


@pytest.fixture
def holder() -> Iterator[Holder]:
    yield from _holder()


def _holder(**settings: int) -> Iterator[Holder]:
    security = new_security(Mode.AUTHENTICATED)
    cfg = NodeConfig(role=Role.SERVER, scheduler_host="127.0.0.1", scheduler_port=1, num_workers=1,
                     num_servers=2, job_id=JOB, **settings)  # type: ignore[arg-type]
    keeper = Keeper(cfg, security)
    keeper.start()
    h = Holder(security, cfg, [ServerAddress(0, "127.0.0.1", 1, keeper.port), ServerAddress(1, "127.0.0.1", 2)],
               keeper)
    try:
        yield h
    finally:
        for t in h.transports:
            t.close()
        keeper.close()


def _within(seconds: float, what: str) -> Callable[[], None]:
    """A copy's pump that fails the wait after ``seconds``."""
    deadline = time.monotonic() + seconds

    def pump() -> None:
        if time.monotonic() > deadline:
            raise _Abandoned(what)
    return pump


class _Abandoned(Exception):
    pass


def _state(value: float) -> tuple[dict, dict]:
    """A server state (psnode.server.checkpoint.snapshot's form) of one dense key 'w' whose
    values and round are ``value``."""
    item = {"key": "w", "part": 0, "sparse": False, "sync": True, "average": True, "round": int(value),
            "state": [], "pushed": {}}
    return {"index": [item], "optimizer": None}, {"v0": np.full(4, value, np.float32)}


def _copy(primary: Replicator, value: float, within: float = 10.0) -> None:
    """Copy ``value`` as the primary's state; _Abandoned if it is not acknowledged in time."""
    state = _state(value)
    primary.copy(state, lambda: state,
                 _within(within, f"the copy of {value} was not acknowledged in {within:g} s"), resend_after=0.5)


def _round(meta: dict) -> int:
    return int(meta["index"][0]["round"])


def test_a_replacements_copies_supersede_its_predecessors_at_the_holder(holder: Holder) -> None:
    """Server 1 copies its state to server 0's keeper three times and dies; its replacement (one
    restart later) restores, changes its state and copies it: the keeper must hold the
    replacement's copy, so a second replacement fetches that one, not the predecessor's (which
    lacks what the replacement reported durable)."""
    for restart, values in ((0, [1.0, 2.0, 3.0]), (1, [4.0])):
        primary = holder.primary(restart)
        for v in values:
            _copy(primary, v)
        primary.close()
    meta, arrays, source = holder.fetch()
    assert (_round(meta), source) == (4, 0)
    np.testing.assert_array_equal(arrays["v0"], np.full(4, 4.0, np.float32))


def test_a_replaced_primarys_late_copy_is_never_acknowledged(holder: Holder) -> None:
    """A primary replaced while it still runs (cut off, then back) copies again: the keeper keeps
    the replacement's copy and never acknowledges the older one, so that primary's copy never
    completes (it waits, pumping its scheduler link, until the job tells it to end)."""
    new = holder.primary(1)    # (both connected to the keeper at once: each gets its own acks)
    old = holder.primary(0)
    _copy(old, 1.0)
    _copy(new, 2.0)
    with pytest.raises(_Abandoned):
        _copy(old, 3.0, within=1.5)
    assert _round(holder.fetch()[0]) == 2


def _asked_whole(value: float, asked: list[float]) -> Callable[[], tuple[dict, dict]]:
    """A primary's ``whole()`` that records being asked (the state whole, ``value``)."""
    def whole() -> tuple[dict, dict]:
        asked.append(value)
        return _state(value)
    return whole


def test_a_replacement_copies_the_holder_it_restored_from_only_its_changes(holder: Holder) -> None:
    """Server 1's replacement restored copy 2 from server 0's keeper: its first copy goes there
    as the changes since copy 2 (its state is never asked whole), numbered in the
    replacement's epoch, so the predecessor, still running, never has a copy acknowledged
    again."""
    old = holder.primary(0)
    _copy(old, 1.0)
    _copy(old, 2.0)
    got = holder.fetched()
    assert (got.seq, got.holder, got.holders, _round(got.meta)) == (2, 0, (0,), 2)
    new = holder.primary(1)
    new.adopt(got.seq, got.holders)
    assert new.ready()
    asked: list[float] = []
    new.copy(_state(3.0), _asked_whole(3.0, asked), _within(10, "the changes"), resend_after=0.5)
    assert asked == [] and new.seq == holder.keeper.held[1].seq == (1 << 32) + 1
    assert _round(holder.fetch()[0]) == 3
    with pytest.raises(_Abandoned):
        _copy(old, 4.0, within=1.5)
    assert _round(holder.fetch()[0]) == 3


def test_a_replacement_sends_its_state_whole_to_a_holder_whose_copy_changed_since_its_fetch(
        holder: Holder) -> None:
    """The predecessor, still running, copied again after the replacement fetched: the holder
    lacks the copy the replacement's changes build on, answers ``whole``, and gets the state
    whole."""
    old = holder.primary(0)
    _copy(old, 1.0)
    got = holder.fetched()
    _copy(old, 2.0)
    new = holder.primary(1)
    new.adopt(got.seq, got.holders)
    asked: list[float] = []
    new.copy(_state(3.0), _asked_whole(5.0, asked), _within(10, "the copy"), resend_after=0.5)
    assert asked == [5.0] and holder.keeper.held[1].seq == (1 << 32) + 1
    assert _round(holder.fetch()[0]) == 5


def _table(rows: int, changed: np.ndarray | None, values: np.ndarray, h: np.ndarray, t: int) -> tuple[dict, dict]:
    """A row_sparse key 'emb' of ``rows`` x 2 with an Adagrad-like state ('h' per row, 't'):
    whole (``changed`` None), or only the rows ``changed`` (a snapshot of changes)."""
    item: dict = {"key": "emb", "part": 0, "sparse": True, "sync": True, "average": False, "round": t,
                  "state": ["t", "h"], "pushed": {"0": t}}
    arrays = {"s0_t": np.array(t, np.int64)}
    if changed is None:
        arrays.update(v0=values, s0_h=h)
    else:
        item.update(changes="rows", state_rows=["h"])
        arrays.update(k0=changed, v0=values[changed], s0_h=h[changed])
    return {"index": [item], "optimizer": None}, arrays


def test_a_holder_that_has_the_last_copy_gets_only_the_rows_changed(holder: Holder) -> None:
    """A 100,000-row table is copied whole once; then three rounds change 2 rows each: each
    copy carries those rows (values and per-row state, 64 bytes of ids, values and state plus
    the index), and the holder's copy equals the primary's table exactly."""
    rows = 100_000
    values = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2)
    h = np.zeros((rows, 2), np.float32)
    primary = holder.primary(0)
    whole = _table(rows, None, values, h, 0)
    primary.copy(whole, lambda: whole, _within(10, "whole copy"), resend_after=0.5)
    assert primary.copied > values.nbytes + h.nbytes
    for t, changed in enumerate([np.array([5, 99_999]), np.array([0, 5]), np.array([77, 123])], start=1):
        values[changed] += 10.0 * t
        h[changed] += t
        before = primary.copied
        primary.copy(_table(rows, changed, values, h, t), lambda: pytest.fail("a whole copy was sent"),
                     _within(10, f"copy {t}"), resend_after=0.5)
        assert 64 <= primary.copied - before < 1024   # (2 ids + 2x2 values + 2x2 state, and the index)
    meta, arrays, _ = holder.fetch()
    assert meta["index"][0]["round"] == 3 and "changes" not in meta["index"][0]
    np.testing.assert_array_equal(arrays["v0"], values)
    np.testing.assert_array_equal(arrays["s0_h"], h)
    assert int(arrays["s0_t"]) == 3


def test_a_holder_that_lacks_the_base_asks_for_the_state_whole(holder: Holder) -> None:
    """The keeper lost what the primary's changes build on (here: its copy dropped): it answers
    ``whole`` and the primary sends the whole state at once, within the same copy."""
    rows = 1000
    values = np.ones((rows, 2), np.float32)
    h = np.zeros((rows, 2), np.float32)
    primary = holder.primary(0)
    whole = _table(rows, None, values, h, 0)
    primary.copy(whole, lambda: whole, _within(10, "whole copy"), resend_after=0.5)
    holder.keeper.held.clear()
    values[[3, 4]] = 7.0
    primary.copy(_table(rows, np.array([3, 4]), values, h, 1), lambda: _table(rows, None, values, h, 1),
                 _within(5, "copy after the keeper lost its copy"), resend_after=30.0)
    meta, arrays, _ = holder.fetch()
    assert meta["index"][0]["round"] == 1
    np.testing.assert_array_equal(arrays["v0"], values)


def _big_store(optimizer: str, lr: float, first: np.ndarray | None = None):
    """A restartable server's store holding a 300,000 x 4 row_sparse table given whole (``first``:
    rows a first push touched), durable as it is."""
    from psnode.protocol import Init, Push, SetOptimizer
    from psnode.server.store import Store

    store = Store(1, restartable=True)
    store.track_changes = True
    store.handle(0, SetOptimizer({"name": optimizer, "params": {"learning_rate": lr}}, id=1))
    table = np.arange(300_000 * 4, dtype=np.float32).reshape(300_000, 4)
    store.handle(0, Init("emb", 0, "float32", table.shape, True, "sum", True, table, id=2))
    while store.filling.pending:
        store.fill_some()
    if first is not None:
        store.handle(0, Push("emb", 0, 1, np.ones((len(first), 4), np.float32), rows=first))
    store.mark_durable()
    store.forget_changes()
    return store


def test_a_holder_without_the_last_copy_gets_the_state_whole_in_the_background(holder: Holder) -> None:
    """A primary whose holder has no copy yet (a restore, a replaced holder) makes a point
    beside its loop (psnode.server.points): the holder gets the state of that moment whole,
    the big table read in place, while a round changes the table;
    the copy the holder keeps is the state at the point, exactly."""
    from psnode.protocol import Push
    from psnode.server import checkpoint
    from psnode.server.points import Points

    store = _big_store("sgd", 1.0)
    sent: list = []
    points = Points(store, sent.extend, every=0, resend_after=5.0)
    points.replicator = holder.primary(0)
    want = checkpoint.snapshot(store)[1]["v0"].copy()
    points.now(lambda: None)
    assert points.pending is not None                       # (beside the loop)
    store.handle(0, Push("emb", 0, 1, np.ones((2, 4), np.float32), rows=np.array([0, 9])))   # meanwhile
    deadline = time.monotonic() + 20
    while points.pending is not None:
        points.poll(lambda: None)
        assert time.monotonic() < deadline, "the whole copy was not acknowledged"
        time.sleep(0.01)
    _, arrays, _ = holder.fetch()
    np.testing.assert_array_equal(arrays["v0"], want)       # the point's state, not the round's
    assert store.entries[("emb", 0)].value[9].tolist() == [35.0, 36.0, 37.0, 38.0]


def test_a_big_copy_is_sent_once_while_its_bytes_can_still_be_on_their_way(holder: Holder) -> None:
    """A whole copy of 64 MiB polled with no grace (``resend_after`` 0): it goes to the holder
    once and is acknowledged, not sent again at each poll before its acknowledgement could
    arrive (on a slow link, every resend of a big copy would queue behind the first)."""
    primary = holder.primary(0)
    meta, _ = _state(1.0)
    state = (meta, {"v0": np.ones(16 << 20, np.float32)})
    primary.start(state)
    deadline = time.monotonic() + 30
    while primary.poll(lambda: state, resend_after=0.0, wait_s=0.0) is not True:
        assert time.monotonic() < deadline, "the copy was not acknowledged"
    assert (64 << 20) <= primary.copied < 2 * (64 << 20)
    assert not resend_due(0.0, 64 << 20, 5.0, 0.5) and resend_due(0.0, 64 << 20, 8.0, 0.5)
    assert resend_due(0.0, 100, 0.6, 0.5)                   # a small copy: after resend_after


def test_a_whole_copy_read_while_the_rounds_write_rows_is_patched_to_the_points_state(holder: Holder) -> None:
    """A primary whose holder has no copy (a replaced holder) sends its Adagrad table whole
    beside its loop, read in place while rounds write rows of it: no round copies the table or
    its state (they are written in place, the rows saved first, once each), and the copy the
    holder ends with, the fuzzy one patched with those rows, is exactly the state at the point,
    values and per-row state."""
    from psnode.protocol import Push
    from psnode.server import checkpoint
    from psnode.server.keypart import RowPin
    from psnode.server.points import Points

    store = _big_store("adagrad", 0.5, first=np.array([1, 2, 3]))   # (the state made by a first push)
    entry = store.entries[("emb", 0)]
    value, history = entry.value, entry.state.arrays["history"]
    want = {n: np.array(a) for n, a in checkpoint.snapshot(store)[1].items()}
    sent: list = []
    points = Points(store, sent.extend, every=0, resend_after=5.0)
    points.replicator = holder.primary(0)
    points.now(lambda: None)
    assert points.pending is not None and any(isinstance(p, RowPin) for p in entry.value_sends)
    for q, rows in enumerate([[0, 9], [9, 299_999], [2, 0, 5]], start=2):   # meanwhile (rows again, too)
        store.handle(0, Push("emb", 0, q, np.full((len(rows), 4), q, np.float32), rows=np.array(rows)))
    assert entry.value is value and entry.state.arrays["history"] is history   # (in place)
    deadline = time.monotonic() + 20
    while points.pending is not None:
        points.poll(lambda: None)
        assert time.monotonic() < deadline, "the whole copy was not acknowledged"
        time.sleep(0.01)
    assert not any(isinstance(p, RowPin) and not p.done for p in entry.value_sends)
    _, arrays, _ = holder.fetch()
    np.testing.assert_array_equal(arrays["v0"], want["v0"])             # the point's state, not the rounds'
    np.testing.assert_array_equal(arrays["s0_history"], want["s0_history"])
    assert not np.array_equal(value[[0, 5, 9, 299_999]], want["v0"][[0, 5, 9, 299_999]])   # (they moved on)
    # the next copy goes as the rows changed since the point, onto the patched copy: exact again
    store.handle(0, Push("emb", 0, 5, np.ones((1, 4), np.float32), rows=np.array([7])))
    points.now(lambda: None)
    while points.pending is not None:
        points.poll(lambda: None)
        assert time.monotonic() < deadline, "the next copy was not acknowledged"
        time.sleep(0.01)
    _, arrays, _ = holder.fetch()
    np.testing.assert_array_equal(arrays["v0"], value)
    np.testing.assert_array_equal(arrays["s0_history"], entry.state.arrays["history"])


def test_a_fuzzy_copy_is_neither_served_nor_built_on_until_its_patch(holder: Holder) -> None:
    """The keeper's side: a whole copy marked fuzzy is kept but not given to a replacement
    (there is no copy of the rank yet) and no changes apply to it (``whole``); its patch, same
    seq, writes the rows back and makes it the copy, acknowledged then, and served."""
    from psnode.errors import ConfigError
    from psnode.protocol.control import Replica
    from psnode.server.replicas import pack_state

    rows = 1000
    values = np.ones((rows, 2), np.float32)
    h = np.zeros((rows, 2), np.float32)
    fuzzy = values.copy()
    fuzzy[[3, 4]] = 9.0   # (read after a round wrote them)
    keeper = holder.keeper
    ack = keeper._put(Replica(1, 7, fuzzy=True), pack_state(*_table(rows, None, fuzzy, h, 0)))
    assert (ack.seq, ack.fuzzy) == (7, True)
    with pytest.raises(ConfigError, match="no copy of server 1"):
        holder.fetch()
    assert keeper._put(Replica(1, 8, base=7), pack_state(*_table(rows, np.array([1]), values, h, 1))).whole
    assert keeper._put(Replica(1, 7, fuzzy=True), pack_state(*_table(rows, None, fuzzy, h, 0))).fuzzy   # (again)
    patch = _table(rows, np.array([3, 4]), values, h, 0)
    ack = keeper._put(Replica(1, 7, patch=True), pack_state(*patch))
    assert (ack.seq, ack.fuzzy, ack.whole) == (7, False, False)
    assert keeper._put(Replica(1, 7, patch=True), pack_state(*patch)).seq == 7   # (sent again: the same ack)
    _, arrays, _ = holder.fetch()
    np.testing.assert_array_equal(arrays["v0"], values)
    assert keeper._put(Replica(2, 3, patch=True), pack_state(*patch)).whole   # (no fuzzy copy of rank 2)


@dataclass
class _Rig:
    """A restartable store with a big row_sparse table (:func:`_big_store`), its durable points
    copied to the holder's keeper by server 1's replicator, and the answers they sent."""

    store: Any
    points: Any
    sent: list
    deadline: float

    @classmethod
    def of(cls, holder: Holder) -> _Rig:
        from psnode.server.points import Points

        store = _big_store("adagrad", 0.5, first=np.array([1, 2, 3]))
        sent: list = []
        points = Points(store, sent.extend, every=0, resend_after=5.0)
        points.replicator = holder.primary(0)
        return cls(store, points, sent, time.monotonic() + 30)

    @property
    def entry(self) -> Any:
        return self.store.entries[("emb", 0)]

    def settle(self) -> None:
        """Poll until no point is under way (the loop never waits: its pump fails the test)."""
        while self.points.pending is not None:
            self.points.poll(_never)
            assert time.monotonic() < self.deadline, "a copy was not acknowledged"
            time.sleep(0.01)

    def push(self, seq: int, rows: list[int], value: float, op_id: int = 0) -> None:
        """Worker 0's push ``seq`` of ``value`` to ``rows``; with ``op_id``, one that asks for its
        answer (and its durability)."""
        from psnode.protocol import Push

        op = Push("emb", 0, seq, np.full((len(rows), 4), value, np.float32), rows=np.array(rows), id=op_id,
                  na=not op_id)
        self.points.reply(self.store.handle(0, op), _never)

    def answered(self, op_id: int) -> list[int]:
        return [r.answer.seq for r in self.sent if getattr(r.answer, "id", None) == op_id]

    def held_by(self, keeper: Keeper) -> None:
        """``keeper`` holds this store's state exactly."""
        held = keeper.held[1]
        assert held.exact
        _, arrays = held.image.whole()
        np.testing.assert_array_equal(arrays["v0"], self.entry.value)
        np.testing.assert_array_equal(arrays["s0_history"], self.entry.state.arrays["history"])


@contextmanager
def _replacement(holder: Holder) -> Iterator[Keeper]:
    """A new keeper in the holder's place: bound, answering only once the test starts it."""
    keeper = Keeper(holder.cfg, holder.security)
    try:
        yield keeper
    finally:
        if keeper.ident is None:
            keeper.start()
        keeper.close()


def test_a_holder_replaced_during_a_point_gets_the_state_whole_beside_the_loop(holder: Holder) -> None:
    """A point under way (the rows of a round) when the holder is replaced (a new keeper): the
    new holder gets the current state whole, read by row while rounds go on, and the loop never
    waits for it (its pump is never called); the next copy, changes only, leaves the new holder
    with the primary's state exactly."""
    rig = _Rig.of(holder)
    points = rig.points
    points.now(_never)
    rig.settle()                                           # (the first holder got it whole)
    rig.push(2, [4, 5], 1.0)
    points.now(_never)                                     # (changes only: rows 4, 5)
    assert points.pending is not None
    with _replacement(holder) as replacement:
        assert points.replicator.repoint([ServerAddress(0, "127.0.0.1", 1, replacement.port),
                                          ServerAddress(1, "127.0.0.1", 2)]) == [0]
        points.now(_never)                                 # (under way: the next one is wanted)
        value = rig.entry.value
        for q, rows in enumerate([[0, 9], [9, 299_999]], start=3):
            points.poll(_never)
            rig.push(q, rows, q)
        assert points.pending is not None
        replacement.start()
        rig.settle()
        assert rig.entry.value is value                    # (written in place meanwhile)
        points.now(_never)
        rig.settle()
        rig.held_by(replacement)


def test_a_replaced_holder_makes_the_state_read_whole_for_it_durable_at_once(holder: Holder) -> None:
    """The only holder is replaced (its host crashed) while a point waits for it: its new keeper
    holds none of this server's copies, so no replacement could restore an older state.  The
    state read whole for it is durable at once: a push answer waiting for the point leaves with
    its count (what a restarted worker's resumed count waits for), the new keeper not started
    yet.  A push taken after that read still waits for the copy, and leaves once the new keeper
    holds the state exactly."""
    rig = _Rig.of(holder)
    points, entry = rig.points, rig.entry
    points.now(_never)
    rig.settle()                                           # (the first holder got it whole)
    rig.push(2, [4, 5], 1.0, op_id=7)
    assert points.pending is not None and rig.answered(7) == []   # (it waits for the holder)
    with _replacement(holder) as replacement:
        points.replicator.repoint([ServerAddress(0, "127.0.0.1", 1, replacement.port),
                                   ServerAddress(1, "127.0.0.1", 2)])
        points.poll(_never)
        assert rig.answered(7) == [2] and entry.durable[0] == 2 and not replacement.held
        rig.push(3, [0, 9], 3.0, op_id=8)
        points.poll(_never)
        assert rig.answered(8) == [] and entry.durable[0] == 2   # (read after the copy: it waits)
        replacement.start()
        rig.settle()
        assert rig.answered(8) == [3] and entry.durable[0] == 3
        rig.held_by(replacement)


def _never() -> None:
    raise AssertionError("the loop waited for a copy")


def test_a_copy_asked_for_is_sent_as_held(holder: Holder) -> None:
    """A replacement's REPLICA_GET is answered with the held image's own arrays, in chunks of
    at most the keeper's chunk size: the keeper allocates no copy of a 64 MB table for it, and
    the chunks put together are that state exactly."""
    rows = 4_000_000
    values = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2)
    h = np.ones((rows, 2), np.float32)
    primary = holder.primary(0)
    whole = _table(rows, None, values, h, 0)
    primary.copy(whole, lambda: whole, _within(10, "whole copy"), resend_after=0.5)
    chan = holder.transport("server:1/fetch").dealer("127.0.0.1", holder.keeper.port, "r1")
    tracemalloc.start()
    try:
        chan.send(Command.REPLICA_GET, Replica(1).to_body())
        answers = [wait_for(chan.recv, 10, "the keeper's answer")[1]]
        for i in range(1, answers[0].body["chunks"]):
            chan.send(Command.REPLICA_GET, Replica(1, 1, chunk=i).to_body())
            answers.append(wait_for(chan.recv, 10, f"chunk {i}")[1])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"the keeper allocated {peak / 2**20:.0f} MiB to answer"
    size = holder.keeper.chunk_bytes
    assert len(answers) == -(-(values.nbytes + h.nbytes) // size) == 8   # (the index and t fit in the last)
    assert all(a.cmd is Command.REPLICA_STATE and a.body["seq"] == 1 for a in answers)
    assert all(sum(f.nbytes for f in a.arrays[i == 0:]) <= size for i, a in enumerate(answers))
    assembly = Assembly.of(answers[0].arrays[0], len(answers), 1 << 30)
    for i, a in enumerate(answers):
        assert assembly.take(i, a.arrays[1:] if i == 0 else a.arrays)
    _, arrays = unpack_state(assembly.arrays)
    np.testing.assert_array_equal(arrays["v0"], values)
    np.testing.assert_array_equal(arrays["s0_h"], h)


class _OnItsWay:
    """An answer zmq still reads (psnode.net.transport.Sent), or one it is done with."""

    def __init__(self, done: bool) -> None:
        self.done = done


@pytest.mark.parametrize("on_its_way", [True, False])
def test_changes_to_a_copy_still_being_sent_go_to_a_copy_of_it(on_its_way: bool) -> None:
    """While an answer reads the held image's arrays, the changes the keeper takes go to a
    copy of the image (the answer goes out as asked for); once it is sent, in place."""
    rows = 1000
    values = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2)
    h = np.zeros((rows, 2), np.float32)
    held = _Held(1, Image(*_table(rows, None, values.copy(), h.copy(), 0)), sending=[_OnItsWay(not on_its_way)])
    sent = held.image.whole()[1]["v0"]
    values[[5, 999]] += 10.0
    h[[5, 999]] += 1.0
    held.writable().apply(*_table(rows, np.array([5, 999]), values, h, 1))
    _, now = held.image.whole()
    np.testing.assert_array_equal(now["v0"], values)
    np.testing.assert_array_equal(now["s0_h"], h)
    assert (now["v0"] is not sent) == on_its_way and not held.sending
    if on_its_way:
        np.testing.assert_array_equal(sent, np.arange(rows * 2, dtype=np.float32).reshape(rows, 2))


@pytest.fixture
def small_messages() -> Iterator[Holder]:
    """A keeper, and primaries, whose transports take messages of at most 4 MiB."""
    yield from _holder(max_message_bytes=4 << 20)


def test_a_whole_copy_bigger_than_a_message_may_be_goes_in_chunks(small_messages: Holder) -> None:
    """A 64 MB table copied whole and fetched back through transports that take 4 MiB messages
    at most (a state bigger than ``max_message_bytes``): it travels in chunks of half that, and
    arrives exactly both ways."""
    rows = 4_000_000
    values = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2)
    h = np.full((rows, 2), 0.5, np.float32)
    primary = small_messages.primary(0)
    assert primary.chunk_bytes == small_messages.keeper.chunk_bytes == 2 << 20
    whole = _table(rows, None, values, h, 0)
    primary.copy(whole, lambda: whole, _within(20, "the whole copy"), resend_after=0.5)
    assert values.nbytes + h.nbytes < primary.copied < values.nbytes + h.nbytes + (1 << 20)   # (each byte once)
    assert not small_messages.keeper.incoming
    meta, arrays, _ = small_messages.fetch()
    assert meta["index"][0]["round"] == 0
    np.testing.assert_array_equal(arrays["v0"], values)
    np.testing.assert_array_equal(arrays["s0_h"], h)


def test_a_keeper_whose_server_restores_takes_no_whole_copy_until_it_is_free(small_messages: Holder) -> None:
    """While its own server restores (``hold``), a keeper refuses a new whole copy (``busy``):
    the primary stops after its first chunk, however long its silence rule would let it go on.
    Once free, the keeper asks for the copy; it arrives exactly, long before the primary's
    silence would have sent it again."""
    rows = 4_000_000
    values = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2)
    h = np.full((rows, 2), 0.5, np.float32)
    keeper = small_messages.keeper
    keeper.hold()
    primary = small_messages.primary(0)
    whole = _table(rows, None, values, h, 0)
    t0 = time.monotonic()
    freed: list[tuple[float, int]] = []

    def pump() -> None:
        now = time.monotonic()
        if not freed and now - t0 > 1.5:
            freed.append((now, primary.copied))
            keeper.free()
        assert now - t0 < 20, "the copy was not acknowledged once the keeper was free"
    primary.copy(whole, lambda: whole, pump, resend_after=60.0)
    (freed_at, before), size = freed[0], primary.chunk_bytes
    assert before <= size + 4096              # (its first chunk, then nothing)
    assert time.monotonic() - freed_at < 10   # (asked for: not after the 60 s silence)
    assert values.nbytes + h.nbytes <= primary.copied - before <= values.nbytes + h.nbytes + 4096
    _, arrays, _ = small_messages.fetch()
    np.testing.assert_array_equal(arrays["v0"], values)
    np.testing.assert_array_equal(arrays["s0_h"], h)


def test_chunks_lost_on_the_way_are_sent_again_from_the_last_one_taken(holder: Holder,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Two chunks of a whole copy never reach the keeper (a connection cut and made again loses
    what was on it): the keeper takes none after the gap, the primary hears no progress and,
    after its silence, sends again from the last chunk taken; the copy arrives exactly, the
    bytes sent again bounded by the window."""
    rows = 4_000_000
    values = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2)
    h = np.zeros((rows, 2), np.float32)
    keeper = holder.keeper
    lost: list[int] = []
    on = keeper._on

    def losing(ident: bytes, msg: object) -> None:
        chunk = getattr(msg, "body", {}).get("chunk", 0)
        if chunk in (2, 3) and chunk not in lost:
            lost.append(chunk)
            return
        on(ident, msg)
    monkeypatch.setattr(keeper, "_on", losing)
    primary = holder.primary(0)
    whole = _table(rows, None, values, h, 0)
    t0 = time.monotonic()
    primary.copy(whole, lambda: whole, _within(30, "the whole copy"), resend_after=0.2)
    assert lost == [2, 3]
    size = primary.chunk_bytes
    assert values.nbytes + h.nbytes + 2 * size <= primary.copied <= values.nbytes + h.nbytes + (4 + 1) * size
    assert time.monotonic() - t0 < 0.2 + 4 * size / 10e6 + 5       # (one silence, not one per chunk)
    _, arrays, _ = holder.fetch()
    np.testing.assert_array_equal(arrays["v0"], values)
    np.testing.assert_array_equal(arrays["s0_h"], h)


def test_a_malformed_chunk_never_kills_the_keeper(holder: Holder) -> None:
    """A chunk whose layout is no layout, or whose frames are not the plan's, is dropped with a
    warning; the keeper goes on taking copies."""
    chan = holder.transport("server:1/odd").dealer("127.0.0.1", holder.keeper.port, "odd")
    chan.send(Command.REPLICA_PUT, Replica(1, 5, chunk=0, chunks=3).to_body(), arrays=[np.zeros(7, np.uint8)])
    chan.send(Command.REPLICA_PUT, Replica(1, 5, chunk=1, chunks=3).to_body(), arrays=[np.zeros(7, np.uint8)])
    chan.send(Command.REPLICA_PUT, {"rank": 1, "seq": 5, "chunk": -1, "chunks": 3}, arrays=[np.zeros(7, np.uint8)])
    primary = holder.primary(0)
    _copy(primary, 2.0)
    assert holder.keeper.is_alive() and _round(holder.fetch()[0]) == 2


@dataclass
class Holders:
    """With 3 servers and 3 replicas: servers 0 and 2's keepers (both hold server 1's copies),
    the address book naming them, and the transports the test opened (closed at the end)."""

    security: Security
    cfg: NodeConfig
    keepers: dict[int, Keeper]
    book: list[ServerAddress]
    transports: list[Transport] = field(default_factory=list)

    def transport(self, name: str) -> Transport:
        t = Transport(JOB, name, self.cfg.max_message_bytes, self.security)
        self.transports.append(t)
        return t

    def copy(self, whole: tuple[dict, dict]) -> None:
        """Server 1 copies ``whole`` to both keepers."""
        primary = Replicator(self.transport("server:1"), 1, 3, 3)
        primary.repoint(self.book)
        primary.copy(whole, lambda: whole, _within(20, "the whole copy"), resend_after=0.5)

    def fetch(self, timeout: float) -> tuple[dict, dict, int]:
        got = fetch(self.transport("server:1/fetch"), 1, self.book, 3, 3, lambda: None, timeout=timeout)
        return got.meta, got.arrays, got.holder


@pytest.fixture
def holders() -> Iterator[Holders]:
    security = new_security(Mode.AUTHENTICATED)
    cfg = NodeConfig(role=Role.SERVER, scheduler_host="127.0.0.1", scheduler_port=1, num_workers=1,
                     num_servers=3, job_id=JOB)
    keepers = {r: Keeper(cfg, security) for r in (0, 2)}
    for k in keepers.values():
        k.start()
    h = Holders(security, cfg, keepers, [ServerAddress(0, "127.0.0.1", 1, keepers[0].port),
                                         ServerAddress(1, "127.0.0.1", 2),
                                         ServerAddress(2, "127.0.0.1", 3, keepers[2].port)])
    try:
        yield h
    finally:
        for t in h.transports:
            t.close()
        for k in keepers.values():
            k.close()


def test_a_holder_that_stops_sending_its_copy_leaves_the_fetch_to_the_next(holders: Holders,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """With 3 replicas, server 1's copy is kept by servers 2 and 0.  Server 2's keeper answers
    first and is taken, then sends no chunk after the first: after the fetch's timeout of silence
    the replacement pulls server 0's copy instead, and it is the state exactly."""
    rows = 2_000_000
    values = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2)
    h = np.full((rows, 2), 3.0, np.float32)
    holders.copy(_table(rows, None, values, h, 0))
    on = {r: k._on for r, k in holders.keepers.items()}

    def silent_after_first(ident: bytes, msg: object) -> None:
        if getattr(msg, "body", {}).get("chunk", 0) == 0:
            on[2](ident, msg)

    def late(ident: bytes, msg: object) -> None:
        time.sleep(0.3)   # (within the grace: its answer counts, after server 2's)
        on[0](ident, msg)
    monkeypatch.setattr(holders.keepers[2], "_on", silent_after_first)
    monkeypatch.setattr(holders.keepers[0], "_on", late)
    t0 = time.monotonic()
    _, arrays, source = holders.fetch(timeout=1.0)
    assert source == 0 and time.monotonic() - t0 >= 1.0
    np.testing.assert_array_equal(arrays["v0"], values)
    np.testing.assert_array_equal(arrays["s0_h"], h)


def test_a_whole_copy_in_chunks_reports_how_far_each_holder_got(holder: Holder) -> None:
    """While a holder gets the state whole in chunks, the primary reports (bytes it acknowledged,
    the copy's bytes), growing chunk by chunk; none once it has it (psnode.server.loop: the
    heartbeat's ``lag``, ``mxdist status``)."""
    primary = holder.primary(0)
    meta, _ = _state(1.0)
    state = (meta, {"v0": np.ones(16 << 20, np.float32)})
    primary.start(state, state)
    seen: list[tuple[int, int]] = []
    deadline = time.monotonic() + 30
    while primary.poll(None, resend_after=5.0, wait_s=0.001) is not True:
        seen += [p for r, p in primary.progress().items() if r == 0]
        assert time.monotonic() < deadline, "the copy was not acknowledged"
    total = seen[0][1]
    assert 64 << 20 <= total < (64 << 20) + 4096 and all(t == total for _, t in seen)
    got = [g for g, _ in seen]
    assert got == sorted(got) and got[0] < total and len(set(got)) > 2   # (chunk by chunk)
    assert primary.progress() == {}


def test_chunks_asked_for_and_lost_are_asked_for_again(holder: Holder, monkeypatch: pytest.MonkeyPatch) -> None:
    """The keeper never sees the first ask for chunk 2 of its copy (lost with a broken
    connection): after half the fetch's timeout without a chunk, the replacement asks for the
    chunks not come again, and the copy arrives exactly from the same (only) holder."""
    rows = 2_000_000
    values = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2)
    h = np.full((rows, 2), 2.0, np.float32)
    primary = holder.primary(0)
    whole = _table(rows, None, values, h, 0)
    primary.copy(whole, lambda: whole, _within(20, "the whole copy"), resend_after=0.5)
    lost: list[int] = []
    on = holder.keeper._on

    def losing(ident: bytes, msg: object) -> None:
        if getattr(msg, "body", {}).get("chunk", 0) == 2 and not lost:
            lost.append(2)
            return
        on(ident, msg)
    monkeypatch.setattr(holder.keeper, "_on", losing)
    got = fetch(holder.transport("server:1/fetch"), 1, holder.book, 2, 2, lambda: None, timeout=2.0)
    arrays, source = got.arrays, got.holder
    assert lost == [2] and source == 0
    np.testing.assert_array_equal(arrays["v0"], values)
    np.testing.assert_array_equal(arrays["s0_h"], h)


def test_a_late_first_answer_does_not_cut_short_the_pull_under_way(holders: Holders,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Server 2's keeper answers at once and its copy is pulled, a chunk every 2 s (a slow
    link); server 0's first answer comes after the grace, while the pull is under way: the
    pull keeps its own timeout (its holder is not left for the late one)."""
    rows = 1_500_000    # (24 MB: three chunks)
    values = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2)
    holders.copy(_table(rows, None, values, np.ones((rows, 2), np.float32), 0))
    on = {r: k._on for r, k in holders.keepers.items()}

    def slow_link(ident: bytes, msg: object) -> None:
        if getattr(msg, "body", {}).get("chunk", 0):
            time.sleep(2.0)
        on[2](ident, msg)

    def late(ident: bytes, msg: object) -> None:
        time.sleep(1.3)   # (after the grace: the pull from server 2 is under way)
        on[0](ident, msg)
    monkeypatch.setattr(holders.keepers[2], "_on", slow_link)
    monkeypatch.setattr(holders.keepers[0], "_on", late)
    _, arrays, source = holders.fetch(timeout=5.0)
    assert source == 2
    np.testing.assert_array_equal(arrays["v0"], values)
