"""A job's secret: its file format, its modes, and the credentials derived from it.

Three modes, named for what they protect (:class:`Mode`):

- ``authenticated`` (what ``mxdist`` gives every job by default): every connection proves it
  belongs to the job before any of its messages reach a role's code; data then travels in
  clear, at full speed.  Links to the scheduler (membership, heartbeats, ``mxdist status`` and
  ``stop``) use CURVE with the job's key pair: both ends prove they hold it and the secret
  never travels.  Data links (worker -> server) use ZeroMQ's PLAIN mechanism with a password
  derived from the job's token and the server's address (:meth:`Security.client_password`):
  a process that gets hold of one (it would have to read the traffic, or bind a dead server's
  port) can use it for that one address only.  A server also proves itself to the worker in
  its handshake (:meth:`Security.server_proof`), so a worker ignores a process that took a
  dead server's port.
- ``encrypted``: CURVE on every link (authenticated both ways and encrypted); for networks
  where others can read or change the traffic.
- ``insecure``: nothing; ``PSNODE_KEY_FILE`` unset.

**The secret file** (``PSNODE_KEY_FILE``), text, mode 0600, owned by the user of the job::

    # a comment
    psnode-secret 1
    mode authenticated            (or: encrypted)
    token <64 hex digits>         32 random bytes, the job's shared secret
    curve-public <40 Z85 chars>   the job's CURVE key pair
    curve-secret <40 Z85 chars>

Every field is required and appears once; blank lines and ``#`` comments are ignored.  The
older format, two lines holding a CURVE key pair and nothing else, is still read, as
``encrypted`` (its token is derived from the secret key): a few lines that let ``mxdist status``
and ``stop`` reach a job an older ``mxdist`` started; nothing writes it any more.

A file that others can read or write, that another user owns, or that does not parse is
refused with a :class:`ConfigError` naming the file and the fix.

:meth:`Security.proof` / :meth:`Security.verify` are there for any other channel of the job
(e.g. a same-host data plane): HMAC-SHA256 of a label under the token, compared in constant
time.  This module does no network I/O and does not import zmq (key pairs are made in
:mod:`psnode.net.transport`).
"""
from __future__ import annotations

import hashlib
import hmac
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from psnode.errors import ConfigError
from psnode.files import write_atomic

MAGIC = "psnode-secret"
FORMAT_VERSION = 1
TOKEN_BYTES = 32
MAX_FILE_BYTES = 4096
_Z85 = frozenset(b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#")
_FIX = "mxdist launch writes a fresh one for every job; from Python: psnode.net.transport.new_security(mode).save(path)"


class Mode(str, Enum):
    """What a job's connections are protected by (see the module docstring)."""

    INSECURE = "insecure"
    AUTHENTICATED = "authenticated"
    ENCRYPTED = "encrypted"


class Plane(str, Enum):
    """Which kind of link a socket serves: the choice of mechanism depends on it."""

    CONTROL = "control"   # to the scheduler: registration, heartbeats, barriers, status, stop
    DATA = "data"         # worker -> server: pushes and pulls


class Mechanism(str, Enum):
    """ZeroMQ security mechanisms."""

    NULL = "NULL"
    PLAIN = "PLAIN"
    CURVE = "CURVE"


def mechanism(mode: Mode, plane: Plane) -> Mechanism:
    """The mechanism a socket of ``plane`` uses in ``mode``."""
    if mode is Mode.INSECURE:
        return Mechanism.NULL
    if mode is Mode.AUTHENTICATED and plane is Plane.DATA:
        return Mechanism.PLAIN
    return Mechanism.CURVE


@dataclass(frozen=True)
class Security:
    """A job's mode and secrets.  ``token`` is b"" (and every proof empty) when insecure.

    ``curve_public``/``curve_secret`` are Z85 text (40 bytes each).  Secrets never appear in
    ``repr``.
    """

    mode: Mode
    token: bytes = field(default=b"", repr=False)
    curve_public: bytes = b""
    curve_secret: bytes = field(default=b"", repr=False)

    def __post_init__(self) -> None:
        if self.mode is Mode.INSECURE:
            if self.token or self.curve_public or self.curve_secret:
                raise ValueError("an insecure Security holds no secrets")
            return
        if len(self.token) != TOKEN_BYTES:
            raise ValueError(f"a job token has {TOKEN_BYTES} bytes, not {len(self.token)}")
        for name, key in (("curve_public", self.curve_public), ("curve_secret", self.curve_secret)):
            if len(key) != 40 or not set(key) <= _Z85:
                raise ValueError(f"{name} is not a Z85 CURVE key (40 characters)")

    @classmethod
    def insecure(cls) -> Security:
        return cls(Mode.INSECURE)

    @property
    def secured(self) -> bool:
        return self.mode is not Mode.INSECURE

    def proof(self, label: bytes) -> bytes:
        """HMAC-SHA256 of ``label`` under the job's token (b"" when insecure)."""
        if not self.secured:
            return b""
        return hmac.new(self.token, label, hashlib.sha256).digest()

    def verify(self, label: bytes, proof: bytes) -> bool:
        """Whether ``proof`` is :meth:`proof` of ``label`` (constant time; always True when insecure)."""
        if not self.secured:
            return True
        return hmac.compare_digest(self.proof(label), proof)

    def client_password(self, address: str) -> bytes:
        """PLAIN password of a data link to the server at ``address`` (``host:port``): the user
        name is the address, so the password is good for that server's address only."""
        return self.proof(b"psnode data client " + address.encode()).hex().encode()

    def server_proof(self, address: str) -> bytes:
        """What the server at ``address`` shows in its handshake (metadata ``X-Psnode-Proof``)."""
        return self.proof(b"psnode data server " + address.encode()).hex().encode()

    def dumps(self) -> bytes:
        """The secret file's content (see the module docstring)."""
        if not self.secured:
            raise ValueError("an insecure job has no secret file: leave PSNODE_KEY_FILE unset")
        return (f"# psnode job secret (PSNODE_KEY_FILE): keep it private (mode 0600)\n"
                f"{MAGIC} {FORMAT_VERSION}\nmode {self.mode.value}\ntoken {self.token.hex()}\n"
                f"curve-public {self.curve_public.decode()}\ncurve-secret {self.curve_secret.decode()}\n"
                ).encode()

    def save(self, path: str) -> None:
        """Write the secret file atomically with mode 0600 (a file or link already there is
        replaced, never written through)."""
        write_atomic(path, self.dumps())

    @classmethod
    def load(cls, path: str | None) -> Security:
        """Read ``PSNODE_KEY_FILE`` (None or "": insecure); refuse a file others could read."""
        if not path:
            return cls.insecure()
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as exc:
            raise ConfigError(f"cannot read the job's secret file {path} (PSNODE_KEY_FILE): "
                              f"{exc.strerror}; {_FIX}") from None
        try:
            st = os.fstat(fd)
            check_private(path, st)
            data = os.read(fd, MAX_FILE_BYTES + 1)
        finally:
            os.close(fd)
        if len(data) > MAX_FILE_BYTES:
            raise ConfigError(f"the job's secret file {path} is larger than {MAX_FILE_BYTES} bytes: "
                              f"not a psnode secret; {_FIX}")
        return parse(data, path)


def check_private(path: str, st: os.stat_result) -> None:
    """Raise ConfigError unless ``st`` is a regular file of this user that no one else may use."""
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"the job's secret file {path} is not a regular file; {_FIX}")
    if st.st_uid != os.geteuid():
        raise ConfigError(f"the job's secret file {path} belongs to uid {st.st_uid}, not to this "
                          f"user (uid {os.geteuid()}): its owner knows the secret; {_FIX}")
    if st.st_mode & 0o077:
        raise ConfigError(f"the job's secret file {path} is readable or writable by others "
                          f"(mode {stat.S_IMODE(st.st_mode):04o}): chmod 600 {path}")


_FIELDS = ("mode", "token", "curve-public", "curve-secret")


def parse(data: bytes, path: str = "<secret>") -> Security:
    """The :class:`Security` in a secret file's content; ConfigError naming ``path`` and the line."""
    def bad(what: str) -> ConfigError:
        return ConfigError(f"the job's secret file {path} {what}; {_FIX}")

    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise bad("is not ASCII text") from None
    lines = [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1)]
    lines = [(n, line) for n, line in lines if line and not line.startswith("#")]
    words = [line.split() for _, line in lines]
    if len(words) == 2 and all(len(w) == 1 and len(w[0]) == 40 for w in words):
        return _legacy(words[0][0].encode(), words[1][0].encode(), bad)
    if not words or words[0] != [MAGIC, str(FORMAT_VERSION)]:
        raise bad(f"does not start with '{MAGIC} {FORMAT_VERSION}'")
    fields: dict[str, str] = {}
    for (n, _), w in zip(lines[1:], words[1:], strict=True):
        if len(w) != 2 or w[0] not in _FIELDS:
            raise bad(f"line {n}: expected one of {', '.join(_FIELDS)} and a value")
        if w[0] in fields:
            raise bad(f"line {n}: {w[0]} appears twice")
        fields[w[0]] = w[1]
    missing = [f for f in _FIELDS if f not in fields]
    if missing:
        raise bad(f"lacks {', '.join(missing)}")
    modes = {m.value: m for m in Mode if m is not Mode.INSECURE}
    mode = modes.get(fields["mode"])
    if mode is None:
        raise bad(f"has mode {fields['mode']!r}: expected authenticated or encrypted "
                  f"(for no security at all, leave PSNODE_KEY_FILE unset)")
    try:
        token = bytes.fromhex(fields["token"])
    except ValueError:
        raise bad("has a token that is not hexadecimal") from None
    if len(token) != TOKEN_BYTES:
        raise bad(f"has a token of {len(token)} bytes, not {TOKEN_BYTES}")
    try:
        return Security(mode, token, fields["curve-public"].encode(), fields["curve-secret"].encode())
    except ValueError as exc:
        raise bad(f"holds a bad key: {exc}") from None


def _legacy(public: bytes, secret: bytes, bad: Callable[[str], ConfigError]) -> Security:
    token = hmac.new(secret, b"psnode legacy token", hashlib.sha256).digest()
    try:
        return Security(Mode.ENCRYPTED, token, public, secret)
    except ValueError as exc:
        raise bad(f"holds a bad key: {exc}") from None
