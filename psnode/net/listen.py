"""A listening socket made before pyzmq is loaded: the scheduler's address, known at once.

:func:`listen_early` binds and listens on ``host:port`` (a ``port`` found taken: any free port
of the host, when ``elsewhere``) with the options libzmq's TCP listener sets itself
(``SO_REUSEADDR``), and returns the socket's file descriptor and port.  The scheduler writes its
address for the launcher right after (``PSNODE_ADDRESS_FILE``), before it imports the rest of
psnode, and then hands the descriptor to its ROUTER (:meth:`psnode.net.transport.Transport.router`,
``ZMQ_USE_FD``).  Standard library only.
"""
from __future__ import annotations

import errno
import socket

from psnode.errors import ConfigError

BACKLOG = 100   # libzmq's default (ZMQ_BACKLOG)


def listen_early(host: str, port: int, elsewhere: bool) -> tuple[int, int]:
    """``(fd, port)`` of a socket listening on ``host:port`` (see the module docstring);
    ConfigError naming the address when it cannot bind."""
    try:
        family, kind, proto, _, where = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except OSError as exc:
        raise ConfigError(f"cannot bind {host}:{port}: {exc}") from None
    for attempt in (port, 0) if elsewhere else (port,):
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((where[0], attempt, *where[2:]))
            sock.listen(BACKLOG)
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE and attempt and elsewhere:
                continue
            raise ConfigError(f"cannot bind {host}:{attempt or 'any port'}: {exc}") from None
        bound = sock.getsockname()[1]
        return sock.detach(), bound
    raise AssertionError("unreachable")


__all__ = ["listen_early"]
