"""What appends and reads return."""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import TracebackType

from gateway.io.newest import join
from gateway.store.files import SegmentFile


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Where an appended bundle landed."""

    #: Sequence number of the bundle's first message.
    first_seq: int
    #: Sequence number of its last message (the partition's new high-water mark).
    last_seq: int
    #: Bytes the framed bundle (``varint len | bundle``) took in the segment.
    size: int


class ReadResult:
    """A range of whole framed bundles in one segment file, plus the partition's bounds.

    The range is ``[offset, offset + length)`` of the file behind :meth:`fileno`: hand
    those to ``os.sendfile`` or call :meth:`read_bytes`. A range served from the tail
    cache has its bytes in memory (no descriptor; ``sendfile_source()`` is None). A
    file-backed result holds a reference to the segment's one shared descriptor
    (:class:`~gateway.store.files.SegmentFile`; no descriptor of its own), which keeps
    it open, so the range stays readable even if the segment is rolled (renamed), deleted
    by retention, or has its file closed by the open-files bound meanwhile. Close it (or
    use ``with``) when done. ``length == 0`` means the read was at the tail
    (``high_water_mark + 1``): nothing to send yet, wait for an append.
    """

    __slots__ = ("_file", "_parts", "base_seq", "first_available", "first_bundle_sparse",
                 "high_water_mark", "length", "next_seq", "offset", "seq")

    def __init__(self, *, seq: int, base_seq: int, first_bundle_sparse: bool,
                 high_water_mark: int, first_available: int,
                 file: SegmentFile | None = None,
                 offset: int = 0, length: int = 0, next_seq: int = 0,
                 parts: list[bytes] | None = None) -> None:
        #: The sequence number the read was for (0 and UINT64_MAX resolved).
        self.seq = seq
        #: Sequence number of the first message of the first bundle in the range (the
        #: bundle that holds ``seq``). Tank sends it as ``baseSeq`` unless the bundle is
        #: sparse (flag 0xfe). For an empty range it is ``seq``.
        self.base_seq = base_seq
        #: True when the range's first bundle is sparse (it names its own sequence numbers).
        self.first_bundle_sparse = first_bundle_sparse
        self.high_water_mark = high_water_mark
        self.first_available = first_available
        self.offset = offset
        self.length = length
        #: Where the next read should start: the sequence number after the range's last
        #: bundle (``seq`` itself for an empty range).
        self.next_seq = next_seq
        #: The reference to the segment's file this result holds (released by close()).
        self._file = file
        #: The range's bytes when it was served from memory (the tail cache).
        self._parts = parts

    def __repr__(self) -> str:
        return (f"<ReadResult seq={self.seq} base={self.base_seq} "
                f"sparse={self.first_bundle_sparse} [{self.offset}+{self.length}] "
                f"hwm={self.high_water_mark} first={self.first_available}>")

    @property
    def at_tail(self) -> bool:
        """True when there was nothing to read (the caller should wait)."""
        return self.length == 0

    def fileno(self) -> int:
        """The segment file's (shared) descriptor, open until :meth:`close`; -1 for a
        range in memory, an empty or a closed one. Not to be closed by the caller."""
        file = self._file
        return file.fd if file is not None else -1

    def sendfile_source(self) -> tuple[int, int] | None:
        """``(fd, offset)`` for ``os.sendfile(out, fd, offset, length)``; None when empty
        or held in memory."""
        file = self._file
        return (file.fd, self.offset) if self.length and file is not None else None

    def read_bytes(self) -> bytes:
        """The range's bytes (``pread``, or from memory)."""
        if self.length == 0:
            return b""
        parts = self._parts
        if parts is not None:
            return join(parts)
        file = self._file
        if file is None:
            raise ValueError("read from a closed ReadResult")
        data = os.pread(file.fd, self.length, self.offset)
        if len(data) != self.length:  # pragma: no cover - files only ever shrink at open
            raise OSError(f"short read: {len(data)} of {self.length} bytes")
        return data

    def close(self) -> None:
        """Release the reference to the segment's file (idempotent)."""
        file, self._file = self._file, None
        if file is not None:
            file.release()

    def __enter__(self) -> ReadResult:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()
