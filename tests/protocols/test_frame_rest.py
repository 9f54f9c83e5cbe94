"""``FrameReader.rest_of_frame``: how much of the next read finishes the frame begun in
what is buffered, checked against feeding the read byte by byte."""

from __future__ import annotations

import random
import struct

from protocols.connection import NEED_DATA, FrameReader

HEADER = struct.Struct("<BI")  # Tank's: msgId, payload length


def _frame(length: int) -> bytes:
    return HEADER.pack(1, length) + bytes(range(length % 251)) * (length // 251) + bytes(
        range(length % 251))


def _finishing(buffered: bytes, data: bytes, max_payload: int) -> int:
    """The reference: feed ``data`` one byte at a time until a frame comes out."""
    reader = FrameReader(HEADER, 1, max_payload)
    reader.feed(buffered)
    assert reader.next_frame() is NEED_DATA
    for i in range(len(data)):
        reader.feed(data[i:i + 1])
        if reader.buffered >= HEADER.size:
            length = HEADER.unpack_from(bytes(reader._buf), reader._pos)[1]
            if length > max_payload:
                return len(data)
        if reader.next_frame() is not NEED_DATA:
            return i + 1
    return len(data)


def test_rest_of_frame_matches_feeding_byte_by_byte() -> None:
    rng = random.Random(5)
    for _ in range(400):
        stream = b"".join(_frame(rng.choice((0, 1, 7, 300, 600))) for _ in range(3))
        cut = rng.randrange(1, len(stream))
        end = rng.randrange(cut, len(stream) + 1)
        max_payload = rng.choice((1000, 5))
        reader = FrameReader(HEADER, 1, max_payload)
        reader.feed(stream[:cut])
        try:
            while reader.next_frame() is not NEED_DATA:
                pass
        except Exception:
            continue  # a frame over the limit: the reader has failed
        if not reader.buffered:
            assert reader.rest_of_frame(stream[cut:end]) == 0
            continue
        buffered = bytes(reader._buf[reader._pos:])
        data = stream[cut:end]
        assert reader.rest_of_frame(data) == _finishing(buffered, data, max_payload)


def test_nothing_buffered_is_zero() -> None:
    reader = FrameReader(HEADER, 1, 100)
    assert reader.rest_of_frame(_frame(3)) == 0
