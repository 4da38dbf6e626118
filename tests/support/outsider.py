"""What any local user can do to a psnode job, with nothing but Python's standard library.

Run as another Unix user (tests/conftest.py: ``other_user``), from stdin::

    python3 - JOB_REGEX TARGET... < outsider.py

1. learns job ids from every process's command line (``/proc/*/cmdline``; group 1 of
   JOB_REGEX), the listening TCP sockets from ``/proc/net/tcp`` and the listening abstract
   Unix sockets (a server's same-host data plane) from ``/proc/net/unix``;
2. for every target ``HOST:PORT`` of the job, for STOP, STATUS, REGISTER and DATA (a push),
   speaks ZMTP 3.1 by hand -- once with the NULL mechanism (what a plain pyzmq socket does) and
   once with PLAIN and a guessed password -- and sends a message well-formed for psnode's wire
   protocol (``frames``) for each job id it found (it cannot tell which job a port serves)
   until one is answered, then reads what comes back until the peer hangs up or a deadline;
3. for every target ``@NAME`` (an abstract Unix address), sends a same-host HELLO as worker 0
   of each job id it found, with a guessed token (``hello``), and reads the answer.

Prints one JSON object: ``{"jobs": [...], "listening": [[host, port], ...], "unix": [name, ...],
"attempts": [{"target", "job", "cmd", "mechanism", "peer_mechanism", "commands", "messages",
"answer", "refused"}, ...]}`` (one per connection): the mechanism the peer's greeting named
(None: it hung up first), the handshake commands it sent (READY, WELCOME, ERROR), the number of
messages it sent and the command of its reply; for a HELLO (``cmd`` "hello"), ``answer`` is
"welcome" if the server took it and ``refused`` the reason it gave.
"""
from __future__ import annotations

import json
import os
import re
import socket
import struct
import sys
import time

VERSION = b"PSN1"
COMMANDS = ("stop", "status", "register", "data")


def job_ids(pattern: str) -> list[str]:
    found = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        found.update(m.group(1) for m in re.finditer(pattern, argv))
    return sorted(found)


def listening() -> list[tuple[str, int]]:
    """IPv4 listening sockets from /proc/net/tcp (state 0A), any owner."""
    out = []
    with open("/proc/net/tcp") as fh:
        for line in fh.readlines()[1:]:
            cols = line.split()
            if cols[3] != "0A":
                continue
            ip_hex, port_hex = cols[1].split(":")
            ip = socket.inet_ntoa(struct.pack("<I", int(ip_hex, 16)))
            out.append((ip, int(port_hex, 16)))
    return out


def unix_listening() -> list[str]:
    """Listening abstract Unix sockets (``@name``) from /proc/net/unix, any owner."""
    out = []
    with open("/proc/net/unix") as fh:
        for line in fh.readlines()[1:]:
            cols = line.split()
            if len(cols) >= 8 and int(cols[3], 16) & 0x10000 and cols[7].startswith("@"):   # __SO_ACCEPTCON
                out.append(cols[7])
    return sorted(set(out))


def hello(name: str, job: str, wait: float) -> dict:
    """A same-host HELLO to the abstract address ``name`` (``@...``) as worker 0 of ``job``."""
    rec: dict = {"target": name, "cmd": "hello", "mechanism": "token", "peer_mechanism": None,
                 "commands": [], "messages": 0, "answer": None, "refused": None}
    body = {"job": job, "rank": 0, "pid": os.getpid(), "token": os.urandom(32).hex(), "segs": []}
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.settimeout(wait)
        try:
            s.connect("\0" + name[1:])
            s.send(b"H" + json.dumps(body).encode())
            data = s.recv(65536)
        except OSError as exc:
            rec["refused"] = f"{type(exc).__name__}: {exc}"
            return rec
    if data:
        rec["messages"] = 1
    if data[:1] == b"W":
        rec["answer"] = "welcome"
    else:
        try:
            rec["refused"] = json.loads(data[1:]).get("reason") if data else "hung up"
        except ValueError:
            rec["refused"] = repr(data[:80])
    return rec


def frames(cmd: str, job: str) -> tuple[bytes, list[bytes]]:
    """(routing identity, psnode frames) of a well-formed ``cmd`` message of job ``job``."""
    arrays: list[list] = []
    bufs: list[bytes] = []
    ident = f"outsider-{os.getpid()}".encode()
    if cmd == "stop":
        body: dict = {"reason": "an outsider stopped it"}
    elif cmd == "status":
        body = {}
    elif cmd == "register":
        body = {"role": "worker", "host": "127.0.0.1", "port": 0, "pid": os.getpid(), "rank": 0}
    else:   # a push of 1000s into key 'w' as worker 0, sequence 1: what the job pushes first
        body = {"ops": [{"op": "push", "k": "w", "p": 0, "q": 1, "a": 0, "id": 1}]}
        arrays = [["float32", [4], 0, 0]]
        bufs = [struct.pack("<4f", 1000, 1000, 1000, 1000)]
        ident = b"w0"
    header = {"c": cmd, "j": job, "s": "worker:0", "b": body, "a": arrays}
    return ident, [VERSION, json.dumps(header).encode(), *bufs]


def _frame(body: bytes, more: bool = False, command: bool = False) -> bytes:
    flags = (1 if more else 0) | (4 if command else 0)
    if len(body) > 255:
        return bytes([flags | 2]) + struct.pack(">Q", len(body)) + body
    return bytes([flags, len(body)]) + body


def _props(**props: bytes) -> bytes:
    return b"".join(bytes([len(k)]) + k.encode() + struct.pack(">I", len(v)) + v
                    for k, v in props.items())


def _greeting(mechanism: bytes) -> bytes:
    return b"\xff" + bytes(8) + b"\x7f" + b"\x03\x01" + mechanism.ljust(20, b"\0") + b"\0" + bytes(31)


class _Peer:
    """A TCP connection read frame by frame, bounded by one deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock, self.deadline, self.buf = sock, deadline, b""

    def exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            self.sock.settimeout(left)
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def frame(self) -> tuple[int, bytes]:
        flags = self.exactly(1)[0]
        size = struct.unpack(">Q", self.exactly(8))[0] if flags & 2 else self.exactly(1)[0]
        return flags, self.exactly(size)

    def command(self, rec: dict) -> str:
        flags, body = self.frame()
        name = body[1:1 + body[0]].decode(errors="replace") if flags & 4 and body else "?"
        rec["commands"].append(name)
        return name


def attempt(host: str, port: int, cmd: str, job: str, mechanism: str, wait: float) -> dict:
    """One connection speaking ZMTP 3.1 as a DEALER: greeting, handshake, one message, replies."""
    ident, msg = frames(cmd, job)
    rec: dict = {"target": f"{host}:{port}", "cmd": cmd, "mechanism": mechanism, "peer_mechanism": None,
                 "commands": [], "messages": 0, "answer": None, "refused": None}
    meta = _props(**{"Socket-Type": b"DEALER", "Identity": ident})
    with socket.create_connection((host, port), timeout=wait) as s:
        peer = _Peer(s, time.monotonic() + wait)
        try:
            s.sendall(_greeting(mechanism.encode()))
            rec["peer_mechanism"] = peer.exactly(64)[12:32].rstrip(b"\0").decode(errors="replace")
            if mechanism == "PLAIN":
                user, password = f"{host}:{port}".encode(), b"guess-" + os.urandom(8).hex().encode()
                s.sendall(_frame(b"\x05HELLO" + bytes([len(user)]) + user + bytes([len(password)]) + password,
                                 command=True))
                if peer.command(rec) != "WELCOME":
                    return rec
                s.sendall(_frame(b"\x08INITIATE" + meta, command=True))
            else:
                s.sendall(_frame(b"\x05READY" + meta, command=True))
            if peer.command(rec) != "READY":
                return rec
            s.sendall(b"".join(_frame(f, more=i < len(msg) - 1) for i, f in enumerate(msg)))
            parts: list[bytes] = []
            while True:
                flags, body = peer.frame()
                if flags & 4:
                    continue
                parts.append(body)
                if not flags & 1:
                    rec["messages"] += 1
                    if rec["answer"] is None and len(parts) >= 2 and parts[0] == VERSION:
                        rec["answer"] = json.loads(parts[1]).get("c")
                        return rec
                    parts = []
        except (EOFError, TimeoutError, OSError, ValueError):
            return rec


def main(argv: list[str]) -> None:
    pattern = argv[0]
    targets = [t.rsplit(":", 1) for t in argv[1:] if not t.startswith("@")]
    jobs = job_ids(pattern)
    report: dict = {"jobs": jobs, "listening": listening(), "unix": unix_listening(), "attempts": []}
    wait = float(os.environ.get("OUTSIDER_WAIT", "5.0"))
    only = os.environ.get("OUTSIDER_COMMANDS", ",".join(COMMANDS)).split(",")
    mechanisms = os.environ.get("OUTSIDER_MECHANISMS", "NULL,PLAIN").split(",")
    for name in (t for t in argv[1:] if t.startswith("@")):
        for job in jobs:
            report["attempts"].append(dict(hello(name, job, wait), job=job))
    for host, port in targets:
        for cmd in only:
            for mech in mechanisms:
                for job in jobs:   # which job a port serves is not visible: try each until answered
                    rec = attempt(host, int(port), cmd, job, mech, wait)
                    report["attempts"].append(dict(rec, job=job))
                    if rec["answer"]:
                        break
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1:])
