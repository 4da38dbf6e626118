"""psnode.server.chunks: a state cut into bounded chunks, put together exactly, and the sender's
window and go-back-N."""
from __future__ import annotations

import json

import numpy as np
import pytest

from psnode.server.chunks import CHUNK_BYTES, Assembly, Sender, chunk_bytes, frames, layout, plan


def _state() -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [np.frombuffer(b'{"index": 1}', np.uint8), rng.random((1000, 3)).astype(np.float32),
            np.array(7, np.int64), np.zeros((0, 4), np.float64), rng.integers(0, 9, 5000).astype(np.int16),
            np.ones(3, bool)]


@pytest.mark.parametrize("size", [1, 7, 100, 4096, 12_000, 1 << 20])
def test_the_chunks_carry_every_byte_once_in_order_none_over_the_size(size: int) -> None:
    arrays = _state()
    chunks = plan([a.nbytes for a in arrays], size)
    assert all(sum(p.stop - p.start for p in c) <= size for c in chunks)
    assert all(sum(p.stop - p.start for p in c) == size for c in chunks[:-1])   # (only the last is short)
    covered = [(p.array, p.start, p.stop) for c in chunks for p in c]
    for i, a in enumerate(arrays):
        runs = [(start, stop) for j, start, stop in covered if j == i]
        assert [s for s, _ in runs] == [0, *[e for _, e in runs[:-1]]] if runs else a.nbytes == 0
        assert (runs[-1][1] if runs else 0) == a.nbytes
    assert [j for j, _, _ in covered] == sorted(j for j, _, _ in covered)


def test_nothing_to_send_is_one_empty_chunk() -> None:
    assert plan([], 10) == [()] and plan([0, 0], 10) == [()]
    with pytest.raises(ValueError, match="at least 1 byte"):
        plan([5], 0)


@pytest.mark.parametrize("size", [1, 333, 4096, 1 << 20])
def test_an_assembly_puts_the_chunks_together_exactly(size: int) -> None:
    arrays = _state()
    sender = Sender(arrays, size)
    got = Assembly.of(layout(arrays, size), len(sender.chunks), 1 << 30)
    for i in range(len(sender.chunks)):
        message = sender.message(i)
        assert got.take(i, message[1:] if i == 0 else message)
    assert got.done
    assert [(a.dtype, a.shape) for a in got.arrays] == [(a.dtype, a.shape) for a in arrays]
    for a, b in zip(got.arrays, arrays, strict=True):
        np.testing.assert_array_equal(a, b)


def test_chunks_are_taken_in_order_only() -> None:
    arrays = _state()
    sender = Sender(arrays, 4096)
    got = Assembly.of(layout(arrays, 4096), len(sender.chunks), 1 << 30)
    assert not got.take(1, sender.message(1))               # (chunk 0 is missing)
    assert got.take(0, sender.message(0)[1:]) and got.taken == 1
    assert not got.take(0, sender.message(0)[1:])           # (again: taken already)
    assert got.take(1, sender.message(1)) and got.taken == 2


def test_a_chunks_frames_must_be_the_plans() -> None:
    arrays = _state()
    sender = Sender(arrays, 4096)
    got = Assembly.of(layout(arrays, 4096), len(sender.chunks), 1 << 30)
    first = sender.message(0)[1:]
    with pytest.raises(ValueError, match="frames, not"):
        got.take(0, first[:-1] if len(first) > 1 else [*first, first[0]])
    with pytest.raises(ValueError, match="where"):
        got.take(0, [f[:-1] for f in first])
    with pytest.raises(ValueError, match="where"):
        got.take(0, [f.view(np.int8) for f in first])
    assert got.taken == 0


def _spec(size: object, arrays: object) -> np.ndarray:
    return np.frombuffer(json.dumps({"size": size, "arrays": arrays}).encode(), np.uint8)


@pytest.mark.parametrize(("spec", "chunks", "match"), [
    (np.frombuffer(b"not json", np.uint8), 1, "not one"),
    (np.frombuffer(b'{"size": 4}', np.uint8), 1, "not one"),
    (_spec(0, []), 1, "chunk size"),
    (_spec(4, [["object", [2]]]), 1, "cannot hold"),
    (_spec(4, [["float32", [-1]]]), 1, "cannot hold"),
    (_spec(4, [["float32", [2.5]]]), 1, "cannot hold"),
    (_spec(4, [["float32", [1] * 40]]), 1, "cannot hold"),
    (_spec(4, [["float32", [1 << 40, 1 << 40]]]), 1, "more than"),
    (_spec(4, [["float32", [3]]]), 2, "makes 3 chunks, not the 2"),
])
def test_a_layout_it_cannot_hold_is_refused_before_anything_is_allocated(spec: np.ndarray, chunks: int,
                                                                         match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Assembly.of(spec, chunks, 1 << 30)


def test_a_sender_keeps_its_window_and_goes_back_after_silence() -> None:
    arrays = [np.zeros(10 * 100, np.uint8)]
    s = Sender(arrays, 100, window=3)
    assert list(s.due(0.0, 1.0)) == [0]                     # (one chunk until the first acknowledgement)
    assert list(s.due(0.05, 1.0)) == []
    s.ack(1, 0.1)
    assert list(s.due(0.2, 1.0)) == [1, 2, 3]
    assert list(s.due(0.5, 1.0)) == []                      # (the window is full)
    s.ack(3, 0.6)
    assert list(s.due(0.7, 1.0)) == [4, 5]
    assert list(s.due(1.5, 1.0)) == []                      # (silent 0.9 s: not yet)
    assert list(s.due(1.7, 1.0)) == [3, 4, 5]               # (silent 1.1 s: from the last acknowledged)
    s.ack(6, 1.8)
    assert list(s.due(1.9, 1.0)) == [6, 7, 8]
    s.ack(0, 2.0)                                           # (a receiver without any of it: one chunk first)
    assert list(s.due(2.1, 1.0)) == [0]
    s.ack(10, 2.2)
    assert s.done and list(s.due(9.0, 1.0)) == []


def test_chunk_0_carries_the_layout_and_frames_are_views() -> None:
    arrays = _state()
    s = Sender(arrays, 4096)
    first = s.message(0)
    assert json.loads(bytes(first[0]))["size"] == 4096
    assert all(np.shares_memory(f, arrays[p.array]) for f, p in zip(frames(arrays, s.chunks[1]), s.chunks[1],
                                                                     strict=True))
    assert s.nbytes(0) == sum(f.nbytes for f in first[1:])


def test_a_chunk_fits_the_transports_message_limit() -> None:
    assert chunk_bytes(4 << 30) == CHUNK_BYTES
    assert chunk_bytes(4 << 20) == 2 << 20
    assert chunk_bytes(1024) == 512
