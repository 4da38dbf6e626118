"""Authentication at the transport: each mode and plane admits the job's peers and refuses the
rest at connect time (before a message reaches the role), counts the refusals, binds PLAIN
passwords to one server address, and makes a worker's data link drop messages from a process
that took a server's port.  Real sockets on 127.0.0.1, in this process."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import zmq

from psnode.net.security import Mode, Plane, Security
from psnode.net.transport import Channel, Transport, new_security
from psnode.protocol import Command, Message, decode, encode
from tests.support import wait_for

SECURED = (Mode.AUTHENTICATED, Mode.ENCRYPTED)


def recv_within(chan: Channel, routed: bool, seconds: float) -> tuple[bytes | None, Message] | None:
    """The first message on ``chan`` within ``seconds``, else None."""
    try:
        return wait_for(lambda: chan.recv(routed), seconds, f"a message on {chan.address}", interval=0.005)
    except AssertionError:
        return None


def wait_until(pred, what: str = "the refusal to be counted") -> None:
    wait_for(pred, 5.0, what, interval=0.01)


@contextmanager
def transports(*secs: Security) -> Iterator[list[Transport]]:
    ts = [Transport("job-a", f"t{i}", 2**22, s) for i, s in enumerate(secs)]
    try:
        yield ts
    finally:
        for t in ts:
            t.close()


@pytest.mark.parametrize("plane", list(Plane))
@pytest.mark.parametrize("mode", list(Mode))
def test_each_mode_carries_messages_both_ways(mode, plane) -> None:
    sec = new_security(mode)
    with transports(sec, sec) as (srv, cli):
        router, port = srv.router("127.0.0.1", 0, plane)
        dealer = cli.dealer("127.0.0.1", port, "w0", plane)
        big = np.arange(2**18, dtype=np.float32)          # 1 MiB: a zero-copy frame
        dealer.send(Command.DATA, {"ops": [{"op": "push"}]}, [big, np.ones(3, np.int64)])
        got = recv_within(router, True, 5)
        assert got is not None and got[0] == b"w0"
        assert np.array_equal(got[1].arrays[0], big) and got[1].body == {"ops": [{"op": "push"}]}
        router.send(Command.DATA_REPLY, {"ops": []}, [big * 2], to=got[0])
        back = recv_within(dealer, False, 5)
        assert back is not None and np.array_equal(back[1].arrays[0], big * 2)
        assert srv.refused == cli.refused == 0


def _raw_dealer(ctx: zmq.Context, port: int, how: str, sec: Security, other: Security) -> zmq.Socket:
    """A pyzmq DEALER as an outsider would make it."""
    s = ctx.socket(zmq.DEALER)
    s.linger = 0
    s.sndtimeo = 2000    # a refused handshake can take the only pipe away: never block on it
    s.identity = b"w0"
    if how == "plain-guess":
        s.plain_username, s.plain_password = f"127.0.0.1:{port}".encode(), b"guess"
    elif how == "plain-other-job":
        s.plain_username = f"127.0.0.1:{port}".encode()
        s.plain_password = other.client_password(f"127.0.0.1:{port}")
    elif how == "curve-other-job":   # another job's key pair, even knowing this job's public key
        s.curve_serverkey, s.curve_publickey, s.curve_secretkey = (
            sec.curve_public, other.curve_public, other.curve_secret)
    elif how == "curve-other-server":
        s.curve_serverkey, s.curve_publickey, s.curve_secretkey = (
            other.curve_public, other.curve_public, other.curve_secret)
    s.connect(f"tcp://127.0.0.1:{port}")
    return s


@pytest.mark.parametrize("plane", list(Plane))
@pytest.mark.parametrize("mode", SECURED)
def test_outsiders_are_refused_before_any_message_and_counted(mode, plane) -> None:
    sec, other = new_security(mode), new_security(mode)
    frames = encode(Message(Command.STOP, "job-a", "control", {"reason": "attack"}))
    hows = ["null", "plain-guess", "plain-other-job", "curve-other-job", "curve-other-server"]
    with transports(sec, sec) as (srv, cli):
        router, port = srv.router("127.0.0.1", 0, plane)
        ctx = zmq.Context()
        try:
            for n, how in enumerate(hows, 1):
                s = _raw_dealer(ctx, port, how, sec, other)
                try:
                    s.send_multipart(frames)
                except zmq.Again:       # refused before the message could even be queued
                    pass
                wait_until(lambda n=n: srv.refused >= n)       # at least one refusal each
                assert recv_within(router, True, 0.05) is None, how
                s.close()
            # another process of this job is admitted afterwards, over the same port
            dealer = cli.dealer("127.0.0.1", port, "w1", plane)
            dealer.send(Command.HEARTBEAT, {})
            got = recv_within(router, True, 5)
            assert got is not None and got[1].cmd is Command.HEARTBEAT and got[0] == b"w1"
        finally:
            ctx.destroy(linger=0)
    assert srv.dropped == 0      # refused at the handshake: nothing reached the decoder


def test_another_job_and_another_mode_are_refused() -> None:
    mine = new_security(Mode.AUTHENTICATED)
    for theirs in (new_security(Mode.AUTHENTICATED), new_security(Mode.ENCRYPTED), Security.insecure(),
                   Security(Mode.ENCRYPTED, mine.token, mine.curve_public, mine.curve_secret)):
        for plane in Plane:
            with transports(mine, theirs) as (srv, cli):
                router, port = srv.router("127.0.0.1", 0, plane)
                dealer = cli.dealer("127.0.0.1", port, "w0", plane)
                dealer.send(Command.REGISTER, {"role": "worker"})
                if theirs.mode is Mode.ENCRYPTED and plane is Plane.CONTROL and theirs.token == mine.token:
                    # the same job in the other mode: its control links are the same CURVE
                    assert recv_within(router, True, 5) is not None
                    continue
                wait_until(lambda srv=srv: srv.refused >= 1)
                assert recv_within(router, True, 0.05) is None, (theirs.mode, plane)


def test_a_plain_password_is_good_for_one_server_address_only() -> None:
    sec = new_security(Mode.AUTHENTICATED)
    frames = encode(Message(Command.DATA, "job-a", "worker:0", {"ops": []}))
    with transports(sec) as (srv,):
        router_a, port_a = srv.router("127.0.0.1", 0, Plane.DATA)
        router_b, port_b = srv.router("127.0.0.1", 0, Plane.DATA)
        ctx = zmq.Context()
        try:
            s = ctx.socket(zmq.DEALER)
            s.linger = 0
            # the credential a worker shows server A, replayed against server B
            s.plain_username = f"127.0.0.1:{port_a}".encode()
            s.plain_password = sec.client_password(f"127.0.0.1:{port_a}")
            s.connect(f"tcp://127.0.0.1:{port_b}")
            s.send_multipart(frames)
            wait_until(lambda: srv.refused >= 1)
            assert recv_within(router_b, True, 0.05) is None
            s.close()
            # the same credential at A itself is admitted (what a worker of the job does)
            s = ctx.socket(zmq.DEALER)
            s.linger = 0
            s.plain_username = f"127.0.0.1:{port_a}".encode()
            s.plain_password = sec.client_password(f"127.0.0.1:{port_a}")
            s.connect(f"tcp://127.0.0.1:{port_a}")
            s.send_multipart(frames)
            assert recv_within(router_a, True, 5) is not None
        finally:
            ctx.destroy(linger=0)


class FakeServer:
    """A process that took a server's port: a PLAIN server admitting anyone, recording the
    credentials it is shown, answering every message with a well-formed DATA_REPLY."""

    def __init__(self, metadata: bytes | None = None) -> None:
        self.ctx = zmq.Context()
        self.creds: list[list[bytes]] = []
        self.received = 0
        self._zap = self.ctx.socket(zmq.REP)
        self._zap.bind("inproc://zeromq.zap.01")
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.linger = 0
        self.sock.plain_server = True
        self.sock.zap_domain = b"any"
        if metadata:
            self.sock.setsockopt(zmq.METADATA, metadata)
        self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")

    def serve(self, stop: threading.Event) -> None:
        poller = zmq.Poller()
        poller.register(self._zap, zmq.POLLIN)
        poller.register(self.sock, zmq.POLLIN)
        while not stop.is_set():
            ready = dict(poller.poll(20))
            if self._zap in ready:
                f = self._zap.recv_multipart()
                self.creds.append(f[6:])
                self._zap.send_multipart([f[0], f[1], b"200", b"OK", b"", b""])
            if self.sock in ready:
                ident, *frames = self.sock.recv_multipart()
                self.received += 1
                assert decode(frames, "job-a", 2**22).cmd is Command.DATA
                reply = encode(Message(Command.DATA_REPLY, "job-a", "server:0", {"ops": [{"id": 1}]},
                                       [np.full(4, 666, np.float32)]))
                self.sock.send_multipart([ident, *reply])

    def close(self) -> None:
        self._zap.close()
        self.sock.close()
        self.ctx.term()


@pytest.mark.parametrize("metadata", [None, b"X-Psnode-Proof:" + b"0" * 64])
def test_a_data_link_drops_what_a_port_squatter_sends(metadata) -> None:
    sec = new_security(Mode.AUTHENTICATED)
    fake = FakeServer(metadata)
    stop = threading.Event()
    thread = threading.Thread(target=fake.serve, args=(stop,))
    thread.start()
    try:
        with transports(sec, sec) as (cli, real):
            dealer = cli.dealer("127.0.0.1", fake.port, "w0", Plane.DATA)
            for _ in range(3):
                dealer.send(Command.DATA, {"ops": [{"op": "pull", "id": 1}]})
            wait_until(lambda: fake.received == 3)
            assert recv_within(dealer, False, 0.5) is None        # its answers never reach the role
            wait_until(lambda: cli.unproven == 3)
            assert cli.refused >= 3
            # what it learnt is good for its own address only: not the token, refused elsewhere
            user, password = fake.creds[0]
            assert user == f"127.0.0.1:{fake.port}".encode() and sec.token.hex().encode() not in password
            router, port = real.router("127.0.0.1", 0, Plane.DATA)
            ctx = zmq.Context()
            try:
                s = ctx.socket(zmq.DEALER)
                s.linger = 0
                s.plain_username, s.plain_password = user, password
                s.connect(f"tcp://127.0.0.1:{port}")
                s.send_multipart(encode(Message(Command.DATA, "job-a", "worker:0", {"ops": []})))
                wait_until(lambda: real.refused >= 1)
                assert recv_within(router, True, 0.05) is None
            finally:
                ctx.destroy(linger=0)
    finally:
        stop.set()
        thread.join(5)
        fake.close()


def test_a_control_link_does_not_talk_to_a_scheduler_without_the_key() -> None:
    sec, impostor = new_security(Mode.AUTHENTICATED), new_security(Mode.AUTHENTICATED)
    with transports(impostor, sec) as (fake, cli):
        router, port = fake.router("127.0.0.1", 0, Plane.CONTROL)
        dealer = cli.dealer("127.0.0.1", port, "worker-1", Plane.CONTROL)
        dealer.send(Command.REGISTER, {"role": "worker"})
        wait_until(lambda: cli.refused >= 1 and fake.refused >= 1)
        assert recv_within(router, True, 0.05) is None
