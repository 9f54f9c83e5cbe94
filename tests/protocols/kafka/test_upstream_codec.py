"""The upstream Kafka client's codec (protocols.kafka.upstream_codec): the compiled
twins (``tank_to_kafka_batch``, ``kafka_batches_to_bundles``) against their pure-Python
references, and both against independent readers and writers.

- Produce: Tank bundles (plain, Snappy, Tank's timestamp rules, 1..5000 messages, every
  Kafka codec) -> one batch, read back by ``read_batches`` and by kafka-python's
  ``DefaultRecordBatch``; malformed bundles give the same error from both twins.
- Fetch: batches written by ``encode_batch`` and by kafka-python's builder (every codec,
  gaps in offset deltas, control and LogAppendTime batches, headers, null values, keys
  over 255 bytes, a cut last batch, ``from_offset`` inside a batch, ``after_seq``
  continuing or not) -> bundles, decoded by ``decode_chunk`` and compared with the
  records as read by ``read_batches``; cut and mutated input gives the same error.

The twins must agree on the result, or raise the same class with the same message.
"""

from __future__ import annotations

import itertools
import random
import struct
from collections.abc import Iterator, Sequence
from typing import Any

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from protocols import native
from protocols.errors import ProtocolError
from protocols.kafka import upstream_codec as U
from protocols.kafka.batch import (
    Compression,
    CorruptBatch,
    InvalidRecord,
    Record,
    RecordBatch,
    encode_batch,
    read_batches,
)
from protocols.kafka.upstream_codec import (
    FetchedBundles,
    bundles_to_record_batch,
    bundles_to_record_batch_py,
    record_batches_to_bundles,
    record_batches_to_bundles_py,
)
from protocols.tank.bundle import (
    Codec,
    Message,
    decode_bundle,
    decode_chunk,
    encode_bundle,
    iter_framed_bundles,
)
from tests.protocols.test_speedups import _mutate

compiled = native.built("protocols._speedups")
SETTINGS = settings(max_examples=120, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
TS = 1_700_000_000_000
NOW = 1_800_000_000_000
INT64_MAX = (1 << 63) - 1
INT64_MIN = -(1 << 63)
UINT64_MAX = (1 << 64) - 1
STAMP = {"producer_id": 4242, "producer_epoch": 3, "base_sequence": 17}


@pytest.fixture(autouse=True)
def _native_wrappers() -> Iterator[None]:
    # The *_native wrappers call the module's ``speedups``: the extension, even when
    # FIGTANK_PURE_PYTHON made the package ignore it.
    saved = U.speedups
    U.speedups = compiled
    try:
        yield
    finally:
        U.speedups = saved


def outcome(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
    """``("ok", result)`` or ``("error", class, message)``."""
    try:
        return ("ok", fn(*args, **kwargs))
    except (ProtocolError, ValueError) as exc:
        return ("error", type(exc), str(exc))


def _comparable(result: tuple[Any, ...]) -> tuple[Any, ...]:
    """An outcome whose fetch error (an exception: compared by identity) is its class
    and text."""
    if result[0] == "ok" and isinstance(result[1], FetchedBundles):
        got = result[1]
        error = None if got.error is None else (type(got.error), str(got.error))
        return ("ok", got.bundles, got.next_offset, error)
    return result


def same(reference: Any, native_fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
    expected = outcome(reference, *args, **kwargs)
    if compiled is not None:
        got = outcome(native_fn, *args, **kwargs)
        assert _comparable(got) == _comparable(expected), (
            f"compiled {got!r} != reference {expected!r}")
    return expected


def produce(bundles: Sequence[bytes | memoryview], now_ms: int = NOW,
            compression: Compression = Compression.NONE, **stamp: int) -> tuple[Any, ...]:
    kwargs: dict[str, Any] = {**STAMP, **stamp, "now_ms": now_ms, "compression": compression}
    return same(bundles_to_record_batch_py, U._bundles_to_record_batch_native, bundles,
                **kwargs)


def fetch(records: bytes | memoryview, from_offset: int = 0, after_seq: int | None = None,
          **kw: Any) -> tuple[Any, ...]:
    return same(record_batches_to_bundles_py, U._record_batches_to_bundles_native, records,
                from_offset=from_offset, after_seq=after_seq, **kw)


def test_the_compiled_twins_are_used_when_built() -> None:
    if native.speedups is None:
        assert U._produce is bundles_to_record_batch_py
        assert U._fetch is record_batches_to_bundles_py
    else:
        assert U._produce is U._bundles_to_record_batch_native
        assert U._fetch is U._record_batches_to_bundles_native


# ------------------------------------------------------------------------------ produce


def _expected_records(bundles: Sequence[bytes], now_ms: int) -> list[tuple[Any, ...]]:
    """``(timestamp, key, value)`` of every message, timestamp 0 taken as now."""
    out = []
    for b in bundles:
        out += [(m.timestamp or now_ms, m.key, m.value) for m in decode_bundle(b, 1)]
    return out


def check_batch(batch: bytes, count: int, bundles: Sequence[bytes], now_ms: int,
                compression: Compression, stamp: dict[str, int] = STAMP) -> None:
    """The batch holds the bundles' messages, as read by figtank's reader and by
    kafka-python's."""
    expected = _expected_records(bundles, now_ms)
    run = read_batches(batch)
    assert run.consumed == len(batch) and run.partial is None
    [b] = run.batches
    assert count == len(expected) == len(b.records)
    assert (b.base_offset, b.partition_leader_epoch, b.attributes, b.last_offset_delta) == (
        0, -1, int(compression), count - 1)
    assert (b.producer_id, b.producer_epoch, b.base_sequence) == (
        stamp["producer_id"], stamp["producer_epoch"], stamp["base_sequence"])
    assert b.base_timestamp == expected[0][0]
    assert b.max_timestamp == max(e[0] for e in expected)
    assert [(r.offset_delta, b.base_timestamp + r.timestamp_delta, r.key, r.value, r.headers)
            for r in b.records] == [(i, *e, ()) for i, e in enumerate(expected)]
    theirs = DefaultRecordBatch(batch)
    assert theirs.validate_crc() and theirs.compression_type == compression
    assert [(r.offset, r.timestamp, r.key, r.value) for r in theirs] == [
        (i, *e) for i, e in enumerate(expected)]


timestamps = st.one_of(st.just(0), st.just(TS), st.integers(0, INT64_MAX),
                       st.sampled_from([1, INT64_MAX, INT64_MAX + 1, UINT64_MAX]))
keys = st.one_of(st.none(), st.just(b""), st.binary(max_size=8), st.just(b"k" * 255))
values = st.one_of(st.just(b""), st.binary(max_size=20),
                   st.sampled_from([b"v" * n for n in (127, 128, 16_383, 16_384)]))


@st.composite
def tank_bundles(draw: st.DrawFn) -> list[bytes]:
    """1-4 plain bundles, codec none or Snappy; timestamps often repeated."""
    out = []
    for _ in range(draw(st.integers(1, 4))):
        messages = []
        ts = draw(timestamps)
        for _ in range(draw(st.integers(1, 40))):
            if draw(st.integers(0, 3)) == 0:
                ts = draw(timestamps)
            messages.append(Message(draw(values), draw(keys), ts))
        out.append(encode_bundle(messages, codec=draw(st.sampled_from(Codec))))
    return out


stamps = st.fixed_dictionaries({
    "producer_id": st.one_of(st.just(-1), st.integers(0, INT64_MAX)),
    "producer_epoch": st.one_of(st.just(-1), st.integers(0, (1 << 15) - 1)),
    "base_sequence": st.one_of(st.just(-1), st.integers(0, (1 << 31) - 1)),
})


@pytest.mark.differential
@SETTINGS
@given(tank_bundles(), stamps, st.sampled_from(Compression),
       st.sampled_from([0, 1, NOW, INT64_MAX]))
def test_produce_twins_agree_and_read_back(bundles: list[bytes], stamp: dict[str, int],
                                           compression: Compression, now_ms: int) -> None:
    result = produce(bundles, now_ms, compression, **stamp)
    stamped = [ts for ts, _, _ in _expected_records(bundles, now_ms)]
    if max(stamped) > INT64_MAX:
        assert result[0] == "error" and result[1] is ValueError
        return
    assert result[0] == "ok"
    batch, count = result[1]
    check_batch(batch, count, bundles, now_ms, compression, stamp)


def test_produce_memoryviews_and_bytes_alike() -> None:
    bundles = [encode_bundle([Message(b"a", b"k", TS), Message(b"b", None, TS + 1)]),
               encode_bundle([Message(b"c" * 300, None, 0)], codec=Codec.SNAPPY)]
    got = produce([memoryview(b) for b in bundles])
    assert got == produce(bundles)
    check_batch(*got[1], bundles, NOW, Compression.NONE)


def test_produce_follows_tanks_timestamp_rules() -> None:
    """A bundle's first message taking the 'last specified' timestamp has timestamp 0
    (Tank's decoder starts each bundle at 0): it becomes now. The next bundle does not
    inherit the previous one's timestamp."""
    # count 3 inline; msg 1: UseLastSpecifiedTS, no key, "a"; msg 2: own ts, key "k", "b";
    # msg 3: UseLastSpecifiedTS, "c".
    first = (bytes((3 << 2, 2, 1)) + b"a" + bytes((1,)) + struct.pack("<Q", TS) + b"\x01k"
             + b"\x01b" + bytes((2, 1)) + b"c")
    second = bytes((1 << 2, 2, 1)) + b"d"
    assert [m.timestamp for m in decode_bundle(first, 1)] == [0, TS, TS]
    result = produce([first, second])
    assert result[0] == "ok"
    batch, count = result[1]
    [b] = read_batches(batch).batches
    assert [(b.base_timestamp + r.timestamp_delta, r.key, r.value) for r in b.records] == [
        (NOW, None, b"a"), (TS, b"k", b"b"), (TS, None, b"c"), (NOW, None, b"d")]
    assert (b.base_timestamp, b.max_timestamp) == (NOW, NOW)
    check_batch(batch, count, [first, second], NOW, Compression.NONE)


@pytest.mark.parametrize("count", [1, 15, 16, 1000, 5000])
@pytest.mark.parametrize("codec", list(Codec), ids=lambda c: c.name)
def test_produce_volume(count: int, codec: Codec) -> None:
    rng = random.Random(count * 2 + codec)
    messages = [Message(rng.randbytes(rng.choice([0, 1, 100, 200])),
                        rng.choice([None, b"", b"key-%d" % i]), TS + i // 7)
                for i in range(count)]
    cut = sorted({0, count, *rng.sample(range(count + 1), min(3, count + 1))})
    bundles = [encode_bundle(messages[a:b], codec=codec) for a, b in itertools.pairwise(cut)]
    for compression in (Compression.NONE, Compression.LZ4):
        result = produce(bundles, compression=compression)
        assert result[0] == "ok"
        check_batch(*result[1], bundles, NOW, compression)


def test_produce_refusals_are_the_same() -> None:
    plain = encode_bundle([Message(b"x", None, TS)])
    sparse = encode_bundle([Message(b"x", None, TS, seq=5)], sparse=True)
    for bundles, kwargs, match in [
        ([], {}, "at least one bundle"),
        ([plain, sparse], {}, "sparse bundle"),
        ([plain], {"producer_id": 1 << 63}, "producer id"),
        ([plain], {"producer_epoch": 1 << 15}, "producer epoch"),
        ([plain], {"base_sequence": -(1 << 31) - 1}, "base sequence"),
        ([plain], {"now_ms": -1}, "now_ms"),
        ([plain], {"compression": 5}, "5"),
        ([encode_bundle([Message(b"x", None, INT64_MAX + 1)])], {}, "over Kafka's int64"),
    ]:
        result = produce(bundles, **kwargs)
        assert result[:2] == ("error", ValueError), (bundles, kwargs, result)
        assert match in result[2]


def test_produce_malformed_bundles_are_the_same() -> None:
    """Every cut and random mutations of good bundles: the same bundle error (or the
    same batch), as decode_bundle would say."""
    rng = random.Random(35)
    good = encode_bundle([Message(b"v%d" % i * 20, b"k" if i % 2 else None, TS + i // 3)
                          for i in range(20)])
    snappy = encode_bundle([Message(b"s" * 50, None, TS)] * 30, codec=Codec.SNAPPY)
    seen = set()
    for base in (good, snappy):
        for end in range(len(base)):
            seen.add(produce([good, base[:end]])[0])
        for _ in range(400):
            result = produce([base, _mutate(rng, base)])
            seen.add(result[0])
            if result[0] == "error":
                assert issubclass(result[1], (ProtocolError, ValueError))
    assert seen == {"ok", "error"}


# -------------------------------------------------------------------------------- fetch


def kept_messages(records: bytes, from_offset: int) -> list[tuple[int, int, Any, bytes]]:
    """``(seq, timestamp, key, value)`` of every record a fetch keeps, by the rules,
    from ``read_batches`` (up to a key over 255 bytes)."""
    out = []
    for b in read_batches(records).batches:
        if b.control:
            continue
        for r in b.records:
            offset = b.base_offset + r.offset_delta
            if offset < from_offset:
                continue
            if r.key is not None and len(r.key) > 255:
                return out
            ts = b.max_timestamp if b.log_append_time else b.base_timestamp + r.timestamp_delta
            out.append((offset + 1, max(ts, 0), r.key, b"" if r.value is None else r.value))
    return out


def check_fetch(records: bytes, from_offset: int, after_seq: int | None,
                got: FetchedBundles) -> None:
    """The bundles decode (as one chunk) to exactly the records kept, each bundle plain
    exactly where the rule says, and next_offset is right."""
    chunk = b"".join(b.framed for b in got.bundles)
    base = got.bundles[0].first_seq if got.bundles and got.bundles[0].plain else None
    decoded = decode_chunk(chunk, base).messages
    assert [(m.seq, m.timestamp, m.key, m.value) for m in decoded] == kept_messages(
        records, from_offset)
    previous = after_seq
    at = 0
    for b in got.bundles:
        mine = decoded[at:at + b.count]
        at += b.count
        assert (b.first_seq, b.last_seq) == (mine[0].seq, mine[-1].seq)
        consecutive = b.last_seq - b.first_seq == b.count - 1
        assert b.plain == (consecutive and (previous is None or b.first_seq == previous + 1))
        [(_, length, info)] = iter_framed_bundles(b.framed)
        assert length == len(b.framed) and info.sparse != b.plain and info.codec == Codec.NONE
        previous = b.last_seq
    run = read_batches(records)
    if got.error is None:
        ends = [b.base_offset + b.last_offset_delta + 1 for b in run.batches]
        assert got.next_offset == max([from_offset, *ends])
    else:
        assert isinstance(got.error, InvalidRecord) and "key of" in str(got.error)
        assert got.next_offset == int(str(got.error).split()[3].rstrip(":"))


fetch_keys = st.one_of(st.none(), st.just(b""), st.binary(max_size=6), st.just(b"k" * 255),
                       st.just(b"k" * 256))
fetch_values = st.one_of(st.none(), st.just(b""), st.binary(max_size=20),
                         st.just(b"v" * 200))
headers = st.one_of(st.just(()), st.lists(st.tuples(st.binary(max_size=3),
                                                    st.none() | st.binary(max_size=3)),
                                          min_size=1, max_size=2).map(tuple))
ts_deltas = st.one_of(st.integers(0, 100), st.integers(-3, 3),
                      st.integers(INT64_MIN, INT64_MAX),
                      st.sampled_from([INT64_MAX, INT64_MIN, -1]))
base_stamps = st.one_of(st.integers(TS, TS + 1000),
                        st.sampled_from([-1, 0, INT64_MAX, INT64_MIN, INT64_MAX - 5]))


@st.composite
def fetched_records(draw: st.DrawFn) -> tuple[bytes, int, int | None]:
    """``(records, from_offset, after_seq)``: 1-4 batches at increasing offsets, gaps
    between and inside them, control, transactional and LogAppendTime ones, every codec;
    maybe a cut batch at the end."""
    offset = draw(st.integers(0, 1000))
    first = offset
    parts = []
    for _ in range(draw(st.integers(1, 4))):
        count = draw(st.integers(0, 12))
        gappy = draw(st.integers(0, 3)) == 0
        records = []
        delta = 0
        for _ in range(count):
            records.append(Record(delta, draw(ts_deltas), draw(fetch_keys),
                                  draw(fetch_values), draw(headers)))
            delta += draw(st.integers(1, 5)) if gappy else 1
        last = delta - 1 + draw(st.sampled_from([0, 0, 0, 3]))  # compaction keeps the last
        attributes = int(draw(st.sampled_from(Compression))) | draw(
            st.sampled_from([0, 0, 0, 0x08, 0x10, 0x20]))
        parts.append(encode_batch(RecordBatch(
            offset, draw(base_stamps), draw(base_stamps), last, records, attributes)))
        offset += last + 1 + draw(st.sampled_from([0, 0, 1, 9]))
    records = b"".join(parts)
    if draw(st.booleans()):
        records += parts[-1][:draw(st.integers(1, len(parts[-1]) - 1))]
    from_offset = draw(st.one_of(st.just(0), st.integers(first, offset + 1)))
    after_seq = draw(st.one_of(st.none(), st.just(from_offset), st.integers(0, offset + 2)))
    return records, from_offset, after_seq


@pytest.mark.differential
@SETTINGS
@given(fetched_records())
def test_fetch_twins_agree_and_decode(case: tuple[bytes, int, int | None]) -> None:
    records, from_offset, after_seq = case
    result = fetch(records, from_offset, after_seq)
    assert result[0] == "ok", result
    check_fetch(records, from_offset, after_seq, result[1])
    again = fetch(memoryview(records), from_offset, after_seq)
    assert _comparable(again) == _comparable(result)


@pytest.mark.differential
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fetched_records())
def test_fetch_cut_at_every_byte(case: tuple[bytes, int, int | None]) -> None:
    """A response cut anywhere: the whole batches before the cut, next_offset stopping
    before the cut one."""
    records, from_offset, after_seq = case
    # The oracle reads each prefix ending at a batch's end; a cut inside a batch must
    # give what the prefix up to that batch's start gave (the twins still read them all).
    boundaries = {0}
    pos = 0
    while len(records) - pos >= 12:
        pos += 12 + struct.unpack_from(">i", records, pos + 8)[0]
        boundaries.add(min(pos, len(records) + 1))
    at_boundary: tuple[Any, ...] = ()
    for end in range(len(records) + 1):
        result = fetch(records[:end], from_offset, after_seq)
        assert result[0] == "ok"
        if end in boundaries:
            check_fetch(records[:end], from_offset, after_seq, result[1])
            at_boundary = _comparable(result)
        else:
            assert _comparable(result) == at_boundary, end


def _recrc(records: bytes | bytearray) -> bytes:
    """``records`` with the first batch's CRC recomputed (so that a mutation in it
    reaches the record parser)."""
    out = bytearray(records)
    if len(out) >= 21:
        end = 12 + struct.unpack_from(">i", out, 8)[0]
        struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:max(end, 21)])))
    return bytes(out)


@pytest.mark.differential
@SETTINGS
@given(fetched_records(), st.data())
def test_fetch_mutated_records_are_the_same(case: tuple[bytes, int, int | None],
                                            data: st.DataObject) -> None:
    """Mutated bytes, the CRC recomputed or not (an uncompressed first batch, so that
    the record parser is reached): the same bundles or the same error."""
    records, from_offset, after_seq = case
    plain = bytearray(records)
    plain[22] &= 0xF8
    plain = bytearray(_recrc(plain))
    for _ in range(6):
        at = data.draw(st.integers(0, len(plain) - 1))
        mutated = bytearray(plain)
        mutated[at] = data.draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF,
                                                 plain[at] ^ 0x40]))
        fetch(bytes(mutated), from_offset, after_seq)
        fetch(_recrc(mutated), from_offset, after_seq)


def _raw_batch(records: bytes, count: int, base_offset: int = 0, base_ts: int = TS,
               attributes: int = 0, last_delta: int | None = None) -> bytes:
    tail = struct.pack(">hiqqqhii", attributes, count - 1 if last_delta is None else last_delta,
                       base_ts, base_ts, -1, -1, -1, count) + records
    return struct.pack(">qiibI", base_offset, 49 + len(records), -1, 2,
                       crc32c.crc32c(tail)) + tail


def _zz(value: int) -> bytes:
    raw = (value << 1) ^ (value >> 200)
    out = bytearray()
    while raw >= 0x80:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


def _record(delta: int, body: bytes = _zz(-1) + _zz(1) + b"v" + _zz(0)) -> bytes:
    inner = b"\x00" + _zz(0) + _zz(delta) + body
    return _zz(len(inner)) + inner


@pytest.mark.parametrize(("records", "count", "last_delta", "base_offset", "message"), [
    (_record(0) + _record(0), 2, 1, 0, "record offset delta 0 after 0"),
    (_record(1) + _record(0), 2, 1, 0, "record offset delta 0 after 1"),
    (_record(-1), 1, 0, 0, "record offset delta -1 after -1"),
    (_record(0) + _record(2), 2, 1, 0, "past the batch's lastOffsetDelta 1"),
    (_record(0), 1, 0, -1, "base offset -1 is negative"),
    (_record(0), 1, 0, INT64_MIN, "is negative"),
    (_record(0) + b"\x00", 1, 0, 0, "1 bytes after the batch's 1 records"),
    (_record(0), 2, 1, 0, "batch claims 2 records in"),
])
def test_fetch_corrupt_batches(records: bytes, count: int, last_delta: int,
                               base_offset: int, message: str) -> None:
    result = fetch(_raw_batch(records, count, base_offset, last_delta=last_delta))
    assert result[:2] == ("error", CorruptBatch) and message in result[2], result


def test_fetch_overlapping_batches_are_corrupt() -> None:
    one = _raw_batch(_record(0) + _record(1), 2, base_offset=10)
    result = fetch(one + _raw_batch(_record(0), 1, base_offset=11))
    assert result[:2] == ("error", CorruptBatch) and "starts before" in result[2]
    ok = fetch(one + _raw_batch(_record(0), 1, base_offset=12))
    assert ok[0] == "ok" and ok[1].next_offset == 13


def test_fetch_other_batch_errors_are_open_batchs() -> None:
    good = _raw_batch(_record(0), 1)
    bad_crc = bytearray(good)
    bad_crc[-1] ^= 1
    old_magic = bytearray(good)
    old_magic[16] = 1
    unknown_codec = bytearray(good)
    unknown_codec[22] |= 5
    for records, name in [(bytes(bad_crc), "CorruptBatch"), (bytes(old_magic), "Magic"),
                          (_recrc(unknown_codec), "UnsupportedCompression"),
                          (good[:8] + struct.pack(">i", 48) + good[12:], "CorruptBatch")]:
        result = fetch(records)
        assert result[0] == "error" and name in result[1].__name__, result
    assert fetch(good[:16])[1] == FetchedBundles([], 0, None)  # a cut header
    big = fetch(encode_batch(RecordBatch(0, TS, TS, 0, [Record(0, 0, None, b"x" * 1000)],
                                         int(Compression.ZSTD))), max_decompressed=100)
    assert big[0] == "error" and "limit" in big[2]
    assert fetch(b"", from_offset=-1)[:2] == ("error", ValueError)


def test_fetch_maps_what_tank_can_hold() -> None:
    """Headers dropped, null values empty, timestamps -1 (and any negative) 0, keys
    null and empty kept apart, LogAppendTime batches all at the max timestamp."""
    records = [Record(0, 0, None, None, ((b"h", b"v"),)), Record(1, 5, b"", b"a"),
               Record(2, -TS - 7, b"k", b"b")]
    data = (encode_batch(RecordBatch(0, TS, TS + 5, 2, records))
            + encode_batch(RecordBatch(3, -1, TS + 9, 2, records, attributes=0x08))
            + encode_batch(RecordBatch(6, -1, -1, 0, [Record(0, 0, None, b"c")])))
    result = fetch(data)
    assert result[0] == "ok"
    got = result[1]
    assert got.error is None and got.next_offset == 7
    assert [b.plain for b in got.bundles] == [True, True, True]
    messages = decode_chunk(b"".join(b.framed for b in got.bundles), 1).messages
    assert [(m.seq, m.timestamp, m.key, m.value) for m in messages] == [
        (1, TS, None, b""), (2, TS + 5, b"", b"a"), (3, 0, b"k", b"b"),
        (4, TS + 9, None, b""), (5, TS + 9, b"", b"a"), (6, TS + 9, b"k", b"b"),
        (7, 0, None, b"c")]


def test_fetch_gaps_and_control_batches_make_sparse_bundles() -> None:
    """A compacted batch (gaps in its deltas) is sparse; a transaction marker's offset is
    skipped, so the bundle after it is sparse too; the next offset passes the marker."""
    compacted = encode_batch(RecordBatch(10, TS, TS, 6, [
        Record(0, 0, b"a", b"1"), Record(3, 0, b"b", b"2"), Record(4, 0, b"c", b"3")]))
    data_txn = encode_batch(RecordBatch(17, TS, TS, 1, [Record(0, 0, None, b"x"),
                                                        Record(1, 0, None, b"y")],
                                        attributes=0x10, producer_id=5))
    marker = encode_batch(RecordBatch(19, TS, TS, 0, [Record(0, 0, b"\x00\x00\x00\x00",
                                                             b"\x00\x00\x00\x00\x00\x00")],
                                      attributes=0x30, producer_id=5))
    after = encode_batch(RecordBatch(20, TS, TS, 0, [Record(0, 0, None, b"z")]))
    data = compacted + data_txn + marker + after
    got = fetch(data, after_seq=10)[1]
    assert [(b.first_seq, b.last_seq, b.plain, b.count) for b in got.bundles] == [
        (11, 15, False, 3), (18, 19, False, 2), (21, 21, False, 1)]
    assert got.next_offset == 21 and got.error is None
    check_fetch(data, 0, 10, got)
    # The control batch alone: no bundle, the offset moves past it.
    assert fetch(marker, from_offset=19)[1] == FetchedBundles([], 20, None)
    # Continuing: plain where the previous bundle (or after_seq) ends right before.
    got = fetch(data_txn + marker, from_offset=17, after_seq=17)[1]
    assert [(b.first_seq, b.plain) for b in got.bundles] == [(18, True)]


def test_fetch_from_offset_inside_a_batch() -> None:
    batch = encode_batch(RecordBatch(100, TS, TS, 9, [
        Record(i, i, None, b"%d" % i) for i in range(10)]))
    for from_offset, after_seq, plain in [(104, 104, True), (104, None, True),
                                          (104, 100, False), (110, 110, None)]:
        got = fetch(batch, from_offset, after_seq)[1]
        assert got.next_offset == 110
        if plain is None:
            assert got.bundles == []
            continue
        [b] = got.bundles
        assert (b.first_seq, b.last_seq, b.plain, b.count) == (105, 110, plain, 6)
        check_fetch(batch, from_offset, after_seq, got)


def test_fetch_a_long_key_stops_the_read_there() -> None:
    ok = encode_batch(RecordBatch(0, TS, TS, 1, [Record(0, 0, None, b"a"),
                                                 Record(1, 0, None, b"b")]))
    bad = encode_batch(RecordBatch(2, TS, TS, 2, [
        Record(0, 0, b"k", b"c"), Record(1, 0, b"k" * 256, b"d"), Record(2, 0, None, b"e")]))
    later = encode_batch(RecordBatch(5, TS, TS, 0, [Record(0, 0, None, b"f")]))
    got = fetch(ok + bad + later)[1]
    assert isinstance(got.error, InvalidRecord)
    assert str(got.error) == "record at offset 3: key of 256 bytes (Tank keys are at most 255)"
    assert got.next_offset == 3
    assert [(b.first_seq, b.last_seq, b.plain) for b in got.bundles] == [(1, 2, True),
                                                                       (3, 3, True)]
    # Skipped records are not mapped: from past the long key, all is read.
    got = fetch(ok + bad + later, from_offset=4)[1]
    assert got.error is None and got.next_offset == 6
    # A batch corrupt after the long key: the batch is checked whole first.
    broken = bytearray(bad)
    broken[-1] = 0x7E  # the last record's header count: 63 headers
    assert fetch(ok + _recrc(broken) + later)[1] is CorruptBatch


@pytest.mark.parametrize("codec", list(Compression), ids=lambda c: c.name)
def test_fetch_what_kafka_python_builds(codec: Compression) -> None:
    """Batches from an independent writer (kafka-python's builder), every codec."""
    parts = []
    base = 0
    for n in (1, 50, 500):
        builder = DefaultRecordBatchBuilder(
            magic=2, compression_type=codec, is_transactional=0, producer_id=-1,
            producer_epoch=-1, base_sequence=-1, batch_size=1 << 22)
        for i in range(n):
            builder.append(i, timestamp=TS + i, key=b"key-%d" % i if i % 3 else None,
                           value=b"value %d " % i * (i % 7 + 1),
                           headers=[("trace", b"t%d" % i)] if i % 10 == 4 else [])
        data = bytearray(builder.build())
        struct.pack_into(">q", data, 0, base)
        parts.append(bytes(data))
        base += n
    records = b"".join(parts)
    for from_offset, after_seq in [(0, None), (0, 0), (30, 30), (51, 7)]:
        result = fetch(records, from_offset, after_seq)
        assert result[0] == "ok"
        check_fetch(records, from_offset, after_seq, result[1])


@pytest.mark.parametrize("codec", list(Compression), ids=lambda c: c.name)
def test_round_trip_produce_then_fetch(codec: Compression) -> None:
    """Bundles -> batch (as a producer sends it) -> the broker's offsets -> bundles: the
    same messages, one plain bundle."""
    messages = [Message(b"m%d" % i * (i % 5), None if i % 4 else b"k%d" % i, TS + i // 10)
                for i in range(2000)]
    bundles = [encode_bundle(messages[:700], codec=Codec.SNAPPY),
               encode_bundle(messages[700:], codec=Codec.NONE)]
    batch, count = bundles_to_record_batch(bundles, now_ms=NOW, compression=codec, **STAMP)
    stored = bytearray(batch)
    struct.pack_into(">q", stored, 0, 1000)  # the broker's base offset (outside the CRC)
    got = record_batches_to_bundles(bytes(stored), from_offset=1000, after_seq=1000)
    assert got.error is None and got.next_offset == 1000 + count
    [b] = got.bundles
    assert (b.first_seq, b.last_seq, b.plain, b.count) == (1001, 3000, True, 2000)
    decoded = decode_chunk(b.framed, 1001).messages
    assert [(m.seq, m.timestamp, m.key, m.value) for m in decoded] == [
        (1001 + i, m.timestamp, m.key, m.value) for i, m in enumerate(messages)]


@pytest.mark.differential
def test_fetch_volume_seeded() -> None:
    """Seeded random runs of 1-5000-record batches: the twins agree and decode."""
    rng = random.Random(3535)
    for _ in range(12):
        base = rng.randrange(0, 1 << 40)
        parts = []
        for _ in range(rng.randrange(1, 4)):
            n = rng.choice([1, 7, 500, 5000])
            step = rng.choice([1, 1, 2])
            records = [Record(i * step, rng.randrange(-5, 5000),
                              rng.choice([None, b"", b"key-%d" % i]),
                              rng.choice([None, b"", rng.randbytes(100)]))
                       for i in range(n)]
            parts.append(encode_batch(RecordBatch(
                base, TS, TS + 5000, (n - 1) * step, records,
                int(rng.choice(list(Compression))))))
            base += (n - 1) * step + 1 + rng.choice([0, 3])
        data = b"".join(parts)
        from_offset = rng.choice([0, base - 3])
        after_seq = rng.choice([None, from_offset, from_offset + 1])
        result = fetch(data, from_offset, after_seq)
        assert result[0] == "ok"
        check_fetch(data, from_offset, after_seq, result[1])
