"""A partition's reads from its segment files, past damaged regions (:func:`read_segments`),
and from the bundles cached at the tail (:func:`read_cached`).
:meth:`gateway.store.partition.Partition.read` says what a read returns."""

from __future__ import annotations

from bisect import bisect_right
from typing import Final

import structlog

from gateway.io.newest import Span
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
    ``segments`` (based at ``bases``): whole bundles to the first boundary at or past
    ``max(fetch_size, 32)`` bytes, within one segment.

    A sequence in a damaged region reads from the next readable one (this segment's next
    extent, or a later segment's base); nothing readable up to ``hwm`` reads as the tail
    does. Raises :class:`~gateway.store.errors.SegmentCheckPending` when a segment must be
    checked first. A suspect index is rebuilt (with ``interval``) once and the read tried
    again; a read that fails still raises :class:`StoreIOError`."""
    wanted = seq
    for attempt in (0, 1):
        # The segment holding seq (the lookup runs here, not in a function of its own:
        # this is every read's path below the cached tail).
        i = max(bisect_right(bases, seq) - 1, 0)
        while i < len(segments) - 1 and (segments[i].last_seq or 0) < seq:
            i += 1
        limit_last: int | None
        check: SegmentCheck | None
        while True:
            seg = segments[i]
            if not seg.rolled:
                limit, limit_last, check = seg.visible_size, hwm, None
                break
            check = checks.checked(seg)
            if check.clean:
                limit, limit_last = seg.visible_size, seg.last_seq
                break
            extent = check.extent_for(seq)
            if extent is not None:
                seq, limit, limit_last = max(seq, extent.first_seq), extent.end, extent.last_seq
                break
            i += 1
            if i == len(segments) or segments[i].base > hwm:
                # lost up to the high-water mark: wait for appends, as at the tail
                return ReadResult(seq=wanted, base_seq=wanted, first_bundle_sparse=False,
                                  high_water_mark=hwm, first_available=first_available,
                                  next_seq=wanted)
            seq = segments[i].base
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


def read_cached(seq: int, span: Span[TailEntry], hwm: int, first_available: int
                ) -> ReadResult:
    """A read served from the tail cache (:func:`gateway.store.tail.find`: the same range
    a read of the segment would give)."""
    first = span.first
    return ReadResult(seq=seq, base_seq=first.first_seq, first_bundle_sparse=first.sparse,
                      high_water_mark=hwm, first_available=first_available,
                      offset=first.offset, length=span.size, next_seq=span.last.last_seq + 1,
                      parts=span.parts)
