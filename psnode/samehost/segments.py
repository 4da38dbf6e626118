"""Shared memory for the same-host data plane: segments, arenas, and their safety checks.

A **segment** is an anonymous memory file (``memfd_create``, named ``psnode.<job>.<owner>.<n>``
in /proc, never in a file system), mode 0600, sealed against shrinking and growing, mapped by
its owner and passed to one peer as a file descriptor over an authenticated Unix socket
(:mod:`psnode.samehost.link`).  Nothing has a name to leak: a segment lives while a process maps it,
so ``kill -9`` of any process (and of the launcher) leaves nothing in /dev/shm.  The job's
launcher still removes ``/dev/shm/psnode.<job_id>.*`` when a job ends (:func:`leftovers`,
:func:`remove_leftovers`): the contract for any named segment psnode may ever create.

A peer maps a segment only after checking (:func:`map_segment`) that it is a regular file owned
by this user, of mode 0600, exactly of the announced size, and sealed against shrinking (so
the owner cannot truncate it under the peer: no SIGBUS).  Every descriptor a peer sends is
bounds-checked against the mapped size (:meth:`Mapped.buffer`); a violation is a
:class:`ProtocolError` naming the peer, never a crash.

An :class:`Arena` hands out aligned blocks of its segments (new segments when full), as numpy
arrays it can locate again (``locate``: segment and offset, for a descriptor); a block returns
to the arena when its array is garbage.  Ownership needs no locks: every block has one writer
at a time by protocol (psnode.samehost.link's docstring says who writes what when).
"""
from __future__ import annotations

import contextlib
import fcntl
import glob
import mmap
import os
import stat
import threading
import weakref
from dataclasses import dataclass, field

import numpy as np

from psnode.errors import ProtocolError

SEGMENT_BYTES = 64 * 2**20     # a new segment's size (bigger when one block needs more)
ALIGN = 64
MAX_SEGMENT_BYTES = 2**40
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def available() -> bool:
    """Whether this system has sealable memory files (Linux >= 3.17)."""
    return hasattr(os, "memfd_create") and hasattr(fcntl, "F_ADD_SEALS")


def leftovers(job_id: str) -> list[str]:
    """Named shared-memory files of job ``job_id`` in /dev/shm (none while psnode runs: its
    segments are anonymous)."""
    return sorted(glob.glob(f"/dev/shm/psnode.{glob.escape(job_id)}.*"))


def holders(job_id: str) -> list[int]:
    """Processes (of this user, visible here) that map a segment of job ``job_id``."""
    mark = f"/memfd:psnode.{job_id}."
    pids = []
    for maps in glob.glob("/proc/[0-9]*/maps"):
        with contextlib.suppress(OSError), open(maps) as fh:
            if mark in fh.read():
                pids.append(int(maps.split("/")[2]))
    return sorted(pids)


def remove_leftovers(job_id: str) -> list[str]:
    """Remove this user's :func:`leftovers` of ``job_id``; returns the paths removed."""
    removed = []
    for path in leftovers(job_id):
        with contextlib.suppress(OSError):
            if os.lstat(path).st_uid == os.geteuid():
                os.unlink(path)
                removed.append(path)
    return removed


@dataclass
class Mapped:
    """One mapped segment (own or a peer's)."""

    index: int
    size: int
    mm: mmap.mmap
    writable: bool
    view: memoryview = field(init=False)

    def __post_init__(self) -> None:
        self.view = memoryview(self.mm)
        if not self.writable:
            self.view = self.view.toreadonly()

    def buffer(self, offset: int, nbytes: int, peer: str = "") -> memoryview:
        if offset < 0 or nbytes < 0 or offset + nbytes > self.size:
            where = f"{peer}: " if peer else ""
            raise ProtocolError(f"{where}{nbytes} bytes at offset {offset} lie outside segment "
                                f"{self.index} of {self.size} bytes")
        return self.view[offset:offset + nbytes]


def create_segment(name: str, index: int, size: int) -> tuple[int, Mapped]:
    """A new sealed memory file of ``size`` bytes, mapped read-write: (fd, mapping)."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.fchmod(fd, 0o600)
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.close(fd)
        raise
    return fd, Mapped(index, size, mm, True)


def map_segment(fd: int, index: int, size: int, writable: bool, peer: str) -> Mapped:
    """Map a peer's segment after checking it (see the module docstring); closes ``fd``."""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise ProtocolError(f"{peer}: segment {index} is not a private file of this user "
                                f"(uid {st.st_uid}, mode {oct(st.st_mode & 0o7777)})")
        if not 0 < size <= MAX_SEGMENT_BYTES or st.st_size != size:
            raise ProtocolError(f"{peer}: segment {index} has {st.st_size} bytes, not the {size} announced")
        try:
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        except OSError:
            seals = 0
        if not seals & fcntl.F_SEAL_SHRINK:
            raise ProtocolError(f"{peer}: segment {index} is not sealed against shrinking")
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        try:
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, prot)
        except (OSError, ValueError) as exc:
            raise ProtocolError(f"{peer}: segment {index} cannot be mapped: {exc}") from None
        return Mapped(index, size, mm, writable)
    finally:
        os.close(fd)


class Arena:
    """Blocks of this process's segments, as arrays (see the module docstring).

    ``name`` prefixes the segments' names; ``first`` is the number of the first segment (an
    owner with two arenas numbers their segments apart).  Thread-safe.
    """

    def __init__(self, name: str, first: int = 0, segment_bytes: int = SEGMENT_BYTES) -> None:
        self.name = name
        self.segment_bytes = segment_bytes
        self.segments: dict[int, Mapped] = {}
        self.fds: dict[int, int] = {}          # kept open to hand segments to later peers
        self._next_index = first
        self._top: dict[int, int] = {}         # segment -> first free byte
        self._free: dict[int, list[tuple[int, int]]] = {}   # block size -> [(segment, offset)]
        self._where: dict[int, tuple[int, int]] = {}        # id(array) -> (segment, offset)
        self._bases: list[tuple[int, int, int]] = []         # (address, size, segment)
        self._lock = threading.Lock()

    def _segment(self, nbytes: int) -> int:
        size = max(self.segment_bytes, nbytes)
        index = self._next_index
        fd, seg = create_segment(f"{self.name}.{index}", index, size)
        self._next_index += 1
        self.segments[index] = seg
        self.fds[index] = fd
        self._top[index] = 0
        self._bases.append((address(seg.view), size, index))
        return index

    def _alloc(self, nbytes: int) -> tuple[int, int, int]:
        size = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
        free = self._free.get(size)
        if free:
            seg, off = free.pop()
            return seg, off, size
        for index, top in self._top.items():
            if top + size <= self.segments[index].size:
                self._top[index] = top + size
                return index, top, size
        index = self._segment(size)
        self._top[index] = size
        return index, 0, size

    def _forget(self, key: int) -> None:
        with self._lock:
            self._where.pop(key, None)

    def _release(self, seg: int, off: int, size: int) -> None:
        with self._lock:
            self._free.setdefault(size, []).append((seg, off))

    def array(self, shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
        """A new array in this arena (returned to it when garbage)."""
        dtype = np.dtype(dtype)
        count = 1
        for d in shape:
            count *= int(d)
        nbytes = count * dtype.itemsize
        with self._lock:
            seg, off, size = self._alloc(nbytes)
            root = np.frombuffer(self.segments[seg].view[off:off + size], dtype=np.uint8)
            arr = root[:nbytes].view(dtype).reshape(shape)
            self._where[id(arr)] = (seg, off)
        # every view of ``arr`` keeps ``root`` alive (numpy bases point at it): the block goes
        # back when the last view is gone; ``arr``'s own entry goes with ``arr``
        weakref.finalize(root, self._release, seg, off, size)
        weakref.finalize(arr, self._forget, id(arr))
        return arr

    def adopt(self, view: np.ndarray) -> np.ndarray:
        """Register ``view`` (of a block of this arena) so :meth:`locate` finds it by identity."""
        where = self.locate(view)
        if where is not None and id(view) not in self._where:
            with self._lock:
                self._where[id(view)] = where
            weakref.finalize(view, self._forget, id(view))
        return view

    def locate(self, arr: np.ndarray) -> tuple[int, int] | None:
        """(segment, offset) of a C-contiguous array in this arena (one it made: a dictionary
        look-up; a view of one: by address), None for any other array."""
        where = self._where.get(id(arr))
        if where is not None or not self._bases or not arr.flags.c_contiguous:
            return where
        addr = arr.__array_interface__["data"][0]
        for base, size, index in self._bases:
            if base <= addr and addr + arr.nbytes <= base + size:
                return index, addr - base
        return None

    def close(self) -> None:
        for fd in self.fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()


def address(view: memoryview) -> int:
    """The memory address of ``view``'s first byte."""
    return int(np.frombuffer(view, np.uint8).__array_interface__["data"][0])


__all__ = ["ALIGN", "SEGMENT_BYTES", "Arena", "Mapped", "address", "available", "create_segment", "holders",
           "leftovers",
           "map_segment", "remove_leftovers"]
