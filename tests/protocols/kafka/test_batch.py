"""Kafka record batches: golden bytes, kafka-python both ways, every codec, bad input."""

from __future__ import annotations

import dataclasses
import random
import struct

import crc32c
import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from protocols.errors import ProtocolError
from protocols.kafka.batch import (
    CORRUPT_MESSAGE,
    UNSUPPORTED_VERSION,
    BatchTooLarge,
    Compression,
    CorruptBatch,
    Record,
    RecordBatch,
    UnsupportedCompression,
    UnsupportedMagic,
    encode_batch,
    read_batch,
    read_batches,
)
from protocols.kafka.codecs import compress, decompress

CODECS = list(Compression)
TS = 1_700_000_000_000


def _golden() -> bytes:
    """One uncompressed batch of two records, written field by field from Kafka's docs."""
    def rec(attrs: bytes, ts_delta: bytes, off_delta: bytes, key: bytes, value: bytes,
            headers: bytes) -> bytes:
        body = attrs + ts_delta + off_delta + key + value + headers
        return bytes((len(body) * 2,)) + body  # zigzag length, one byte
    records = (
        # attrs 0, tsDelta 0, offsetDelta 0, key null (-1 -> 01), value "a" (1 -> 02), 0 headers
        rec(b"\x00", b"\x00", b"\x00", b"\x01", b"\x02a", b"\x00")
        # tsDelta 5 (0a), offsetDelta 1 (02), key "k" (02 6b), value "bc", header "h"="v"
        + rec(b"\x00", b"\x0a", b"\x02", b"\x02k", b"\x04bc", b"\x02\x02h\x02v")
    )
    after_crc = struct.pack(">hiqqqhii", 0, 1, TS, TS + 5, 77, 3, 9, 2) + records
    return (struct.pack(">qiib", 41, 49 + len(records), 7, 2)
            + struct.pack(">I", crc32c.crc32c(after_crc)) + after_crc)


GOLDEN_BATCH = RecordBatch(
    base_offset=41, base_timestamp=TS, max_timestamp=TS + 5, last_offset_delta=1,
    records=[Record(0, 0, None, b"a"), Record(1, 5, b"k", b"bc", ((b"h", b"v"),))],
    partition_leader_epoch=7, producer_id=77, producer_epoch=3, base_sequence=9)


def test_golden_bytes_decode_and_encode() -> None:
    golden = _golden()
    got = read_batch(golden)
    assert not isinstance(got, int)
    batch, end = got
    assert end == len(golden)
    assert batch == dataclasses.replace(GOLDEN_BATCH, crc=struct.unpack_from(">I", golden, 17)[0])
    assert encode_batch(GOLDEN_BATCH) == golden


def test_golden_bytes_match_kafka_python_builder() -> None:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=0, producer_id=77, producer_epoch=3,
        base_sequence=9, batch_size=1 << 20)
    builder.append(0, timestamp=TS, key=None, value=b"a", headers=[])
    builder.append(1, timestamp=TS + 5, key=b"k", value=b"bc", headers=[("h", b"v")])
    data = bytearray(builder.build())
    # the broker's base offset and leader epoch (both outside the CRC)
    struct.pack_into(">qii", data, 0, 41, len(data) - 12, 7)
    assert bytes(data) == _golden()


def _kafka_python_batch(codec: int, n: int = 50) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=codec, is_transactional=0, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 22)
    for i in range(n):
        builder.append(i, timestamp=TS + i * 3, key=b"key-%d" % i if i % 3 else None,
                       value=b"value %d " % i * (i % 7 + 1),
                       headers=[("trace", b"t%d" % i)] if i % 10 == 4 else [])
    return bytes(builder.build())


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_reads_what_kafka_python_builds(codec: Compression) -> None:
    data = _kafka_python_batch(codec)
    run = read_batches(data)
    assert run.consumed == len(data) and run.partial is None
    [batch] = run.batches
    assert batch.compression == codec
    theirs = list(DefaultRecordBatch(data))
    assert [(batch.base_offset + r.offset_delta, batch.base_timestamp + r.timestamp_delta,
             r.key, r.value, [(k.decode(), v) for k, v in r.headers])
            for r in batch.records] == [
        (r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in theirs]


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_kafka_python_reads_what_we_build(codec: Compression) -> None:
    [ours] = read_batches(_kafka_python_batch(0)).batches
    ours.attributes = int(codec)
    data = encode_batch(ours)
    theirs = DefaultRecordBatch(data)
    assert theirs.validate_crc() and theirs.compression_type == codec
    assert [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in theirs] == [
        (r.offset, r.timestamp, r.key, r.value, list(r.headers))
        for r in DefaultRecordBatch(_kafka_python_batch(0))]


def test_snappy_raw_and_xerial_both_read() -> None:
    from kafka import codec as kcodec
    data = b"snappy records " * 5000
    assert decompress(Compression.SNAPPY, kcodec.snappy_encode(data)) == data  # xerial
    assert decompress(Compression.SNAPPY, kcodec.snappy_encode(data, False)) == data  # raw
    ours = compress(Compression.SNAPPY, data)
    assert ours.startswith(b"\x82SNAPPY\x00")
    # 75 KB in one xerial block (snappy-java writes 32 KiB ones; readers take any size).
    assert int.from_bytes(ours[16:20], "big") == len(ours) - 20
    assert kcodec.snappy_decode(ours) == data


@pytest.mark.parametrize("codec", CODECS[1:], ids=lambda c: c.name)
def test_decompression_bomb_refused(codec: Compression) -> None:
    with pytest.raises(ProtocolError, match="limit"):
        decompress(codec, compress(codec, bytes(100_000)), 50_000)


def test_unknown_codec_refused() -> None:
    golden = bytearray(_golden())
    golden[22] = 5  # attributes low byte: codec 5
    struct.pack_into(">I", golden, 17, crc32c.crc32c(bytes(golden[21:])))
    with pytest.raises(UnsupportedCompression) as err:
        read_batch(golden)
    assert err.value.error_code == 76


def test_bad_crc_is_corrupt_message() -> None:
    golden = bytearray(_golden())
    golden[-1] ^= 1
    with pytest.raises(CorruptBatch, match="CRC") as err:
        read_batch(golden)
    assert err.value.error_code == CORRUPT_MESSAGE


@pytest.mark.parametrize("magic", [0, 1, 3])
def test_other_magic_refused(magic: int) -> None:
    golden = bytearray(_golden())
    golden[16] = magic
    with pytest.raises(UnsupportedMagic) as err:
        read_batch(golden)
    assert err.value.error_code == UNSUPPORTED_VERSION and err.value.magic == magic


def test_legacy_message_set_refused() -> None:
    from kafka.record.legacy_records import LegacyRecordBatchBuilder
    for magic in (0, 1):
        builder = LegacyRecordBatchBuilder(magic=magic, compression_type=0, batch_size=1 << 20)
        builder.append(0, timestamp=TS if magic else None, key=b"k", value=b"v")
        with pytest.raises(UnsupportedMagic):
            read_batches(bytes(builder.build()))


def test_truncation_at_every_byte_needs_more() -> None:
    two = _golden() + encode_batch(GOLDEN_BATCH)
    first = len(_golden())
    for cut in range(len(two)):
        run = read_batches(two[:cut])
        whole = 1 if cut >= first else 0
        assert len(run.batches) == whole
        assert run.consumed == whole * first
        if cut in (0, first):
            assert run.partial is None
        else:
            assert run.partial is not None and run.partial > cut - run.consumed
        # a single read says how much it needs, never more than the batch
        got = read_batch(two, run.consumed, cut)
        if cut not in (0, first):
            assert isinstance(got, int) and got <= first


def test_too_large_batch_refused_before_reading() -> None:
    golden = _golden()
    with pytest.raises(BatchTooLarge) as err:
        read_batch(golden[:20], max_batch_size=len(golden) - 1)
    assert err.value.error_code == 10


def test_short_batch_length_is_corrupt() -> None:
    golden = bytearray(_golden())
    struct.pack_into(">i", golden, 8, 20)
    with pytest.raises(CorruptBatch):
        read_batch(golden)


def _recrc(data: bytearray) -> bytes:
    struct.pack_into(">I", data, 17, crc32c.crc32c(bytes(data[21:])))
    return bytes(data)


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.name)
def test_random_mutation_only_protocol_error(codec: Compression) -> None:
    """Mutate bytes (CRC fixed up half the time, to get past it): never another exception."""
    rng = random.Random(17 + codec)
    base = _kafka_python_batch(codec, n=12)
    outcomes = {"ok": 0, "error": 0, "more": 0}
    for _ in range(1500):
        data = bytearray(base)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        if rng.random() < 0.5:
            data = bytearray(_recrc(data))
        if rng.random() < 0.2:
            data = data[:rng.randrange(len(data))]
        try:
            run = read_batches(bytes(data))
        except ProtocolError:
            outcomes["error"] += 1
        else:
            outcomes["more" if run.partial else "ok"] += 1
    assert outcomes["error"] > 100


def test_record_structure_errors_after_valid_crc() -> None:
    """Record-level corruption under a correct CRC is still a CorruptBatch."""
    golden = bytearray(_golden())
    golden[61] = 0x7E  # first record's length: 63, past the batch
    with pytest.raises(CorruptBatch):
        read_batch(_recrc(golden))
    golden = bytearray(_golden())
    struct.pack_into(">i", golden, 57, 3)  # count 3 for two records
    with pytest.raises(CorruptBatch):
        read_batch(_recrc(golden))
