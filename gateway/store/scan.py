"""Walking the ``varint len | bundle`` runs of a segment file.

Reads go through a read-ahead window, so walking many small bundles costs one
``pread`` per window, not one per bundle. Only bundle headers are looked at (the
length prefix, flags, message count and a sparse bundle's first/last sequence
numbers, read by the bundle codec's :func:`~protocols.tank.bundle.read_framed_header`);
a bundle larger than the window is skipped without reading its body.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Final

from protocols.errors import ProtocolError
from protocols.tank.bundle import read_framed_header

#: Longest possible prefix before a bundle's message set: a 10-byte length varint,
#: flags, a 10-byte count varint, the sparse u64 first and a 10-byte gap varint.
MAX_HEADER_PEEK: Final = 10 + 1 + 10 + 8 + 10
DEFAULT_WINDOW: Final = 64 * 1024


class ScanError(Exception):
    """The bytes at ``offset`` are not a whole, well-formed framed bundle."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"at offset {offset}: {reason}")
        self.offset = offset
        self.reason = reason


class Scanner:
    """Reads bundle headers of one file through a read-ahead window."""

    __slots__ = ("_buf", "_buf_start", "_fd", "_window")

    def __init__(self, fd: int, window: int = DEFAULT_WINDOW) -> None:
        self._fd = fd
        self._window = max(window, MAX_HEADER_PEEK)
        self._buf = b""
        self._buf_start = 0

    def _ensure(self, offset: int, need: int) -> int:
        """Make ``[offset, offset + need)`` resident (or up to EOF); return its buffer index."""
        rel = offset - self._buf_start
        if rel < 0 or rel + need > len(self._buf):
            self._buf = os.pread(self._fd, max(self._window, need), offset)
            self._buf_start = offset
            rel = 0
        return rel

    def read(self, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` (served from the window when resident)."""
        rel = self._ensure(offset, length)
        data = self._buf[rel:rel + length]
        if len(data) != length:
            raise ScanError(offset, f"file ends inside a {length}-byte read")
        return data

    def walk(self, start: int, end: int, next_seq: int
             ) -> Iterator[tuple[int, int, int, int, int]]:
        """Yield ``(offset, framed_len, first_seq, last_seq, sparse)`` for bundles in [start, end).

        ``next_seq`` is the sequence number of the first message of the bundle at
        ``start`` if that bundle is plain. Raises :class:`ScanError` at a malformed
        header, a bundle running past ``end``, or a sparse bundle that goes back in
        sequence numbers.
        """
        offset = start
        while offset < end:
            rel = self._ensure(offset, min(MAX_HEADER_PEEK, end - offset))
            try:
                framed_len, count, first, last = read_framed_header(
                    self._buf, rel, min(len(self._buf), rel + end - offset))
            except ProtocolError as exc:
                raise ScanError(offset, str(exc)) from None
            if offset + framed_len > end:
                raise ScanError(offset, f"bundle of {framed_len} bytes runs past {end}")
            if first is None:
                first = next_seq
                last = first + count - 1
                sparse = 0
            elif first < next_seq:
                raise ScanError(offset, f"sparse bundle starts at {first} < {next_seq}")
            else:
                assert last is not None  # a sparse header names both
                sparse = 1
            yield offset, framed_len, first, last, sparse
            next_seq = last + 1
            offset += framed_len
