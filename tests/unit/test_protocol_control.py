"""Typed control bodies and same-host datagrams (psnode.protocol.control, .samehost): every body
round-trips through JSON to itself, bodies keep their wire form, and any malformed body is a
ProtocolError naming the field, never another exception."""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import time

import numpy as np
import pytest

from psnode.config import NodeConfig, Role
from psnode.errors import PeerLost, ProtocolError
from psnode.net.link import SchedulerLink
from psnode.net.security import Plane, Security
from psnode.net.transport import Transport
from psnode.protocol import Command, Message, decode, encode
from psnode.protocol.control import (
    BODIES,
    MAX_IMPLIED,
    Barrier,
    BarrierDone,
    Beats,
    BeatsAck,
    Bye,
    Counters,
    Empty,
    Entries,
    Heartbeat,
    JobEnd,
    Lost,
    Membership,
    Register,
    Rejoin,
    Replica,
    ScaleDown,
    ServerAddress,
    Servers,
    Standby,
    StatusAnswer,
    Stop,
    WaitKind,
    WaitReport,
    Welcome,
    decode_body,
)
from psnode.protocol.samehost import (
    Accepted,
    Announce,
    Hello,
    Refused,
    Segment,
    data_datagram,
    data_header,
)
from psnode.protocol.status import NodeRow

BOOK = (ServerAddress(0, "127.0.0.1", 4000), ServerAddress(1, "10.0.0.2", 4001, replica=4101))
ROW = NodeRow("worker", 1, "10.0.0.3", "dead", pid=9, port=0, pushes=4, rate=1.5)
WAIT = WaitReport(WaitKind.PULL, of="'w'", push=2, on=(0,), waited=2.5)

#: one valid body of every control command (two where a body has two forms)
VALID = [
    (Command.REGISTER, Register("worker", "127.0.0.1", 0, 4242, None)),
    (Command.REGISTER, Register("server", "10.0.0.2", 4001, 7, 1)),
    (Command.REGISTER, Register("server", "10.0.0.2", 4001, 7, 1, replica=4101)),
    (Command.REGISTER, Register("server", "10.0.0.2", 4001, 7, 1, Rejoin(1, 0, False, 2, (0, 3), (3,)))),
    (Command.REJOIN, Empty()),
    (Command.WELCOME, Welcome(1, BOOK, 99, 2, 2, (0, 1), 3, True, 5)),
    (Command.HEARTBEAT, Heartbeat(Counters(pushes=10, pulls=9, rounds=5, bytes_in=2**40, retries=1, wait=WAIT,
                                         awaited=((2, 1.5),), late=((1, 3),)))),
    (Command.HEARTBEAT, Heartbeat(Counters(rounds=3, dropped=2, refused=1))),
    (Command.HEARTBEAT, Heartbeat(Counters(rounds=3, state_bytes=2**31, copied=5 * 2**30, checkpointed=7,
                                           loop_gap_us=41_000, lag=((1, 0), (2, 3))))),
    (Command.HEARTBEAT_ACK, Empty()),
    (Command.HEARTBEATS, Beats(4, ((b"worker-7-ab12", Counters(pushes=3, wait=WAIT)), (b"server-8-cd", Counters())))),
    (Command.HEARTBEATS, Beats(1)),
    (Command.HEARTBEATS_ACK, BeatsAck(4)),
    (Command.HEARTBEATS_ACK, BeatsAck(5, (b"worker-9-ff",))),
    (Command.BARRIER, Barrier(3)),
    (Command.BARRIERS, Entries(((b"worker-7-ab12", 3), (b"worker-8-cd", 4)))),
    (Command.BARRIERS, Entries()),
    (Command.BARRIER_DONE, BarrierDone(3)),
    (Command.FINISH, Empty()),
    (Command.FINISH_ACK, Empty()),
    (Command.MEMBERSHIP, Membership((0, 2, 5))),
    (Command.SERVERS, Servers(down=1)),
    (Command.SERVERS, Servers(restored=1, servers=BOOK)),
    (Command.SHUTDOWN, JobEnd(True, "every worker finished")),
    (Command.PEER_LOST, JobEnd(False, "worker 1 on h failed", ROW)),
    (Command.BYE, Bye()),
    (Command.BYE, Bye(error="ValueError: bad batch")),
    (Command.BYE, Bye(restart="worker 1 failed")),
    (Command.STATUS, Empty()),
    (Command.REPLICA_PUT, Replica(1, 7)), (Command.REPLICA_ACK, Replica(1, 7)),
    (Command.REPLICA_GET, Replica(2)), (Command.REPLICA_STATE, Replica(2, 0)),
    (Command.STATUS_REPLY, StatusAnswer("job-a", 12.5, True, 3, (ROW, NodeRow("server", 0, "h", "alive")))),
    (Command.STOP, Stop("stopped by test")),
    (Command.STOP_ACK, Empty()),
    (Command.LEAVE, ScaleDown((2, 3))),
    (Command.LEAVE_ACK, Empty()),
    (Command.LOST, Lost(1, "killed by signal 9")),
    (Command.LOST, Lost(1, "killed by signal 9", restart=True, restarts=2)),
    (Command.LOST_ACK, Empty()),
    # an elastic job's fields
    (Command.WELCOME, Welcome(2, BOOK, 99, 2, 2, (0, 1, 2), 0, False, 0, 3, True, (2,))),
    (Command.WELCOME, Welcome(0, BOOK, 99, 2, 2, (0, 1), standby="10.0.0.3:9093")),
    (Command.STANDBY, Standby("10.0.0.3:9093")),
    (Command.STANDBY_ACK, Empty()),
    (Command.BARRIER_DONE, BarrierDone(4, (0, 2), 5)),
    (Command.MEMBERSHIP, Membership((0, 1, 2), 2, (2,), (1,))),
    (Command.REPLICA_PUT, Replica(1, 7)), (Command.REPLICA_ACK, Replica(1, 7)),
    (Command.REPLICA_GET, Replica(2)), (Command.REPLICA_STATE, Replica(2, 0)),
    (Command.STATUS_REPLY, StatusAnswer("job-a", 1.0, True, 0, (ROW,), 3, (0, 2), 2, 1, 1)),
    (Command.STATUS_REPLY, StatusAnswer("job-a", 1.0, True, 0, (ROW,), relayed=40, relayed_barriers=6)),
    (Command.STATUS_REPLY, StatusAnswer("job-a", 1.0, True, 0, (NodeRow(
        "server", 1, "h", "alive", state_bytes=10, copied=4, checkpointed=2, copied_per_round=1.0,
        checkpointed_per_round=0.5, lag=[[0, 1]], loop_gap=0.012),), loop_gap=0.25)),
]


def _wire(cmd: Command, body: dict) -> dict:
    """``body`` as a receiver sees it: encoded and decoded as a control message."""
    frames = [bytes(memoryview(f)) if not isinstance(f, bytes) else f
              for f in encode(Message(cmd, "j", "s", body))]
    return decode(frames, "j", 2**20).body


def test_every_control_command_has_a_body_type() -> None:
    assert set(BODIES) == set(Command) - {Command.DATA, Command.DATA_REPLY}
    assert {cmd for cmd, _ in VALID} == set(BODIES)
    for cmd in (Command.DATA, Command.DATA_REPLY):
        with pytest.raises(ProtocolError, match="not a control command"):
            decode_body(cmd, {})


@pytest.mark.parametrize("cmd,body", VALID, ids=[f"{c.value}-{i}" for i, (c, _) in enumerate(VALID)])
def test_bodies_round_trip(cmd: Command, body) -> None:
    assert decode_body(cmd, _wire(cmd, body.to_body())) == body


def test_bodies_keep_their_wire_form() -> None:
    """The fields a receiver of the same version reads, under the same names."""
    assert Register("worker", "h", 0, 5, None).to_body() == {"role": "worker", "host": "h", "port": 0, "pid": 5,
                                                             "rank": None}
    assert Welcome(1, BOOK[:1], 99, 3, 1, (0, 2), 0, False, 0).to_body() == {
        "rank": 1, "servers": "0 127.0.0.1 4000", "pid": 99, "num_workers": 3, "num_servers": 1,
        "active": [0, 2], "restarts": 0, "restore": False, "barriers": 0}
    assert Servers(down=1).to_body() == {"down": 1}
    assert Servers(restored=0, servers=BOOK[:1]).to_body() == {"servers": "0 127.0.0.1 4000", "restored": 0}
    assert JobEnd(False, "x").to_body() == {"ok": False, "reason": "x"}
    assert JobEnd(False, "x", ROW).to_body()["node"] == ROW.to_dict()
    assert Bye().to_body() == {} and Bye(error="e").to_body() == {"error": "e"}
    assert Bye(restart="r").to_body() == {"restart": "r"}
    assert Barrier(2).to_body() == {"n": 2} and BarrierDone(2).to_body() == {"n": 2}
    assert Membership((0, 1)).to_body() == {"active": [0, 1]} and Stop("s").to_body() == {"reason": "s"}
    stats = {"pushes": 1, "pulls": 2, "rounds": 3, "bytes_in": 4, "bytes_out": 5, "retries": 6, "dropped": 0,
             "refused": 0}
    assert Heartbeat(Counters(**stats)).to_body() == {"stats": stats}
    status = StatusAnswer("j", 1.0, False, 0, (ROW,)).to_body()
    assert status == {"job": "j", "uptime": 1.0, "started": False, "refused": 0, "nodes": [ROW.to_dict()],
                      "generation": 0, "members": [], "joined": 0, "left": 0, "lost": 0}
    assert ScaleDown((1, 2)).to_body() == {"ranks": [1, 2]} and Lost(1, "r").to_body() == {"rank": 1, "reason": "r"}
    assert Membership((0, 2), 1, (2,), (0,)).to_body() == {"active": [0, 2], "generation": 1, "joined": [2],
                                                          "leave": [0]}


def test_defaults_of_absent_fields() -> None:
    assert decode_body(Command.BARRIER, {}) == Barrier(None)
    assert decode_body(Command.STOP, {}) == Stop("stopped by mxdist stop")
    assert decode_body(Command.PEER_LOST, {}) == JobEnd(False, "the job ended", None)
    assert decode_body(Command.HEARTBEAT, {}) == Heartbeat(Counters())
    assert decode_body(Command.FINISH, {"unknown": 1}) == Empty()
    # a malformed wait report is no wait (the worker never takes part in a deadlock verdict)
    assert decode_body(Command.HEARTBEAT, {"stats": {"wait": {"what": "barrier"}}}) == Heartbeat(Counters())
    # a row the scheduler sends before the ranks are assigned: rank -1 reads as None
    got = decode_body(Command.STATUS_REPLY, {"job": "j", "uptime": 0, "started": False, "refused": 0,
                                             "nodes": [{"role": "worker", "rank": -1, "host": "h", "state": "x"}]})
    assert isinstance(got, StatusAnswer) and got.nodes[0].rank is None and got.uptime == 0.0


@pytest.mark.parametrize("cmd,body,field", [
    (Command.REGISTER, {"role": "nobody", "host": "h", "port": 0, "pid": 1}, "role"),
    (Command.REGISTER, {"role": ["worker"], "host": "h", "port": 0, "pid": 1}, "role"),
    (Command.REGISTER, {"role": "server", "port": "x", "pid": 1, "host": "h"}, "port"),
    (Command.REGISTER, {"role": "worker", "port": None, "pid": {"a": 1}, "host": "h"}, "port"),
    (Command.REGISTER, {"role": "worker", "port": 1, "pid": 1, "host": 5}, "host"),
    (Command.REGISTER, {"role": "worker", "port": 1, "pid": 1, "host": "h" * 300}, "host"),
    (Command.REGISTER, {"role": "worker", "port": 1, "pid": 1, "host": "h", "rank": True}, "rank"),
    (Command.REGISTER, {"role": "worker", "port": 70000, "pid": 1, "host": "h"}, "port"),
    (Command.REGISTER, {"role": "worker", "port": 1, "host": "h"}, "pid"),
    (Command.WELCOME, {"rank": 0}, "servers"),
    (Command.WELCOME, {**Welcome(1, BOOK, 9, 2, 2, (0, 1)).to_body(), "rank": -1}, "rank"),
    (Command.WELCOME, {**Welcome(1, BOOK, 9, 2, 2, (0, 1)).to_body(), "servers": "0 h"}, "server address"),
    (Command.WELCOME, {**Welcome(1, BOOK, 9, 2, 2, (0, 1)).to_body(), "active": [0, "1"]}, "active"),
    (Command.WELCOME, {**Welcome(1, BOOK, 9, 2, 2, (0, 1)).to_body(), "restore": 1}, "restore"),
    (Command.WELCOME, {**Welcome(1, BOOK, 9, 2, 2, (0, 1)).to_body(), "barriers": -2}, "barriers"),
    (Command.HEARTBEAT, {"stats": [1]}, "stats"),
    (Command.HEARTBEAT, {"stats": {"pushes": 1.5}}, "pushes"),
    (Command.HEARTBEAT, {"stats": {"bytes_in": -1}}, "bytes_in"),
    (Command.BARRIER, {"n": "1"}, "n"),
    (Command.BARRIER, {"n": 0}, "n"),
    (Command.BARRIER_DONE, {}, "n"),
    (Command.MEMBERSHIP, {"active": 3}, "active"),
    (Command.MEMBERSHIP, {}, "active"),
    (Command.SERVERS, {}, "down and restored"),
    (Command.SERVERS, {"down": 1, "restored": 1, "servers": []}, "down and restored"),
    (Command.SERVERS, {"down": "0"}, "down"),
    (Command.SERVERS, {"restored": 1, "servers": "0 h 1"}, "address book"),
    (Command.SHUTDOWN, {"ok": "yes"}, "ok"),
    (Command.PEER_LOST, {"reason": 7}, "reason"),
    (Command.PEER_LOST, {"reason": "r", "node": [1]}, "node"),
    (Command.BYE, {"error": 1}, "error"),
    (Command.BYE, {"restart": ["x"]}, "restart"),
    (Command.STOP, {"reason": None}, "reason"),
    (Command.STATUS_REPLY, {"job": "j", "uptime": -1, "started": True, "refused": 0, "nodes": []}, "uptime"),
    (Command.STATUS_REPLY, {"job": "j", "uptime": 1, "started": True, "refused": 0, "nodes": [3]}, "node"),
    (Command.STATUS_REPLY, {"job": "j", "uptime": 1, "started": 1, "refused": 0, "nodes": []}, "started"),
    (Command.STATUS_REPLY, {"job": "j", "uptime": 1, "started": True, "refused": 0, "nodes": [],
                            "members": [0, -1]}, "members"),
    (Command.STATUS_REPLY, {"job": "j", "uptime": 1, "started": True, "refused": 0, "nodes": [],
                            "lost": -1}, "lost"),
    (Command.LEAVE, {"ranks": []}, "ranks"),
    (Command.LEAVE, {"ranks": [0, "1"]}, "ranks"),
    (Command.LOST, {}, "rank"),
    (Command.LOST, {"rank": 1, "reason": 5}, "reason"),
    (Command.LOST, {"rank": 1, "restart": 1}, "restart"),
    (Command.LOST, {"rank": 1, "restart": True, "restarts": -1}, "restarts"),
    (Command.MEMBERSHIP, {"active": [0], "generation": -1}, "generation"),
    (Command.MEMBERSHIP, {"active": [0], "leave": [None]}, "leave"),
    (Command.WELCOME, {**Welcome(1, BOOK, 9, 2, 2, (0, 1)).to_body(), "joiner": 1}, "joiner"),
    (Command.BARRIER_DONE, {"n": 1, "members": "0"}, "members"),
])
def test_malformed_bodies_name_the_field(cmd: Command, body: dict, field: str) -> None:
    with pytest.raises(ProtocolError, match=field):
        decode_body(cmd, body)


def test_wait_reports_round_trip_with_their_wire_names() -> None:
    barrier = WaitReport(WaitKind.BARRIER, n=3, waited=1.23456)
    assert barrier.to_body() == {"what": "barrier", "n": 3, "s": 1.235}
    assert WaitReport.from_body(barrier.to_body()) == WaitReport(WaitKind.BARRIER, n=3, waited=1.235)
    pull = WaitReport(WaitKind.PULL, of="'w', 'b'", push=7, on=(0, 2), waited=2.5)
    assert pull.to_body() == {"what": "pull", "of": "'w', 'b'", "push": 7, "on": [0, 2], "s": 2.5}
    assert WaitReport.from_body(pull.to_body()) == pull
    init = WaitReport.from_body({"what": "init", "of": "'w'", "on": [4, 1, 4]})
    assert init == WaitReport(WaitKind.INIT, of="'w'", push=0, on=(1, 4), waited=0.0)
    assert init.what is WaitKind.INIT and init.episode == ("init", 0, "'w'", 0)
    got = decode_body(Command.HEARTBEAT, Heartbeat(Counters(pushes=1, wait=pull, awaited=((2, 4.0),))).to_body())
    assert got == Heartbeat(Counters(pushes=1, wait=pull, awaited=((2, 4.0),)))


@pytest.mark.parametrize("body,message", [
    ({"what": "sleep", "n": 1}, "what must be one of barrier, pull, init, not 'sleep'"),
    ({"n": 1}, "what is missing"),
    ({"what": "barrier"}, "n is missing"),
    ({"what": "barrier", "n": True}, "n must be an integer"),
    ({"what": "barrier", "n": 1, "s": -1}, "s must be a non-negative number"),
    ({"what": "barrier", "n": 1, "s": float("inf")}, "s must be a non-negative number"),
    ({"what": "pull", "of": "'w'", "on": []}, "on must list 1 to 4096 ranks, not 0"),
    ({"what": "pull", "of": "'w'", "on": list(range(4097))}, "on must list 1 to 4096 ranks, not 4097"),
    ({"what": "pull", "of": "'w'", "on": [0, -1]}, "on must list ranks"),
    ({"what": "pull", "on": [0]}, "of is missing"),
    ({"what": "pull", "of": "x" * 301, "on": [0]}, "of must be a string of at most 300 characters"),
    ({"what": "init", "of": "'w'", "on": [0], "push": "2"}, "push must be an integer"),
])
def test_malformed_wait_reports_raise_protocol_error(body: dict, message: str) -> None:
    with pytest.raises(ProtocolError, match=re.escape(f"heartbeat wait: {message}")):
        WaitReport.from_body(body)
    # in a heartbeat, the worker counts as not waiting; its heartbeat and counters still count
    got = decode_body(Command.HEARTBEAT, {"stats": {"pushes": 5, "wait": body}})
    assert got == Heartbeat(Counters(pushes=5))


BAD_VALUES = [None, True, -1, 2**70, 1.5, float("nan"), "x", "", [], [1, "a"], {}, {"a": [None]}]


def test_every_field_of_every_body_fuzzed_raises_only_protocol_error() -> None:
    """Each field of each valid body replaced by each bad value, or dropped: the body decodes,
    or decoding raises ProtocolError; nothing else."""
    bad = []
    for cmd, valid in VALID:
        body = valid.to_body()
        variants = [{k: v for k, v in body.items() if k != name} for name in body]
        variants += [{**body, name: value} for name, value in itertools.product(body, BAD_VALUES)]
        stats = body.get("stats") or {}
        variants += [{**body, "stats": {**stats, name: value}} for name, value in itertools.product(stats, BAD_VALUES)]
        for variant in variants:
            try:
                decode_body(cmd, variant)
            except ProtocolError:
                pass
            except Exception as exc:  # noqa: BLE001 - what the test looks for
                bad.append(f"{cmd.value} {str(variant)[:80]}: {type(exc).__name__}: {exc}")
    assert not bad, "\n".join(bad)


# ------------------------------------------------------------------ the node's scheduler link
def _collect(step, want: int, timeout: float = 5.0) -> list:
    """What ``step()`` returns (lists, gathered) until ``want`` items came or ``timeout`` passed."""
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        got += step()
        time.sleep(0.01)
    return got


def _drain(recv) -> list:
    out = []
    while (m := recv()) is not None:
        out.append(m)
    return out


def test_a_node_drops_malformed_scheduler_messages_and_keeps_the_rest() -> None:
    """SchedulerLink.recv decodes what the scheduler sends; a malformed body is logged and
    dropped, the node goes on, and only a well-formed WELCOME marks it welcomed."""
    sched = Transport("jl", "scheduler", 2**20, Security.insecure())
    node = Transport("jl", "worker", 2**20, Security.insecure())
    try:
        router, port = sched.router("127.0.0.1", 0, Plane.CONTROL)
        cfg = NodeConfig(role=Role.WORKER, scheduler_host="127.0.0.1", scheduler_port=port, num_workers=1,
                         num_servers=1, job_id="jl", host="127.0.0.1")
        link = SchedulerLink(node, cfg, "worker", 0, lambda: Counters(pushes=3, wait=WAIT))
        got = _collect(lambda: _drain(lambda: router.recv(routed=True)), 1)
        assert [g[1].cmd for g in got] == [Command.REGISTER]
        assert decode_body(Command.REGISTER, got[0][1].body) == Register("worker", "127.0.0.1", 0, os.getpid(), None)
        for cmd, body in [(Command.WELCOME, {"rank": 0}), (Command.SERVERS, {"down": "x"}),
                          (Command.PEER_LOST, {"reason": 5}), (Command.BARRIER_DONE, {"n": None}),
                          (Command.WELCOME, Welcome(0, BOOK[:1], 4321, 1, 1, (0,)).to_body()),
                          (Command.HEARTBEAT_ACK, {})]:
            router.send(cmd, body, to=got[0][0])
        msgs = _collect(lambda: _drain(link.recv), 2)
        assert [m.cmd for m in msgs] == [Command.WELCOME, Command.HEARTBEAT_ACK], msgs
        assert msgs[0].body == Welcome(0, BOOK[:1], 4321, 1, 1, (0,))
        assert link.welcomed and link.scheduler_pid == 4321
        link.tick(time.monotonic())   # a heartbeat with the role's counters, typed
        beats = _collect(lambda: [g for g in _drain(lambda: router.recv(routed=True))
                                  if g[1].cmd is Command.HEARTBEAT], 1)
        assert [decode_body(Command.HEARTBEAT, g[1].body) for g in beats] == [Heartbeat(Counters(pushes=3, wait=WAIT))]
    finally:
        node.close()
        sched.close()


# ------------------------------------------------------------------ same-host datagrams
SEGS = (Segment(0, 4096, False), Segment(3, 2**20, True))


def test_same_host_datagrams_round_trip() -> None:
    hello = Hello("job-a", 1, 4242, "ab12", SEGS)
    data = hello.encode()
    assert data[:1] == b"H" and json.loads(data[1:]) == {"job": "job-a", "rank": 1, "pid": 4242, "token": "ab12",
                                                         "segs": [[0, 4096, False], [3, 2**20, True]]}
    assert Hello.decode(data[1:], 2) == hello
    assert Accepted.decode(Accepted(SEGS).encode()[1:], 2) == Accepted(SEGS)
    assert Announce.decode(Announce(SEGS[:1]).encode()[1:], 1) == Announce(SEGS[:1])
    assert Refused.decode(Refused("not of job x").encode()[1:]) == Refused("not of job x")
    head = bytes(range(40))
    d = data_datagram(head, b"payload")
    assert d[:1] == b"D" and data_header(d) == 40 and d[5:45] == head and d[45:] == b"payload"


@pytest.mark.parametrize("data,n_fds,reason", [
    (b"not json", 0, "not JSON"), (b"[1]", 0, "not a JSON object"),
    (b'{"job": 1, "rank": 0, "pid": 1, "segs": []}', 0, "job"),
    (b'{"job": "j", "rank": "0", "pid": 1, "segs": []}', 0, "rank"),
    (b'{"job": "j", "rank": 0, "pid": null, "segs": []}', 0, "pid"),
    (b'{"job": "j", "rank": 0, "pid": 1, "token": 5, "segs": []}', 0, "token"),
    (b'{"job": "j", "rank": 0, "pid": 1, "segs": []}', 1, "1 segment descriptor"),
    (b'{"job": "j", "rank": 0, "pid": 1, "segs": [[0, 1, 1]]}', 1, "bad segment"),
    (b'{"job": "j", "rank": 0, "pid": 1, "segs": [[-1, 1, true]]}', 1, "bad segment"),
])
def test_malformed_hellos_say_why(data: bytes, n_fds: int, reason: str) -> None:
    with pytest.raises(ProtocolError, match=reason):
        Hello.decode(data, n_fds)


def test_truncated_data_datagrams() -> None:
    for data, reason in ((b"D\x01", "truncated data datagram"), (b"D\x10\0\0\0abc", "truncated data header")):
        with pytest.raises(ProtocolError, match=reason):
            data_header(data)


def test_random_datagrams_raise_only_protocol_error() -> None:
    rng = np.random.default_rng(3)
    for n in range(300):
        raw = rng.integers(0, 256, int(rng.integers(0, 80)), dtype=np.uint8).tobytes()
        for parse in (lambda d: Hello.decode(d, 0), lambda d: Accepted.decode(d, 0), Refused.decode,
                      lambda d: Announce.decode(d, 1), lambda d: data_header(b"D" + d)):
            with contextlib.suppress(ProtocolError):
                parse(raw if n % 2 else b"{" + raw)


def test_a_heartbeats_holder_lag_keeps_only_well_formed_pairs() -> None:
    body = Counters(lag=((1, 2),)).to_body()
    body["lag"] += [[-1, 0], [2, "x"], "no", [3, 4]]
    assert decode_body(Command.HEARTBEAT, {"stats": body}) == Heartbeat(Counters(lag=((1, 2), (3, 4))))


def test_a_heartbeats_holder_lag_carries_a_whole_copys_progress() -> None:
    """A holder getting the state whole: [holder, copies, bytes acknowledged, the copy's bytes];
    one acknowledging more than the copy, or with three numbers, is left out."""
    body = Counters(lag=((1, 1, 2 << 20, 640 << 20), (2, 0))).to_body()
    assert body["lag"] == [[1, 1, 2 << 20, 640 << 20], [2, 0]]
    body["lag"] += [[3, 1, 9, 8], [4, 1, 5], [5, 1, -1, 8]]
    got = decode_body(Command.HEARTBEAT, {"stats": body})
    assert got == Heartbeat(Counters(lag=((1, 1, 2 << 20, 640 << 20), (2, 0))))
    assert "lag" not in Counters().to_body() and "loop_gap_us" not in Counters().to_body()


def test_a_node_held_by_its_own_work_never_takes_the_scheduler_for_dead() -> None:
    """A turn of the node's loop longer than the heartbeat timeout (its own work: the
    scheduler's replies wait in the socket) counts as one heartbeat interval; a scheduler that
    stays silent while the node listens is still lost after ``dead_after``."""
    sched = Transport("jh", "scheduler", 2**20, Security.insecure())
    node = Transport("jh", "worker", 2**20, Security.insecure())
    try:
        _, port = sched.router("127.0.0.1", 0, Plane.CONTROL)
        cfg = NodeConfig(role=Role.WORKER, scheduler_host="127.0.0.1", scheduler_port=port, num_workers=1,
                         num_servers=1, job_id="jh", host="127.0.0.1", heartbeat_interval=1.0,
                         heartbeat_liveness=5)
        link = SchedulerLink(node, cfg, "worker", 0, lambda: Counters())
        t0 = link.last_ack
        link.tick(t0 + 0.5)
        link.tick(t0 + 30.0)                 # held 29.5 s by its own work: it counts as 1 s
        now = t0 + 30.0
        with pytest.raises(PeerLost, match="stopped responding"):
            while now < t0 + 60:             # listening (a turn every 0.5 s), and nothing comes
                now += 0.5
                link.tick(now)
        assert now - t0 == 34.0              # silence: 0.5 s + the held turn as 1 s + 4 s listening > 5 s
    finally:
        node.close()
        sched.close()


def test_a_standby_address_without_a_port_is_refused_naming_it() -> None:
    with pytest.raises(ProtocolError, match="standby: address must be host:port, not 'node3'"):
        decode_body(Command.STANDBY, {"address": "node3"})


def test_a_welcome_leaves_out_active_when_every_rank_is_and_implies_it_back() -> None:
    """Every worker of the job active (a job's start): no list of W ranks in each of W WELCOMEs;
    the receiver reads every rank back, up to MAX_IMPLIED workers."""
    full = Welcome(1, BOOK[:1], 99, 4, 1, (0, 1, 2, 3))
    assert "active" not in full.to_body()
    assert decode_body(Command.WELCOME, _wire(Command.WELCOME, full.to_body())) == full
    big = {**full.to_body(), "num_workers": MAX_IMPLIED + 1}
    with pytest.raises(ProtocolError, match=f"welcome: active left out with {MAX_IMPLIED + 1} workers"):
        decode_body(Command.WELCOME, big)
