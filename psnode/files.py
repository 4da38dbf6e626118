"""Atomic file writes: a reader sees the previous file or the new one, never a part.

:func:`atomic_file` opens a fresh temporary file beside the target (``.<name>.<pid>.<random>.tmp``
in the same directory, created exclusively, mode 0600 unless ``mode`` says otherwise; the umask
applies), hands it to the caller to write (binary), optionally fsyncs it (``sync``: the content is
on disk once the call returns), then renames it over the target.  On any error the temporary file
is removed and the error propagates.  :func:`write_atomic` writes bytes or text that way.

Every file psnode or the launcher writes whole goes through here: job records and request files,
failure records, server checkpoints, optimizer state files, the job's secret.  Standard library
only; imports nothing of psnode.
"""
from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from typing import BinaryIO

PRIVATE = 0o600


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str], *, mode: int = PRIVATE, sync: bool = False) -> Iterator[BinaryIO]:
    """A binary file to write; renamed over ``path`` when the block ends without an error."""
    target = os.fspath(path)
    directory, name = os.path.split(target)
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.{secrets.token_hex(3)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            if sync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_atomic(path: str | os.PathLike[str], data: bytes | str, *, mode: int = PRIVATE, sync: bool = False) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` through :func:`atomic_file`."""
    with atomic_file(path, mode=mode, sync=sync) as fh:
        fh.write(data.encode() if isinstance(data, str) else data)


__all__ = ["PRIVATE", "atomic_file", "write_atomic"]
