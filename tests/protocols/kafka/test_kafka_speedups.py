"""The compiled Kafka paths against their pure-Python references.

- Produce: :func:`records_to_bundles_py` (read every batch, then ``batch_to_bundle``) vs
  the compiled one-pass ``kafka_to_tank`` behind ``_records_to_bundles_native``;
- Fetch: :func:`kafka_sections_py` (``decode_chunk_py`` + ``_kafka_records``) vs the
  compiled ``kafka_sections``, and :func:`bundles_to_batches` on top of each, checked
  against batches built record by record with ``encode_batch``.

Both must give equal results, or a ``ProtocolError`` of the same class with the same
message. Inputs: hypothesis batches over every codec with null and empty keys and
values, 255- and 256-byte keys, headers, timestamp deltas of every size, wrong offset
deltas and every batch flag; the same cut at every byte and with records mutated (the
CRC recomputed, so the record parser is reached); seeded random volume.
"""

from __future__ import annotations

import random
import struct
import time
from collections.abc import Iterator
from typing import Any

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocols import native
from protocols.kafka import bundles as KB
from protocols.kafka.batch import (
    Compression,
    Record,
    RecordBatch,
    encode_batch,
    encode_records,
    read_batches,
)
from protocols.kafka.bundles import (
    DEFAULT_FETCH_CODECS,
    FETCH_GZIP_LEVEL,
    FetchCodecs,
    bundles_to_batches,
    kafka_sections_py,
    records_to_bundles_py,
)
from protocols.tank.bundle import Codec, decode_chunk_py
from tests.protocols.test_speedups import (
    BAD_CHUNKS,
    _mutate,
    _random_chunk,
    chunks,
    compiled,
    outcome,
)

SETTINGS = settings(max_examples=80, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
INT64_MAX = (1 << 63) - 1
INT64_MIN = -(1 << 63)


@pytest.fixture(autouse=True)
def _native_wrappers() -> Iterator[None]:
    # Point the *_native wrappers at the extension even under FIGTANK_PURE_PYTHON.
    saved = KB.speedups
    KB.speedups = compiled
    try:
        yield
    finally:
        KB.speedups = saved


def same(reference: Any, native_fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
    expected = outcome(reference, *args, **kwargs)
    if compiled is not None:
        got = outcome(native_fn, *args, **kwargs)
        assert got == expected, f"compiled {got!r} != reference {expected!r}"
    return expected


def same_produce(records: bytes, append_time: int | None = None,
                 max_batch_size: int = 1 << 28) -> tuple[Any, ...]:
    return same(records_to_bundles_py, KB._records_to_bundles_native, records,
                append_time=append_time, max_batch_size=max_batch_size)


def same_sections(chunk: Any, base_seq: int | None, **kw: Any) -> tuple[Any, ...]:
    return same(kafka_sections_py, KB._kafka_sections_native, chunk, base_seq, **kw)


def test_selected_functions() -> None:
    if native.speedups is None:
        assert KB.records_to_bundles is records_to_bundles_py
        assert KB.kafka_sections is kafka_sections_py
    else:
        assert KB.records_to_bundles is KB._records_to_bundles_native
        assert KB.kafka_sections is KB._kafka_sections_native


# ------------------------------------------------------------------------- produce

keys = st.one_of(st.none(), st.just(b""), st.binary(max_size=8), st.just(b"k" * 255),
                 st.just(b"k" * 256))
values = st.one_of(st.just(b""), st.binary(max_size=20), st.binary(min_size=120, max_size=300),
                   st.none() | st.just(b""))
headers = st.one_of(st.just(()), st.lists(st.tuples(st.binary(max_size=3),
                                                    st.none() | st.binary(max_size=3)),
                                          min_size=1, max_size=2).map(tuple))
ts_deltas = st.one_of(st.integers(0, 100), st.integers(-3, 3), st.integers(INT64_MIN, INT64_MAX),
                      st.sampled_from([INT64_MAX, INT64_MIN, -1, 1 << 40]))
base_stamps = st.one_of(st.integers(1_600_000_000_000, 1_800_000_000_000),
                        st.sampled_from([-1, 0, INT64_MAX, INT64_MIN, INT64_MAX - 5]))


@st.composite
def kafka_batches(draw: st.DrawFn) -> bytes:
    count = draw(st.integers(1, 20))
    clean = draw(st.booleans())  # mostly-valid batches reach the encoder
    records = []
    for i in range(count):
        records.append(Record(
            offset_delta=i if clean or draw(st.integers(0, 9)) else draw(st.integers(-2, 40)),
            timestamp_delta=draw(st.integers(0, 50)) if clean else draw(ts_deltas),
            key=draw(keys.filter(lambda k: k is None or len(k) <= 255)) if clean
            else draw(keys),
            value=draw(values.filter(lambda v: v is not None)) if clean else draw(values),
            headers=() if clean else draw(headers)))
    attributes = int(draw(st.sampled_from(Compression)))
    if not clean:
        attributes |= draw(st.sampled_from([0, 0, 0, 0x08, 0x10, 0x20]))
    batch = RecordBatch(base_offset=draw(st.integers(0, 1000)),
                        base_timestamp=draw(base_stamps),
                        max_timestamp=0,
                        last_offset_delta=count - 1 if draw(st.integers(0, 9)) else count,
                        records=records, attributes=attributes)
    return encode_batch(batch)


@pytest.mark.differential
@SETTINGS
@given(st.lists(kafka_batches(), min_size=1, max_size=3),
       st.sampled_from([None, 0, 1_700_000_000_000]))
def test_produce_batches(batches: list[bytes], append_time: int | None) -> None:
    records = b"".join(batches)
    result = same_produce(records, append_time)
    if result[0] == "ok":
        assert len(result[1]) == len(batches)
    same_produce(records, append_time, max_batch_size=len(batches[0]) - 1)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kafka_batches())
def test_produce_cut_at_every_byte(batch: bytes) -> None:
    assert same_produce(b"") == ("ok", [])
    for end in range(1, len(batch)):
        assert same_produce(batch[:end])[0] == "error"


def _recrc(batch: bytes | bytearray) -> bytes:
    """The batch with its CRC recomputed (so a mutated record reaches the record parser)."""
    out = bytearray(batch)
    if len(out) >= 21:
        struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return bytes(out)


def _fix_length(batch: bytes) -> bytes:
    out = bytearray(batch)
    if len(out) >= 12:
        struct.pack_into(">i", out, 8, len(out) - 12)
    return _recrc(out)


@pytest.mark.differential
@SETTINGS
@given(kafka_batches(), st.data())
def test_produce_records_mutated(batch: bytes, data: st.DataObject) -> None:
    plain = bytearray(batch)
    plain[22] &= 0xF8  # uncompressed: mutations land in the records themselves
    if len(plain) <= 61:
        return
    for _ in range(8):
        at = data.draw(st.integers(61, len(plain) - 1))
        byte = data.draw(st.sampled_from([0x00, 0x01, 0x02, 0x7F, 0x80, 0xFF, 0xFE,
                                          plain[at] ^ 0x40]))
        mutated = bytearray(plain)
        mutated[at] = byte
        same_produce(_recrc(mutated))
        # and with bytes inserted or removed (length fixed up)
        cut = data.draw(st.integers(61, len(plain)))
        same_produce(_fix_length(bytes(plain[:cut]) + bytes(plain[cut + 1:])))
        same_produce(_fix_length(bytes(plain[:cut]) + data.draw(st.binary(min_size=1,
                                                                           max_size=11))
                                 + bytes(plain[cut:])))


def _raw_batch(records: bytes, count: int, base_ts: int = 1_700_000_000_000,
               attributes: int = 0, last_delta: int | None = None) -> bytes:
    """A batch whose records section is given as raw bytes."""
    tail = struct.pack(">hiqqqhii", attributes, count - 1 if last_delta is None else last_delta,
                       base_ts, base_ts, -1, -1, -1, count) + records
    return struct.pack(">qiibI", 0, 49 + len(records), -1, 2, crc32c.crc32c(tail)) + tail


def _zz(value: int) -> bytes:
    raw = (value << 1) ^ (value >> 200)
    out = bytearray()
    while raw >= 0x80:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


def _record(body: bytes) -> bytes:
    return _zz(len(body)) + body


EDGE_RECORDS = [
    # attributes, ts delta, offset delta, key, value, headers
    _record(b"\x00" + _zz(0) + _zz(0) + _zz(-1) + _zz(3) + b"abc" + _zz(0)),
    _record(b"\x00" + _zz(0) + _zz(0) + _zz(0) + _zz(0) + _zz(0)),  # empty key and value
    _record(b"\x00" + _zz(0) + _zz(0) + _zz(255) + b"k" * 255 + _zz(0) + _zz(0)),
    _record(b"\x00" + _zz(0) + _zz(0) + _zz(256) + b"k" * 256 + _zz(0) + _zz(0)),
    _record(b"\x00" + _zz(0) + _zz(0) + _zz(-1) + _zz(-1) + _zz(0)),  # null value
    _record(b"\x00" + _zz(0) + _zz(0) + _zz(-2) + _zz(0) + _zz(0)),  # key length -2
    _record(b"\x00" + _zz(0) + _zz(0) + _zz(-1) + _zz(-5) + _zz(0)),
    _record(b"\x00" + _zz(0) + _zz(0) + _zz(-1) + _zz(0) + _zz(1) + _zz(1) + b"h" + _zz(-1)),
    _record(b"\x00" + _zz(0) + _zz(0) + _zz(-1) + _zz(0) + _zz(-1)),  # header count -1
    _record(b"\x00" + _zz(0) + _zz(0) + _zz(-1) + _zz(0) + _zz(1) + _zz(-1) + _zz(0)),
    _record(b"\x00" + _zz(0) + _zz(0) + _zz(-1) + _zz(0) + _zz(1) + _zz(0) + _zz(-3)),
    _record(b"\x00" + _zz(0) + _zz(0) + _zz(-1) + _zz(0) + _zz(1) + _zz(0) + _zz(9)),
    _record(b"\x00" + _zz(INT64_MAX) + _zz(0) + _zz(-1) + _zz(0) + _zz(0)),
    _record(b"\x00" + _zz(INT64_MIN) + _zz(0) + _zz(-1) + _zz(0) + _zz(0)),
    _record(b"\x00" + _zz(INT64_MAX + 1) + _zz(0) + _zz(-1) + _zz(0) + _zz(0)),  # 10 bytes
    _record(b"\x00" + _zz(1 << 70) + _zz(0) + _zz(-1) + _zz(0) + _zz(0)),  # 11 bytes
    _record(b"\x00" + b"\x80\x00" + _zz(0) + _zz(-1) + _zz(0) + _zz(0)),  # over-long zero
    _record(b"\x00" + _zz(0) + _zz(1 << 31) + _zz(-1) + _zz(0) + _zz(0)),  # over int32
    _record(b"\x00" + _zz(0) + _zz(-(1 << 31)) + _zz(-1) + _zz(0) + _zz(0)),
    _record(b"\x00" + _zz(0) + b"\xff\xff\xff\xff\xff\x01" + _zz(-1) + _zz(0) + _zz(0)),
    _record(b"\x00" + _zz(-1_700_000_000_001) + _zz(0) + _zz(-1) + _zz(0) + _zz(0)),
    _record(b"\x00" + _zz(-1_700_000_000_000) + _zz(0) + _zz(-1) + _zz(0) + _zz(0)),
    _record(b"\x00" + _zz(0) + _zz(0) + _zz(-1) + _zz(2) + b"ab" + _zz(0) + b"x"),  # long
    b"\x0a\x00\x00\x00\x01\x00\x00",  # length over its fields
    b"\x0b", b"\xff", b"\x80", b"\xff\xff\xff\xff\x0f", b"\x01",
]


@pytest.mark.parametrize("base_ts", [1_700_000_000_000, -1, 0, INT64_MAX, INT64_MIN])
@pytest.mark.parametrize("attributes", [0, 0x08, 0x10, 0x20])
@pytest.mark.parametrize("append_time", [None, 5])
def test_produce_edge_records(base_ts: int, attributes: int, append_time: int | None) -> None:
    ok = EDGE_RECORDS[0]
    for rec in EDGE_RECORDS:
        for records, count in ((rec, 1), (ok + rec, 2), (rec + ok, 2), (rec, 2), (ok, 2),
                               (ok * 3, 2), (b"", 0), (b"", 1)):
            same_produce(_raw_batch(records, count, base_ts, attributes), append_time)
        same_produce(_raw_batch(rec, 1, base_ts, attributes, last_delta=5), append_time)


def test_produce_key_and_value_edges_become_tank_messages() -> None:
    """Null keys stay null, empty keys and values empty, 255-byte keys are kept."""
    records = [Record(i, i * 3, key, value) for i, (key, value) in enumerate(
        [(None, b""), (b"", b"v"), (b"k" * 255, b"x" * 300), (None, b"y" * 5000)])]
    for codec in Compression:
        data = encode_batch(RecordBatch(9, 1_700_000_000_000, 0, 3, records, int(codec)))
        result = same_produce(data)
        assert result[0] == "ok"
        from protocols.tank.bundle import decode_bundle
        messages = decode_bundle(result[1][0], 1)
        assert [(m.key, m.value, m.timestamp) for m in messages] == [
            (r.key, r.value, 1_700_000_000_000 + r.timestamp_delta) for r in records]


def test_produce_append_time_checked() -> None:
    batch = _raw_batch(EDGE_RECORDS[0], 1)
    for bad in (-1, 1 << 63):
        for fn in (records_to_bundles_py, KB._records_to_bundles_native):
            if fn is KB._records_to_bundles_native and compiled is None:
                continue
            with pytest.raises(ValueError):
                fn(batch, append_time=bad)


# --------------------------------------------------------------------------- fetch


def _expected_batches(chunk: bytes, base_seq: int | None, codecs: FetchCodecs) -> bytes:
    """Batches built record by record with ``encode_batch`` (the old Fetch path)."""
    from protocols.tank.bundle import iter_framed_bundles

    decoded = decode_chunk_py(chunk, base_seq)
    out, at = [], 0
    for _, _, info in iter_framed_bundles(chunk, 0, decoded.consumed):
        mine = decoded.messages[at:at + info.msg_count]
        at += info.msg_count
        first, base_ts = mine[0].seq, mine[0].timestamp
        codec = codecs[info.codec]
        records = [Record(m.seq - first, m.timestamp - base_ts, m.key, m.value) for m in mine]
        batch = RecordBatch(first - 1, base_ts, max(m.timestamp for m in mine),
                            mine[-1].seq - first, records, int(codec))
        out.append(encode_batch(batch, encode_records(records), len(records),
                                gzip_level=FETCH_GZIP_LEVEL))
    return b"".join(out)


@pytest.mark.differential
@SETTINGS
@given(chunks(), st.sampled_from([bytes, bytearray, memoryview]))
def test_fetch_sections(case: tuple[bytes, int | None, list[int]], kind: type) -> None:
    chunk, base_seq, _ = case
    same_sections(kind(chunk), base_seq)
    for end in (len(chunk) - 1, len(chunk) // 2, 1):
        same_sections(chunk[:end], base_seq)


@pytest.mark.differential
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chunks(max_count=5), st.data())
def test_fetch_sections_cut_and_mutated(case: tuple[bytes, int | None, list[int]],
                                        data: st.DataObject) -> None:
    chunk, base_seq, _ = case
    for end in range(len(chunk) + 1):
        same_sections(chunk[:end], base_seq)
    for _ in range(6):
        at = data.draw(st.integers(0, len(chunk) - 1))
        byte = data.draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF, chunk[at] ^ 0x40]))
        same_sections(chunk[:at] + bytes((byte,)) + chunk[at + 1:], base_seq)
    same_sections(chunk, base_seq, max_bundle_size=data.draw(st.integers(1, 300)))


@pytest.mark.parametrize(("chunk", "base_seq"), BAD_CHUNKS)
def test_fetch_sections_malformed(chunk: bytes, base_seq: int | None) -> None:
    same_sections(chunk, base_seq)


@pytest.mark.differential
@SETTINGS
@given(chunks(), st.one_of(st.just(DEFAULT_FETCH_CODECS),
                           st.tuples(st.sampled_from(Compression),
                                     st.sampled_from(Compression))))
def test_fetch_batches_match_record_by_record(case: tuple[bytes, int | None, list[int]],
                                              codecs: FetchCodecs) -> None:
    """bundles_to_batches, over the compiled and the pure sections, gives the bytes of
    batches encoded record by record (or the same error), for every pair of codecs the
    plain and the Snappy bundles may be served in."""
    chunk, base_seq, seqs = case
    results = []
    for sections in (kafka_sections_py, KB._kafka_sections_native):
        if sections is KB._kafka_sections_native and compiled is None:
            continue
        saved = KB.kafka_sections
        KB.kafka_sections = sections
        try:
            results.append(outcome(bundles_to_batches, chunk, base_seq, codecs=codecs))
        finally:
            KB.kafka_sections = saved
    got = results[0]
    if got[0] == "error":
        assert all(r == got for r in results)
        return
    for other in results[1:]:
        assert other[0] == "ok"
        assert other[1].records == got[1].records
        assert (other[1].consumed, other[1].next_seq, other[1].partial) == (
            got[1].consumed, got[1].next_seq, got[1].partial)
    assert got[1].records == _expected_batches(chunk, base_seq, codecs)
    run = read_batches(got[1].records)
    assert [b.base_offset + r.offset_delta + 1 for b in run.batches for r in b.records] == seqs


# --------------------------------------------------------------------------- volume


def _timed(seed: int, seconds: float = 1.5) -> Iterator[random.Random]:
    rng = random.Random(seed)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        yield rng


def test_volume_produce() -> None:
    runs = 0
    for rng in _timed(0x4AFC1):
        count = rng.choice([1, 2, 15, 16, 100, 700])
        records = [Record(i, rng.choice([0, 1, rng.randrange(1 << 20)]),
                          rng.choice([None, b"", rng.randbytes(rng.randrange(1, 40))]),
                          rng.randbytes(rng.choice([0, 1, 100, 127, 128, 1000])))
                   for i in range(count)]
        codec = rng.choice(list(Compression))
        data = encode_batch(RecordBatch(rng.randrange(1000), 1_700_000_000_000, 0,
                                        count - 1, records, int(codec)))
        assert same_produce(data)[0] == "ok"
        plain = encode_batch(RecordBatch(0, 1_700_000_000_000, 0, count - 1, records))
        for _ in range(4):
            same_produce(_fix_length(_mutate(rng, plain)))
        runs += 1
    assert runs > 5


def test_volume_fetch() -> None:
    runs = 0
    for rng in _timed(0x4AFC2):
        chunk, base = _random_chunk(rng)
        same_sections(chunk, base)
        same_sections(chunk[:rng.randrange(len(chunk))], base)
        for _ in range(4):
            same_sections(_mutate(rng, chunk), base)
        runs += 1
    assert runs > 5


def test_fetch_plain_bundles_stay_uncompressed_and_snappy_ones_as_asked() -> None:
    from protocols.tank.bundle import Message, encode_bundle, frame_bundle

    messages = [Message(b"v%d" % i, None, 1_700_000_000_000 + i) for i in range(600)]
    for codecs in (DEFAULT_FETCH_CODECS, *((Compression.NONE, c) for c in Compression)):
        for codec in Codec:
            chunk = frame_bundle(encode_bundle(messages, codec=codec))
            got = bundles_to_batches(chunk, 1, codecs=codecs)
            run = read_batches(got.records)
            assert [b.compression for b in run.batches] == [codecs[codec]]
            assert [r.value for r in run.batches[0].records] == [m.value for m in messages]
    assert DEFAULT_FETCH_CODECS == (Compression.NONE, Compression.NONE)
