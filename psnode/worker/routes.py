"""Values of other array libraries through the KVStore API: a hook that integrations fill.

The KVStore hands every value it is given to :func:`push_values` and every ``out`` to
:func:`pull_outs` first; after the pull, :func:`finish` writes what was pulled into the values
the routes took.  A route is a module or object with the three functions of :class:`Route` (for
torch: :mod:`psnode.torch.values`).  :func:`install` registers one under the name of the module
that must be loaded before any value can be its kind (``"torch"``); it is loaded the first time a
call finds that module in ``sys.modules``.  So a process that never imported torch pays one dict
lookup per call, and this package imports no integration: ``psnode/__init__.py`` installs torch's.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Protocol

Info = Callable[[Any], Any]   # key -> its KeyInfo (shape, dtype), or None when not initialised


class Route(Protocol):
    """What a route does (the contracts of :mod:`psnode.torch.values`)."""

    def push_values(self, key: Any, value: Any, info: Info) -> Any: ...

    def pull_outs(self, key: Any, out: Any, info: Info, bufs: dict[Any, Any],
                  rows: bool = False) -> tuple[Any, list[Any]]: ...

    def finish(self, scatters: list[Any]) -> None: ...


#: (module that must be loaded, how to load the route), in the order installed
_INSTALLED: list[tuple[str, Callable[[], Route]]] = []
_LOADED: dict[str, Route] = {}

#: what :func:`finish` does after a pull: each route with what it asked for
Pending = list[tuple[Route, list[Any]]]


def install(trigger: str, loader: Callable[[], Route]) -> None:
    """Route values with ``loader()``'s route once module ``trigger`` is loaded (idempotent)."""
    if all(t != trigger for t, _ in _INSTALLED):
        _INSTALLED.append((trigger, loader))


def _active() -> list[Route]:
    out = []
    for trigger, loader in _INSTALLED:
        if trigger in sys.modules:
            route = _LOADED.get(trigger)
            if route is None:
                route = _LOADED[trigger] = loader()
            out.append(route)
    return out


def push_values(key: Any, value: Any, info: Info) -> Any:
    """``value`` with what a route takes replaced by the host arrays to push."""
    for route in _active():
        value = route.push_values(key, value, info)
    return value


def pull_outs(key: Any, out: Any, info: Info, bufs: dict[Any, Any], rows: bool = False) -> tuple[Any, Pending]:
    """``out`` with what a route takes replaced by host arrays, and what :func:`finish` does."""
    pending: Pending = []
    for route in _active():
        out, scatters = route.pull_outs(key, out, info, bufs, rows=rows)
        if scatters:
            pending.append((route, scatters))
    return out, pending


def finish(pending: Pending) -> None:
    """After the pull: each route writes the pulled host arrays into the values it took."""
    for route, scatters in pending:
        route.finish(scatters)
