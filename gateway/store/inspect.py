"""Read a partition directory's segment and index files: ``figtank inspect`` and the
``figtank-segments`` Spark source.

This reads the files as they are on disk, without opening the store: it works on a
data directory in use (it only reads) and on one copied from a Tank broker.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Final

from gateway.store.damage import Extent, SegmentCheck, check_segment_file
from gateway.store.index import read_index_file
from gateway.store.segment import SegmentName, index_name, parse_segment_name
from protocols.errors import ProtocolError
from protocols.tank.bundle import Message, bundle_last_seq, decode_chunk, iter_framed_bundles
from protocols.wire import UINT64_MAX

#: Bytes of segment file read (and decoded) at a time.
WINDOW: Final = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class SegmentFile:
    """One segment file of a partition and its index."""

    name: str
    base_seq: int
    last_seq: int | None  # known from the name of a rolled segment only
    rolled: bool
    size: int
    index_entries: list[tuple[int, int]]  # (relative seq, file offset)


@dataclass(frozen=True, slots=True)
class MessageRecord:
    """One message as stored: where it is and what it looks like."""

    segment: str
    offset: int  # file offset of the bundle holding it
    seq: int
    timestamp: int
    key: bytes | None
    size: int


@dataclass(frozen=True, slots=True)
class SegmentBatch:
    """The messages decoded from one window of a segment file."""

    messages: list[Message]
    #: ``(file offset, first seq)`` of each bundle the messages came from, in order.
    bundles: list[tuple[int, int]]
    #: File offset just past the window's last whole bundle.
    end: int


def list_segments(directory: str) -> list[SegmentFile]:
    """The partition's segments in sequence order, with their index entries."""
    segments = []
    for entry in os.listdir(directory):
        parsed: SegmentName | None = parse_segment_name(entry)
        if parsed is None or parsed.kind == "index":
            continue
        rels, offsets, _ = read_index_file(os.path.join(directory, index_name(parsed.base)))
        segments.append(SegmentFile(
            name=entry, base_seq=parsed.base, last_seq=parsed.last, rolled=parsed.kind == "rolled",
            size=os.path.getsize(os.path.join(directory, entry)),
            index_entries=list(zip(rels, offsets, strict=True))))
    return sorted(segments, key=lambda s: s.base_seq)


def read_segment(path: str, base_seq: int, start: int, end: int, *, min_seq: int = 0,
                 end_seq: int = UINT64_MAX + 1, torn_tail_ok: bool = False
                 ) -> Iterator[SegmentBatch]:
    """The messages with ``min_seq <= seq < end_seq`` in bytes ``[start, end)`` of a
    segment file (``start`` a bundle boundary, whose bundle starts at ``base_seq`` if
    plain), read and decoded a window of bundles at a time.

    A corrupt bundle is a ProtocolError naming its offset, after the messages before it;
    so is a partial bundle at ``end`` unless ``torn_tail_ok`` (the active segment's tail
    may still be being written). A zero where a bundle length belongs ends the data: in
    ``fsync`` durability figtank writes zeros ahead of the active segment's appends.
    """
    seq = base_seq
    carry = b""
    pos = start  # file offset of the first byte not yet decoded
    with open(path, "rb") as f:
        f.seek(start)
        remaining = end - start
        while remaining > 0 or carry:
            data = f.read(min(WINDOW, remaining)) if remaining > 0 else b""
            remaining -= len(data)
            if not data:
                if carry and not torn_tail_ok:
                    raise ProtocolError(f"{path}: {len(carry)} bytes of a partial bundle "
                                        f"at offset {pos}")
                return
            data = carry + data if carry else data
            batch, consumed, seq, done, bad = _decode_window(data, pos, seq, min_seq, end_seq)
            if batch.messages:
                yield batch
            if bad is not None:
                raise ProtocolError(f"{path}: bundle at offset {bad[0]}: {bad[1]}")
            if done:
                return
            carry = data[consumed:]
            pos += consumed


def _decode_window(data: bytes, pos: int, seq: int, lo: int, hi: int
                   ) -> tuple[SegmentBatch, int, int, bool, tuple[int, ProtocolError] | None]:
    """Decode the whole bundles of ``data`` (read from file offset ``pos``) holding
    sequence numbers in ``[lo, hi)``: ``(batch, bytes of whole bundles, next plain
    bundle's first seq, past hi, (file offset, error) of a corrupt bundle)``; a batch
    ending before a corrupt bundle holds the messages of the bundles before it."""
    bundles: list[tuple[int, int]] = []  # (file offset, first seq) of the wanted ones
    wanted_end = consumed = 0
    done = False
    bad = None
    try:
        for offset, length, info in iter_framed_bundles(data):
            first = info.first_seq if info.sparse else seq
            assert first is not None
            if first >= hi:
                done = True
                break
            last = bundle_last_seq(info, seq)
            if last >= lo:
                bundles.append((pos + offset, first))
                wanted_end = offset + length
            seq = last + 1
            consumed = offset + length
    except ProtocolError as exc:
        if data[consumed] == 0:  # a zero bundle length: the end of the data (zeros
            done = True          # written ahead of an active segment's appends)
        else:
            bad = (pos + consumed, exc)
    if not bundles:
        return SegmentBatch([], [], pos + consumed), consumed, seq, done, bad
    try:
        messages = decode_chunk(data[bundles[0][0] - pos:wanted_end], bundles[0][1], lo).messages
    except ProtocolError:  # rare: find the bad bundle, keep the messages before it
        messages = []
        stops = [offset - pos for offset, _ in bundles[1:]] + [wanted_end]
        for (offset, first), stop in zip(bundles, stops, strict=True):
            try:
                messages += decode_chunk(data[offset - pos:stop], first, lo).messages
            except ProtocolError as exc:
                bad = (offset, exc)
                break
    if messages and messages[-1].seq >= hi:
        messages = [m for m in messages if m.seq < hi]
    return SegmentBatch(messages, bundles, pos + consumed), consumed, seq, done, bad


def check_rolled(directory: str, segment: SegmentFile) -> SegmentCheck | None:
    """The damage check of a rolled segment (see :mod:`gateway.store.damage`); None for
    the active one. Raises ``OSError``."""
    if not segment.rolled or segment.last_seq is None:
        return None
    rels = array("I", (rel for rel, _ in segment.index_entries))
    offsets = array("I", (offset for _, offset in segment.index_entries))
    return check_segment_file(os.path.join(directory, segment.name), segment.base_seq,
                              segment.last_seq, index_rels=rels, index_offsets=offsets)


def iter_messages(directory: str, segment: SegmentFile,
                  progress: Callable[[int, int], None] | None = None,
                  extents: Sequence[Extent] | None = None) -> Iterator[MessageRecord]:
    """Every message of one segment file (up to its listed size), or of the given
    ``extents`` of it (the readable parts :func:`check_rolled` found); ``progress(
    done_bytes, total_bytes)`` per window read.

    A torn or corrupt tail ends the listing with a ProtocolError naming its offset.
    """
    if extents is None:
        extents = [Extent(0, segment.size, segment.base_seq, UINT64_MAX)]
    for extent in extents:
        yield from _extent_messages(directory, segment, extent, progress)


def _extent_messages(directory: str, segment: SegmentFile, extent: Extent,
                     progress: Callable[[int, int], None] | None) -> Iterator[MessageRecord]:
    path = os.path.join(directory, segment.name)
    for batch in read_segment(path, extent.first_seq, extent.start, extent.end):
        bundles = iter(batch.bundles)
        offset, _ = next(bundles)
        next_offset, next_first = next(bundles, (0, UINT64_MAX + 1))
        for m in batch.messages:
            while m.seq >= next_first:
                offset = next_offset
                next_offset, next_first = next(bundles, (0, UINT64_MAX + 1))
            yield MessageRecord(segment.name, offset, m.seq, m.timestamp, m.key, len(m.value))
        if progress is not None:
            progress(batch.end, segment.size)
