"""Hosts: the hosts file and the inline ``-H`` list, parsed into :class:`Host` values.

Pure: no I/O.  The caller reads the file and passes its text.

One rule for a host, wherever it is written (a hosts file line, an inline ``-H`` item, a
line of a ``--host-discovery-script``)::

    [USER@]HOST[:SLOTS] [FIELD=VALUE ...]

* ``HOST:N`` is read as the users who write it mean it (:class:`Colon`): inline (``-H h1:2,h2:4``)
  and in a discovery script's answer it is N slots, as horovodrun and Horovod's discovery
  script mean it; in a hosts file it is the SSH port, as MXNet's ``launch.py`` (the dmlc
  tracker) reads its ``ip:port`` lines.  A number that could mean either is refused with what to
  write (``HOST slots=N`` or ``HOST port=N``), never placed: in a file any N but 22 and those
  above :data:`MAX_SLOTS`, inline 22 (SSH's port) and those above :data:`MAX_SLOTS`;
* fields: ``slots=N`` (the same as ``:N``), ``port=N`` (the SSH port; else Port from the ssh
  config, else 22), ``addr=ADDRESS`` (what the host's processes bind to and are reached at, for
  hosts with several networks; else the address SSH connects to).  A field follows the host
  after a space or a ``:``, so ``node2:port=2222`` and ``node2 port=2222`` are the same host;
* an IPv6 address goes in brackets: ``[fe80::1]:2``.

Hosts file format (see ``hosts.example``)::

    # comment                       blank lines and comments are ignored
    node1                           a host, one slot, port and user from ~/.ssh/config or 22/you
    node2 slots=2 port=2222         two slots, sshd on port 2222
    alice@node3 slots=4             a user; four slots
    10.0.0.5:22                     MXNet's ip:port: sshd on port 22, one slot
    node4 addr=10.1.0.4             the job's traffic on 10.1.0.4 (SSH still goes to node4)

Inline list (``-H a,b:2,user@c:port=2222``): the same entries separated by commas.

Every word is validated before
any connection: host names, user names, ports and addresses that could be read as shell syntax
or ssh options (``h;touch x``, ``$(id)``, backticks, ``-oProxyCommand=..``) are rejected with
``file:line`` and the offending line.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, replace
from enum import Enum

_HOST_RE = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,252})$")
_V6_RE = re.compile(r"^\[[0-9A-Fa-f:.]{2,45}\]$")
_USER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")

#: More slots than any host runs workers: ``HOST:N`` above it is an SSH port, never slots.
MAX_SLOTS = 1024
#: SSH's own port: ``HOST:22`` is a port wherever it is written, so inline it is refused as slots.
SSH_PORT = 22


class Colon(Enum):
    """What ``HOST:N`` means where it is written (the module docstring's rule)."""

    SLOTS = "slots"   # inline -H and a discovery script's answer: horovodrun's h1:4
    PORT = "port"     # a hosts file: MXNet launch.py's ip:port
#: The fields a host entry may carry (``NAME=VALUE``).
FIELDS = ("slots", "port", "addr")
#: ``Host.origin`` of the only word of ``-H WORD`` that names no file: if it does not resolve
#: either, the error says both (:mod:`mxdist.backends.ssh`).
LONE_WORD = "-H (no such file)"


class HostsError(ValueError):
    """A malformed host word or hosts file line; the message names where and why."""


@dataclass(frozen=True)
class Host:
    """One machine of a job.

    ``name`` is what the user wrote (also the key for ~/.ssh/config lookups); ``address`` is what
    processes bind to and are reached at: ``addr`` when given (``addr=``), else the ssh config's
    HostName once resolved, else ``name``.  ``port``/``user`` are None when not given (ssh config
    or defaults decide).
    """

    name: str
    port: int | None = None
    user: str | None = None
    slots: int = 1
    address: str = ""
    origin: str = ""
    addr: str | None = None

    def __post_init__(self) -> None:
        if self.addr:
            object.__setattr__(self, "address", self.addr.strip("[]"))
        elif not self.address:
            object.__setattr__(self, "address", self.name.strip("[]"))

    @property
    def label(self) -> str:
        """``user@name:port=N`` with only the parts that were given: how users name the host
        (written so, it is a host entry again)."""
        text = self.name
        if self.user:
            text = f"{self.user}@{text}"
        if self.port is not None:
            text = f"{text}:port={self.port}"
        return text

    def with_slots(self, slots: int) -> Host:
        return replace(self, slots=slots)


def check_hostname(name: str, where: str = "host") -> str:
    """Return ``name`` if it is a plain host name, IPv4 or bracketed IPv6 address; else raise."""
    if name.startswith("-"):
        raise HostsError(f"{where}: host {name!r} starts with '-' (would be read as an ssh option)")
    if not (_HOST_RE.match(name) or _V6_RE.match(name)):
        raise HostsError(
            f"{where}: host {name!r} is not a valid host name "
            "(letters, digits, '.', '-', '_'; no spaces or shell characters)"
        )
    return name


def check_user(user: str, where: str = "user") -> str:
    """Return ``user`` if it is a plain POSIX user name; else raise."""
    if not _USER_RE.match(user):
        raise HostsError(f"{where}: user {user!r} is not a valid user name")
    return user


def check_env_name(name: str, where: str = "env") -> str:
    """Return ``name`` if it is a valid environment variable name; else raise."""
    if not _ENV_RE.match(name):
        raise HostsError(f"{where}: {name!r} is not a valid environment variable name")
    return name


def _port(text: str, where: str) -> int:
    if not text.isdigit():
        raise HostsError(f"{where}: port {text!r} is not a number")
    port = int(text)
    if not 1 <= port <= 65535:
        raise HostsError(f"{where}: port {port} is outside 1..65535")
    return port


def parse_host_word(word: str, where: str = "host") -> Host:
    """Parse ssh's ``[user@]host[:port]`` (``[v6]:port`` too): a ProxyJump host, not a host
    entry (:func:`parse_host_entry`)."""
    if not word:
        raise HostsError(f"{where}: empty host")
    user = None
    if "@" in word:
        user, _, word = word.rpartition("@")
        check_user(user, where)
    port = None
    if word.startswith("["):
        end = word.find("]")
        if end < 0:
            raise HostsError(f"{where}: unclosed '[' in {word!r}")
        host, rest = word[: end + 1], word[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise HostsError(f"{where}: unexpected {rest!r} after {host}")
            port = _port(rest[1:], where)
    elif ":" in word:
        host, _, port_s = word.rpartition(":")
        port = _port(port_s, where)
    else:
        host = word
    check_hostname(host, where)
    return Host(name=host, port=port, user=user, origin=where)


def _colon_parts(text: str) -> list[str]:
    """``text`` split at each ``:`` outside brackets."""
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == ":" and depth <= 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return parts


def _slots(text: str, entry: str, where: str) -> int:
    """A slot count written ``slots=N``."""
    if not text.isdigit() or int(text) < 1:
        raise HostsError(f"{where}: slots {text!r} in {entry!r} must be a whole number >= 1 (slots={text})")
    count = int(text)
    if count > MAX_SLOTS:
        raise HostsError(f"{where}: slots={count} in {entry!r} is more than {MAX_SLOTS}")
    return count


def _colon_number(text: str, head: str, host: str, where: str, colon: Colon) -> tuple[str, str]:
    """``HOST:N``'s N as the field it is where it is written (``("slots", N)`` or ``("port", N)``);
    a number that could mean either is refused, naming both readings and what to write."""
    if not text.isdigit() or int(text) < 1:
        what = "slots" if colon is Colon.SLOTS else "port"
        raise HostsError(f"{where}: {what} {text!r} in {head!r} must be a whole number >= 1 "
                         f"({host} slots=N for slots, {host} port=N for the SSH port)")
    number = int(text)
    both = f"write {host}:slots={number} for {number} slots, or {host}:port={number} for SSH port {number}"
    if colon is Colon.SLOTS:
        if number > MAX_SLOTS:
            raise HostsError(
                f"{where}: {head!r}: HOST:N in -H means N slots (as horovodrun -H and the discovery script), "
                f"and {number} is more than {MAX_SLOTS}; for SSH port {number} write {host}:port={number} (or "
                "Port in ~/.ssh/config)")
        if number == SSH_PORT:
            raise HostsError(f"{where}: {head!r} could mean {number} slots (horovodrun's -H h1:4) or SSH port "
                             f"{number} (MXNet's ip:port): {both}")
        return "slots", text
    if number == SSH_PORT or number > MAX_SLOTS:
        return "port", str(_port(text, where))
    raise HostsError(f"{where}: {head!r}: in a hosts file HOST:N is the SSH port (MXNet's ip:port lines), and "
                     f"{number} could be a slot count (horovodrun's -H h1:4) as well: {both}")


def parse_host_entry(entry: str, where: str = "host", colon: Colon = Colon.SLOTS) -> Host:
    """One host entry, ``[USER@]HOST[:N] [FIELD=VALUE ...]`` (the module docstring's rule), its
    ``:N`` read as ``colon`` says; errors name ``where`` and say what to write."""
    words = entry.split()
    if not words:
        raise HostsError(f"{where}: empty host")
    head, rest = words[0], words[1:]
    user = None
    if "@" in head.split(":")[0]:
        user, _, head = head.partition("@")
        check_user(user, where)
    if head.startswith("["):
        end = head.find("]")
        if end < 0:
            raise HostsError(f"{where}: unclosed '[' in {head!r}")
        host, tail = head[: end + 1], head[end + 1 :]
        if tail and not tail.startswith(":"):
            raise HostsError(f"{where}: unexpected {tail!r} after {host}")
        chunks = _colon_parts(tail[1:]) if tail else []
    else:
        host, *chunks = _colon_parts(head)
    if any(not c for c in chunks):
        raise HostsError(f"{where}: empty part after ':' in {head!r} (HOST:SLOTS; an IPv6 address goes in "
                         "brackets: [fe80::1]:2)")
    check_hostname(host, where)
    values: dict[str, str] = {}
    numbered = ""      # the field HOST:N gave
    for index, chunk in enumerate([*chunks, *rest]):
        name, eq, value = chunk.partition("=")
        if not eq:
            if index == 0 and chunks and chunk.isdigit():
                numbered, number = _colon_number(chunk, head, host, where, colon)
                values[numbered] = number
                continue
            if index < len(chunks):
                raise HostsError(f"{where}: {chunk!r} after ':' in {head!r} is neither a slot count nor a field "
                                 "(HOST:SLOTS, HOST:port=N, HOST:addr=ADDRESS)")
            raise HostsError(f"{where}: unknown field {chunk!r} (fields: slots=N, port=N, addr=ADDRESS; one "
                             "host per line, or per comma with -H)")
        if name not in FIELDS:
            near = difflib.get_close_matches(name, FIELDS, n=1)
            hint = f"did you mean {near[0]}=? " if near else ""
            raise HostsError(f"{where}: unknown field {chunk!r} ({hint}fields: slots=N, port=N, addr=ADDRESS)")
        if name in values:
            first = f":{values[name]}" if name == numbered else f"{name}={values[name]}"
            raise HostsError(f"{where}: {name} given twice in {entry.strip()!r} ({first} and {chunk})")
        values[name] = value
    slots = _slots(values["slots"], entry.strip(), where) if "slots" in values else 1
    port = _port(values["port"], where) if "port" in values else None
    addr = values.get("addr")
    if addr is not None:
        if not addr:
            raise HostsError(f"{where}: addr= needs an address (addr=10.1.0.4, addr=[fe80::1])")
        check_hostname(addr, f"{where}: addr")
    return Host(name=host, port=port, user=user, slots=slots, origin=where, addr=addr)


def _key(host: Host) -> tuple[str, int | None, str | None]:
    return (host.name.lower(), host.port, host.user)


def _check_duplicate(seen: dict[tuple[str, int | None, str | None], str], host: Host, where: str) -> None:
    key = _key(host)
    if key in seen:
        raise HostsError(f"{where}: duplicate host {host.label!r} (first at {seen[key]}); use slots=N")
    seen[key] = where


def parse_hosts_file(text: str, path: str) -> list[Host]:
    """Parse a hosts file's text (``HOST:N`` is the SSH port: :class:`Colon`); errors name
    ``path:line`` and quote the line."""
    hosts: list[Host] = []
    seen: dict[tuple[str, int | None, str | None], str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{path}:{number}"
        try:
            host = parse_host_entry(line, where, Colon.PORT)
            _check_duplicate(seen, host, where)
        except HostsError as exc:
            raise HostsError(f"{exc}\n  {number} | {raw.rstrip()}") from None
        hosts.append(host)
    if not hosts:
        raise HostsError(f"{path}: no hosts (every line is blank or a comment)")
    return hosts


def parse_host_list(spec: str) -> list[Host]:
    """Parse the inline ``-H a,b:2,user@c:port=2222`` form (entries separated by commas; ``HOST:N``
    is N slots: :class:`Colon`)."""
    hosts: list[Host] = []
    seen: dict[tuple[str, int | None, str | None], str] = {}
    items = spec.split(",")
    for index, word in enumerate(items, start=1):
        where = "-H" if len(items) == 1 else f"-H item {index}"
        host = parse_host_entry(word.strip(), where)
        _check_duplicate(seen, host, where)
        hosts.append(host)
    return hosts


def looks_like_file(spec: str) -> bool:
    """Whether ``-H`` names a file rather than a list: a path separator or a file's suffix, and
    nothing a host entry has (a comma, a space)."""
    if "," in spec or any(ch.isspace() for ch in spec):
        return False
    return "/" in spec or spec.endswith((".txt", ".hosts")) or spec.startswith(".")


def lone_word(spec: str) -> bool:
    """Whether ``-H`` is a single bare name (no user, slots, fields, list): a hosts file's name
    or a host's, which only the file system and the resolver can tell apart."""
    return bool(_HOST_RE.match(spec))
