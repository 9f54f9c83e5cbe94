"""A segment's sparse index, ``<base>.index``: ``u32 relSeq | u32 fileOffset`` entries.

``relSeq`` is the first sequence number of the indexed bundle minus the segment's
base; ``fileOffset`` is where that bundle's length prefix starts. The first bundle of
a segment is always indexed, then one bundle whenever more than
``log.index.interval.bytes`` were written since the last entry (Tank's rule).
The whole index is kept in memory (two ``array('I')``) for binary search.
"""

from __future__ import annotations

import os
import struct
from array import array
from bisect import bisect_right
from collections.abc import Sequence
from typing import Final

ENTRY: Final = struct.Struct("<II")
ENTRY_SIZE: Final = ENTRY.size
U32_MAX: Final = 0xFFFFFFFF


def read_index_file(path: str) -> tuple[array[int], array[int], int]:
    """Entries of an index file: ``(rels, offsets, trailing_bytes)``.

    A missing file reads as empty. ``trailing_bytes`` counts bytes of a torn last
    entry (the file size is not a multiple of 8). Consistency is the caller's check.
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return array("I"), array("I"), 0
    whole = len(data) - len(data) % ENTRY_SIZE
    pairs = array("I", data[:whole])
    if pairs.itemsize != 4:  # pragma: no cover - every platform we run on has 4-byte "I"
        raise RuntimeError("array('I') is not 32-bit here")
    if struct.pack("=I", 1) != struct.pack("<I", 1):  # pragma: no cover - big-endian host
        pairs.byteswap()
    return pairs[0::2], pairs[1::2], len(data) - whole


def entries_are_sane(rels: Sequence[int], offsets: Sequence[int], file_size: int,
                     max_rel: int) -> bool:
    """Cheap structural check: starts at (0, 0), both columns strictly increase, in bounds."""
    n = len(rels)
    if n == 0:
        return file_size == 0
    if rels[0] != 0 or offsets[0] != 0:
        return False
    if offsets[-1] >= file_size or rels[-1] > max_rel:
        return False
    return all(not (rels[i] <= rels[i - 1] or offsets[i] <= offsets[i - 1]) for i in range(1, n))


class SparseIndex:
    """The in-memory entries of one segment's index, and (for the active segment) its file."""

    __slots__ = ("_fd", "offsets", "path", "rels")

    def __init__(self, path: str, rels: array[int] | None = None,
                 offsets: array[int] | None = None) -> None:
        self.path = path
        self.rels = rels if rels is not None else array("I")
        self.offsets = offsets if offsets is not None else array("I")
        self._fd = -1

    def __len__(self) -> int:
        return len(self.rels)

    @property
    def size_bytes(self) -> int:
        """Bytes the index file holds."""
        return len(self.rels) * ENTRY_SIZE

    @property
    def last(self) -> tuple[int, int] | None:
        """The last entry ``(rel, offset)``, or ``None`` when empty."""
        if not self.rels:
            return None
        return self.rels[-1], self.offsets[-1]

    # -- the file (active segments only) ------------------------------------------------

    def open_file(self, *, truncate: bool) -> None:
        """Open the index file for appending entries, creating it if needed."""
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
        if truncate:
            flags |= os.O_TRUNC
        self._fd = os.open(self.path, flags, 0o664)

    @property
    def fd(self) -> int:
        """The open file descriptor, or -1."""
        return self._fd

    def append(self, rel: int, offset: int) -> None:
        """Add an entry in memory and write it to the file. Raises ``OSError``."""
        if self._fd >= 0:
            at = len(self.rels) * ENTRY_SIZE
            written = os.pwrite(self._fd, ENTRY.pack(rel, offset), at)
            if written != ENTRY_SIZE:
                os.ftruncate(self._fd, at)
                raise OSError(f"short write to {self.path}")
        self.rels.append(rel)
        self.offsets.append(offset)

    def truncate_to(self, file_offset: int) -> None:
        """Drop entries for bundles at or after ``file_offset``, in memory and on disk."""
        keep = bisect_right(self.offsets, file_offset - 1)
        if keep == len(self.offsets):
            return
        del self.rels[keep:]
        del self.offsets[keep:]
        if self._fd >= 0:
            os.ftruncate(self._fd, keep * ENTRY_SIZE)

    def rewrite(self, rels: array[int], offsets: array[int]) -> None:
        """Replace every entry (in memory, and the file if open)."""
        self.rels = rels
        self.offsets = offsets
        if self._fd >= 0:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, self.to_bytes(), 0)

    def to_bytes(self) -> bytes:
        """The file image of the entries."""
        pairs = array("I", bytes(len(self.rels) * ENTRY_SIZE))
        pairs[0::2] = self.rels
        pairs[1::2] = self.offsets
        if struct.pack("=I", 1) != struct.pack("<I", 1):  # pragma: no cover - big-endian host
            pairs.byteswap()
        return pairs.tobytes()

    def write_file(self) -> None:
        """Write the whole index to its path (for rolled segments whose index was rebuilt)."""
        # A dot name: Tank skips those when it scans a partition directory.
        head, tail = os.path.split(self.path)
        tmp = os.path.join(head, f".{tail}.tmp")
        with open(tmp, "wb") as f:
            f.write(self.to_bytes())
        os.replace(tmp, self.path)

    def close(self) -> None:
        """Close the file if open (entries stay in memory)."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)
