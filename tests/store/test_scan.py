"""The recovery walk reads bundle headers with the codec's reader, window by window."""

from __future__ import annotations

import os

import pytest

from gateway.store.scan import ScanError, Scanner
from protocols.errors import ProtocolError
from protocols.tank.bundle import Codec, Message, encode_bundle, frame_bundle, read_framed_header


def _framed(count: int, *, sparse_from: int | None = None, codec: Codec = Codec.NONE) -> bytes:
    messages = [Message(b"v" * 50, seq=0 if sparse_from is None else sparse_from + 2 * i)
                for i in range(count)]
    return frame_bundle(encode_bundle(messages, codec=codec, sparse=sparse_from is not None))


@pytest.mark.parametrize(("framed", "expected"), [
    (_framed(1), (1, None, None)),
    (_framed(20), (20, None, None)),                    # count in a varint
    (_framed(3, codec=Codec.SNAPPY), (3, None, None)),
    (_framed(1, sparse_from=7), (1, 7, 7)),
    (_framed(4, sparse_from=7), (4, 7, 13)),
])
def test_read_framed_header_needs_only_the_header(framed: bytes, expected: tuple) -> None:
    window = framed[:40]  # the message set is not there
    assert read_framed_header(window, 0, len(window)) == (len(framed), *expected)
    padded = b"xx" + framed
    assert read_framed_header(padded, 2, len(padded)) == (len(framed), *expected)


@pytest.mark.parametrize("bad", [b"", b"\x80", b"\x00", b"\x05\x80", b"\x05\x07", b"\x05\x40",
                                 b"\x05\x00"])
def test_read_framed_header_refuses_bad_headers(bad: bytes) -> None:
    with pytest.raises(ProtocolError):
        read_framed_header(bad, 0, len(bad))


def test_walk_numbers_plain_and_sparse_bundles(tmp_path) -> None:
    data = _framed(2) + _framed(3, sparse_from=10) + _framed(20)
    path = tmp_path / "seg"
    path.write_bytes(data + b"\x05\x80zzzz")  # a bad header after the good bundles
    fd = os.open(path, os.O_RDONLY)
    try:
        walked = []
        with pytest.raises(ScanError) as caught:
            for _, _, first, last, sparse in Scanner(fd, 64).walk(0, len(data) + 6, 1):
                walked.append((first, last, sparse))
        assert caught.value.offset == len(data)
        assert walked == [(1, 2, 0), (10, 14, 1), (15, 34, 0)]
    finally:
        os.close(fd)
