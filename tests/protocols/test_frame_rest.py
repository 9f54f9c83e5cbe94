"""``FrameReader.rest_of_frame`` and ``completed_frame``: how much of the next read ends
the frame begun in what is buffered, checked against feeding the read byte by byte."""

from __future__ import annotations

import random
import struct

from protocols.connection import NEED_DATA, FrameReader
from protocols.errors import FrameTooLarge

HEADER = struct.Struct("<BI")  # Tank's: msgId, payload length


def _frame(length: int) -> bytes:
    return HEADER.pack(1, length) + bytes(i % 251 for i in range(length))


def _ending(buffered: bytes, data: bytes, max_payload: int) -> int | None:
    """The reference: feed ``data`` a byte at a time; how many bytes end the frame
    (None: it does not end in ``data``, or it is over the limit)."""
    reader = FrameReader(HEADER, 1, max_payload)
    reader.feed(buffered)
    for i in range(len(data)):
        reader.feed(data[i:i + 1])
        try:
            if reader.next_frame() is not NEED_DATA:
                return i + 1
        except FrameTooLarge:
            return None
    return None


def test_rest_of_frame_matches_feeding_byte_by_byte() -> None:
    rng = random.Random(5)
    checked = 0
    while checked < 400:
        stream = b"".join(_frame(rng.choice((0, 1, 7, 300, 600))) for _ in range(3))
        cut = rng.randrange(1, len(stream))
        data = stream[cut:rng.randrange(cut, len(stream) + 1)]
        max_payload = rng.choice((1000, 5))
        reader = FrameReader(HEADER, 1, max_payload)
        reader.feed(stream[:cut])
        try:
            while reader.next_frame() is not NEED_DATA:
                pass
        except FrameTooLarge:
            continue
        if not reader.buffered:
            assert reader.rest_of_frame(data) == 0
            assert reader.completed_frame(data) is None
            continue
        buffered = bytes(reader._buf[reader._pos:])
        want = _ending(buffered, data, max_payload)
        completed = reader.completed_frame(data)
        if want is None:
            assert reader.rest_of_frame(data) > len(data)
            assert completed is None
        else:
            assert reader.rest_of_frame(data) == want
            assert completed == (buffered + data[:want], want)
            start = cut - len(buffered)
            assert completed[0] == stream[start:start + len(completed[0])]
        assert bytes(reader._buf[reader._pos:]) == buffered  # nothing consumed
        checked += 1


def test_drop_buffered_forgets_the_begun_frame() -> None:
    reader = FrameReader(HEADER, 1, 100)
    reader.feed(_frame(10)[:7])
    frame, used = reader.completed_frame(_frame(10)[7:] + _frame(2)) or (b"", 0)
    assert (frame, used) == (_frame(10), 8)
    reader.drop_buffered()
    assert reader.buffered == 0
    reader.feed(_frame(2))
    assert reader.next_frame() == ((1, 2), b"\x00\x01")
