"""Tank bundle codec: golden bytes from the documented layout, round trips, chunks, bad input."""

from __future__ import annotations

import random
import struct

import pytest
import snappy
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols.errors import ProtocolError
from protocols.tank.bundle import (
    BundleInfo,
    Codec,
    Message,
    bundle_last_seq,
    choose_codec,
    decode_bundle,
    decode_chunk,
    encode_bundle,
    frame_bundle,
    iter_framed_bundles,
    parse_bundle_header,
    validate_bundle,
)

TS = 1_700_000_000_000  # 0x18B_CFE5_6800


def u64(n: int) -> bytes:
    return struct.pack("<Q", n)


def with_seqs(messages: list[Message], seqs) -> list[Message]:
    return [Message(m.value, m.key, m.timestamp, s) for m, s in zip(messages, seqs, strict=True)]


# ------------------------------------------------------------------------ golden bytes


def test_golden_single_message_no_key():
    bundle = bytes([0x04]) + bytes([0x00]) + u64(TS) + bytes([5]) + b"hello"
    assert bundle.hex() == "04000068e5cf8b0100000568656c6c6f"
    msg = Message(b"hello", None, TS)
    assert encode_bundle([msg]) == bundle
    assert decode_bundle(bundle, 42) == [Message(b"hello", None, TS, 42)]
    assert parse_bundle_header(bundle) == BundleInfo(1, Codec.NONE, False, None, None)


def test_golden_keyed_message_and_two_byte_length():
    value = bytes(range(200))
    bundle = b"\x04" + b"\x01" + u64(1) + b"\x02k1" + b"\xc8\x01" + value
    assert encode_bundle([Message(value, b"k1", 1)]) == bundle
    assert decode_bundle(bundle, 1) == [Message(value, b"k1", 1, 1)]


def test_golden_varint_count_and_last_specified_timestamp():
    messages = [Message(b"x", None, TS) for _ in range(20)]
    bundle = b"\x00" + b"\x14" + b"\x00" + u64(TS) + b"\x01x" + b"\x02\x01x" * 19
    assert encode_bundle(messages) == bundle
    assert decode_bundle(bundle, 7) == with_seqs(messages, range(7, 27))
    assert parse_bundle_header(bundle).msg_count == 20


def test_count_boundary_15_inline_16_varint():
    fifteen = encode_bundle([Message(b"")] * 15)
    sixteen = encode_bundle([Message(b"")] * 16)
    assert fifteen[0] == 15 << 2
    assert sixteen[:2] == b"\x00\x10"


def test_timestamp_changes_are_written_explicitly():
    messages = [Message(b"a", None, 5), Message(b"b", None, 5), Message(b"c", None, 6)]
    bundle = b"\x0c" + b"\x00" + u64(5) + b"\x01a" + b"\x02\x01b" + b"\x00" + u64(6) + b"\x01c"
    assert encode_bundle(messages) == bundle
    assert decode_bundle(bundle, 1) == with_seqs(messages, [1, 2, 3])


def test_golden_sparse_with_prev_plus_one_and_delta():
    messages = with_seqs(
        [Message(v, None, 7) for v in (b"a", b"b", b"c", b"d")], [100, 101, 105, 110]
    )
    bundle = (
        b"\x50"  # sparse | 4 messages
        + u64(100)
        + b"\x09"  # 110 - 100 - 1
        + b"\x00" + u64(7) + b"\x01a"  # first: no delta
        + b"\x06\x01b"  # SeqNumPrevPlusOne | UseLastSpecifiedTS
        + b"\x02\x03\x01c"  # delta 105 - 101 - 1 = 3
        + b"\x02\x01d"  # last: from the header
    )  # fmt: skip
    assert encode_bundle(messages, sparse=True) == bundle
    assert decode_bundle(bundle) == messages
    assert decode_bundle(bundle, 999) == messages  # base ignored for a sparse bundle
    info = validate_bundle(bundle)
    assert info == BundleInfo(4, Codec.NONE, True, 100, 110)
    assert bundle_last_seq(info, None) == 110


def test_golden_sparse_single_message_has_no_last_delta():
    bundle = b"\x44" + u64(9) + b"\x00" + u64(3) + b"\x01z"
    assert encode_bundle([Message(b"z", None, 3, 9)], sparse=True) == bundle
    assert validate_bundle(bundle) == BundleInfo(1, Codec.NONE, True, 9, 9)
    assert decode_bundle(bundle) == [Message(b"z", None, 3, 9)]


def test_golden_snappy():
    value = b"abcdefgh" * 4
    messages = [Message(value, None, TS) for _ in range(3)]
    message_set = b"\x00" + u64(TS) + b"\x20" + value + (b"\x02\x20" + value) * 2
    compressed = snappy.compress(message_set)
    assert compressed[0] == len(message_set)  # raw Snappy: varint uncompressed length first
    bundle = bytes([0x01 | 3 << 2]) + compressed
    assert encode_bundle(messages, codec=Codec.SNAPPY) == bundle
    assert decode_bundle(bundle, 1) == with_seqs(messages, [1, 2, 3])
    assert validate_bundle(bundle) == BundleInfo(3, Codec.SNAPPY, False, None, None)


def test_last_specified_timestamp_on_first_message_means_zero():
    # Tank's decoder starts every bundle with "last timestamp" 0; its encoder never does this.
    assert decode_bundle(b"\x04\x02\x01x", 5) == [Message(b"x", None, 0, 5)]


def test_prev_plus_one_ignored_outside_sparse_middle():
    assert decode_bundle(b"\x04\x06\x01x", 5) == [Message(b"x", None, 0, 5)]
    sparse_first = b"\x48" + u64(10) + b"\x00" + b"\x04" + u64(1) + b"\x01a" + b"\x02\x01b"
    assert [m.seq for m in decode_bundle(sparse_first)] == [10, 11]


def test_empty_key_and_empty_value_round_trip_distinct_from_none():
    messages = [Message(b"", b"", 0), Message(b"", None, 0)]
    assert decode_bundle(encode_bundle(messages), 0) == with_seqs(messages, [0, 1])


def test_frame_bundle():
    assert frame_bundle(b"\x04\x02\x00") == b"\x03\x04\x02\x00"
    assert frame_bundle(bytes(200))[:2] == b"\xc8\x01"


def test_choose_codec_follows_tank_client():
    assert choose_codec([Message(b"")] * 512) is Codec.NONE
    assert choose_codec([Message(b"")] * 513) is Codec.SNAPPY
    assert choose_codec([Message(bytes(1000), b"k" * 24)]) is Codec.NONE
    assert choose_codec([Message(bytes(1000), b"k" * 25)]) is Codec.SNAPPY
    assert parse_bundle_header(encode_bundle([Message(bytes(1025))])).codec is Codec.SNAPPY


def test_values_are_independent_bytes():
    buf = bytearray(frame_bundle(encode_bundle([Message(b"abc", b"k"), Message(b"def")])))
    messages = decode_chunk(memoryview(buf), 1).messages
    direct = decode_bundle(memoryview(buf)[1:], 1)
    buf[:] = bytes(len(buf))
    for got in (messages, direct):
        assert [type(m.value) for m in got] == [bytes, bytes]
        assert [(m.value, m.key) for m in got] == [(b"abc", b"k"), (b"def", None)]


def test_bundle_last_seq():
    info = parse_bundle_header(encode_bundle([Message(b"")] * 3))
    assert bundle_last_seq(info, 10) == 12
    with pytest.raises(ValueError):
        bundle_last_seq(info, None)


@pytest.mark.parametrize(
    "messages, kwargs",
    [
        ([], {}),
        ([Message(b"x", b"k" * 256)], {}),
        ([Message(b"x", None, -1)], {}),
        ([Message(b"x", None, 2**64)], {}),
        ([Message(b"x", None, 0, 5), Message(b"y", None, 0, 5)], {"sparse": True}),
        ([Message(b"x", None, 0, 5), Message(b"y", None, 0, 7), Message(b"z", None, 0, 6)],
         {"sparse": True}),
        ([Message(b"x", None, 0, -1)], {"sparse": True}),
        ([Message(b"x", None, 0, 0), Message(b"y", None, 0, 2**64)], {"sparse": True}),
        ([Message(b"x")], {"codec": 2}),
    ],
)  # fmt: skip
def test_encode_rejects_bad_arguments(messages, kwargs):
    with pytest.raises(ValueError):
        encode_bundle(messages, **kwargs)


# ------------------------------------------------------------------------ round trips

keys = st.one_of(st.none(), st.binary(max_size=8), st.binary(min_size=255, max_size=255))
values = st.one_of(st.binary(max_size=20), st.binary(min_size=120, max_size=300))
timestamps = st.one_of(st.sampled_from([0, 1, TS, 2**64 - 1]), st.integers(0, 2**64 - 1))
message_lists = st.lists(
    st.builds(Message, value=values, key=keys, timestamp=timestamps), min_size=1, max_size=40
)
gaps = st.one_of(st.just(1), st.integers(1, 3), st.integers(1, 2**33))


@settings(max_examples=150, deadline=None)
@given(
    messages=message_lists,
    codec=st.sampled_from([None, Codec.NONE, Codec.SNAPPY]),
    base=st.integers(0, 2**62),
)
def test_round_trip_plain(messages, codec, base):
    bundle = encode_bundle(messages, codec=codec)
    expected = with_seqs(messages, range(base, base + len(messages)))
    assert decode_bundle(bundle, base) == expected
    info = validate_bundle(bundle)
    assert info == parse_bundle_header(bundle)
    assert info.msg_count == len(messages) and not info.sparse
    assert info.codec == (choose_codec(messages) if codec is None else codec)
    result = decode_chunk(frame_bundle(bundle), base)
    assert result.messages == expected
    assert result.next_seq == base + len(messages)


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    messages=message_lists,
    codec=st.sampled_from([Codec.NONE, Codec.SNAPPY]),
    first=st.integers(0, 2**62),
)
def test_round_trip_sparse(data, messages, codec, first):
    steps = data.draw(st.lists(gaps, min_size=len(messages) - 1, max_size=len(messages) - 1))
    seqs = [first]
    for step in steps:
        seqs.append(seqs[-1] + step)
    messages = with_seqs(messages, seqs)
    bundle = encode_bundle(messages, codec=codec, sparse=True)
    assert decode_bundle(bundle) == messages
    assert validate_bundle(bundle) == BundleInfo(len(messages), codec, True, seqs[0], seqs[-1])
    min_seq = data.draw(st.sampled_from(seqs))
    result = decode_chunk(frame_bundle(bundle), None, min_seq)
    assert result.messages == [m for m in messages if m.seq >= min_seq]
    assert result.next_seq == seqs[-1] + 1


# ----------------------------------------------------------------------------- chunks


def sample_bundles() -> list[tuple[bytes, list[Message]]]:
    """Bundles with their messages (seqs filled in when the chunk starts at 10)."""
    plain = [Message(b"p%d" % i, None, TS) for i in range(3)]  # 10..12
    packed = [Message(b"s" * 300, b"key", TS + i) for i in range(5)]  # 13..17, snappy
    sparse = with_seqs([Message(b"x"), Message(b"y" * 150)], [20, 25])
    tail = [Message(b"t1"), Message(b"t2", b"k")]  # 26..27
    return [
        (encode_bundle(plain, codec=Codec.NONE), with_seqs(plain, range(10, 13))),
        (encode_bundle(packed, codec=Codec.SNAPPY), with_seqs(packed, range(13, 18))),
        (encode_bundle(sparse, sparse=True), sparse),
        (encode_bundle(tail), with_seqs(tail, [26, 27])),
    ]


def test_chunk_of_several_bundles():
    bundles = sample_bundles()
    chunk = b"".join(frame_bundle(b) for b, _ in bundles)
    every = [m for _, msgs in bundles for m in msgs]
    result = decode_chunk(chunk, 10)
    assert result.messages == every
    assert (result.next_seq, result.consumed, result.partial_bundle_len) == (28, len(chunk), None)
    for min_seq in (0, 10, 11, 14, 18, 21, 25, 26, 27, 28, 40):
        result = decode_chunk(chunk, 10, min_seq)
        assert result.messages == [m for m in every if m.seq >= min_seq]
        assert result.next_seq == max(28, min_seq)
        assert result.consumed == len(chunk)


def test_chunk_starting_with_sparse_bundle():
    sparse = with_seqs([Message(b"a"), Message(b"b")], [50, 60])
    plain = [Message(b"c"), Message(b"d")]
    chunk = frame_bundle(encode_bundle(sparse, sparse=True)) + frame_bundle(encode_bundle(plain))
    result = decode_chunk(chunk, None)
    assert [m.seq for m in result.messages] == [50, 60, 61, 62]
    assert result.next_seq == 63


def test_chunk_plain_first_bundle_needs_base():
    with pytest.raises(ProtocolError):
        decode_chunk(frame_bundle(encode_bundle([Message(b"a")])), None)


def test_chunk_sparse_bundle_going_backwards():
    first = frame_bundle(encode_bundle([Message(b"a")] * 5))  # 10..14
    back = frame_bundle(encode_bundle([Message(b"b", None, 0, 14)], sparse=True))
    with pytest.raises(ProtocolError):
        decode_chunk(first + back, 10)


def test_empty_chunk():
    assert decode_chunk(b"", 5, 3) == decode_chunk(b"", 5) == decode_chunk(b"", 5, 5)
    result = decode_chunk(b"", 5, 9)
    assert (result.messages, result.next_seq, result.consumed, result.partial_bundle_len) == (
        [],
        9,
        0,
        None,
    )
    assert decode_chunk(b"", None, 0).next_seq == 0


def test_partial_last_bundle_at_every_cut():
    bundles = sample_bundles()
    frames = [frame_bundle(b) for b, _ in bundles]
    chunk = b"".join(frames)
    starts = [sum(map(len, frames[:i])) for i in range(len(frames) + 1)]
    assert any(len(f) - len(b) > 1 for f, (b, _) in zip(frames, bundles, strict=True))
    for cut in range(len(chunk) + 1):
        whole = max(i for i, s in enumerate(starts) if s <= cut)
        result = decode_chunk(chunk[:cut], 10)
        assert result.messages == [m for _, msgs in bundles[:whole] for m in msgs]
        assert result.consumed == starts[whole]
        assert result.next_seq == [10, 13, 18, 26, 28][whole]
        if cut == starts[whole]:
            assert result.partial_bundle_len is None
            continue
        framed, bundle = frames[whole], bundles[whole][0]
        prefix = len(framed) - len(bundle)
        if cut - starts[whole] >= prefix:
            assert result.partial_bundle_len == len(framed)
        else:  # the length varint itself is cut: a lower bound that still asks for more
            assert cut - starts[whole] < result.partial_bundle_len <= len(framed)


def test_iter_framed_bundles():
    frames = [frame_bundle(b) for b, _ in sample_bundles()]
    chunk = b"".join(frames)
    listed = list(iter_framed_bundles(chunk))
    assert [(off, n) for off, n, _ in listed] == [
        (sum(map(len, frames[:i])), len(f)) for i, f in enumerate(frames)
    ]
    assert [info.msg_count for _, _, info in listed] == [3, 5, 2, 2]
    assert [info.sparse for _, _, info in listed] == [False, False, True, False]
    assert listed[2][2].first_seq == 20 and listed[2][2].last_seq == 25
    # A torn tail: iteration stops at the last whole bundle.
    torn = list(iter_framed_bundles(memoryview(chunk)[: len(chunk) - 1]))
    assert torn == listed[:3]
    # Bounds.
    assert (
        list(iter_framed_bundles(chunk, len(frames[0]), len(chunk) - len(frames[3])))
        == (listed[1:3])
    )


def test_iter_framed_bundles_raises_on_corrupt_header_after_good_ones():
    good = frame_bundle(encode_bundle([Message(b"a")]))
    seen = []
    with pytest.raises(ProtocolError):
        for entry in iter_framed_bundles(good + b"\x02\x84\x00" + good):
            seen.append(entry)
    assert len(seen) == 1
    with pytest.raises(ProtocolError):
        list(iter_framed_bundles(good + b"\x00"))  # zero-length bundle (zero-filled tail)


def test_oversized_bundle_length_refused():
    with pytest.raises(ProtocolError):
        decode_chunk(b"\x81\x80\x80\x80\x01", 1)  # 2**28 + 1 > 256 MiB
    with pytest.raises(ProtocolError):
        decode_chunk(b"\x80\x80\x80\x80", 1)  # even cut short, it can only be larger
    assert decode_chunk(b"\x80\x80\x80", 1).partial_bundle_len == 4 + (1 << 21)
    with pytest.raises(ProtocolError):
        decode_chunk(b"\x10" + bytes(16), 1, max_bundle_size=8)


# -------------------------------------------------------------------------- bad input


def good_bundles() -> list[bytes]:
    keyed = [Message(b"v%d" % i, b"k%d" % i, i // 2) for i in range(20)]
    return [
        encode_bundle([Message(b"hello", None, TS)]),
        encode_bundle(keyed, codec=Codec.NONE),
        encode_bundle(keyed, codec=Codec.SNAPPY),
        encode_bundle(with_seqs(keyed[:6], [3, 4, 9, 10, 200, 2**40]), sparse=True),
        encode_bundle(with_seqs(keyed, range(5, 500, 20)[:20]), sparse=True, codec=Codec.SNAPPY),
        encode_bundle([Message(bytes(300), None, 1)] * 2),
    ]


def assert_refused(bundle: bytes, **kwargs) -> None:
    with pytest.raises(ProtocolError):
        validate_bundle(bundle, **kwargs)
    with pytest.raises(ProtocolError):
        decode_bundle(bundle, 1, **kwargs)


@pytest.mark.parametrize("flags", [0x84, 0x86, 0xC4, 0x06, 0x07, 0x46])
def test_bad_bundle_flags(flags):
    bundle = bytes([flags]) + encode_bundle([Message(b"x")])[1:]
    assert_refused(bundle)
    with pytest.raises(ProtocolError):
        parse_bundle_header(bundle)


@pytest.mark.parametrize("msg_flags", [0x08, 0x10, 0x80, 0xFF])
def test_bad_message_flags(msg_flags):
    assert_refused(b"\x04" + bytes([msg_flags]) + u64(0) + b"\x01x")


def test_zero_message_count():
    assert_refused(b"\x00\x00")
    assert_refused(b"\x00\x00\x02\x01x")


def test_count_disagrees_with_message_set():
    assert_refused(b"\x0c\x02\x01a\x02\x01b")  # says 3, holds 2
    assert_refused(b"\x04\x02\x01a\x02\x01b")  # says 1, holds 2
    assert_refused(b"\x0c" + b"\x02\x00" * 2)  # says 3, two bytes short of a third
    # The header alone can tell when an uncompressed set is too small for its count.
    with pytest.raises(ProtocolError):
        parse_bundle_header(b"\x00\xe8\x07\x02\x01a")


def test_every_prefix_is_refused():
    for bundle in good_bundles():
        validate_bundle(bundle)
        for cut in range(len(bundle)):
            assert_refused(bundle[:cut])


def test_trailing_garbage_refused():
    for bundle in good_bundles():
        for garbage in (b"\x00", b"\x02\x00", b"\xff" * 3):
            assert_refused(bundle + garbage)


def test_corrupt_snappy_refused():
    good = encode_bundle([Message(b"abc" * 50)] * 4, codec=Codec.SNAPPY)
    assert_refused(good[:1] + b"\x05" + b"\xff" * 10)
    assert_refused(good[:1] + b"\xff\xff\xff\xff\x0f" + b"\x00")  # claims ~4 GiB
    assert_refused(good[:1] + b"\x80")  # truncated preamble
    assert_refused(good, max_uncompressed=100)  # over a configured limit, refused unread
    lying = bytearray(good)
    lying[1] += 1  # preamble one byte longer than the data decompresses to
    assert_refused(bytes(lying))


def test_sparse_inconsistent_with_header():
    first = b"\x00" + u64(0) + b"\x01a"
    # Header: 100..103 for 3 messages; middle delta 5 -> 106 >= last.
    assert_refused(b"\x4c" + u64(100) + b"\x02" + first + b"\x02\x05\x01b" + b"\x02\x01c")
    # Middle lands exactly on last.
    assert_refused(b"\x4c" + u64(100) + b"\x02" + first + b"\x02\x02\x01b" + b"\x02\x01c")
    # Last message says prev + 1, header says otherwise (101 + 1 != 103).
    assert_refused(b"\x4c" + u64(100) + b"\x02" + first + b"\x06\x01b" + b"\x06\x01c")
    # Header span too small for its count: 100..101 cannot hold 3 messages.
    with pytest.raises(ProtocolError):
        parse_bundle_header(b"\x4c" + u64(100) + b"\x00" + first * 3)
    # Last sequence past u64.
    with pytest.raises(ProtocolError):
        parse_bundle_header(b"\x48" + u64(2**64 - 1) + b"\x00" + first * 2)
    # Consistent variant is fine (101 + 1 == 102 with header last 102).
    ok = b"\x4c" + u64(100) + b"\x01" + first + b"\x06\x01b" + b"\x06\x01c"
    assert [m.seq for m in decode_bundle(ok)] == [100, 101, 102]


def test_plain_bundle_needs_base_and_fits_u64():
    bundle = encode_bundle([Message(b"a")] * 2)
    with pytest.raises(ProtocolError):
        decode_bundle(bundle)
    with pytest.raises(ProtocolError):
        decode_bundle(bundle, 2**64 - 1)
    assert decode_bundle(bundle, 2**64 - 2)[-1].seq == 2**64 - 1


def test_over_long_varint_refused():
    assert_refused(b"\x04\x02\x81\x00x")  # value length 1 as a redundant two-byte varint


# --------------------------------------------------------------------------- mini fuzz


def mutate(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(5)
        pos = rng.randrange(len(buf) + 1)
        if kind == 0 and buf:
            buf[min(pos, len(buf) - 1)] ^= 1 << rng.randrange(8)
        elif kind == 1 and buf:
            buf[min(pos, len(buf) - 1)] = rng.choice([0, 0x7F, 0x80, 0xFF, rng.randrange(256)])
        elif kind == 2:
            buf[pos:pos] = rng.randbytes(rng.randint(1, 4))
        elif kind == 3:
            del buf[pos : pos + rng.randint(1, 4)]
        else:
            del buf[pos:]
    return bytes(buf)


def attempt(fn, *args):
    """``fn(*args)``, or ``None`` if it raised ProtocolError (anything else fails the test)."""
    try:
        return fn(*args)
    except ProtocolError:
        return None


def test_fuzz_only_protocol_errors():
    rng = random.Random(1234)
    seeds = good_bundles()
    chunk_seed = b"".join(frame_bundle(b) for b in seeds)
    for i in range(3000):
        data = rng.randbytes(rng.randint(0, 40)) if i % 10 == 0 else mutate(rng, rng.choice(seeds))
        info = attempt(validate_bundle, data)
        decoded = attempt(decode_bundle, data, 1)
        # The checker and the decoder must agree on what is a valid bundle.
        assert (info is None) == (decoded is None), data.hex()
        if info is not None:
            assert len(decoded) == info.msg_count
            assert attempt(parse_bundle_header, data) == info
        attempt(parse_bundle_header, data)
        chunk = mutate(rng, chunk_seed) if i % 3 == 0 else frame_bundle(data)
        result = attempt(decode_chunk, chunk, rng.choice([None, 0, 1]), rng.randrange(3))
        assert result is None or result.consumed <= len(chunk)
        attempt(lambda c: list(iter_framed_bundles(c)), chunk)
