"""Read a partition directory's segment and index files for operators (``figtank inspect``).

This reads the files as they are on disk, without opening the store: it works on a
data directory in use (it only reads) and on one copied from a Tank broker.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from gateway.store.index import read_index_file
from gateway.store.segment import SegmentName, index_name, parse_segment_name
from protocols.errors import ProtocolError
from protocols.tank.bundle import decode_bundle, iter_framed_bundles
from protocols.wire import decode_varint


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


def iter_messages(directory: str, segment: SegmentFile,
                  progress: Callable[[int, int], None] | None = None
                  ) -> Iterator[MessageRecord]:
    """Every message of one segment file; ``progress(done_bytes, total_bytes)`` per bundle.

    A torn or corrupt tail ends the listing with a ProtocolError naming its offset.
    """
    with open(os.path.join(directory, segment.name), "rb") as f:
        data = f.read()
    next_seq = segment.base_seq
    end = 0
    for offset, framed_len, info in iter_framed_bundles(data):
        decoded = decode_varint(data, offset)
        assert decoded is not None  # iter_framed_bundles yields whole bundles only
        _, body = decoded
        messages = decode_bundle(data[body:offset + framed_len],
                                 None if info.sparse else next_seq)
        for message in messages:
            yield MessageRecord(segment.name, offset, message.seq, message.timestamp,
                                message.key, len(message.value))
        if messages:
            next_seq = messages[-1].seq + 1
        end = offset + framed_len
        if progress is not None:
            progress(end, len(data))
    if end != len(data):
        raise ProtocolError(f"{segment.name}: {len(data) - end} bytes of a partial bundle "
                            f"at offset {end}")
