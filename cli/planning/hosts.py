"""Hosts: the hosts file and the inline ``-H`` list, parsed into :class:`Host` values.

Pure: no I/O.  The caller reads the file and passes its text.

One rule for a host, wherever it is written (a hosts file line, an inline ``-H`` item, a
line of a ``--host-discovery-script``)::

    [USER@]HOST[:SLOTS] [FIELD=VALUE ...]

* ``HOST:N`` means N slots, as horovodrun's ``-H h1:2,h2:4`` and the discovery script do;
* fields: ``slots=N`` (the same as ``:N``), ``port=N`` (the SSH port; else Port from the ssh
  config, else 22), ``addr=ADDRESS`` (what the host's processes bind to and are reached at, for
  hosts with several networks; else the address SSH connects to).  A field follows the host
  after a space or a ``:``, so ``node2:port=2222`` and ``node2 port=2222`` are the same host;
* an IPv6 address goes in brackets: ``[fe80::1]:2``.

Hosts file format (see ``hosts.example``)::

    # comment                       blank lines and comments are ignored
    node1                           a host, one slot, port and user from ~/.ssh/config or 22/you
    node2 slots=2 port=2222         two slots, sshd on port 2222
    alice@node3:4                   a user; four slots
    node4 addr=10.1.0.4             the job's traffic on 10.1.0.4 (SSH still goes to node4)

Inline list (``-H a,b:2,user@c:port=2222``): the same entries separated by commas.

``HOST:N`` with N above :data:`MAX_SLOTS` is refused with what to write for an SSH port
(``HOST:port=N``): it is what ``host:port`` habits look like.  Every word is validated before
any connection: host names, user names, ports and addresses that could be read as shell syntax
or ssh options (``h;touch x``, ``$(id)``, backticks, ``-oProxyCommand=..``) are rejected with
``file:line`` and the offending line.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, replace

_HOST_RE = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,252})$")
_V6_RE = re.compile(r"^\[[0-9A-Fa-f:.]{2,45}\]$")
_USER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")

#: More slots than any host runs workers: ``HOST:N`` above it is an SSH port written the old way.
MAX_SLOTS = 1024
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


def _slots(text: str, entry: str, where: str, colon: bool) -> int:
    """A slot count (``colon``: written ``HOST:N``, where a number above MAX_SLOTS is a port)."""
    form = f":{text}" if colon else f"slots={text}"
    if not text.isdigit() or int(text) < 1:
        raise HostsError(f"{where}: slots {text!r} in {entry!r} must be a whole number >= 1 ({form})")
    count = int(text)
    if count > MAX_SLOTS:
        host = entry.split(":")[0] if colon else entry.split()[0]
        if colon:
            raise HostsError(
                f"{where}: {entry!r}: HOST:N means N slots (as horovodrun -H and the discovery script), and "
                f"{count} is more than {MAX_SLOTS}; for SSH port {count} write {host}:port={count} (or Port "
                "in ~/.ssh/config)")
        raise HostsError(f"{where}: slots={count} in {entry!r} is more than {MAX_SLOTS}")
    return count


def parse_host_entry(entry: str, where: str = "host") -> Host:
    """One host entry, ``[USER@]HOST[:SLOTS] [FIELD=VALUE ...]`` (the module docstring's rule);
    errors name ``where`` and say what to write."""
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
    for index, chunk in enumerate([*chunks, *rest]):
        name, eq, value = chunk.partition("=")
        if not eq:
            if index == 0 and chunks and chunk.isdigit():
                values["slots"] = str(_slots(chunk, head, where, colon=True))
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
            first = f":{values[name]}" if name == "slots" and chunks and chunks[0].isdigit() else \
                f"{name}={values[name]}"
            raise HostsError(f"{where}: {name} given twice in {entry.strip()!r} ({first} and {chunk})")
        values[name] = value
    slots = _slots(values["slots"], entry.strip(), where, colon=False) if "slots" in values else 1
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
    """Parse a hosts file's text; errors name ``path:line`` and quote the line."""
    hosts: list[Host] = []
    seen: dict[tuple[str, int | None, str | None], str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{path}:{number}"
        try:
            host = parse_host_entry(line, where)
            _check_duplicate(seen, host, where)
        except HostsError as exc:
            raise HostsError(f"{exc}\n  {number} | {raw.rstrip()}") from None
        hosts.append(host)
    if not hosts:
        raise HostsError(f"{path}: no hosts (every line is blank or a comment)")
    return hosts


def parse_host_list(spec: str) -> list[Host]:
    """Parse the inline ``-H a,b:2,user@c:port=2222`` form (entries separated by commas)."""
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
