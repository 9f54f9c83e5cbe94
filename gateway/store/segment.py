"""One segment of a partition: a ``.log`` (active) or ``.ilog`` (rolled) file and its index.

File names are the Tank broker's:

- active segment ``<base>_<createdTs>.log`` (Tank also wrote ``<base>.log`` once),
- rolled segment ``<base>-<last>_<rolledTs>.ilog`` (``<base>-<last>.ilog`` accepted),
- sparse index ``<base>.index``,

where ``base`` is the sequence number of the segment's first message, ``last`` of its
last, and the timestamps are seconds. A segment holds ``varint len | bundle`` runs,
byte-identical to what Tank sends in a Consume chunk.
"""

from __future__ import annotations

import contextlib
import os
import re
from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Final, Protocol

from gateway.store.damage import check_bundle_at, data_end, describe_cut, keep_cut_bytes
from gateway.store.files import OpenFiles, SegmentFile
from gateway.store.index import U32_MAX, SparseIndex, entries_are_sane, read_index_file
from gateway.store.scan import ScanError, Scanner

_O_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
#: Recovery reads the active segment in windows this large.
RECOVERY_WINDOW: Final = 1024 * 1024
#: Tank's index entries are 32-bit; it refuses (crashes on) relative sequence numbers
#: above INT32_MAX, so a segment is rolled before a bundle would need one.
MAX_REL_SEQ: Final = 0x7FFFFFFF

_ACTIVE_RE: Final = re.compile(r"(\d+)(?:_(\d+))?\.log")
_ROLLED_RE: Final = re.compile(r"(\d+)-(\d+)(?:_(\d+))?\.ilog")
_INDEX_RE: Final = re.compile(r"(\d+)\.index")

#: What :meth:`LogSegment.prefill` writes from (and recovery compares with).
_ZEROS: Final = bytes(1024 * 1024)


class ZerosLedger(Protocol):
    """Where the zeros written ahead of active segments are counted (the store's
    :class:`~gateway.store.disk.DiskGuard`)."""

    def zeros_added(self, n: int) -> None: ...

    def zeros_used(self, n: int) -> None: ...

    def zeros_freed(self, n: int) -> None: ...


@dataclass(frozen=True, slots=True)
class SegmentName:
    """A parsed segment-file name."""

    kind: str  # "active", "rolled" or "index"
    base: int
    last: int | None = None
    ts: int | None = None


def parse_segment_name(name: str) -> SegmentName | None:
    """Parse a partition-directory entry name; ``None`` for anything else."""
    if m := _ACTIVE_RE.fullmatch(name):
        return SegmentName("active", int(m[1]), None, int(m[2]) if m[2] else None)
    if m := _ROLLED_RE.fullmatch(name):
        return SegmentName("rolled", int(m[1]), int(m[2]), int(m[3]) if m[3] else None)
    if m := _INDEX_RE.fullmatch(name):
        return SegmentName("index", int(m[1]))
    return None


def active_name(base: int, created_ts: int) -> str:
    """``<base>_<createdTs>.log``."""
    return f"{base}_{created_ts}.log"


def rolled_name(base: int, last: int, ts: int) -> str:
    """``<base>-<last>_<ts>.ilog``."""
    return f"{base}-{last}_{ts}.ilog"


def index_name(base: int) -> str:
    """``<base>.index``."""
    return f"{base}.index"


@dataclass(slots=True)
class Recovery:
    """What opening an active segment had to repair."""

    bytes_dropped: int = 0
    #: Why the tail was cut (the first bad bundle's problem), or None.
    reason: str | None = None
    #: "rebuilt", "truncated" or None.
    index_action: str | None = None
    bundles: int = 0
    #: Zeros after the data, written ahead in fsync mode (not data: nothing was lost).
    prefill_trimmed: int = 0
    #: The first sequence number lost (cut, or named by the index past the file's end).
    first_seq_lost: int | None = None
    #: The last one: exact if ``last_seq_exact``, else a lower bound (None: unknown).
    last_seq_lost: int | None = None
    last_seq_exact: bool = False
    #: Bytes the old index says the file had past its end (a file cut short elsewhere).
    indexed_past_end: int = 0
    #: Where the cut bytes were kept (``<segment>.corrupt``), or why they could not be.
    corrupt_file: str | None = None
    corrupt_error: str | None = None


class LogSegment:
    """A segment file, its in-memory index, and how much of it readers may see.

    ``size`` is what was written; ``visible_size`` what readers may see (smaller
    while bundles wait for their fsync). A rolled segment is immutable and its index
    is loaded on first use.

    The file is one shared :class:`SegmentFile`: the segment holds a reference while it
    keeps it open, each read range another (:meth:`acquire_file`). The active segment
    keeps its file open; a rolled one opens it on first use and, when the store bounds
    open files (:class:`OpenFiles`), may have it closed while unused and reopens it on
    its next use. :attr:`fd` is valid until the next use of another rolled segment: code
    that keeps a descriptor longer (across an await, in a worker thread) takes
    :meth:`acquire_file` and releases it.
    """

    __slots__ = ("_closed", "_file", "_files", "_index", "base", "created_ts", "directory",
                 "last_seq", "name", "prefilled", "rolled_ts", "since_index", "size",
                 "visible_size", "zeros")

    def __init__(self, directory: str, name: str, base: int, fd: int, size: int, *,
                 created_ts: int, rolled_ts: int | None, last_seq: int | None,
                 index: SparseIndex | None, files: OpenFiles | None = None) -> None:
        self.directory = directory
        self.name = name
        self.base = base
        #: The open file (None while a rolled segment's is closed); ``fd`` -1: none yet.
        self._file: SegmentFile | None = SegmentFile(fd) if fd >= 0 else None
        #: The bound on open rolled files this segment counts against (None: unbounded).
        self._files = files
        self._closed = False
        self.size = size
        self.visible_size = size
        self.created_ts = created_ts
        self.rolled_ts = rolled_ts
        self.last_seq = last_seq
        self._index = index
        #: Bytes written since the last index entry (None: index the next bundle).
        self.since_index: int | None = None
        #: Where the file ends: past ``size`` when zeros were written ahead (:meth:`prefill`).
        self.prefilled = size
        #: Where the zeros ahead are counted (None: nowhere).
        self.zeros: ZerosLedger | None = None

    def __repr__(self) -> str:
        return f"<LogSegment {self.name} size={self.size} visible={self.visible_size}>"

    @property
    def rolled(self) -> bool:
        """True once the segment is immutable (an ``.ilog``)."""
        return self.rolled_ts is not None

    @property
    def fd(self) -> int:
        """The segment file's descriptor, opened (read-only) first for a rolled segment
        whose file is closed. Raises ``OSError`` (the file is gone), ``ValueError``
        after :meth:`close`."""
        file = self._file
        if file is None:
            file = self._open_file()
        elif self._files is not None and self.rolled:
            self._files.touch(self)
        return file.fd

    @property
    def file_open(self) -> bool:
        """Whether the segment holds its file open now."""
        return self._file is not None

    def acquire_file(self) -> SegmentFile:
        """A reference to the segment's open file (opened first if needed); the caller
        releases it. The descriptor stays open until then, whatever becomes of the
        segment."""
        self.fd  # noqa: B018 - opens the file if needed and marks it used
        assert self._file is not None
        return self._file.acquire()

    def _open_file(self) -> SegmentFile:
        if self._closed:
            raise ValueError(f"segment {self.name} is closed")
        file = self._file = SegmentFile(os.open(self.path, os.O_RDONLY | _O_CLOEXEC))
        if self._files is not None and self.rolled:
            self._files.touch(self)
        return file

    def drop_file(self) -> None:
        """Close the segment's file until its next use (reads in flight keep theirs)."""
        file, self._file = self._file, None
        if file is not None:
            file.release()

    @property
    def path(self) -> str:
        """The segment file's current path."""
        return os.path.join(self.directory, self.name)

    @property
    def index_path(self) -> str:
        """The index file's path."""
        return os.path.join(self.directory, index_name(self.base))

    # -- opening --------------------------------------------------------------------------

    @classmethod
    def create(cls, directory: str, base: int, now: int) -> LogSegment:
        """Create a new, empty active segment (and an empty index) with ``base``."""
        name = active_name(base, now)
        fd = os.open(os.path.join(directory, name),
                     os.O_RDWR | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC, 0o664)
        index = SparseIndex(os.path.join(directory, index_name(base)))
        try:
            index.open_file(truncate=True)
        except OSError:
            os.close(fd)
            os.unlink(os.path.join(directory, name))
            raise
        return cls(directory, name, base, fd, 0, created_ts=now, rolled_ts=None,
                   last_seq=None, index=index)

    @classmethod
    def open_rolled(cls, directory: str, name: str, base: int, last: int, ts: int,
                    files: OpenFiles | None = None) -> LogSegment:
        """An immutable segment. Its file is opened on first use (within ``files``'
        bound), its index read (and checked) on first use."""
        size = os.stat(os.path.join(directory, name)).st_size
        return cls(directory, name, base, -1, size, created_ts=ts, rolled_ts=ts,
                   last_seq=last, index=None, files=files)

    @classmethod
    def recover_active(cls, directory: str, name: str, base: int, created_ts: int, *,
                       index_interval: int, deep_check_bytes: int
                       ) -> tuple[LogSegment, Recovery]:
        """Open the active segment, repairing a torn or corrupt tail and a bad index.

        Every bundle header is walked; the last ``deep_check_bytes`` of the file are
        checked bundle by bundle with :func:`validate_bundle` (message framing, Snappy).
        The file is cut at the first bad bundle. The index is checked against the
        entries Tank's rule gives for the bundles kept: entries past the cut are
        dropped; a missing, short or inconsistent index is rebuilt.
        """
        path = os.path.join(directory, name)
        fd = os.open(path, os.O_RDWR | _O_CLOEXEC)
        try:
            return cls._recover(directory, name, base, created_ts, fd, index_interval,
                                deep_check_bytes)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def _recover(cls, directory: str, name: str, base: int, created_ts: int, fd: int,
                 interval: int, deep_check_bytes: int) -> tuple[LogSegment, Recovery]:
        size = os.fstat(fd).st_size
        index_path = os.path.join(directory, index_name(base))
        old_rels, old_offsets, torn_entry = read_index_file(index_path)
        report = Recovery()
        deep_from = size - deep_check_bytes
        rels, offsets = array("I"), array("I")
        since: int | None = None
        good_end = 0
        last_seq: int | None = None
        scanner = Scanner(fd, RECOVERY_WINDOW)
        try:
            for off, flen, first, last, _ in scanner.walk(0, size, base):
                rel = first - base
                if rel > MAX_REL_SEQ:
                    raise ScanError(off, f"sequence number {first} too far from base {base}")
                if off >= deep_from:
                    check_bundle_at(scanner, off, flen)
                if since is None or since > interval:
                    rels.append(rel)
                    offsets.append(off)
                    since = 0
                since += flen
                good_end = off + flen
                last_seq = last
                report.bundles += 1
        except ScanError as exc:
            report.reason = exc.reason
        except OSError as exc:
            report.reason = f"read error: {exc}"
        end = data_end(fd, good_end, size) if good_end < size else size
        if end < size:  # zeros written ahead (prefill): not data
            report.prefill_trimmed = size - end
        if end == good_end:
            report.reason = None
        loss = describe_cut(fd, base, good_end, end,
                            base if last_seq is None else last_seq + 1, old_rels, old_offsets)
        if loss is not None:
            report.first_seq_lost, report.last_seq_lost = loss.first_seq, loss.last_seq
            report.last_seq_exact, report.indexed_past_end = loss.exact, loss.indexed_past_end
        if end > good_end:
            report.bytes_dropped = end - good_end
            try:
                report.corrupt_file = os.path.basename(
                    keep_cut_bytes(fd, os.path.join(directory, name), good_end, end))
            except OSError as exc:
                report.corrupt_error = str(exc)
        if good_end < size:
            os.ftruncate(fd, good_end)
        # Keep the index file when it holds exactly the entries Tank's rule gives for
        # the bundles kept (maybe followed by entries past the cut); else rewrite it.
        n = len(rels)
        index = SparseIndex(index_path, rels, offsets)
        index.open_file(truncate=False)
        try:
            if old_rels[:n] != rels or old_offsets[:n] != offsets:
                index.rewrite(rels, offsets)
                report.index_action = "rebuilt"
            elif len(old_rels) > n or torn_entry:
                os.ftruncate(index.fd, index.size_bytes)
                report.index_action = "truncated"
        except BaseException:
            index.close()
            raise
        segment = cls(directory, name, base, fd, good_end, created_ts=created_ts,
                      rolled_ts=None, last_seq=last_seq, index=index)
        segment.since_index = since
        return segment, report

    # -- the index --------------------------------------------------------------------------

    def index(self) -> SparseIndex:
        """The segment's index; a rolled segment's is read on first use and rebuilt if bad."""
        if self._index is None:
            rels, offsets, torn = read_index_file(self.index_path)
            max_rel = (self.last_seq or self.base) - self.base
            if torn or not entries_are_sane(rels, offsets, self.size, max_rel):
                self.rebuild_index()
            else:
                self._index = SparseIndex(self.index_path, rels, offsets)
        assert self._index is not None
        return self._index

    def use_index(self, rels: array[int], offsets: array[int], *, write: bool = False
                  ) -> None:
        """Read a rolled segment through these entries (a damage check's); with ``write``,
        also rewrite the index file if it is unusable (failing to is not an error; a
        usable one made with another index interval stays as it is)."""
        assert self.rolled
        index = SparseIndex(self.index_path, rels, offsets)
        if write:
            old_rels, old_offsets, torn = read_index_file(self.index_path)
            max_rel = (self.last_seq or self.base) - self.base
            if torn or not entries_are_sane(old_rels, old_offsets, self.size, max_rel):
                with contextlib.suppress(OSError):
                    index.write_file()
        self._index = index

    def rebuild_index(self, interval: int = 4096) -> None:
        """Rebuild the index by walking the segment's bundles (Tank's rule).

        Raises :class:`ScanError` if the segment itself is corrupt. Failing to write a
        rolled segment's index file is not an error: the entries stay in memory.
        """
        rels, offsets = array("I"), array("I")
        since: int | None = None
        for off, flen, first, _, _ in Scanner(self.fd, RECOVERY_WINDOW).walk(
                0, self.size, self.base):
            if since is None or since > interval:
                rels.append(min(first - self.base, U32_MAX))
                offsets.append(off)
                since = 0
            since += flen
        index = self._index
        if index is not None and index.fd >= 0:  # the active segment: rewrite in place
            index.rewrite(rels, offsets)
            self.since_index = since
            return
        index = SparseIndex(self.index_path, rels, offsets)
        self._index = index
        with contextlib.suppress(OSError):
            index.write_file()

    # -- writing (active segment) -----------------------------------------------------------

    def append(self, prefix: bytes, bundle: bytes, first_seq: int, last_seq: int,
               index_interval: int) -> int:
        """Write one framed bundle at the end; return its offset.

        On any ``OSError`` the file and index are cut back to where they were, so no
        partial bundle remains, and the error propagates.
        """
        start = self.size
        total = len(prefix) + len(bundle)
        index = self._index
        assert index is not None and not self.rolled
        add_entry = self.since_index is None or self.since_index > index_interval
        ahead = self.prefilled - start  # zeros written ahead, which the bundle overwrites
        try:
            written = os.pwritev(self.fd, (prefix, bundle), start)
            if written != total:
                rest = memoryview(prefix + bundle)[written:]
                while rest:
                    n = os.pwrite(self.fd, rest, start + written)
                    if n <= 0:
                        raise OSError("short write")
                    written += n
                    rest = rest[n:]
            if add_entry:
                index.append(first_seq - self.base, start)
        except OSError:
            self._cut(start)
            raise
        self.size = start + total
        if ahead:
            self.prefilled = max(self.prefilled, self.size)
            if self.zeros is not None:
                self.zeros.zeros_used(ahead - (self.prefilled - self.size))
        else:
            self.prefilled = self.size
        self.since_index = total if add_entry else self.since_index + total  # type: ignore[operator]
        self.last_seq = last_seq
        return start

    def _cut(self, size: int) -> None:
        # If this fails too, the bytes past ``size`` stay invisible and the next write
        # overwrites them.
        with contextlib.suppress(OSError):
            os.ftruncate(self.fd, size)
            self._zeros_cut()
            self.prefilled = size
        with contextlib.suppress(OSError):
            self.index().truncate_to(size)

    def prefill(self, up_to: int) -> None:
        """Write zeros from the end of the file up to ``up_to`` (the active segment in
        ``fsync`` durability). Appends then overwrite blocks that exist already, and an
        fdatasync of an overwrite has no file size to commit: no journal commit, about
        half the time of one after an append. A zero where a bundle length belongs marks
        the end of the data (a bundle is never empty); :meth:`trim` cuts the zeros off.
        Raises ``OSError``.
        """
        start = self.prefilled
        with memoryview(_ZEROS) as zeros:
            while start < up_to:
                n = os.pwrite(self.fd, zeros[:up_to - start], start)
                if n <= 0:
                    raise OSError("short write while prefilling")
                start += n
                self.prefilled = start
                if self.zeros is not None:
                    self.zeros.zeros_added(n)

    def trim(self) -> None:
        """Cut the zeros written ahead by :meth:`prefill` (the file ends with the data)."""
        if self.prefilled > self.size:
            os.ftruncate(self.fd, self.size)
            self._zeros_cut()
            self.prefilled = self.size

    def _zeros_cut(self) -> None:
        """The zeros ahead were cut off the file: count them given back."""
        if self.zeros is not None and self.prefilled > self.size:
            self.zeros.zeros_freed(self.prefilled - self.size)

    def truncate(self, size: int, last_seq: int | None) -> None:
        """Cut the file back to ``size`` (a bundle boundary); raises ``OSError``."""
        os.ftruncate(self.fd, size)
        self._zeros_cut()
        self.prefilled = size
        index = self.index()
        index.truncate_to(size)
        self.size = size
        self.visible_size = min(self.visible_size, size)
        self.last_seq = last_seq
        last = index.last
        self.since_index = None if last is None else size - last[1]

    def roll(self, ts: int, files: OpenFiles | None = None) -> None:
        """Rename the active segment to ``<base>-<last>_<ts>.ilog``; it becomes immutable
        and its file counts against ``files``' bound from now on.

        The index file is left open for the caller to sync; see :meth:`close_index`.
        """
        assert self.last_seq is not None and not self.rolled
        self.trim()
        new_name = rolled_name(self.base, self.last_seq, ts)
        os.rename(self.path, os.path.join(self.directory, new_name))
        self.name = new_name
        self.rolled_ts = ts
        self.visible_size = self.size
        self.zeros = None
        self._files = files
        if files is not None and self._file is not None:
            files.touch(self)

    # -- reading ------------------------------------------------------------------------------

    def locate(self, seq: int, limit: int, last_seq: int | None = None
               ) -> tuple[int, int, bool] | None:
        """Find the bundle holding ``seq`` (or the first one after it) below ``limit``.

        Returns ``(offset, first_seq_of_bundle, sparse)`` or ``None``. Binary-searches
        the index, then walks bundle headers forward up to the next index entry (or to
        ``limit``, where the last bundle must end with ``last_seq`` if given), checking
        that the index agrees with the bundles it walked. Raises :class:`ScanError`.
        """
        index = self.index()
        n = len(index)
        i = bisect_right(index.rels, max(seq - self.base, 0)) - 1 if n else -1
        if i < 0 or index.offsets[i] >= limit:
            i = -1
        rel, offset = (index.rels[i], index.offsets[i]) if i >= 0 else (0, 0)
        stop, stop_rel = limit, -1
        if 0 <= i < n - 1 and index.offsets[i + 1] < limit:
            stop, stop_rel = index.offsets[i + 1], index.rels[i + 1]
        found = None
        walked_last = None
        for off, _, first, last, sparse in Scanner(self.fd).walk(offset, limit, self.base + rel):
            if off >= stop:
                if off != stop or first - self.base != stop_rel:
                    raise ScanError(off, "index entry disagrees with the segment")
                return found if found is not None else (off, first, bool(sparse))
            if found is None and seq <= last:
                found = (off, first, bool(sparse))
            walked_last = last
        if last_seq is not None and walked_last is not None and walked_last != last_seq:
            raise ScanError(limit, f"segment ends at sequence {walked_last}, not {last_seq}")
        return found

    def chunk_end(self, start: int, start_seq: int, target: int, limit: int,
                  limit_seq: int) -> tuple[int, int]:
        """The first bundle boundary at or after ``target`` (capped at ``limit``).

        ``start`` is a bundle boundary below ``target`` whose bundle starts with
        ``start_seq``; ``limit_seq`` is the sequence number after the bundle ending at
        ``limit``. Returns ``(offset, sequence number of the bundle starting there)``.
        """
        if target >= limit:
            return limit, limit_seq
        index = self.index()
        # The last index entry below the target: the walk from it reaches the bundle that
        # ends at or past the target, so the sequence after the range is its last + 1 (an
        # entry at the target would give the next bundle's first, past a sparse gap).
        i = bisect_left(index.offsets, target) - 1
        if i >= 0 and index.offsets[i] > start:
            floor, seq = index.offsets[i], self.base + index.rels[i]
        else:
            floor, seq = start, start_seq
        for off, flen, _, last, _ in Scanner(self.fd).walk(floor, limit, seq):
            if off + flen >= target:
                return off + flen, last + 1
        return limit, limit_seq

    # -- lifecycle ----------------------------------------------------------------------------

    def close_index(self) -> None:
        """Close the index file (the entries stay in memory)."""
        if self._index is not None:
            self._index.close()

    def close(self) -> None:
        """Close the segment's index and release its file (reads in flight keep theirs);
        the segment is not to be used after this."""
        self._closed = True
        if self.zeros is not None and self.prefilled > self.size:
            self.zeros.zeros_used(self.prefilled - self.size)  # no longer counted here
        self.zeros = None
        self.close_index()
        if self._files is not None:
            self._files.forget(self)
        self.drop_file()

    def delete(self) -> None:
        """Close and remove the segment and its index (missing files are fine)."""
        path, index_path = self.path, self.index_path
        self.close()
        for p in (path, index_path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)

