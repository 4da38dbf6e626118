"""Hosts: the hosts file and the inline ``-H`` list, parsed into :class:`Host` values.

Pure: no I/O.  The caller reads the file and passes its text.

Hosts file format (see ``hosts.example``)::

    # comment                       blank lines and comments are ignored
    node1                           a host, one slot, port and user from ~/.ssh/config or 22/you
    node2:2222                      a port
    alice@node3                     a user
    alice@node4:2222 slots=4        slots: how many workers the host runs

Inline list (``-H a,b:2222,user@c``): the same host words separated by commas, one slot each.

Every word is validated before any connection: host names, user names and ports that could be
read as shell syntax or ssh options (``h;touch x``, ``$(id)``, backticks, ``-oProxyCommand=..``)
are rejected with ``file:line`` and the offending line.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

_HOST_RE = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,252})$")
_V6_RE = re.compile(r"^\[[0-9A-Fa-f:.]{2,45}\]$")
_USER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


class HostsError(ValueError):
    """A malformed host word or hosts file line; the message names where and why."""


@dataclass(frozen=True)
class Host:
    """One machine of a job.

    ``name`` is what the user wrote (also the key for ~/.ssh/config lookups); ``address`` is what
    processes bind to and are reached at (the ssh config's HostName once resolved; else ``name``).
    ``port``/``user`` are None when not given (ssh config or defaults decide).
    """

    name: str
    port: int | None = None
    user: str | None = None
    slots: int = 1
    address: str = ""
    origin: str = ""

    def __post_init__(self) -> None:
        if not self.address:
            object.__setattr__(self, "address", self.name.strip("[]"))

    @property
    def label(self) -> str:
        """``user@name:port`` with only the parts that were given: how users name the host."""
        text = self.name
        if self.user:
            text = f"{self.user}@{text}"
        if self.port is not None:
            text = f"{text}:{self.port}"
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
    """Parse ``[user@]host[:port]`` (``[v6]:port`` too)."""
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


def _key(host: Host) -> tuple[str, int | None, str | None]:
    return (host.name.lower(), host.port, host.user)


def _check_duplicate(seen: dict[tuple[str, int | None, str | None], str], host: Host, where: str) -> None:
    key = _key(host)
    if key in seen:
        raise HostsError(f"{where}: duplicate host {host.label!r} (first at {seen[key]}); use slots=N")
    seen[key] = where


def parse_hosts_file(text: str, path: str) -> list[Host]:
    """Parse a hosts file's text; errors name ``path:line`` and quote the line."""
    hosts: list[Host] = []
    seen: dict[tuple[str, int | None, str | None], str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{path}:{number}"
        try:
            words = line.split()
            host = parse_host_word(words[0], where)
            slots = 1
            for extra in words[1:]:
                name, eq, value = extra.partition("=")
                if name != "slots" or not eq:
                    raise HostsError(f"{where}: unknown field {extra!r} (only slots=N is accepted)")
                if not value.isdigit() or int(value) < 1:
                    raise HostsError(f"{where}: slots={value!r} must be a whole number >= 1")
                slots = int(value)
            host = host.with_slots(slots)
            _check_duplicate(seen, host, where)
        except HostsError as exc:
            raise HostsError(f"{exc}\n  {number} | {raw.rstrip()}") from None
        hosts.append(host)
    if not hosts:
        raise HostsError(f"{path}: no hosts (every line is blank or a comment)")
    return hosts


def parse_host_list(spec: str) -> list[Host]:
    """Parse the inline ``-H a,b:2222,user@c`` form (one slot per host)."""
    hosts: list[Host] = []
    seen: dict[tuple[str, int | None, str | None], str] = {}
    for index, word in enumerate(spec.split(","), start=1):
        where = f"-H item {index}"
        host = parse_host_word(word.strip(), where)
        _check_duplicate(seen, host, where)
        hosts.append(host)
    return hosts


def looks_like_file(spec: str) -> bool:
    """Whether ``-H`` names a file rather than a list: a path separator or no host syntax."""
    return "/" in spec or spec.endswith((".txt", ".hosts")) or spec.startswith(".")
