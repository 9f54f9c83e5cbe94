"""Wire primitives: varints, fixed ints, length-prefixed fields and the bounded reader."""

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocols.errors import ProtocolError
from protocols.wire import (
    UINT64_MAX,
    Reader,
    decode_varint,
    encode_str8,
    encode_varint,
    varint_size,
)


@pytest.mark.parametrize(("value", "encoded"), [
    (0, "00"), (1, "01"), (127, "7f"), (128, "8001"), (209, "d101"), (8196, "8440"),
    (UINT64_MAX, "ffffffffffffffffff01"),
])
def test_varint_golden(value: int, encoded: str) -> None:
    assert encode_varint(value).hex() == encoded
    assert decode_varint(bytes.fromhex(encoded)) == (value, len(encoded) // 2)


@given(st.integers(min_value=0, max_value=UINT64_MAX))
def test_varint_round_trip(value: int) -> None:
    raw = encode_varint(value)
    assert len(raw) == varint_size(value)
    assert decode_varint(raw + b"\xaa") == (value, len(raw))
    for cut in range(len(raw)):
        assert decode_varint(raw[:cut]) is None


@pytest.mark.parametrize("raw", [
    "ffffffffffffffffff02",    # 65th bit set
    "ffffffffffffffffff7f",    # overflows 64 bits
    "8080808080808080808001",  # 11 bytes
    "8000",                    # redundant zero group (over-long 0)
    "ff00",                    # over-long 127
])
def test_varint_rejects_overflow_and_overlong(raw: str) -> None:
    with pytest.raises(ProtocolError):
        decode_varint(bytes.fromhex(raw))


def test_varint_encode_range() -> None:
    with pytest.raises(ValueError):
        encode_varint(-1)
    with pytest.raises(ValueError):
        encode_varint(UINT64_MAX + 1)


def test_reader_fixed_ints() -> None:
    r = Reader(struct.pack("<BHIQ", 1, 2, 3, 4))
    assert [r.u8(), r.u16le(), r.u32le(), r.u64le()] == [1, 2, 3, 4]
    assert r.remaining == 0


def test_reader_length_prefixed() -> None:
    raw = b"\x06" + "héllo".encode() + b"\x02\x00\x01" + encode_varint(3) + b"abc"
    r = Reader(raw)
    assert r.str8() == "héllo"
    assert r.bytes8() == b"\x00\x01"
    assert r.take(r.varint()) == b"abc"
    assert r.remaining == 0


@pytest.mark.parametrize("read", [
    lambda r: r.u8(), lambda r: r.u16le(), lambda r: r.u32le(), lambda r: r.u64le(),
    lambda r: r.varint(), lambda r: r.str8(), lambda r: r.bytes8(), lambda r: r.take(5),
])
def test_reader_raises_protocol_error_when_input_runs_out(read) -> None:
    with pytest.raises(ProtocolError):
        read(Reader(b""))


def test_reader_lying_lengths_and_bounds() -> None:
    # A str8 claiming 10 bytes with 2 present.
    with pytest.raises(ProtocolError, match="truncated"):
        Reader(b"\x0aab").str8()
    # The reader never reads past its own end, even when the buffer goes on.
    r = Reader(b"\x01\x02\x03\x04", 0, 2)
    assert r.u16le() == 0x0201
    with pytest.raises(ProtocolError):
        r.u8()
    with pytest.raises(ProtocolError, match="not UTF-8"):
        Reader(b"\x02\xff\xfe").str8()


def test_reader_take_copies() -> None:
    buf = bytearray(b"abcdef")
    taken = Reader(buf).take(3)
    buf[0:3] = b"xyz"
    assert taken == b"abc"


@given(st.binary(max_size=64))
def test_reader_never_raises_anything_but_protocol_error(data: bytes) -> None:
    r = Reader(data)
    try:
        while True:
            r.varint()
            r.str8()
            r.u32le()
    except ProtocolError:
        pass


def test_big_endian_u32_and_str8_limit() -> None:
    r = Reader(struct.pack(">I", 6) + encode_str8("hé"))
    assert r.u32be() == 6
    assert r.str8() == "hé"
    assert r.remaining == 0
    with pytest.raises(ValueError):
        encode_str8("x" * 256)
