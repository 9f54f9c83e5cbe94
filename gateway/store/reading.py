"""A partition's reads below its cached tail: from its segment files, past damaged regions
(:func:`read_segments`), and from the bundles cached at the tail (:func:`read_cached`).
:meth:`gateway.store.partition.Partition.read` says what a read returns."""

from __future__ import annotations

from bisect import bisect_right
from typing import Final

import structlog

from gateway.store.checks import SegmentChecks
from gateway.store.damage import SegmentCheck
from gateway.store.errors import StoreIOError
from gateway.store.results import ReadResult
from gateway.store.scan import ScanError
from gateway.store.segment import LogSegment
from gateway.store.tail import TailEntry

#: Tank's minimum read: a Consume reads on to the bundle boundary past max(fetch_size, 32).
MIN_FETCH: Final = 32


def read_segments(segments: list[LogSegment], bases: list[int], checks: SegmentChecks,
                  seq: int, fetch_size: int, hwm: int, first_available: int, interval: int,
                  log: structlog.typing.FilteringBoundLogger) -> ReadResult:
    """Read ``seq`` (a sequence number from ``first_available`` to ``hwm``) from
    ``segments``: whole bundles to the first boundary at or past ``max(fetch_size, 32)``
    bytes, within one segment, past damaged regions. A suspect index is rebuilt (with
    ``interval``) once and the read tried again; a read that fails still raises
    :class:`StoreIOError`."""
    wanted = seq
    for attempt in (0, 1):
        where = readable(segments, bases, checks, seq, hwm)
        if where is None:  # lost up to the high-water mark: wait for appends, as at the tail
            return ReadResult(seq=wanted, base_seq=wanted, first_bundle_sparse=False,
                              high_water_mark=hwm, first_available=first_available,
                              next_seq=wanted)
        seg, seq, limit, limit_last, check = where
        try:
            found = seg.locate(seq, limit, limit_last)
            if found is None:
                raise ScanError(limit, f"sequence {seq} not found")
            offset, base_seq, sparse = found
            end, next_seq = seg.chunk_end(offset, base_seq,
                                          offset + max(fetch_size, MIN_FETCH), limit,
                                          (limit_last or 0) + 1)
            file = seg.acquire_file()
        except ScanError as exc:
            failure: Exception = exc
            if attempt == 0:
                log.error("segment_index_suspect", segment=seg.name, error=str(exc))
                try:
                    if check is not None and not check.clean:  # the check's entries
                        seg.use_index(check.rels, check.offsets)
                    else:
                        seg.rebuild_index(interval)
                except (ScanError, OSError) as again:
                    failure = again
                else:
                    seq = wanted
                    continue
            log.error("segment_read_failed", segment=seg.name, error=str(failure))
            raise StoreIOError(f"{seg.name}: {failure}") from None
        except OSError as exc:
            log.error("segment_read_failed", segment=seg.name, error=str(exc))
            raise StoreIOError(f"{seg.name}: {exc}") from exc
        return ReadResult(seq=wanted, base_seq=base_seq, first_bundle_sparse=sparse,
                          high_water_mark=hwm, first_available=first_available,
                          file=file, offset=offset, length=end - offset,
                          next_seq=next_seq)
    raise AssertionError("unreachable")  # pragma: no cover


def readable(segments: list[LogSegment], bases: list[int], checks: SegmentChecks, seq: int,
             hwm: int) -> tuple[LogSegment, int, int, int | None, SegmentCheck | None] | None:
    """Where to read ``seq`` in ``segments`` (based at ``bases``): ``(segment, sequence
    to read from, byte limit, last sequence before the limit, the segment's check)``. A
    sequence in a damaged region moves on to the next readable one (this segment's next
    extent, or a later segment's base); None when nothing readable follows up to ``hwm``.
    Raises :class:`~gateway.store.errors.SegmentCheckPending` when a segment must be
    checked first."""
    i = max(bisect_right(bases, seq) - 1, 0)
    while i < len(segments) - 1 and (segments[i].last_seq or 0) < seq:
        i += 1
    while True:
        seg = segments[i]
        if not seg.rolled:
            return seg, seq, seg.visible_size, hwm, None
        check = checks.checked(seg)
        if check.clean:
            return seg, seq, seg.visible_size, seg.last_seq, check
        extent = check.extent_for(seq)
        if extent is not None:
            return seg, max(seq, extent.first_seq), extent.end, extent.last_seq, check
        i += 1
        if i == len(segments) or segments[i].base > hwm:
            return None
        seq = segments[i].base


def read_cached(seq: int, entries: list[TailEntry], target: int, hwm: int,
                first_available: int) -> ReadResult:
    """A read served from the tail cache: the same range a read of the segment would
    give (whole bundles from ``entries[0]`` on, to the first boundary at or past
    ``target`` bytes)."""
    parts: list[bytes] = []
    size = 0
    for entry in entries:
        parts += (entry.prefix, entry.bundle)
        size += entry.size
        if size >= target:
            break
    first = entries[0]
    return ReadResult(seq=seq, base_seq=first.first_seq, first_bundle_sparse=first.sparse,
                      high_water_mark=hwm, first_available=first_available,
                      offset=first.offset, length=size, next_seq=entry.last_seq + 1,
                      parts=parts)
