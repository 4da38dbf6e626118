"""``-H``'s value on this machine: a hosts file read, or an inline list (both parsed by
:mod:`mxdist.planning.hosts`), and which of its hosts name this machine.

A host entry names this machine when it is written ``localhost``, ``127.0.0.1``, ``[::1]`` or
this machine's own host name, with no user and no SSH port (those ask for a login): a job
whose every host names this machine runs here without SSH, as horovodrun runs ``localhost``.
"""
from __future__ import annotations

import os
import re
import socket
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ..planning.hosts import LONE_WORD, Host, HostsError, lone_word, looks_like_file, parse_host_list, parse_hosts_file

#: The names of this machine whatever it is called.
LOOPBACK = frozenset({"localhost", "127.0.0.1", "[::1]"})


def read_hosts(spec: str) -> list[Host]:
    """``-H`` value: an existing file (hosts file format), else an inline list.  A value that
    cannot be a path (too long, a NUL) is a list; a lone name that is no file is a host whose
    origin says so (:data:`mxdist.planning.hosts.LONE_WORD`)."""
    path = Path(spec).expanduser()
    try:
        is_file = path.is_file()
    except (OSError, ValueError):
        is_file = False
    if is_file:
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            why = getattr(exc, "strerror", None) or exc
            raise HostsError(f"-H {spec}: cannot read the hosts file: {why}") from None
        return parse_hosts_file(text, str(spec))
    if looks_like_file(spec) and not re.search(r"[\s;|&$`<>(){}'\"\\]", spec):
        raise HostsError(f"-H {spec}: no such hosts file (in {os.getcwd()})")
    # an inline list; shell characters make it one too, so the host check names the bad value
    hosts = parse_host_list(spec)
    return [replace(hosts[0], origin=LONE_WORD)] if lone_word(spec) else hosts


def own_names() -> frozenset[str]:
    """This machine's names: the loopback ones and its host name (whole and short), lower case."""
    name = socket.gethostname().lower()
    return LOOPBACK | {name, name.split(".")[0]}


def names_this_machine(host: Host, names: frozenset[str]) -> bool:
    """Whether ``host`` is this machine (one of ``names``) asked for without a login: no user, no port."""
    return host.user is None and host.port is None and host.name.lower() in names


def all_here(hosts: Sequence[Host]) -> bool:
    """Whether every host of ``hosts`` names this machine (:func:`names_this_machine`)."""
    names = own_names()
    return bool(hosts) and all(names_this_machine(h, names) for h in hosts)
