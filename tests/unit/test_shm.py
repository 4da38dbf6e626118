"""The same-host data plane without a job: real memory files, real Unix sockets, real fds.

Segments are sealed private memory files; a peer's segment is mapped only after its owner,
mode, size and seals were checked; every descriptor is bounds-checked and a bad one is a
ProtocolError naming the peer; sends never block; nothing is left in /dev/shm.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import struct
import uuid

import numpy as np
import pytest

from psnode.errors import ProtocolError
from psnode.net.security import Mode, Security
from psnode.net.transport import new_security
from psnode.protocol import Ok, Pull, Push
from psnode.protocol.codec import ARRAY, HEAD, RECORD
from psnode.samehost import handshake as shmhandshake
from psnode.samehost import link as shmlink
from psnode.samehost import segments as shm

pytestmark = pytest.mark.skipif(not shm.available(), reason="needs memfd_create and file seals")
F = np.float32


def test_arena_blocks_are_located_reused_and_kept_alive_by_views() -> None:
    arena = shm.Arena(f"psnode.t{uuid.uuid4().hex[:6]}.a", segment_bytes=1 << 20)
    a = arena.array((4, 4), F)
    b = arena.array((10,), np.int64)
    assert arena.locate(a) == (0, 0) and arena.locate(b) == (0, 64)
    assert arena.locate(a.reshape(16)[4:]) == (0, 16)          # a view: found by address
    assert arena.locate(np.zeros(3)) is None
    view = a.reshape(16)
    del a
    assert arena.array((4, 4), F) is not None and arena.locate(view) == (0, 0)   # still held
    c = arena.array((1 << 19,), F)                             # 2 MiB: a segment of its own
    assert arena.locate(c) == (1, 0) and arena.segments[1].size == 2 << 20
    st = os.fstat(arena.fds[0])
    assert st.st_mode & 0o777 == 0o600 and st.st_nlink == 0    # private, and no name anywhere
    assert fcntl.fcntl(arena.fds[0], fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK
    arena.close()


def test_a_peer_maps_only_private_sealed_segments_of_the_announced_size(tmp_path) -> None:
    fd, _ = shm.create_segment("psnode.t.ok", 0, 4096)
    shm.map_segment(os.dup(fd), 0, 4096, False, "worker 0")     # fine
    with pytest.raises(ProtocolError, match="worker 0: segment 0 has 4096 bytes, not the 8192"):
        shm.map_segment(os.dup(fd), 0, 8192, False, "worker 0")
    loose = os.memfd_create("psnode.t.loose", os.MFD_CLOEXEC)
    os.fchmod(loose, 0o600)
    os.ftruncate(loose, 4096)
    with pytest.raises(ProtocolError, match="not sealed against shrinking"):
        shm.map_segment(loose, 0, 4096, False, "worker 3")
    path = tmp_path / "f"
    path.write_bytes(bytes(4096))
    os.chmod(path, 0o644)
    with pytest.raises(ProtocolError, match="not a private file"):
        shm.map_segment(os.open(path, os.O_RDWR), 0, 4096, False, "worker 1")
    seg = shm.map_segment(fd, 0, 4096, False, "worker 0")
    with pytest.raises(ProtocolError, match="worker 0: 100 bytes at offset 4000 lie outside segment 0"):
        seg.buffer(4000, 100, "worker 0")


def test_leftovers_of_a_job_are_found_and_removed() -> None:
    job = f"t{uuid.uuid4().hex[:8]}"
    path = f"/dev/shm/psnode.{job}.w0.out.0"
    with open(path, "wb"):
        pass
    other = f"/dev/shm/psnode.{job}x.w0"
    with open(other, "wb"):
        pass
    try:
        assert shm.leftovers(job) == [path]
        assert shm.remove_leftovers(job) == [path] and shm.leftovers(job) == []
    finally:
        os.unlink(other)


INSECURE = Security.insecure()


class Pair:
    """A listening 'server' side and a connected 'worker' side of one same-host link."""

    def __init__(self, job: str | None = None, rank: int = 1, server_security: Security = INSECURE,
                 worker_security: Security = INSECURE) -> None:
        self.job = job or f"t{uuid.uuid4().hex[:8]}"
        self.server_security, self.worker_security = server_security, worker_security
        self.listener = shmhandshake.listen(self.job, "127.0.0.1", 4242)
        self.server_arena = shm.Arena(f"psnode.{self.job}.s", segment_bytes=1 << 20)
        self.out = shm.Arena(f"psnode.{self.job}.w.out", 0, 1 << 20)
        self.land = shm.Arena(f"psnode.{self.job}.w.in", 1 << 20, 1 << 20)
        self.slot = self.out.array((1000,), F)     # segments exist before the handshake
        self.server_value = self.server_arena.array((1000,), F)
        self.rank = rank

    def at(self, arr: np.ndarray) -> tuple[tuple[int, int] | None, ...]:
        """``op.at`` of a request with the one array ``arr`` (its place, as the data path writes it)."""
        return (self.out.locate(arr) or self.land.locate(arr),)

    def connect(self) -> tuple[shmlink.Link, shmlink.Link]:
        import threading
        got: list = []

        def serve() -> None:
            import select
            select.select([self.listener], [], [], 5)
            conn, _ = self.listener.accept()
            conn.setblocking(False)
            for _ in range(200):
                try:
                    r = shmhandshake.welcome(conn, self.job, 2, self.server_arena, 2**30, self.server_security)
                except ProtocolError as exc:
                    got.append(exc)
                    return
                if r is not None:
                    got.append(r)
                    return
                import time
                time.sleep(0.01)
        t = threading.Thread(target=serve)
        t.start()
        worker = shmhandshake.connect(self.job, self.rank, 0, "127.0.0.1", 4242, self.out, self.land, 2**30,
                                      self.worker_security)
        t.join(5)
        assert worker is not None and got and not isinstance(got[0], Exception), got
        rank, server = got[0]
        assert rank == self.rank and server.peer.startswith(f"worker {self.rank} (pid {os.getpid()})")
        return worker, server


def test_data_travels_as_descriptors_and_is_read_in_place() -> None:
    p = Pair()
    worker, server = p.connect()
    p.slot[:] = np.arange(1000)
    dest = p.land.array((1000,), F)
    assert worker.send_ops(shmlink.KIND_DATA, [Push("w", 0, 1, p.slot, id=5, at=p.at(p.slot)),
                                               Pull("w", 0, 1, id=6, dest=dest, at=p.at(dest)),
                                               Push("small", 0, 1, np.ones(3, F), id=7, at=(None,))]) == []
    (msg,) = server.recv()
    push, pull, small = msg.ops
    assert np.array_equal(push.data, np.arange(1000)) and not push.data.flags.writeable   # the worker's slot
    assert pull.dest is not None and pull.dest.flags.writeable                            # its landing area
    assert small.data.tolist() == [1, 1, 1]                                               # inline
    pull.dest[:] = 7
    p.server_value[:] = 3
    assert server.send_ops(shmlink.KIND_REPLY, [Ok(6, [p.server_value]), Ok(8, [pull.dest])]) == []
    (answer,) = worker.recv()
    direct, landed = answer.ops
    assert (direct.arrays[0] == 3).all() and not direct.arrays[0].flags.writeable
    assert (landed.arrays[0] == 7).all() and (dest == 7).all()
    assert worker.bytes_out >= 4000 + 12 and server.bytes_in >= 4000


def test_a_request_travels_where_its_data_path_placed_it() -> None:
    """The link sends a request's arrays where ``op.at`` says, never looking them up: an array in
    shared memory without a place travels as bytes (inline when small, else back to the caller
    for TCP); a resent pull (no landing area) reads the first places only.  A server's answers
    are located by the link."""
    p = Pair()
    big = p.out.array((2000,), F)                 # in a push slot's segment, but not placed
    worker, server = p.connect()
    p.slot[:] = 5
    small, unplaced = Push("w", 0, 1, p.slot, id=5, at=(None,)), Push("b", 0, 1, big, id=6, at=(None,))
    assert worker.send_ops(shmlink.KIND_DATA, [small, unplaced]) == [unplaced]
    (msg,) = server.recv()
    (got,) = msg.ops
    assert got.data.tolist() == [5.0] * 1000 and got.data.ctypes.data != p.slot.ctypes.data   # a copy, inline
    rows, dest = p.land.array((4,), np.int64), p.land.array((4, 2), F)
    rows[:] = [0, 1, 2, 3]
    pull = Pull("r", 0, 1, rows, id=7, dest=dest, at=p.at(rows) + p.at(dest))
    again = Pull("r", 0, 1, rows, id=7, re=True, at=pull.at)      # (resent: without its landing area)
    assert worker.send_ops(shmlink.KIND_DATA, [pull]) == [] and worker.send_ops(shmlink.KIND_DATA, [again]) == []
    first, second = server.recv()
    assert first.ops[0].dest is not None and first.ops[0].rows.tolist() == [0, 1, 2, 3]
    assert second.ops[0].dest is None and second.ops[0].rows.tolist() == [0, 1, 2, 3]


def _datagram(job: str, arrays: list[tuple], ops: list[bytes]) -> bytes:
    head = HEAD.pack(1, 0, len(ops), len(arrays), len(job)) + job.encode()
    for code, dims, loc, index, offset in arrays:
        head += ARRAY.pack(code, len(dims), loc, index, offset) + struct.pack(f"<{len(dims)}Q", *dims)
    head += b"".join(ops)
    return b"D" + struct.pack("<I", len(head)) + head


def _push_record(first: int = 0) -> bytes:
    return RECORD.pack(2, 2, 0, 1, 1, first, 1) + struct.pack("<Bq", 0, 1) + b"\0\0\0\0"


@pytest.mark.parametrize("arrays,reason", [
    ([(10, (1000,), 1, 0, 2**20 - 100)], "lie outside segment"),           # past the end
    ([(10, (2**24,), 1, 0, 0)], "lie outside segment"),                    # too big
    ([(10, (10,), 1, 7, 0)], "segment 7 was never announced"),
    ([(10, (10,), 2, 3, 0)], "segment 3 of this process does not exist"),
    ([(10, (10,), 9, 0, 0)], "location 9"),
])
def test_bad_descriptors_are_protocol_errors_naming_the_peer(arrays, reason) -> None:
    p = Pair()
    worker, server = p.connect()
    worker.send_raw(_datagram(p.job, arrays, [_push_record()]))
    with pytest.raises(ProtocolError, match=rf"worker 1 \(pid \d+\): .*{reason}"):
        server.recv()
    worker.send_raw(b"D\x05\x00")                                   # truncated
    with pytest.raises(ProtocolError, match="truncated"):
        server.recv()
    worker.send_raw(b"Zjunk")
    with pytest.raises(ProtocolError, match="unknown type"):
        server.recv()
    assert worker.send_ops(shmlink.KIND_DATA, [Push("w", 0, 1, p.slot, id=5, at=p.at(p.slot))]) == []
    assert len(server.recv()) == 1                                    # the link still works



def test_one_operation_messages_decode_as_the_general_decoder_does() -> None:
    """The one-pass form (one op, 1-d arrays in shared memory, no extra fields) and the
    general decoder agree, op for op; the one-pass form refuses what the general one does."""
    from psnode.protocol import DATA_VERSION, PushPull
    from psnode.protocol.codec import decode_data, decode_single
    p = Pair()
    worker, server = p.connect()
    p.slot[:] = np.arange(1000)
    dest = p.land.array((1000,), F)
    sent = [PushPull("\0bucket3", 0, 4, p.slot, id=9, at=p.at(p.slot)),
            PushPull(7, 2, 5, p.slot, id=10, dest=dest, at=p.at(p.slot) + p.at(dest)),
            Pull("k", 1, 3, id=11, dest=dest, at=p.at(dest)), Push("k", 0, 2, p.slot, id=12, re=True, at=p.at(p.slot))]
    for op in sent:
        raw: list[bytes] = []
        real = worker.send_raw

        def keep(data: bytes, fds=(), raw=raw, real=real) -> None:
            if data[:1] == b"D":
                raw.append(data)
            else:
                real(data, fds)          # (segment announcements go through)
        worker.send_raw = keep           # type: ignore[method-assign]
        assert worker.send_ops(shmlink.KIND_DATA, [op]) == []
        del worker.send_raw
        assert server.recv() == []
        (data,) = raw
        (hlen,) = struct.unpack_from("<I", data, 1)
        assert 5 + hlen == len(data)                                  # no inline payload
        assert decode_single(data, 5, p.job, p.job.encode(), 2**30, server._resolve) is not None
        fast = server.decode(data).ops
        slow = decode_data([DATA_VERSION, data[5:]], p.job, 2**30, server._resolve).ops
        assert fast is not None and slow is not None and len(fast) == len(slow) == 1
        a, b = fast[0], slow[0]
        assert type(a) is type(b) is type(op)
        assert (a.key, a.part, a.id, getattr(a, "seq", None), a.re) == (b.key, b.part, b.id, getattr(b, "seq", None),
                                                                      b.re) == (op.key, op.part, op.id,
                                                                                getattr(op, "seq", None), op.re)
        for name in ("data", "dest"):
            x, y = getattr(a, name, None), getattr(b, name, None)
            assert (x is None) == (y is None) and (x is None or np.array_equal(x, y))
    for arrays, record, reason in [
        ([(99, (10,), 1, 0, 0)], _push_record(), "dtype code 99"),
        ([(10, (10,), 1, 0, 0)], RECORD.pack(2, 2, 0, 1, 1, 0, 1) + b"\x01\x02\x00\xff\xfe\0\0\0\0", "UTF-8"),
        ([(10, (10,), 1, 0, 0)], RECORD.pack(2, 2, 0, 1, 1, 0, 1) + b"\x05", "bad key tag"),
        ([(10, (10,), 1, 0, 0)], RECORD.pack(2, 2, 0, 1, 1, 0, 1), "truncated"),
    ]:
        worker.send_raw(_datagram(p.job, arrays, [record]))
        with pytest.raises(ProtocolError, match=rf"worker 1 \(pid \d+\): .*{reason}"):
            server.recv()
    worker.send_raw(_datagram("otherjob", [(10, (10,), 1, 0, 0)], [_push_record()]))
    with pytest.raises(ProtocolError, match="otherjob"):
        server.recv()
    assert worker.send_ops(shmlink.KIND_DATA, [Push("w", 0, 1, p.slot, id=5, at=p.at(p.slot))]) == []
    assert len(server.recv()) == 1                                    # the link still works

def _accept(listener: socket.socket) -> tuple[socket.socket, object]:
    import select
    select.select([listener], [], [], 5)
    return listener.accept()


def _hello(where: str, **body) -> tuple[socket.socket, bytes]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(shmhandshake.server_address(where, "127.0.0.1", 4242))
    msg = {"job": where, "rank": 0, "pid": os.getpid(), "token": None, "segs": []}
    msg.update(body)
    return s, b"H" + json.dumps(msg).encode()


@pytest.mark.parametrize("change,reason", [
    ({"job": "other"}, "is not of job"), ({"rank": 5}, "claims worker rank 5 of a job of 2"),
    ({"segs": [[0, 4096, False]]}, "0 segment descriptor"),
])
def test_refused_handshakes_say_why(change, reason) -> None:
    p = Pair()
    s, hello = _hello(p.job, **change)
    s.send(hello)
    conn, _ = _accept(p.listener)
    conn.setblocking(False)
    with pytest.raises(ProtocolError, match=reason):
        for _ in range(100):
            if shmhandshake.welcome(conn, p.job, 2, p.server_arena, 2**30, INSECURE) is not None:
                break
    s.settimeout(2)
    answer = s.recv(4096)
    assert answer[:1] == b"X" and reason.split()[0] in json.loads(answer[1:])["reason"]


def test_an_unsealed_segment_is_refused_at_the_handshake() -> None:
    p = Pair()
    loose = os.memfd_create("psnode.t.loose", os.MFD_CLOEXEC)
    os.fchmod(loose, 0o600)
    os.ftruncate(loose, 4096)
    s, hello = _hello(p.job, segs=[[0, 4096, False]])
    socket.send_fds(s, [hello], [loose])
    conn, _ = _accept(p.listener)
    conn.setblocking(False)
    with pytest.raises(ProtocolError, match="not sealed against shrinking"):
        for _ in range(100):
            if shmhandshake.welcome(conn, p.job, 2, p.server_arena, 2**30, INSECURE) is not None:
                break


def test_sends_never_block_a_backlog_waits_for_the_reader() -> None:
    p = Pair()
    worker, server = p.connect()
    for i in range(5000):                        # far more than the socket buffers hold
        worker.send_ops(shmlink.KIND_DATA, [Push("w", 0, i + 1, p.slot, id=i, at=p.at(p.slot))])
    assert worker.backlog and worker.up
    got = 0
    for _ in range(1000):
        got += len(server.recv())
        if worker.flush() and got == 5000:
            break
    got += len(server.recv())
    assert got == 5000 and not worker.backlog


def test_a_closed_peer_is_noticed_as_end_of_file() -> None:
    p = Pair()
    worker, server = p.connect()
    worker.close()
    assert server.recv() == [] and not server.up


def test_a_secured_job_admits_only_workers_holding_its_token() -> None:
    """With a job secret, HELLO carries an HMAC of the job id and the rank under the job's token;
    a worker of another job (its own secret) is refused, naming why."""
    secret = new_security(Mode.AUTHENTICATED)
    worker, server = Pair(server_security=secret, worker_security=secret).connect()
    worker.close()
    server.close()
    other = new_security(Mode.AUTHENTICATED)
    with pytest.raises(ProtocolError, match="does not hold the secret"):
        Pair(server_security=secret, worker_security=other).connect()


def test_announced_descriptors_are_closed_once_so_a_reused_number_survives(monkeypatch) -> None:
    """Every descriptor a peer hands over is closed exactly once.  A second close would hit
    whatever another thread (libzmq's I/O thread accepting a connection) opened under the freed
    number in between: libzmq then aborts with 'Bad file descriptor (src/epoll.cpp)'.  The test
    opens a file under each freed number right after the mapping closed it, as that thread would."""
    reused: list[int] = []
    real = shmlink.map_segment

    def map_then_reuse(fd: int, *args, **kw):
        seg = real(fd, *args, **kw)                      # closes fd
        reused.append(os.open(os.devnull, os.O_RDONLY))  # the lowest free number: fd's
        assert reused[-1] == fd
        return seg

    monkeypatch.setattr(shmlink, "map_segment", map_then_reuse)
    arena = shm.Arena(f"psnode.t{uuid.uuid4().hex[:8]}")
    arena.array((1000,), F)
    arena.array((2 * shm.SEGMENT_BYTES // 4,), F)      # a second segment
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        link = shmlink.Link(a, "worker 0", "j", [], 2**30)
        segs = tuple(shm_segment(i, arena.segments[i].size) for i in arena.fds)
        link.add_segments(segs, [os.dup(fd) for fd in arena.fds.values()], writable_ok=False)
        assert len(reused) == 2
        for fd in reused:
            os.fstat(fd)                                  # still open: not closed a second time
            os.close(fd)
    finally:
        a.close()
        b.close()
        arena.close()


def shm_segment(index: int, size: int):
    from psnode.protocol.samehost import Segment
    return Segment(index, size, False)


def test_a_link_is_taken_down_while_a_thread_keeps_waiting_on_the_links() -> None:
    """The I/O thread takes down a link while the user's thread waits for an answer the way
    ``Engine.wait`` does, ``read_until`` again and again (here 30 s each, so that only a wake-up
    can end one): the take-down gets the reader's place within a second, and the waiting thread
    goes on waiting (a reader that leaves each half second and comes back at once kept a worker's
    I/O thread out for minutes)."""
    import threading
    import time

    from psnode.config import NodeConfig, Role
    from psnode.worker.futures import Future
    from psnode.worker.samehost import SameHostLinks

    p = Pair()
    worker, server = p.connect()
    cfg = NodeConfig(role=Role.WORKER, scheduler_host="127.0.0.1", scheduler_port=1, num_workers=1,
                     num_servers=1, job_id=p.job)
    links = SameHostLinks(cfg, lambda s, msg, io: None, lambda: 0, lambda: False)
    links.add(0, worker)
    fut, stop, turns = Future(server=0), threading.Event(), [0]

    def wait() -> None:   # (the answer never comes: the request goes by TCP once the link is down)
        while not stop.is_set():
            links.read_until(fut, 30.0)
            turns[0] += 1

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    try:
        while links.readers == 0:   # (it waits in the links' poll)
            time.sleep(0.01)
        down = threading.Thread(target=links.take_down, args=(0,), daemon=True)
        t0 = time.monotonic()
        down.start()
        down.join(5)
        assert not down.is_alive(), "take_down waited for the reader for 5 s"
        assert time.monotonic() - t0 < 1.0 and not worker.up and 0 not in links.links
    finally:
        stop.set()
        fut.set(Ok(0))
        links.wake_readers(always=True)
        waiter.join(5)
        server.close()
    assert not waiter.is_alive()


def test_a_handshake_begun_never_waits_for_a_busy_server_and_ends_when_it_answers() -> None:
    """A worker reconnecting to a replacement that is still restoring (its loop answers no
    handshake yet): ``begin`` sends HELLO and returns at once; the socket is readable only once
    the server answered, and ``finish`` then gives the link, up and carrying data."""
    import select
    import time as _time
    p = Pair()
    t0 = _time.monotonic()
    opening = shmhandshake.begin(p.job, p.rank, 0, "127.0.0.1", 4242, p.out, p.land, 2**30, INSECURE, timeout=60)
    assert opening is not None and _time.monotonic() - t0 < 0.5 and opening.deadline > t0 + 59
    assert select.select([opening], [], [], 0.3)[0] == []      # (the server's loop is busy: no answer)
    conn, _ = _accept(p.listener)
    conn.setblocking(False)
    got = None
    for _ in range(200):
        got = shmhandshake.welcome(conn, p.job, 2, p.server_arena, 2**30, INSECURE)
        if got is not None:
            break
        _time.sleep(0.01)
    assert got is not None and got[0] == p.rank
    assert select.select([opening], [], [], 2)[0] == [opening]
    worker = shmhandshake.finish(opening)
    assert worker.up
    worker.close()
    got[1].close()
