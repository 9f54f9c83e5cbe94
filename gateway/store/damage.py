"""Finding damage in segment files, and saying what it cost.

A rolled segment (``<base>-<last>_<ts>.ilog``) is immutable, so its bytes can be
checked once: :func:`check_segment` walks every bundle header, validates every bundle
(message framing, Snappy) and expects the walk to end exactly at the file's end with
the sequence number its name gives. What it finds is a :class:`SegmentCheck`: the
*extents* (byte ranges of whole, valid bundles) readers may serve, and the *damage*
between and after them with the sequence numbers it cost. After a bad region the walk
resynchronises at the next entry of the segment's index that lies past it, when the
bundles from there on are valid (an index entry always names a bundle boundary);
otherwise everything after the damage is lost.

Recovery of the active segment cuts a bad tail instead (the segment must stay
appendable): :func:`describe_cut` says which sequence numbers the cut bytes held, as far
as the old index and the bundle headers that still parse tell, and :func:`keep_cut_bytes`
copies them to a ``<segment>.corrupt`` file beside the segment first.
"""

from __future__ import annotations

import contextlib
import os
import time
from array import array
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Final

from gateway.store.scan import ScanError, Scanner
from protocols.errors import ProtocolError
from protocols.tank.bundle import validate_bundle
from protocols.wire import decode_varint

#: Damage checks read segment files in windows this large.
CHECK_WINDOW: Final = 1024 * 1024
#: A check gives up the GIL after this many bundles or bytes (see _walk_run).
_PAUSE_BUNDLES: Final = 32
_PAUSE_BYTES: Final = 256 * 1024
#: Index entries past a cut that recovery tries to walk to the end from (each walk may
#: read the rest of the file).
_CUT_WALKS: Final = 4
#: Suffix of the file that keeps the bytes recovery cut off a segment.
CORRUPT_SUFFIX: Final = ".corrupt"
_O_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)


@dataclass(frozen=True, slots=True)
class Extent:
    """A byte range of whole, valid bundles: ``[start, end)`` holds ``first_seq..last_seq``."""

    start: int
    end: int
    first_seq: int
    last_seq: int


@dataclass(frozen=True, slots=True)
class Damage:
    """Bytes ``[offset, end)`` of a segment that can not be served.

    ``first_lost..last_lost`` are the sequence numbers they held (a range: sparse
    bundles may have left gaps in it); both None when no message was lost (bytes after
    the segment's last sequence number, garbage appended to the file).
    """

    offset: int
    end: int
    first_lost: int | None
    last_lost: int | None
    reason: str

    @property
    def size(self) -> int:
        """Bytes of the damaged region."""
        return self.end - self.offset

    @property
    def lost_range(self) -> int:
        """How many sequence numbers the region held (at most that many messages)."""
        if self.first_lost is None or self.last_lost is None:
            return 0
        return self.last_lost - self.first_lost + 1


@dataclass(slots=True)
class SegmentCheck:
    """What :func:`check_segment` found: readable extents, damage, and the index entries
    (Tank's rule, restarted at each extent) of the readable bundles."""

    extents: list[Extent]
    damage: list[Damage]
    rels: array[int] = field(default_factory=lambda: array("I"))
    offsets: array[int] = field(default_factory=lambda: array("I"))

    @property
    def clean(self) -> bool:
        """True when the whole segment is readable."""
        return not self.damage

    def extent_for(self, seq: int) -> Extent | None:
        """The extent holding ``seq``, or the first one after it; None past the last."""
        extents = self.extents
        i = bisect_right([e.last_seq for e in extents], seq - 1) if len(extents) > 1 else 0
        if i < len(extents) and extents[i].last_seq >= seq:
            return extents[i]
        return None


def clean_check(base: int, last: int, size: int) -> SegmentCheck:
    """The check of a segment known to be whole (rolled by this process)."""
    return SegmentCheck([Extent(0, size, base, last)], [])


def check_bundle_at(scanner: Scanner, offset: int, framed_len: int) -> None:
    """Validate the framed bundle at ``offset`` fully (framing, messages, Snappy)."""
    framed = scanner.read(offset, framed_len)
    decoded = decode_varint(framed, 0)
    if decoded is None:  # pragma: no cover - the header walk has read this varint already
        raise ScanError(offset, "truncated bundle length")
    try:
        validate_bundle(memoryview(framed)[decoded[1]:])
    except ProtocolError as exc:
        raise ScanError(offset, f"invalid bundle: {exc}") from None


@dataclass(slots=True)
class _Run:
    """One stretch of valid bundles walked from ``start``."""

    start: int
    end: int
    first_seq: int | None = None
    next_seq: int = 0
    reached_last: bool = False
    reason: str | None = None


def _walk_run(scanner: Scanner, start: int, size: int, next_seq: int, last: int,
              interval: int, base: int, rels: array[int], offsets: array[int]) -> _Run:
    """Walk and validate bundles from ``start`` until the segment's last sequence number,
    the end of the file or the first bad bundle; add index entries for the good ones."""
    run = _Run(start, start, next_seq=next_seq)
    since: int | None = None
    pending: list[tuple[int, int]] = []
    bundles = walked = 0
    try:
        for off, flen, first, bundle_last, _ in scanner.walk(start, size, next_seq):
            bundles += 1
            walked += flen
            if bundles >= _PAUSE_BUNDLES or walked >= _PAUSE_BYTES:
                # In a worker thread, the event loop's thread waits for the GIL whenever
                # it comes back from a system call: hand it over often, so a long check
                # delays the loop by a few bundles' work, not by Python's 5 ms switch
                # interval per system call.
                time.sleep(0)
                bundles = walked = 0
            if bundle_last > last:
                raise ScanError(off, f"bundle ends at sequence {bundle_last}, past the "
                                f"segment's last {last}")
            check_bundle_at(scanner, off, flen)
            if since is None or since > interval:
                pending.append((first - base, off))
                since = 0
            since += flen
            if run.first_seq is None:
                run.first_seq = first
            run.end = off + flen
            run.next_seq = bundle_last + 1
            if bundle_last == last:
                run.reached_last = True
                break
    except ScanError as exc:
        run.reason = exc.reason
    except OSError as exc:
        run.reason = f"read error: {exc}"
    for rel, off in pending:
        rels.append(rel)
        offsets.append(off)
    return run


def _resync_points(rels: array[int], offsets: array[int], base: int, last: int,
                   size: int) -> list[tuple[int, int]]:
    """``(first_seq, offset)`` of the index entries that can be trusted as bundle
    boundaries: in bounds, both columns strictly increasing."""
    points: list[tuple[int, int]] = []
    for rel, off in zip(rels, offsets, strict=True):
        if off >= size or base + rel > last:
            break
        if points and (base + rel <= points[-1][0] or off <= points[-1][1]):
            break
        points.append((base + rel, off))
    return points


def check_segment(fd: int, base: int, last: int, size: int, *, index_rels: array[int],
                  index_offsets: array[int], interval: int = 4096,
                  window: int = CHECK_WINDOW) -> SegmentCheck:
    """Check a rolled segment's bytes ``[0, size)``, which should hold ``base..last``.

    ``index_*`` are the entries of its index file (resynchronisation points after
    damage). Reads the whole file once; blocking (run it in a worker thread when the
    segment is big).
    """
    scanner = Scanner(fd, window)
    points = _resync_points(index_rels, index_offsets, base, last, size)
    check = SegmentCheck([], [])
    pos, next_seq = 0, base
    while True:
        run = _walk_run(scanner, pos, size, next_seq, last, interval, base,
                        check.rels, check.offsets)
        if run.first_seq is not None:
            check.extents.append(Extent(run.start, run.end, run.first_seq, run.next_seq - 1))
        if run.reached_last:
            if run.end < size:
                _add_damage(check, Damage(run.end, size, None, None,
                                          f"{size - run.end} bytes after the segment's "
                                          f"last sequence number {last}"))
            return check
        if run.reason is None:  # the file ends on a bundle boundary, short of `last`
            _add_damage(check, Damage(size, size, run.next_seq, last,
                                      f"the file ends at sequence {run.next_seq - 1}, "
                                      f"its name says {last}"))
            return check
        lost_from = run.next_seq
        resync = next(((seq, off) for seq, off in points
                       if off > run.end and seq >= lost_from), None)
        if resync is None:
            _add_damage(check, Damage(run.end, size, lost_from, last, run.reason))
            return check
        seq, off = resync
        first_lost, last_lost = (lost_from, seq - 1) if seq > lost_from else (None, None)
        _add_damage(check, Damage(run.end, off, first_lost, last_lost, run.reason))
        pos, next_seq = off, seq


def _add_damage(check: SegmentCheck, damage: Damage) -> None:
    """Record ``damage``, merged with the previous region when nothing readable lies
    between them (a resynchronisation point that did not hold)."""
    if check.damage and check.damage[-1].end == damage.offset and (
            not check.extents or check.extents[-1].end <= check.damage[-1].offset):
        prev = check.damage.pop()
        first = prev.first_lost if prev.first_lost is not None else damage.first_lost
        last = damage.last_lost if damage.last_lost is not None else prev.last_lost
        damage = Damage(prev.offset, damage.end, first, last, prev.reason)
    check.damage.append(damage)


def check_segment_file(path: str, base: int, last: int, *, index_rels: array[int],
                       index_offsets: array[int], interval: int = 4096) -> SegmentCheck:
    """:func:`check_segment` on a file opened (and closed) here: the check never uses a
    descriptor someone else may close meanwhile. Raises ``OSError`` when it can not
    be opened."""
    fd = os.open(path, os.O_RDONLY | _O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        return check_segment(fd, base, last, size, index_rels=index_rels,
                             index_offsets=index_offsets, interval=interval)
    finally:
        os.close(fd)


# -- recovery of the active segment ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CutLoss:
    """What the bytes cut off an active segment held, as far as can be told."""

    #: The first sequence number lost (the one after the last bundle kept).
    first_seq: int
    #: The last sequence number lost: exact when the bundle headers after the bad one
    #: could be walked to the end (``exact``), else a lower bound from the old index, or
    #: None when nothing tells.
    last_seq: int | None
    exact: bool
    #: How far the old index pointed past the end of the file (bytes known missing).
    indexed_past_end: int = 0


def describe_cut(fd: int, base: int, good_end: int, size: int, next_seq: int,
                 old_rels: array[int], old_offsets: array[int]) -> CutLoss | None:
    """The sequence numbers held by bytes ``[good_end, size)`` of a segment, cut by
    recovery, and by the bundles the old index names past ``size`` (a file truncated
    by something else). None when nothing says a message was there."""
    after = [(base + rel, off) for rel, off in zip(old_rels, old_offsets, strict=True)
             if off >= good_end]
    if good_end >= size and not after:
        return None
    scanner = Scanner(fd, CHECK_WINDOW)
    candidates = [(seq, off) for seq, off in after
                  if good_end < off < size and seq >= next_seq][:_CUT_WALKS]
    for seq, off in candidates:
        walked_last = None
        try:
            for _, _, _, bundle_last, _ in scanner.walk(off, size, seq):
                walked_last = bundle_last
        except (ScanError, OSError):
            continue
        if walked_last is not None:
            return CutLoss(next_seq, walked_last, True)
    lower = max((seq for seq, _ in after), default=None)
    past_end = max((off for _, off in after), default=-1) + 1 - size
    return CutLoss(next_seq, lower, False, max(past_end, 0))


def corrupt_path(segment_path: str) -> str:
    """A free name for the copy of bytes cut off ``segment_path``: ``<segment>.corrupt``,
    or ``<segment>.<n>.corrupt`` when that exists already (a second cut)."""
    path = segment_path + CORRUPT_SUFFIX
    n = 1
    while os.path.exists(path):
        path = f"{segment_path}.{n}{CORRUPT_SUFFIX}"
        n += 1
    return path


def keep_cut_bytes(fd: int, segment_path: str, start: int, end: int) -> str:
    """Copy bytes ``[start, end)`` of the segment to a new ``.corrupt`` file beside it,
    synced (file and directory) before the caller cuts them. Returns its path; raises
    ``OSError`` (no partial copy is left)."""
    path = corrupt_path(segment_path)
    out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o644)
    try:
        pos = start
        while pos < end:
            data = os.pread(fd, min(end - pos, CHECK_WINDOW), pos)
            if not data:
                break
            view = memoryview(data)
            while view:
                view = view[os.write(out, view):]
            pos += len(data)
        os.fsync(out)
    except BaseException:
        os.close(out)
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    os.close(out)
    directory = os.open(os.path.dirname(path) or ".", os.O_RDONLY | _O_CLOEXEC)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return path


def data_end(fd: int, start: int, end: int) -> int:
    """Where the non-zero bytes of ``[start, end)`` end: zeros after them were written
    ahead of the data (prefill in ``fsync`` durability), not lost data."""
    pos = end
    while pos > start:
        n = min(pos - start, CHECK_WINDOW)
        data = os.pread(fd, n, pos - n)
        stripped = data.rstrip(b"\x00")
        if stripped:
            return pos - n + len(stripped)
        pos -= n
    return start
