"""The C allocator's thresholds for a process that builds large buffers again and again.

A produce of a few thousand messages decodes into buffers of megabytes (a decompressed
message set, a record batch, its compressed form). glibc hands each allocation over its
mmap threshold fresh pages from the kernel and gives them back on free, and trims the heap
top back to the kernel past its trim threshold: the next request pays a page fault per
4 KiB again. In a virtual machine that cost more than the conversion itself (a 10,000
message Kafka batch to Tank bundles: 240,000 page faults and 1.7 s per 300 conversions,
4,400 and 0.8 s with the thresholds raised).

:func:`keep_large_buffers` raises both thresholds so such buffers come from, and go back
to, the heap. The memory kept is bounded by ``keep_bytes`` (the trim threshold: free
space at the heap's top beyond it still goes back to the kernel).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Final

__all__ = ["DEFAULT_KEEP_BYTES", "MMAP_THRESHOLD", "keep_large_buffers"]

#: glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD: Final = -1
_M_MMAP_THRESHOLD: Final = -3
#: Allocations up to this size come from the heap: a batch of ``upstream_kafka.
#: max_batch_bytes`` and its conversions fit. Larger ones still get pages of their own,
#: given back on free (a client's 8 MB frame must not stay in the heap after it).
MMAP_THRESHOLD: Final = 4 * 1024 * 1024
#: Free heap kept for the next large buffers.
DEFAULT_KEEP_BYTES: Final = 32 * 1024 * 1024


def keep_large_buffers(keep_bytes: int = DEFAULT_KEEP_BYTES) -> bool:
    """Raise the C allocator's mmap and trim thresholds (glibc's ``mallopt``) for this
    process. False for ``keep_bytes`` 0 (the defaults stay), and where the C library has
    no ``mallopt`` (musl, macOS) or refuses: the process works as before, only slower
    with large buffers."""
    if keep_bytes < 0:
        raise ValueError("keep_bytes must not be negative")
    if keep_bytes == 0:
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    threshold = min(MMAP_THRESHOLD, keep_bytes)
    return bool(mallopt(_M_MMAP_THRESHOLD, threshold)) and bool(
        mallopt(_M_TRIM_THRESHOLD, keep_bytes))
