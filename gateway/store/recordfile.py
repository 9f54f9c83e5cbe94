"""Appending to a small file of whole records (the Kafka offsets file, the HTTP
idempotency log): a record is either all there or not at all, so a failed append never
leaves a torn record for the next one to land behind."""

from __future__ import annotations

import contextlib
import errno
import os

__all__ = ["append_whole"]


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
