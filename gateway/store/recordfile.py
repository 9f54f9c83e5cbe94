"""Small files of whole records (the Kafka offsets file, the HTTP idempotency log): an
append is either all there or not at all, so a failed one never leaves a torn record for
the next to land behind; a rewrite (compaction) replaces the file whole."""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path
from typing import Final

from gateway.store.durability import sync_directory

__all__ = ["COMPACTING", "append_whole", "replace_whole", "write_new"]

#: What a file being rewritten is called beside it until it is renamed over the old one.
COMPACTING: Final = ".compacting"


def append_whole(fd: int, data: bytes, size: int, *, fsync: bool) -> int:
    """Write ``data`` at the end of the file ``fd`` whose whole records take ``size``
    bytes, and fsync it when asked; returns the new size. On any failure (a short write is
    ENOSPC) the file is cut back to ``size`` and the error raised. Blocking: a worker
    thread's call."""
    try:
        written = os.write(fd, data)
        if written != len(data):
            raise OSError(errno.ENOSPC, f"short write ({written} of {len(data)} bytes)")
        if fsync:
            os.fsync(fd)
    except OSError:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, size)
        raise
    return size + len(data)


def replace_whole(path: Path, data: bytes, flags: int = 0) -> int:
    """Write ``data`` to ``path`` + ``.compacting``, fsync it and rename it over ``path``;
    returns the new file's descriptor, opened with ``flags`` (the caller closes it; the
    directory is not fsynced yet). On failure the temporary file is removed and ``path``
    is untouched."""
    tmp = path.with_name(path.name + COMPACTING)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | flags, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
        os.replace(tmp, path)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return fd


def write_new(path: Path, data: bytes) -> None:
    """Write ``path`` whole, durably (:func:`replace_whole`, then the directory fsynced)."""
    os.close(replace_whole(path, data))
    sync_directory(str(path.parent))
