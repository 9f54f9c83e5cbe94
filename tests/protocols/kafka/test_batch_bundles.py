"""Kafka batches <-> Tank bundles: offsets = sequence - 1, refusals, every codec."""

from __future__ import annotations

import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from protocols.errors import ProtocolError
from protocols.kafka.batch import (
    INVALID_RECORD,
    Compression,
    InvalidRecord,
    ProducerStamp,
    Record,
    RecordBatch,
    encode_batch,
    encode_records,
    producer_stamps,
    read_batches,
)
from protocols.kafka.bundles import (
    batch_to_bundle,
    batch_to_messages,
    bundles_to_batches,
    fetch_codecs,
)
from protocols.tank.bundle import (
    Codec,
    Message,
    decode_bundle,
    decode_chunk,
    encode_bundle,
    frame_bundle,
    parse_bundle_header,
)

TS = 1_700_000_000_000
PAD = b"x" * 200  # compressible: kafka-python keeps a batch uncompressed when it would grow


def _messages(n: int, first_seq: int = 0, step: int = 1) -> list[Message]:
    return [Message(b"value-%d" % i * (i % 5 + 1), b"k%d" % i if i % 3 else None,
                    TS + (i * 7) % 11, first_seq + i * step) for i in range(n)]


def _chunk() -> tuple[bytes, list[Message]]:
    """Plain, Snappy and sparse (gapped) bundles from sequence 1, and their messages."""
    plain = _messages(20, 1)
    snappy = _messages(600, 21)
    sparse = _messages(4, 700, step=3)
    chunk = (frame_bundle(encode_bundle(plain, codec=Codec.NONE))
             + frame_bundle(encode_bundle(snappy, codec=Codec.SNAPPY))
             + frame_bundle(encode_bundle(sparse, sparse=True)))
    return chunk, plain + snappy + sparse


@pytest.mark.parametrize("codec", list(Compression), ids=lambda c: c.name)
def test_bundles_to_batches_kafka_python_reads_offsets_and_timestamps(codec: Compression) -> None:
    chunk, messages = _chunk()
    fetched = bundles_to_batches(chunk, 1, codecs=(codec, codec))
    assert fetched.consumed == len(chunk) and not fetched.partial
    assert fetched.next_seq == messages[-1].seq + 1
    got = []
    pos = 0
    batches = 0
    while pos < len(fetched.records):
        size = 12 + int.from_bytes(fetched.records[pos + 8:pos + 12], "big")
        theirs = DefaultRecordBatch(fetched.records[pos:pos + size])
        assert theirs.validate_crc() and theirs.compression_type == codec
        got += [(r.offset, r.timestamp, r.key, r.value) for r in theirs]
        pos += size
        batches += 1
    assert batches == 3  # one batch per bundle
    assert got == [(m.seq - 1, m.timestamp, m.key, m.value) for m in messages]


def test_round_trip_bundle_batch_bundle_keeps_everything() -> None:
    chunk, messages = _chunk()
    run = read_batches(bundles_to_batches(chunk, 1).records)
    back = b"".join(frame_bundle(batch_to_bundle(b, keep_offsets=True)) for b in run.batches)
    assert decode_chunk(back, None).messages == messages
    # the Produce path: plain bundles, the log numbers them from wherever it is
    plain = batch_to_bundle(run.batches[1])
    assert not parse_bundle_header(plain).sparse
    assert [(m.key, m.value, m.timestamp) for m in decode_bundle(plain, 1)] == [
        (m.key, m.value, m.timestamp) for m in messages[20:620]]


@pytest.mark.parametrize("codec", list(Compression), ids=lambda c: c.name)
def test_fetch_codecs_follow_the_bundle(codec: Compression) -> None:
    """A plain bundle is an uncompressed batch, a Snappy one a batch in the chosen codec;
    by default uncompressed too (every Kafka client reads it)."""
    chunk, messages = _chunk()
    default = read_batches(bundles_to_batches(chunk, 1).records)
    assert [b.compression for b in default.batches] == [Compression.NONE] * 3
    run = read_batches(bundles_to_batches(chunk, 1, codecs=fetch_codecs(codec)).records)
    assert [b.compression for b in run.batches] == [Compression.NONE, codec, Compression.NONE]
    assert [r.value for b in run.batches for r in b.records] == [m.value for m in messages]


def test_partial_last_bundle_left_out() -> None:
    chunk, _ = _chunk()
    cut = chunk[:-3]
    fetched = bundles_to_batches(cut, 1)
    assert fetched.partial and fetched.next_seq == 621
    assert len(read_batches(fetched.records).batches) == 2


def test_produce_codec_rule() -> None:
    for codec in Compression:
        builder = DefaultRecordBatchBuilder(
            magic=2, compression_type=codec, is_transactional=0, producer_id=-1,
            producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
        for i in range(30):
            builder.append(i, timestamp=TS + i, key=None, value=b"v%d" % i + PAD, headers=[])
        [batch] = read_batches(bytes(builder.build())).batches
        assert batch.compression == codec
        bundle = batch_to_bundle(batch)
        want = Codec.NONE if codec == Compression.NONE else Codec.SNAPPY
        assert parse_bundle_header(bundle).codec == want
        assert [(m.value, m.timestamp, m.seq) for m in decode_bundle(bundle, 5)] == [
            (b"v%d" % i + PAD, TS + i, 5 + i) for i in range(30)]


def _batch(*records: Record, attributes: int = 0, base_ts: int = TS) -> RecordBatch:
    return RecordBatch(0, base_ts, base_ts, len(records) - 1, list(records), attributes)


@pytest.mark.parametrize(("record", "cause"), [
    (Record(0, 0, b"k" * 256, b"v"), "key of 256 bytes"),
    (Record(0, 0, None, b"v", ((b"h", b"x"),)), "header"),
    (Record(0, 0, b"k", None), "null value"),
    (Record(0, -TS - 5, None, b"v"), "timestamp"),
])
def test_refusals_name_the_cause(record: Record, cause: str) -> None:
    batch = _batch(Record(0, 0, None, b"fine"), Record(1, record.timestamp_delta, record.key,
                                                      record.value, record.headers))
    with pytest.raises(InvalidRecord, match=cause) as err:
        batch_to_bundle(batch)
    assert err.value.error_code == INVALID_RECORD
    assert "offset delta 1" in str(err.value)


def test_key_of_255_bytes_and_empty_value_accepted() -> None:
    bundle = batch_to_bundle(_batch(Record(0, 0, b"k" * 255, b"")))
    [m] = decode_bundle(bundle, 1)
    assert m.key == b"k" * 255 and m.value == b""


def test_no_timestamp_takes_append_time() -> None:
    batch = _batch(Record(0, 0, None, b"v"), base_ts=-1)
    with pytest.raises(InvalidRecord):
        batch_to_messages(batch)
    assert batch_to_messages(batch, append_time=42)[0].timestamp == 42
    log_append = _batch(Record(0, 0, None, b"v"), attributes=0x08)
    assert batch_to_messages(log_append, append_time=43)[0].timestamp == 43


@pytest.mark.parametrize(("attributes", "what"), [(0x10, "transactional"), (0x20, "control")])
def test_transactional_and_control_refused(attributes: int, what: str) -> None:
    with pytest.raises(InvalidRecord, match=what):
        batch_to_bundle(_batch(Record(0, 0, None, b"v"), attributes=attributes))


def test_gapped_offsets_refused_on_produce() -> None:
    batch = RecordBatch(0, TS, TS, 2, [Record(0, 0, None, b"a"), Record(2, 0, None, b"b")])
    with pytest.raises(InvalidRecord, match=r"(?i)offset ?delta 2"):
        batch_to_bundle(batch)
    assert [m.seq for m in batch_to_messages(batch, keep_offsets=True)] == [1, 3]


def test_corrupt_bundle_is_protocol_error() -> None:
    bundle = bytearray(encode_bundle(_messages(3), codec=Codec.NONE))
    bundle[0] |= 0x80
    with pytest.raises(ProtocolError):
        bundles_to_batches(frame_bundle(bytes(bundle)), 1)


def test_producer_stamps_read_each_batch_header() -> None:
    records = [Record(offset_delta=i, timestamp_delta=0, key=None, value=b"v")
               for i in range(3)]
    first = encode_batch(RecordBatch(base_offset=0, base_timestamp=1, max_timestamp=1,
                                     last_offset_delta=2, producer_id=7, producer_epoch=1,
                                     base_sequence=10), encode_records(records), 3)
    second = encode_batch(RecordBatch(base_offset=0, base_timestamp=1, max_timestamp=1,
                                      last_offset_delta=0), encode_records(records[:1]), 1)
    assert producer_stamps(first + second) == [ProducerStamp(7, 1, 10, 2),
                                               ProducerStamp(-1, -1, -1, 0)]
