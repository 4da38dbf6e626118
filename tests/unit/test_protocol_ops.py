"""Typed data operations on the wire: every op and answer round-trips through the binary
encoding, and any corruption of a data message is a ProtocolError, never another exception."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from psnode.errors import ProtocolError
from psnode.protocol import (
    DATA_VERSION,
    Command,
    Failed,
    Flush,
    GetStates,
    Init,
    LoadStates,
    Message,
    Missing,
    Ok,
    Pull,
    Push,
    PushPull,
    SetOptimizer,
    Wait,
    decode,
    encode,
    resent,
)
from psnode.protocol.codec import ARRAY, HEAD, RECORD

F = np.float32


def _frames(cmd: Command, ops: list) -> list[bytes]:
    return [f if isinstance(f, bytes) else bytes(memoryview(f)) for f in encode(Message(cmd, "j", "", ops=ops))]


def _same(a, b) -> None:
    assert type(a) is type(b)
    for name in a.__dataclass_fields__:
        x, y = getattr(a, name), getattr(b, name)
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y), name
        elif isinstance(x, list) and x and isinstance(x[0], np.ndarray):
            assert len(x) == len(y) and all(np.array_equal(p, q) for p, q in zip(x, y)), name
        else:
            assert x == y, name


REQUESTS = [
    Init("w", 0, "float32", (3, 4), True, "average", False, np.arange(12, dtype=F).reshape(3, 4), id=1),
    Init(7, 2, "int64", (), False, "sum", True, None, id=2, re=True),
    Init("emb", 1, "float32", (5, 16), True, "max", True, None, id=12, fill={
        "init": {"name": "normal", "params": {"sigma": 0.01}}, "seed": 3, "shape": [10, 16], "start": 80}, bare=True),
    Init("emb", 0, "float32", (5, 16), True, "average", True, None, id=13, bare=True),
    Push("w", 1, 5, np.arange(100_000, dtype=F), id=3),
    Push("emb", 0, 9, np.ones((2, 3), F), np.array([4, 1], np.int64), id=4, re=True, na=False),
    Pull("w", 0, 5, id=5),
    Pull(-(2**63), 65535, 0, np.array([1, 2, 3], np.int32), id=2**64 - 1),
    PushPull("é-ключ", 0, 1, np.zeros(0, F), id=6),
    Flush([("w", 0, [1, 2]), (3, 1, [7])], id=7),
    Flush([("w", 0, [4])], id=8, durable=False),
    SetOptimizer({"name": "sgd", "params": {"learning_rate": 0.1}}, id=9),
    GetStates(id=10),
    LoadStates([("w", 0, "mom"), ("b", 1, "v")], [np.ones(3, F), np.zeros((2, 2), np.float64)], id=11),
]
ANSWERS = [
    Ok(1, [np.arange(5, dtype=np.float64)], seq=3),
    Ok(2, [], names=[("w", 0, "mom")]),
    Wait(3), Wait(4, gap=2, blockers=[0, 3]),
    Missing(5, [("w", 0, [2, 3])]),
    Failed(6, "ShapeMismatch", "key 'w' holds float32[3]", na=True),
]


def test_every_op_and_answer_round_trips() -> None:
    got = decode(_frames(Command.DATA, REQUESTS), "j", 2**30)
    assert got.cmd is Command.DATA and len(got.ops) == len(REQUESTS)
    for a, b in zip(REQUESTS, got.ops):
        _same(a, b)
    got = decode(_frames(Command.DATA_REPLY, ANSWERS), "j", 2**30)
    assert got.cmd is Command.DATA_REPLY
    for a, b in zip(ANSWERS, got.ops):
        _same(a, b)


def test_small_arrays_share_a_frame_and_big_ones_travel_alone() -> None:
    ops = [Push(f"k{i}", 0, 1, np.full(100, i, F)) for i in range(200)] + [Push("big", 0, 1, np.ones(2**16, F))]
    frames = _frames(Command.DATA, ops)
    assert len(frames) == 4            # tag, header, the big array, one frame for 200 small ones
    got = decode(frames, "j", 2**30)
    assert [op.data[0] for op in got.ops[:200]] == list(range(200))


def test_resent_marks_a_copy() -> None:
    op = Pull("w", 0, 3, id=4)
    again = resent(op)
    assert again.re and not op.re and again.id == 4 and again.after == 3


def _data(n_ops: int = 1, n_arrays: int = 0, job: bytes = b"j", body: bytes = b"", frames=()) -> list[bytes]:
    return [DATA_VERSION, HEAD.pack(1, 0, n_ops, n_arrays, len(job)) + job + body, *frames]


def _rec(code: int, flags: int = 0, first: int = 0, count: int = 0, key: bytes = struct.pack("<Bq", 0, 1),
         extra: bytes = b"") -> bytes:
    return RECORD.pack(code, flags, 0, 1, 1, first, count) + key + struct.pack("<I", len(extra)) + extra


def _arr(code: int = 10, dims=(4,), loc: int = 0, index: int = 0, offset: int = 0) -> bytes:
    return ARRAY.pack(code, len(dims), loc, index, offset) + struct.pack(f"<{len(dims)}Q", *dims)


@pytest.mark.parametrize("frames,reason", [
    (_data(job=b"other", body=_rec(3)), "other"),
    (_data(body=_rec(99)), "unknown operation code"),
    (_data(body=_rec(3)[:10]), "truncated"),
    (_data(body=_rec(3) + b"xx"), "stray"),
    (_data(body=_rec(2)), "carries 0 arrays"),                               # a push without data
    (_data(n_arrays=1, body=_arr() + _rec(2, count=2), frames=[b"\0" * 16]), "refers to arrays"),
    (_data(n_arrays=1, body=_arr() + _rec(2, first=-1, count=1), frames=[b"\0" * 16]), "refers to arrays"),
    (_data(n_arrays=1, body=_arr(code=40) + _rec(2, count=1), frames=[b"\0" * 16]), "dtype code"),
    (_data(n_arrays=1, body=_arr(dims=(5,)) + _rec(2, count=1), frames=[b"\0" * 16]), "does not fit"),
    (_data(n_arrays=1, body=_arr(loc=1) + _rec(2, count=1), frames=[b"\0" * 16]), "location"),
    (_data(n_arrays=1, body=_arr(index=3) + _rec(2, count=1), frames=[b"\0" * 16]), "does not exist"),
    (_data(n_arrays=0, body=_rec(3), frames=[b"\0" * 16]), "referenced"),
    (_data(body=_rec(3, key=b"\x07")), "key tag"),
    (_data(body=_rec(3, key=struct.pack("<BH", 1, 2) + b"\xff\xfe")), "UTF-8"),
    (_data(body=_rec(1, extra=b"[1]")), "JSON object"),
    (_data(body=_rec(1, extra=b"{nope")), "not JSON"),
    (_data(body=_rec(1, extra=b'{"dtype": "object", "shape": [1]}')), "not allowed"),
    (_data(body=_rec(1, extra=b'{"dtype": "float32", "shape": [-1]}')), "shape"),
    (_data(body=_rec(1, extra=b'{"dtype": "float32", "shape": [1], "fill": [1]}')), "fill must be an object"),
    (_data(n_arrays=1, body=_arr() + _rec(1, count=1, extra=b'{"dtype": "float32", "shape": [4], "fill": {}}'),
           frames=[b"\0" * 16]), "without a value"),
    (_data(body=_rec(1, extra=b'{"dtype": "float32", "shape": [1], "bare": 1}')), "bare must be"),
    (_data(body=_rec(5, extra=b'{"check": [["k", 0, [0]]]}')), ">= 1"),
    (_data(body=_rec(5, extra=b'{"check": [[["k"], 0, [1]]]}')), "neither an int nor a str"),
    (_data(body=_rec(7, extra=b'{"spec": "rm -rf /"}')), "not an object"),
    (_data(n_arrays=1, body=_arr(code=10) + _rec(3, flags=32, count=1), frames=[b"\0" * 16]), "row ids"),
    ([DATA_VERSION, HEAD.pack(9, 0, 0, 0, 1) + b"j"], "kind"),
])
def test_bad_data_messages_are_rejected_with_a_reason(frames: list[bytes], reason: str) -> None:
    with pytest.raises(ProtocolError, match=reason):
        decode(frames, "j", 2**30)


def test_corrupted_data_messages_raise_only_protocol_errors() -> None:
    rng = np.random.default_rng(11)
    good = [_frames(Command.DATA, REQUESTS), _frames(Command.DATA_REPLY, ANSWERS)]
    accepted = 0
    for trial in range(4000):
        frames = [bytearray(f) for f in good[trial % 2]]
        head = frames[1]
        for _ in range(int(rng.integers(1, 4))):
            what = rng.random()
            if not head:
                break
            if what < 0.6:                                      # flip a byte
                head[int(rng.integers(0, len(head)))] = int(rng.integers(0, 256))
            elif what < 0.8:                                    # cut the header
                del head[int(rng.integers(0, len(head))):]
            elif len(frames) > 2:                               # cut an array frame
                i = int(rng.integers(2, len(frames)))
                del frames[i][int(rng.integers(0, len(frames[i]) + 1)):]
        try:
            decode([bytes(f) for f in frames], "j", 2**30)
            accepted += 1
        except ProtocolError:
            pass
    assert accepted < 4000      # (some flips land in harmless places: ids, payload values)
