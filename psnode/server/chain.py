"""A server's checkpoints on disk: a whole base, then the changes of each durable point.

Files of server ``r`` in the checkpoint directory:

* ``server-<r>.npz``, the **base**: a whole snapshot (psnode.server.checkpoint.snapshot) whose
  index names its ``chain`` (the job that wrote it) and ``after``: the deltas numbered above
  it complete it.
* ``server-<r>.<n>.delta.npz``: the **changes** of durable point ``n`` (a snapshot with
  ``changes_only``: the rows each round touched, the dense parts pushed, the index), naming
  its chain.

**Restore** (:func:`load`): the base, then the deltas ``after + 1, after + 2, ...`` of its chain
in order, up to the first missing (psnode.server.image): exactly the state of the last durable
point written.  Every file is written under a temporary name, fsynced and renamed
(psnode.files.atomic_file), so a kill -9 at any point of any write leaves a whole chain.

**Off the loop** (:class:`Chain`).  A durable point's file is written by the chain's writer
thread; the server's loop waits for it (its heartbeats flowing: the caller's ``pump``) only
before answers that need it durable, and it holds the rows touched since the last point.  When
the deltas since the base hold more bytes than the base (and than COMPACT_FLOOR or a quarter of
the state, the fewer), a new base is **compacted** by another
thread from the live arrays while the rounds go on: a fuzzy copy (a row may be read while a
round writes it), written to ``server-<r>.next-<after>.npz``.  It is installed (renamed over the base,
the deltas it covers removed) by the first durable point written after it was complete: every
row changed since it started is in the deltas numbered above its ``after``, so that base and
those deltas are exact; a compaction is also due past MAX_DELTAS deltas, so a directory holds
a bounded number of files.  A base is written whole and waited for only where the chain has
none (a job's first durable point, or a resumed job's) and where a point's changes outweigh
the base (the creation of a big key).  ``--resume`` restores the chain as a restart does.
"""
from __future__ import annotations

import contextlib
import glob
import json
import os
import re
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from psnode.errors import ConfigError
from psnode.files import atomic_file
from psnode.server.checkpoint import path_for, restore, snapshot
from psnode.server.image import Image, nbytes

if TYPE_CHECKING:
    from psnode.server.store import Store

Arrays = dict[str, np.ndarray]
WAIT_S = 0.05   # how long the loop's wait for a write goes without pumping
MAX_DELTAS = 1000   # a compaction is due past this many deltas (or more bytes in them than the base)
#: nor before the deltas hold this many bytes or a quarter of the state's size, the fewer: a
#: small base (a table computed on the servers is its spec and the rows touched) would otherwise
#: be rewritten every few points
COMPACT_FLOOR = 64 << 20


def delta_path(directory: str, rank: int, n: int) -> str:
    return os.path.join(directory, f"server-{rank}.{n}.delta.npz")


def next_path(directory: str, rank: int, after: int) -> str:
    """Where a compaction whose deltas start above ``after`` is written until installed."""
    return os.path.join(directory, f"server-{rank}.next-{after}.npz")


def _deltas(directory: str, rank: int) -> dict[int, str]:
    """Every delta file of ``rank`` in ``directory``, by number."""
    out = {}
    for path in glob.glob(os.path.join(glob.escape(directory), f"server-{rank}.*.delta.npz")):
        m = re.fullmatch(rf"server-{rank}\.(\d+)\.delta\.npz", os.path.basename(path))
        if m:
            out[int(m.group(1))] = path
    return out


def _write(path: str, meta: dict[str, Any], arrays: Arrays) -> int:
    """Write one snapshot file atomically and durably; the bytes its arrays hold."""
    named = {**arrays, "meta": np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)}
    with atomic_file(path, sync=True) as fh:
        np.savez(fh, **named)  # type: ignore[arg-type]
    return nbytes(arrays)


def _read(path: str) -> tuple[dict[str, Any], Arrays]:
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(bytes(data["meta"]).decode())
        return meta, {n: data[n] for n in data.files if n != "meta"}


def _sync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load(directory: str, rank: int, store: Store, same_job: bool = False,
         pump: Callable[[], None] = lambda: None) -> tuple[int, str | None, int]:
    """Restore ``store`` from server ``rank``'s chain (module docstring; ``same_job`` and
    ``pump``: as psnode.server.checkpoint.restore; the files are read by another thread while
    ``pump`` runs).  Returns (key parts, the chain, the last point applied)."""
    with ThreadPoolExecutor(1, thread_name_prefix=f"restore-{rank}") as reader:
        read = reader.submit(_read_chain, directory, rank)
        wait(read, pump)
        image, chain, n = read.result()
    return restore(store, *image.whole(), same_job=same_job, pump=pump), chain, n


def wait(fut: Future[Any], pump: Callable[[], None]) -> None:
    """Wait for ``fut``, calling ``pump`` (the server's heartbeats) at least every WAIT_S s; its
    error, if any, is raised by ``fut.result()``."""
    while not fut.done():
        with contextlib.suppress(TimeoutError):
            fut.exception(WAIT_S)
        pump()


def _read_chain(directory: str, rank: int) -> tuple[Image, str | None, int]:
    """The state server ``rank``'s chain holds: its base with its deltas applied."""
    path = path_for(directory, rank)
    try:
        meta, arrays = _read(path)
        image = Image(meta, arrays)
        chain, n = meta.get("chain"), int(meta.get("after", 0))
        deltas = _deltas(directory, rank) if chain is not None else {}
        while n + 1 in deltas:
            dmeta, darrays = _read(deltas[n + 1])
            if dmeta.get("chain") != chain:
                break
            image.apply(dmeta, darrays)
            n += 1
    except FileNotFoundError:
        raise ConfigError(f"no checkpoint for server {rank} at {path}") from None
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"checkpoint {path} is unreadable: {exc}") from None
    return image, chain, n


def _drop_leftovers(directory: str, rank: int) -> None:
    """Remove what an earlier process of ``rank`` left mid-write (temporary files, a compaction
    never installed): the process that opens a rank's chain is its only writer."""
    here = glob.escape(directory)
    for pattern in (f".server-{rank}.*.tmp", f"server-{rank}.next-*.npz"):
        for path in glob.glob(os.path.join(here, pattern)):
            with contextlib.suppress(OSError):
                os.unlink(path)


class Chain:
    """Server ``rank``'s checkpoint chain ``chain`` in ``directory`` (module docstring): one
    writer thread for durable points, one for compactions.  ``point`` and ``wait`` are called
    from the server's loop only."""

    def __init__(self, directory: str, rank: int, chain: str, last: int = 0, based: bool = False) -> None:
        os.makedirs(directory, exist_ok=True)
        _drop_leftovers(directory, rank)
        self.dir, self.rank, self.chain = directory, rank, chain
        self.n = last              # the last durable point numbered
        self.based = based         # a base of this chain is on disk
        # what that base holds (a loaded chain's: its file's size)
        self.base_bytes = os.path.getsize(path_for(directory, rank)) if based else 0
        self._sizes: dict[int, int] = {}   # the deltas since that base: point -> bytes
        self.written = 0           # bytes written, every file
        self._writer = ThreadPoolExecutor(1, thread_name_prefix=f"checkpoint-{rank}")
        self._compactor = ThreadPoolExecutor(1, thread_name_prefix=f"compaction-{rank}")
        self._next: Future[int] | None = None   # a compaction: the ``after`` of the base it writes

    # ---------------------------------------------------------------- the loop's side
    def point(self, store: Store, whole: bool = False) -> Future[None]:
        """Write the store's state as a durable point (its changes, or a base where the module
        docstring says so; ``whole``: a base in any case); the future completes once it is on
        disk.  The store must not change until then (its arrays are written as they are)."""
        if self.based and not whole:
            changes = snapshot(store, changes_only=True)
            if nbytes(changes[1]) < max(self.base_bytes, 1):   # (else a base: as cheap, and no compaction)
                return self.append(changes, store)
        meta, arrays = snapshot(store)
        self.based = True
        self.base_bytes, self._sizes = nbytes(arrays), {}
        if self._next is not None:   # (a compaction under way is outdone by this base)
            self._next.cancel()
            self._next = None
        return self._writer.submit(self._write_base, {**meta, "chain": self.chain, "after": self.n}, arrays)

    def appendable(self, size: int) -> bool:
        """May changes of ``size`` bytes be written as a delta?  (A base is there; changes past
        its size start a compaction once written.)"""
        return self.based

    def append(self, changes: tuple[dict[str, Any], Arrays], store: Store) -> Future[None]:
        """Write ``changes`` (a snapshot of changes, :meth:`appendable`; arrays nobody writes
        until the future completes) as the next durable point; starts a compaction of ``store``
        when one is due."""
        meta, arrays = changes
        self.n += 1
        self._sizes[self.n] = nbytes(arrays)
        install = self._next if self._next is not None and self._next.done() else None
        if install is not None:
            self._next = None
            if install.exception() is None:   # (the deltas it covers go with this point)
                self._sizes = {n: b for n, b in self._sizes.items() if n > install.result()}
        fut = self._writer.submit(self._write_delta, self.n, {**meta, "chain": self.chain, "n": self.n},
                                  arrays, install)
        if install is None:   # (one compaction at a time, installed before the next starts)
            self._compact_if_due(store)
        return fut

    @staticmethod
    def wait(fut: Future[None], pump: Callable[[], None]) -> None:
        """Wait for a write (:func:`wait`); its error, if any, is raised here."""
        wait(fut, pump)
        fut.result()

    def close(self) -> None:
        """Wait for the writes under way; drop a compaction not installed."""
        self._writer.shutdown(wait=True)
        self._compactor.shutdown(wait=True, cancel_futures=True)
        _drop_leftovers(self.dir, self.rank)

    # ---------------------------------------------------------------- the threads' side
    def _write_base(self, meta: dict[str, Any], arrays: Arrays) -> None:
        self.written += _write(path_for(self.dir, self.rank), meta, arrays)
        self._drop_deltas(upto=None)

    def _write_delta(self, n: int, meta: dict[str, Any], arrays: Arrays, install: Future[int] | None) -> None:
        self.written += _write(delta_path(self.dir, self.rank, n), meta, arrays)
        if install is not None and install.exception() is None:
            after = install.result()
            os.replace(next_path(self.dir, self.rank, after), path_for(self.dir, self.rank))
            _sync_dir(self.dir)
            self._drop_deltas(upto=after)

    def _compact_if_due(self, store: Store) -> None:
        deltas = sum(self._sizes.values())
        floor = min(COMPACT_FLOOR, store.state_bytes() // 4)
        if self._next is None and (deltas > max(self.base_bytes, floor) or len(self._sizes) > MAX_DELTAS):
            meta, arrays = snapshot(store)   # (the live arrays: a fuzzy copy, module docstring)
            self.base_bytes = nbytes(arrays)
            self._next = self._compactor.submit(self._compact, {**meta, "chain": self.chain, "after": self.n}, arrays)

    def _compact(self, meta: dict[str, Any], arrays: Arrays) -> int:
        after = int(meta["after"])
        self.written += _write(next_path(self.dir, self.rank, after), meta, arrays)
        return after

    def _drop_deltas(self, upto: int | None) -> None:
        """Remove the deltas numbered ``upto`` or below (None: every one; a base was written)."""
        for n, path in _deltas(self.dir, self.rank).items():
            if upto is None or n <= upto:
                with contextlib.suppress(OSError):
                    os.unlink(path)


__all__ = ["Chain", "delta_path", "load", "next_path", "wait"]
