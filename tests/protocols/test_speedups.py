"""The compiled loops (``protocols._speedups``) against their pure-Python references.

Every check runs one input through the reference and through the compiled function (via
the same wrappers the package uses) and wants the same outcome: equal results, or a
``ProtocolError`` of the same class with the same message; anything else escaping either
side fails the test. Inputs: hypothesis strategies for valid data (plain, sparse and
Snappy bundles, chunks of several bundles, Figg frame streams) cut at every byte, and a
seeded ``random.Random`` for volume (mutated bundles, chunks and streams).

``make test`` runs the suite twice. Without ``FIGTANK_PURE_PYTHON`` the extension must be
built and in use (:func:`test_extension_is_built`). With it, the package must select the
pure functions; the comparisons still run whenever the extension can be imported, and
without it they still run every input through the reference (which must then keep the
protocol rule: a value or a ``ProtocolError``).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocols import native, translate
from protocols.errors import FrameTooLarge, ProtocolError
from protocols.figg.messages import FAST, HEADER, MessageType
from protocols.tank import bundle as B
from protocols.tank.bundle import Codec, Message, encode_bundle, frame_bundle
from protocols.wire import UINT64_MAX, encode_varint

PURE = native.pure_python_requested()
#: The extension, imported directly (also under FIGTANK_PURE_PYTHON), or None.
compiled = native.built("protocols._speedups")

MAX = B.MAX_UNCOMPRESSED_SIZE
FAST_SETTINGS = settings(max_examples=60, deadline=None,
                         suppress_health_check=[HealthCheck.too_slow])
#: Wall-clock budget of each seeded volume test.
VOLUME_SECONDS = 2.0


@pytest.fixture(autouse=True, scope="module")
def _native_wrappers() -> Iterator[None]:
    # The *_native wrappers call whatever the modules' ``speedups`` is: point it at the
    # extension even when FIGTANK_PURE_PYTHON made the package ignore it. data_frames_py
    # is made of decode_chunk: keep it on the pure one, so the reference stays pure.
    with mock.patch.object(B, "speedups", compiled), \
            mock.patch.object(translate, "speedups", compiled), \
            mock.patch.object(translate, "decode_chunk", B.decode_chunk_py):
        yield


def outcome(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, ...]:
    """``("ok", result)`` or ``("error", class, message)`` for a ProtocolError; anything
    else raised fails the test (the protocol rule)."""
    try:
        return ("ok", fn(*args, **kwargs))
    except ProtocolError as exc:
        return ("error", type(exc), str(exc))


def same(reference: Callable[..., Any], native_fn: Callable[..., Any], *args: Any,
         **kwargs: Any) -> tuple[Any, ...]:
    """Run both; they must agree. Returns the reference's outcome."""
    expected = outcome(reference, *args, **kwargs)
    if compiled is not None:
        got = outcome(native_fn, *args, **kwargs)
        assert got == expected, f"compiled {got!r} != reference {expected!r} for {args!r}"
    return expected


def same_validate(bundle: Any, max_uncompressed: int = MAX) -> tuple[Any, ...]:
    return same(B.validate_bundle_py, B._validate_bundle_native, bundle,
                max_uncompressed=max_uncompressed)


def same_chunk(chunk: Any, base_seq: int | None, min_seq: int = 0, *,
               max_bundle_size: int = B.MAX_BUNDLE_SIZE, max_uncompressed: int = MAX,
               topic: bytes = b"orders") -> tuple[Any, ...]:
    """decode_chunk and data_frames, compiled and pure, on one chunk."""
    kw = {"max_bundle_size": max_bundle_size, "max_uncompressed": max_uncompressed}
    decoded = same(B.decode_chunk_py, B._decode_chunk_native, chunk, base_seq, min_seq, **kw)
    frames = same(translate.data_frames_py, translate._data_frames_native, topic, chunk,
                  base_seq, min_seq, **kw)
    if decoded[0] == "ok":
        assert frames[0] == "ok"
        assert frames[1].count == len(decoded[1].messages)
    else:
        assert frames == decoded
    return decoded


def same_scan(buf: Any, pos: int, end: int, max_payload: int,
              timestamp: int) -> tuple[Any, ...]:
    expected = outcome(translate.scan_publishes_py, buf, pos, end, max_payload, timestamp)
    if compiled is None:
        return expected
    got = outcome(translate._scan_publishes_native, buf, pos, end, max_payload, timestamp)
    assert got[0] == expected[0] == "ok"  # errors are returned, not raised
    items, got_pos, error = got[1]
    want_items, want_pos, want_error = expected[1]
    assert items == want_items
    assert type(error) is type(want_error)
    assert str(error) == str(want_error)
    # After an error pos is meaningless; the wrapper's topic check comes after the scan.
    if error is None or str(error) != "Publish.topic is not UTF-8":
        assert got_pos == want_pos
    return expected


# ------------------------------------------------------------------------- selection


def test_extension_is_built() -> None:
    """Without FIGTANK_PURE_PYTHON the extension must be built and in use, so a broken
    build fails here instead of silently running the pure code."""
    if PURE:
        assert native.speedups is None
        assert native.implementation() == "pure-python"
        return
    assert compiled is not None, "protocols._speedups does not import: rebuild with pip"
    assert native.speedups is compiled
    assert native.implementation() == "compiled"


def test_selected_functions() -> None:
    pairs = [
        (B.validate_bundle, B.validate_bundle_py, B._validate_bundle_native),
        (B.decode_chunk, B.decode_chunk_py, B._decode_chunk_native),
        (translate.scan_publishes, translate.scan_publishes_py,
         translate._scan_publishes_native),
        (translate.data_frames, translate.data_frames_py, translate._data_frames_native),
    ]
    for public, pure, compiled_twin in pairs:
        assert public is (pure if native.speedups is None else compiled_twin)


_REPORT = """
from protocols import native, translate
from protocols.tank import bundle
print(native.implementation(),
      bundle.validate_bundle is bundle.validate_bundle_py,
      bundle.decode_chunk is bundle.decode_chunk_py,
      translate.scan_publishes is translate.scan_publishes_py,
      translate.data_frames is translate.data_frames_py)
"""


@pytest.mark.parametrize("value", ["1", "yes", "0", ""])
def test_environment_selects_implementation(value: str) -> None:
    env = {**os.environ, native.PURE_PYTHON_ENV: value}
    out = subprocess.run([sys.executable, "-c", _REPORT], env=env, capture_output=True,
                         text=True, check=True, timeout=60).stdout.split()
    if value in ("", "0") and compiled is not None:
        assert out == ["compiled", "False", "False", "False", "False"]
    else:
        assert out == ["pure-python", "True", "True", "True", "True"]


# ------------------------------------------------------------------------- bundles

values = st.one_of(st.binary(max_size=16), st.binary(min_size=120, max_size=300))
keys = st.one_of(st.none(), st.binary(max_size=8), st.just(b"k" * 255))


@st.composite
def seq_runs(draw: st.DrawFn, count: int, lowest: int = 0) -> list[int]:
    """``count`` strictly increasing sequence numbers >= ``lowest`` within u64 (sparse)."""
    gaps = draw(st.lists(st.one_of(st.just(0), st.integers(0, 3), st.integers(0, 1 << 40)),
                         min_size=count - 1, max_size=count - 1))
    span = sum(gaps) + count - 1
    if lowest + span > UINT64_MAX:
        gaps = [0] * (count - 1)
        span = count - 1
    first = draw(st.one_of(st.integers(lowest, lowest + 1000),
                           st.just(UINT64_MAX - span), st.integers(lowest, UINT64_MAX - span)))
    first = max(lowest, min(first, UINT64_MAX - span))
    seqs = [first]
    for gap in gaps:
        seqs.append(seqs[-1] + gap + 1)
    return seqs


@st.composite
def message_lists(draw: st.DrawFn, sparse: bool, lowest: int = 0,
                  max_count: int = 24) -> list[Message]:
    count = draw(st.one_of(st.integers(1, min(4, max_count)), st.integers(1, max_count)))
    stamps = draw(st.lists(st.one_of(st.just(0), st.just(UINT64_MAX),
                                     st.integers(0, UINT64_MAX)), min_size=1, max_size=3))
    seqs = draw(seq_runs(count, lowest)) if sparse else [0] * count
    return [Message(draw(values), draw(keys), draw(st.sampled_from(stamps)), seq)
            for seq in seqs]


@st.composite
def bundles(draw: st.DrawFn) -> tuple[bytes, list[Message], bool]:
    sparse = draw(st.booleans())
    messages = draw(message_lists(sparse))
    codec = draw(st.sampled_from(Codec))
    return encode_bundle(messages, codec=codec, sparse=sparse), messages, sparse


@FAST_SETTINGS
@given(bundles(), st.sampled_from([bytes, bytearray, memoryview]))
def test_validate_bundle_valid(case: tuple[bytes, list[Message], bool], kind: type) -> None:
    bundle, messages, sparse = case
    result = same_validate(kind(bundle))
    assert result[0] == "ok"
    assert result[1].msg_count == len(messages)
    if sparse:
        assert (result[1].first_seq, result[1].last_seq) == (messages[0].seq, messages[-1].seq)


@pytest.mark.differential
@FAST_SETTINGS
@given(bundles(), st.data())
def test_validate_bundle_cut_and_flipped(case: tuple[bytes, list[Message], bool],
                                         data: st.DataObject) -> None:
    bundle = case[0]
    for end in range(len(bundle)):
        assert same_validate(bundle[:end])[0] == "error"
    same_validate(bundle + b"\x00")
    for _ in range(8):
        at = data.draw(st.integers(0, len(bundle) - 1))
        byte = data.draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF, bundle[at] ^ 0x04]))
        same_validate(bundle[:at] + bytes((byte,)) + bundle[at + 1:])


def _count_header(flags: int, count: int) -> bytes:
    return bytes((flags,)) + encode_varint(count)


EDGE_BUNDLES = [
    b"", b"\x80", b"\xc4", b"\x03", b"\x02", b"\x00", b"\x00\x00", b"\x00\x80", b"\x00\x80\x00",
    b"\x00" + b"\xff" * 9 + b"\x02", b"\x00" + b"\xff" * 10, b"\x04",
    # message length: over-long, overflowing, cut
    b"\x04\x02\x80\x00", b"\x04\x02" + b"\xff" * 9 + b"\x02", b"\x04\x02\x80",
    b"\x04\x08", b"\x04\x09\x01", b"\x04\x01\x05ab",
    # sparse headers
    b"\x44" + b"\x00" * 7, b"\x48" + b"\x00" * 8, b"\x48" + b"\xff" * 8 + b"\x00" + b"\x02\x00" * 2,
    b"\x48" + b"\x00" * 8 + b"\xfe" + b"\xff" * 8 + b"\x01" + b"\x02\x00" * 2,
    b"\x4c" + b"\x00" * 8 + b"\x00" + b"\x02\x00" * 3,
    # sparse deltas
    b"\x4c" + b"\x05" + b"\x00" * 7 + b"\x03" + b"\x02\x00\x02\x03\x00\x02\x00",
    b"\x4c" + b"\x05" + b"\x00" * 7 + b"\x03" + b"\x02\x00\x02\x80\x00\x00\x02\x00",
    b"\x4c" + b"\x05" + b"\x00" * 7 + b"\x03" + b"\x02\x00\x02\xff" * 3,
    b"\x4c" + b"\x05" + b"\x00" * 7 + b"\x03" + b"\x02\x00\x02",
    b"\x48" + b"\x05" + b"\x00" * 7 + b"\x03" + b"\x02\x00\x06\x00",
    b"\x48" + b"\x05" + b"\x00" * 7 + b"\x00" + b"\x02\x00\x06\x00",
    # counts
    _count_header(0, 16) + b"\x02\x00" * 17, _count_header(0, 16) + b"\x02\x00" * 15 + b"\x00\x00",
    _count_header(0, 1 << 63) + b"\x02\x00",
    # keys and timestamps
    b"\x04\x01" + b"\x00" * 8 + b"\x05ab", b"\x04\x03", b"\x04\x03\x00", b"\x04\x00" + b"\x00" * 7,
    b"\x08\x08\x00\x02\x00", b"\x04\x02\x00\x00", b"\x08\x02\x03abc", b"\x04\x02\x00\x02\x00",
    # snappy
    b"\x05", b"\x05\x80", b"\x05\x05\x00", b"\x05\x00", b"\x05\x00\x00", b"\x05\x02\x04\x02\x00",
    b"\x05" + encode_varint(MAX + 1) + b"\x00", b"\x05" + encode_varint(1 << 32) + b"\x00",
    b"\x05\x03\x08\x02\x00\x00",
]


@pytest.mark.parametrize("bundle", EDGE_BUNDLES)
def test_validate_bundle_edges(bundle: bytes) -> None:
    same_validate(bundle)
    same_validate(bundle, max_uncompressed=1 << 40)


def test_validate_bundle_snappy_limits() -> None:
    plain = encode_bundle([Message(b"x" * 200)], codec=Codec.NONE)[1:]
    bundle = encode_bundle([Message(b"x" * 200)], codec=Codec.SNAPPY)
    size = len(plain)
    assert same_validate(bundle, max_uncompressed=size)[0] == "ok"
    expected = same_validate(bundle, max_uncompressed=size - 1)
    assert expected[2] == (f"snappy message set of {size} bytes is over the {size - 1} "
                           "byte limit")
    # A preamble past what Snappy allows at all: the decompressor's own refusal.
    huge = b"\x05" + encode_varint(1 << 33) + b"\x00\x00"
    assert same_validate(huge, max_uncompressed=1 << 40)[2].startswith("corrupt snappy")


# -------------------------------------------------------------------------- chunks


@st.composite
def chunks(draw: st.DrawFn, max_count: int = 12) -> tuple[bytes, int | None, list[int]]:
    """Framed bundles with consistent sequence numbers: ``(chunk, base_seq, seqs)``."""
    near_end = draw(st.booleans())
    base = draw(st.integers(UINT64_MAX - 200, UINT64_MAX) if near_end
                else st.integers(0, 1000))
    parts, seqs = [], []
    next_seq = base
    first_sparse = None
    for _ in range(draw(st.integers(1, 4))):
        sparse = draw(st.booleans())
        room = UINT64_MAX - next_seq + 1  # sequence numbers left
        if room < 1:
            break
        messages = draw(message_lists(sparse, next_seq, min(max_count, room)))
        if not sparse:
            for i, m in enumerate(messages):
                m.seq = next_seq + i
        if first_sparse is None:
            first_sparse = sparse
        parts.append(frame_bundle(encode_bundle(messages, codec=draw(st.sampled_from(Codec)),
                                                sparse=sparse)))
        seqs += [m.seq for m in messages]
        next_seq = messages[-1].seq + 1
    base_seq = None if first_sparse and draw(st.booleans()) else base
    if not parts:
        parts.append(frame_bundle(encode_bundle([Message(b"v", seq=base)], sparse=True)))
        seqs.append(base)
    return b"".join(parts), base_seq, seqs


def min_seqs(seqs: list[int]) -> st.SearchStrategy[int]:
    return st.one_of(st.just(0), st.sampled_from(seqs), st.sampled_from([s + 1 for s in seqs]),
                     st.integers(0, UINT64_MAX + 2))


@pytest.mark.differential
@FAST_SETTINGS
@given(chunks(), st.data(), st.sampled_from([bytes, bytearray, memoryview]))
def test_chunk_valid(case: tuple[bytes, int | None, list[int]], data: st.DataObject,
                     kind: type) -> None:
    chunk, base_seq, seqs = case
    min_seq = data.draw(min_seqs(seqs))
    result = same_chunk(kind(chunk), base_seq, min_seq)
    assert result[0] == "ok"
    assert [m.seq for m in result[1].messages] == [s for s in seqs if s >= min_seq]
    assert result[1].consumed == len(chunk)
    assert result[1].partial_bundle_len is None


@pytest.mark.differential
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chunks(max_count=5), st.data())
def test_chunk_cut_at_every_byte(case: tuple[bytes, int | None, list[int]],
                                 data: st.DataObject) -> None:
    chunk, base_seq, seqs = case
    min_seq = data.draw(min_seqs(seqs))
    for end in range(len(chunk) + 1):
        result = same_chunk(chunk[:end], base_seq, min_seq)
        assert result[0] == "ok"
        assert result[1].consumed == end or result[1].partial_bundle_len is not None


@pytest.mark.differential
@FAST_SETTINGS
@given(chunks(), st.data())
def test_chunk_mutated(case: tuple[bytes, int | None, list[int]], data: st.DataObject) -> None:
    chunk, base_seq, seqs = case
    min_seq = data.draw(min_seqs(seqs))
    for _ in range(6):
        at = data.draw(st.integers(0, len(chunk) - 1))
        byte = data.draw(st.sampled_from([0x00, 0x01, 0x02, 0x7F, 0x80, 0xFF, chunk[at] ^ 0x40]))
        same_chunk(chunk[:at] + bytes((byte,)) + chunk[at + 1:], base_seq, min_seq)
    same_chunk(chunk, base_seq, min_seq, max_bundle_size=data.draw(st.integers(1, 300)))
    same_chunk(chunk, None if base_seq is not None else 7, min_seq)


_NO_LENGTH = b"\x0a\x04\x00" + b"\x00" * 8  # one message: flags, timestamp, no length
_NO_KEY_LENGTH = b"\x0a\x04\x01" + b"\x00" * 8  # with a key: no key length

BAD_CHUNKS = [
    (b"\x00", 1), (b"\x80\x00", 1), (b"\xff" * 9 + b"\x02", 1), (b"\x80", 1), (b"\xff" * 5, 1),
    (b"\xff" * 9, 1), (b"\x03\x04\x02\x00", None), (b"\x03\x04\x02\x00", UINT64_MAX),
    (b"\x03\x04\x02\x00" * 2, UINT64_MAX), (b"\x03\x08\x02\x00\x02\x00", UINT64_MAX),
    # the message length (or key length) of a bundle's last message lies just past its end,
    # in the next bundle or past the chunk
    (_NO_LENGTH + b"\x03\x04\x02\x00", 1), (_NO_LENGTH + b"\x83\x04\x02\x00", 1),
    (_NO_LENGTH + b"\x80", 1), (_NO_LENGTH, 1), (_NO_KEY_LENGTH + b"\x03\x04\x02\x00", 1),
    (_NO_KEY_LENGTH, 1), (b"\x03\x04\x01\x00" + b"\x81", 1), (b"\x02\x04\x00\x81", 1),
    # a plain bundle holding fewer or more messages than its header counts
    (frame_bundle(b"\x08\x02\x03abc"), 1), (frame_bundle(b"\x04\x02\x00\x02\x00"), 1),
    # sparse after sparse going back; plain after a sparse bundle ending at u64 max
    (frame_bundle(encode_bundle([Message(b"", seq=9)], sparse=True)) * 2, None),
    (frame_bundle(encode_bundle([Message(b"", seq=UINT64_MAX)], sparse=True))
     + frame_bundle(encode_bundle([Message(b"")])), None),
    (frame_bundle(encode_bundle([Message(b"", seq=UINT64_MAX)], sparse=True))
     + frame_bundle(encode_bundle([Message(b"", seq=1)], sparse=True)), None),
]


@pytest.mark.parametrize(("chunk", "base_seq"), BAD_CHUNKS)
def test_chunk_malformed(chunk: bytes, base_seq: int | None) -> None:
    for min_seq in (0, 5, UINT64_MAX, UINT64_MAX + 1):
        for limit in (B.MAX_BUNDLE_SIZE, 3, 1 << 70):
            same_chunk(chunk, base_seq, min_seq, max_bundle_size=limit)


def test_chunk_partial_prefix_lower_bound() -> None:
    """A chunk cut inside a length varint reports the same lower bound, or the same
    error when even that is over the limit."""
    for have in range(1, 10):
        for fill in (0x80, 0xFF, 0x81):
            chunk = bytes([fill] * have)
            for limit in (B.MAX_BUNDLE_SIZE, 200, 1 << 62, 1 << 64, 1 << 70):
                result = same_chunk(chunk, 1, max_bundle_size=limit)
                if result[0] == "ok":
                    assert result[1].consumed == 0


def test_chunk_skips_bundles_below_min_seq_unread() -> None:
    good = frame_bundle(encode_bundle([Message(b"a"), Message(b"b")]))
    corrupt = frame_bundle(b"\x09" + b"\x07\xff\xff\xff")  # snappy, 2 messages, corrupt
    result = same_chunk(corrupt + good, 1, 3)
    assert [m.value for m in result[1].messages] == [b"a", b"b"]
    assert same_chunk(corrupt + good, 1, 2)[0] == "error"


def test_data_frames_layout() -> None:
    chunk = frame_bundle(encode_bundle([Message(b"hello", key=b"k"), Message(b"")]))
    result = same_chunk(chunk, 41, topic="tö".encode())[1]
    frames = translate.data_frames(b"t\xc3\xb6", chunk, 41)
    assert frames.count == 2
    topic = "tö".encode()
    expected = b"".join(
        HEADER.pack(MessageType.DATA, 1, len(topic) + len(v) + 16) + len(topic).to_bytes(4, "big")
        + topic + s.to_bytes(8, "big") + len(v).to_bytes(4, "big") + v
        for s, v in ((41, b"hello"), (42, b"")))
    assert frames.frames == expected
    assert [m.seq for m in result.messages] == [41, 42]


# ------------------------------------------------------------------------ PUBLISH

_PUBLISH = FAST[MessageType.PUBLISH]
TOPICS = [b"orders", b"a", b"", "tö".encode(), b"\xff\xfe", b"x" * 70]


def frame(message_type: int, payload: bytes, version: int = 1) -> bytes:
    return HEADER.pack(message_type, version, len(payload)) + payload


def bad_publish_payloads(topic: bytes) -> list[bytes]:
    head = len(topic).to_bytes(4, "big") + topic
    return [
        b"", b"\x00\x00", (len(topic) + 1).to_bytes(4, "big") + topic, head, head + b"\x00" * 11,
        head + b"\x00" * 8 + b"\x00\x00\x00\x05abc", head + b"\x00" * 12 + b"z",
        head + b"\x00" * 8 + b"\xff\xff\xff\xff",
    ]


publish_frames = st.builds(lambda t, s, d: _PUBLISH.encode_frame(t, s, d),
                           st.sampled_from(TOPICS[:4]), st.integers(0, UINT64_MAX),
                           st.binary(max_size=200))
other_frames = st.builds(frame, st.sampled_from([1, 3, 8]), st.binary(max_size=20))
bad_frames = st.one_of(
    st.builds(frame, st.sampled_from([0, 2, 4, 6, 7, 9, 10, 0xFFFF]), st.binary(max_size=4)),
    st.builds(frame, st.sampled_from([1, 5, 8]), st.binary(max_size=4),
              st.sampled_from([0, 2, 0xFFFF])),
    st.builds(lambda t, i: frame(5, bad_publish_payloads(t)[i]), st.sampled_from(TOPICS),
              st.integers(0, 7)),
    st.builds(lambda t, s, d: _PUBLISH.encode_frame(t, s, d), st.just(b"\xff\xfe"),
              st.integers(0, 9), st.binary(max_size=4)),
)


@st.composite
def streams(draw: st.DrawFn, bad: bool) -> bytes:
    kinds = st.one_of(publish_frames, publish_frames, other_frames,
                      *([bad_frames] if bad else []))
    runs = draw(st.lists(st.tuples(kinds, st.integers(1, 4)), min_size=1, max_size=6))
    return b"".join(f * n for f, n in runs)


@FAST_SETTINGS
@given(streams(bad=False), st.integers(0, UINT64_MAX),
       st.sampled_from([bytes, bytearray]))
def test_scan_publishes_cut_at_every_byte(buf: bytes, timestamp: int, kind: type) -> None:
    data = kind(buf)
    for end in range(len(buf) + 1):
        _, pos, error = same_scan(data, 0, end, 1 << 20, timestamp)[1]
        assert error is None
    assert pos == len(buf)


@pytest.mark.differential
@FAST_SETTINGS
@given(streams(bad=True), st.integers(0, UINT64_MAX), st.data())
def test_scan_publishes_malformed(buf: bytes, timestamp: int, data: st.DataObject) -> None:
    limit = data.draw(st.sampled_from([1 << 20, 0, 16, 40, 100, -1, 1 << 40]))
    for end in range(0, len(buf) + 1, data.draw(st.integers(1, 7))):
        same_scan(buf, 0, end, limit, timestamp)
    for _ in range(10):
        pos = data.draw(st.integers(0, len(buf)))
        same_scan(bytearray(buf), pos, data.draw(st.integers(pos, len(buf))), limit, timestamp)


def test_scan_publishes_errors_match() -> None:
    good = _PUBLISH.encode_frame(b"t", 1, b"x")
    for topic in TOPICS:
        for payload in bad_publish_payloads(topic):
            buf = good + frame(5, payload)
            result = same_scan(buf, 0, len(buf), 1 << 20, 5)[1]
            assert len(result[0]) == 1 and result[2] is not None
    for message_type in range(12):
        for version in (0, 1, 2):
            buf = frame(message_type, b"\x00" * 24, version)
            same_scan(buf, 0, len(buf), 1 << 20, 5)
    big = frame(5, b"\x00" * 50)
    for limit in (49, 50, -1):
        error = same_scan(big[:8], 0, 8, limit, 5)[1][2]
        assert isinstance(error, FrameTooLarge) == (limit != 50)


# --------------------------------------------------------------- seeded volume


def _mutate(rng: random.Random, data: bytes) -> bytes:
    if not data:
        return bytes((rng.randrange(256),))
    buf = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        op = rng.randrange(6)
        at = rng.randrange(len(buf)) if buf else 0
        if op == 0 and buf:
            buf[at] = rng.randrange(256)
        elif op == 1 and buf:
            buf[at] = rng.choice([0x00, 0x80, 0xFF, 0x7F, 0x01, 0x02, 0x04, 0x40])
        elif op == 2:
            del buf[at:]
        elif op == 3:
            buf[at:at] = rng.choice([b"\x80", b"\xff" * 10, b"\x00", rng.randbytes(3)])
        elif op == 4 and buf:
            del buf[at:at + rng.randrange(1, 4)]
        else:
            buf += rng.randbytes(rng.randrange(1, 4))
    return bytes(buf)


def _random_messages(rng: random.Random, count: int, sparse: bool, first: int) -> list[Message]:
    stamps = [rng.randrange(1 << 64) for _ in range(rng.randrange(1, 3))]
    seq = first
    out = []
    for _ in range(count):
        value = rng.randbytes(rng.choice([0, 1, 5, 100, 127, 128, 300]))
        key = rng.choice([None, b"", rng.randbytes(rng.randrange(1, 20))])
        out.append(Message(value, key, rng.choice(stamps), seq))
        seq += 1 + (rng.choice([0, 0, 1, 1000]) if sparse and seq < 1 << 63 else 0)
    return out


def _random_chunk(rng: random.Random) -> tuple[bytes, int]:
    base = rng.choice([1, 1000, UINT64_MAX - 3000])
    parts = []
    seq = base
    for _ in range(rng.randrange(1, 4)):
        sparse = rng.random() < 0.4
        messages = _random_messages(rng, rng.choice([1, 3, 15, 16, 40]), sparse, seq)
        codec = rng.choice([Codec.NONE, Codec.SNAPPY])
        if parts and messages[-1].seq > UINT64_MAX:
            break
        parts.append(frame_bundle(encode_bundle(messages, codec=codec, sparse=sparse)))
        seq = messages[-1].seq + 1 + rng.choice([0, 0, 7])
    return b"".join(parts), base


def _timed(seed: int) -> Iterator[random.Random]:
    rng = random.Random(seed)
    deadline = time.monotonic() + VOLUME_SECONDS
    while time.monotonic() < deadline:
        yield rng


def test_volume_bundles() -> None:
    runs = 0
    for rng in _timed(0x5EED1):
        sparse = rng.random() < 0.5
        messages = _random_messages(rng, rng.choice([1, 2, 15, 16, 100, 1000]), sparse, 7)
        bundle = encode_bundle(messages, codec=rng.choice(list(Codec)), sparse=sparse)
        assert same_validate(bundle)[0] == "ok"
        for _ in range(5):
            same_validate(_mutate(rng, bundle), rng.choice([MAX, len(bundle) * 2]))
        runs += 1
    assert runs > 10


def test_volume_chunks() -> None:
    runs = 0
    for rng in _timed(0x5EED2):
        chunk, base = _random_chunk(rng)
        min_seq = rng.choice([0, base, base + 20, base + 5000])
        assert same_chunk(chunk, base, min_seq)[0] == "ok"
        same_chunk(chunk[:rng.randrange(len(chunk))], base, min_seq)
        for _ in range(5):
            same_chunk(_mutate(rng, chunk), base, min_seq,
                       max_bundle_size=500 if rng.random() < 0.1 else B.MAX_BUNDLE_SIZE)
        runs += 1
    assert runs > 10


def test_volume_streams() -> None:
    runs = 0
    for rng in _timed(0x5EED3):
        parts = []
        for _ in range(rng.randrange(1, 30)):
            roll = rng.random()
            if roll < 0.7:
                parts.append(_PUBLISH.encode_frame(rng.choice(TOPICS[:4]), rng.randrange(1 << 64),
                                                   rng.randbytes(rng.choice([0, 1, 128, 500]))))
            elif roll < 0.95:
                parts.append(frame(rng.choice([1, 3, 8]), rng.randbytes(rng.randrange(30))))
            else:
                parts.append(frame(5, rng.choice(bad_publish_payloads(rng.choice(TOPICS)))))
        buf = b"".join(parts)
        timestamp = rng.randrange(1 << 64)
        limit = 300 if rng.random() < 0.2 else 1 << 20
        same_scan(bytearray(buf), 0, len(buf), limit, timestamp)
        for _ in range(3):
            mutated = _mutate(rng, buf)
            same_scan(mutated, 0, rng.randrange(len(mutated) + 1), limit, timestamp)
        runs += 1
    assert runs > 10


def test_threads_agree() -> None:
    """Worker threads (Snappy releases the GIL) get the same answers as one thread."""
    rng = random.Random(0x7EAD)
    chunk, base = _random_chunk(rng)
    chunk += frame_bundle(encode_bundle(_random_messages(rng, 600, False, 0),
                                        codec=Codec.SNAPPY))
    expected = same_chunk(chunk, base)
    failures: list[object] = []

    def work() -> None:
        for _ in range(20):
            if outcome(B.decode_chunk, chunk, base) != expected:
                failures.append("differs")

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
