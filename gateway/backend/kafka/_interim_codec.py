"""INTERIM (replaced by protocols.kafka.upstream_codec): slow reference conversions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from protocols.kafka.batch import (
    CorruptBatch,
    InvalidRecord,
    Record,
    RecordBatch,
    encode_batch,
    read_batches,
)
from protocols.kafka.codecs import Compression
from protocols.kafka.upstream import UpstreamBundle, records_to_bundles
from protocols.tank.bundle import decode_chunk
from protocols.wire import encode_varint


def bundles_to_record_batch(bundles: Sequence[bytes | memoryview], *, producer_id: int,
                            producer_epoch: int, base_sequence: int, now_ms: int,
                            compression: Compression = Compression.NONE) -> tuple[bytes, int]:
    chunk = b"".join(encode_varint(len(b)) + bytes(b) for b in bundles)
    messages = decode_chunk(chunk, 1, max_bundle_size=len(chunk)).messages
    if not messages:
        raise ValueError("no messages")
    stamps = [m.timestamp or now_ms for m in messages]
    base = stamps[0]
    records = [Record(i, ts - base, m.key or None, m.value)
               for i, (m, ts) in enumerate(zip(messages, stamps, strict=True))]
    batch = RecordBatch(0, base, max(stamps), len(records) - 1, records,
                        attributes=int(compression), producer_id=producer_id,
                        producer_epoch=producer_epoch, base_sequence=base_sequence)
    return encode_batch(batch), len(records)


@dataclass(frozen=True, slots=True)
class FetchedBundles:
    bundles: list[UpstreamBundle]
    next_offset: int
    error: InvalidRecord | None


def record_batches_to_bundles(records: bytes | memoryview, *, from_offset: int,
                              after_seq: int | None) -> FetchedBundles:
    try:
        run = read_batches(bytes(records))
    except CorruptBatch:
        raise
    next_offset = from_offset
    out: list[UpstreamBundle] = []
    previous = after_seq
    for batch in run.batches:
        next_offset = max(next_offset, batch.base_offset + batch.last_offset_delta + 1)
        if batch.control:
            continue
        base_ts = batch.base_timestamp
        client = [(batch.base_offset + r.offset_delta,
                   batch.max_timestamp if batch.log_append_time else base_ts + r.timestamp_delta,
                   r.key, r.value) for r in batch.records
                  if batch.base_offset + r.offset_delta >= from_offset]
        if not client:
            continue
        try:
            made = records_to_bundles(client, after_seq=previous)
        except InvalidRecord as exc:
            return FetchedBundles(out, client[0][0], exc)
        out += made
        previous = made[-1].last_seq
    return FetchedBundles(out, next_offset, None)
