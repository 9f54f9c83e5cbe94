"""Tank bundles <-> Kafka record batches for figtank's own client of an upstream Kafka
cluster (sans-IO): the two calls on its Produce and Fetch paths.

- :func:`bundles_to_record_batch`: the plain Tank bundles of one partition's produce, as
  ONE magic-2 record batch (Kafka takes one batch per partition per ProduceRequest)
  stamped with the idempotent producer's id, epoch and base sequence.
- :func:`record_batches_to_bundles`: the ``records`` field of one partition of a
  FetchResponse, as framed Tank bundles (one per batch) and the offset to fetch next.

Positions: Tank sequence = Kafka offset + 1. Each function is compiled in
``protocols._speedups`` (``tank_to_kafka_batch``, ``kafka_batches_to_bundles``) with no
Python object per message; the ``*_py`` functions here are the references the
differential tests (tests/protocols/kafka/test_upstream_codec.py) hold them to: the same
bytes, or the same error (class and text).

Produce: every message keeps its key (a Tank message without one is a null key), value
and timestamp (Tank's rules decide a message's own timestamp: see
:func:`~protocols.tank.bundle.decode_bundle`); a timestamp of 0 (none) becomes ``now_ms``.
The records carry no headers; the batch's attributes are its codec only.

Fetch: records are mapped where Tank can hold them: headers are dropped, a null value
reads as an empty one, a negative timestamp (-1: none) as 0, and every record of a
LogAppendTime batch takes the batch's max timestamp (Kafka's rule). A key over 255 bytes
can not be mapped: the read stops at that record (:attr:`FetchedBundles.error`). A bundle
is plain when its offsets are consecutive and it continues the previous bundle (or
``after_seq``), else sparse, naming its sequence numbers, so offsets are never renumbered
(compacted topics, transaction markers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from protocols.kafka.batch import (
    MAX_BATCH_SIZE,
    Compression,
    CorruptBatch,
    InvalidRecord,
    Record,
    RecordBatch,
    decode_records,
    encode_batch,
    open_batch,
)
from protocols.kafka.codecs import MAX_DECOMPRESSED_SIZE
from protocols.native import speedups
from protocols.tank.bundle import (
    MAX_UNCOMPRESSED_SIZE,
    Codec,
    Message,
    decode_bundle,
    encode_bundle,
    frame_bundle,
    parse_bundle_header,
)

__all__ = [
    "FetchedBundles",
    "UpstreamBundle",
    "bundles_to_record_batch",
    "bundles_to_record_batch_py",
    "record_batches_to_bundles",
    "record_batches_to_bundles_py",
]

_INT16_MIN: Final = -(1 << 15)
_INT16_MAX: Final = (1 << 15) - 1
_INT32_MIN: Final = -(1 << 31)
_INT32_MAX: Final = (1 << 31) - 1
_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1
_MAX_KEY_SIZE: Final = 255
_ATTR_LOG_APPEND_TIME: Final = 0x08
_ATTR_CONTROL: Final = 0x20


@dataclass(frozen=True, slots=True)
class UpstreamBundle:
    """One framed bundle built from consecutive records of a partition.

    ``plain``: it carries no sequence numbers and starts right after the previous bundle
    of the same call (or is the first), so a chunk starting with it has ``base_seq ==
    first_seq``; otherwise it is sparse.
    """

    first_seq: int
    last_seq: int
    framed: bytes
    plain: bool
    count: int


@dataclass(frozen=True, slots=True)
class FetchedBundles:
    """What :func:`record_batches_to_bundles` made of a partition's fetched records."""

    #: The framed bundles, one per batch that kept a record, in order.
    bundles: list[UpstreamBundle]
    #: The Kafka offset to fetch next: after the last whole batch read (control batches
    #: included), or the offset of the record that stopped the read.
    next_offset: int
    #: A record Tank can not hold (a key over 255 bytes) stopped the read there: the
    #: records before it are in ``bundles``.
    error: InvalidRecord | None


# ------------------------------------------------------------------------- produce path


def _check_produce(bundles: Sequence[bytes | memoryview], producer_id: int,
                   producer_epoch: int, base_sequence: int, now_ms: int,
                   compression: Compression) -> Compression:
    """The arguments' checks, shared by both twins (so they raise the same ValueError)."""
    if not bundles:
        raise ValueError("a record batch needs at least one bundle")
    if not _INT64_MIN <= producer_id <= _INT64_MAX:
        raise ValueError(f"producer id {producer_id} is outside int64")
    if not _INT16_MIN <= producer_epoch <= _INT16_MAX:
        raise ValueError(f"producer epoch {producer_epoch} is outside int16")
    if not _INT32_MIN <= base_sequence <= _INT32_MAX:
        raise ValueError(f"base sequence {base_sequence} is outside int32")
    if not 0 <= now_ms <= _INT64_MAX:
        raise ValueError(f"now_ms {now_ms} is not milliseconds since 1970")
    return Compression(compression)  # ValueError for an unknown codec


def _sparse_refusal() -> ValueError:
    return ValueError("a sparse bundle names its sequence numbers; a produced batch is "
                      "numbered by the upstream")


def _check_batch(count: int, max_ts: int) -> None:
    if count > _INT32_MAX:
        raise ValueError(f"{count} messages are over a record batch's int32 count")
    if max_ts > _INT64_MAX:
        raise ValueError(f"timestamp {max_ts} is over Kafka's int64")


def bundles_to_record_batch_py(
    bundles: Sequence[bytes | memoryview], *, producer_id: int, producer_epoch: int,
    base_sequence: int, now_ms: int, compression: Compression = Compression.NONE,
) -> tuple[bytes, int]:
    """:func:`bundles_to_record_batch`'s reference: each bundle decoded
    (:func:`~protocols.tank.bundle.decode_bundle`), then the batch encoded by
    :func:`~protocols.kafka.batch.encode_batch`."""
    codec = _check_produce(bundles, producer_id, producer_epoch, base_sequence, now_ms,
                           compression)
    messages: list[Message] = []
    for bundle in bundles:
        if parse_bundle_header(bundle).sparse:
            raise _sparse_refusal()
        messages += decode_bundle(bundle, 1)
    stamps = [m.timestamp or now_ms for m in messages]
    count = len(messages)
    max_ts = max(stamps)
    _check_batch(count, max_ts)
    base_ts = stamps[0]
    records = [Record(i, ts - base_ts, m.key, m.value)
               for i, (m, ts) in enumerate(zip(messages, stamps, strict=True))]
    batch = RecordBatch(0, base_ts, max_ts, count - 1, records, attributes=int(codec),
                        partition_leader_epoch=-1, producer_id=producer_id,
                        producer_epoch=producer_epoch, base_sequence=base_sequence)
    return encode_batch(batch), count


def _bundles_to_record_batch_native(
    bundles: Sequence[bytes | memoryview], *, producer_id: int, producer_epoch: int,
    base_sequence: int, now_ms: int, compression: Compression = Compression.NONE,
) -> tuple[bytes, int]:
    """:func:`bundles_to_record_batch_py`, compiled: same arguments, results, errors."""
    assert speedups is not None
    codec = _check_produce(bundles, producer_id, producer_epoch, base_sequence, now_ms,
                           compression)
    got: tuple[bytes, int] = speedups.tank_to_kafka_batch(
        bundles, producer_id, producer_epoch, base_sequence, now_ms, codec,
        MAX_UNCOMPRESSED_SIZE)
    return got


# --------------------------------------------------------------------------- fetch path


def _check_fetch(from_offset: int, after_seq: int | None, max_decompressed: int) -> None:
    if not 0 <= from_offset <= _INT64_MAX:
        raise ValueError(f"from_offset {from_offset} is not a Kafka offset")
    if after_seq is not None and after_seq < 0:
        raise ValueError(f"after_seq {after_seq} is not a Tank sequence number")
    if max_decompressed < 0:
        raise ValueError("max_decompressed must not be negative")


def _offset_checks(base_offset: int, previous_end: int | None) -> None:
    """What refuses a batch's place, before its records are looked at."""
    if base_offset < 0:
        raise CorruptBatch(f"record batch base offset {base_offset} is negative")
    if previous_end is not None and base_offset < previous_end:
        raise CorruptBatch(f"the batch at base offset {base_offset} starts before the "
                           f"previous batch ends (offset {previous_end})")


def _delta_checks(records: list[Record], last_delta: int) -> None:
    """Offset deltas increase, from 0 up, and stay within the batch's lastOffsetDelta."""
    prev = -1
    for r in records:
        delta = r.offset_delta
        if delta <= prev:
            raise CorruptBatch(f"record offset delta {delta} after {prev}")
        if delta > last_delta:
            raise CorruptBatch(f"record offset delta {delta} past the batch's "
                               f"lastOffsetDelta {last_delta}")
        prev = delta


def _key_refusal(offset: int, size: int) -> InvalidRecord:
    return InvalidRecord(f"record at offset {offset}: key of {size} bytes (Tank keys are "
                         f"at most {_MAX_KEY_SIZE})")


def _bundle(messages: list[Message], previous: int | None) -> UpstreamBundle:
    """The framed bundle of one batch's kept messages (``seq`` set), plain if it can be."""
    first, last = messages[0].seq, messages[-1].seq
    plain = last - first == len(messages) - 1 and (previous is None or first == previous + 1)
    bundle = encode_bundle(messages, codec=Codec.NONE, sparse=not plain)
    return UpstreamBundle(first, last, frame_bundle(bundle), plain, len(messages))


def record_batches_to_bundles_py(
    records: bytes | bytearray | memoryview, *, from_offset: int, after_seq: int | None,
    max_decompressed: int = MAX_DECOMPRESSED_SIZE,
) -> FetchedBundles:
    """:func:`record_batches_to_bundles`'s reference: each batch opened by
    :func:`~protocols.kafka.batch.open_batch` and its records decoded by
    :func:`~protocols.kafka.batch.decode_records`, then mapped and encoded by
    :func:`~protocols.tank.bundle.encode_bundle`."""
    _check_fetch(from_offset, after_seq, max_decompressed)
    out: list[UpstreamBundle] = []
    next_offset = from_offset
    previous = after_seq
    previous_end: int | None = None
    pos, end = 0, len(records)
    while pos < end:
        got = open_batch(records, pos, end, max_batch_size=MAX_BATCH_SIZE,
                         max_uncompressed=max_decompressed)
        if isinstance(got, int):
            break  # a batch cut at the response's byte limit: fetched again next time
        head, section, start, stop, pos = got
        base_offset, attributes, last_delta, max_ts, count = (
            head[0], head[5], head[6], head[8], head[12])
        batch_end = base_offset + last_delta + 1
        _offset_checks(base_offset, previous_end)
        previous_end = batch_end
        if attributes & _ATTR_CONTROL:
            next_offset = max(next_offset, batch_end)
            continue
        decoded = decode_records(bytes(section[start:stop]), 0, stop - start, count)
        _delta_checks(decoded, last_delta)
        base_ts = head[7]
        forced = max(max_ts, 0) if attributes & _ATTR_LOG_APPEND_TIME else None
        kept: list[Message] = []
        error = None
        for r in decoded:
            offset = base_offset + r.offset_delta
            if offset < from_offset:
                continue
            if r.key is not None and len(r.key) > _MAX_KEY_SIZE:
                error = _key_refusal(offset, len(r.key))
                next_offset = offset
                break
            ts = forced if forced is not None else max(base_ts + r.timestamp_delta, 0)
            kept.append(Message(b"" if r.value is None else r.value, r.key, ts, offset + 1))
        if kept:
            out.append(_bundle(kept, previous))
            previous = out[-1].last_seq
        if error is not None:
            return FetchedBundles(out, next_offset, error)
        next_offset = max(next_offset, batch_end)
    return FetchedBundles(out, next_offset, None)


def _record_batches_to_bundles_native(
    records: bytes | bytearray | memoryview, *, from_offset: int, after_seq: int | None,
    max_decompressed: int = MAX_DECOMPRESSED_SIZE,
) -> FetchedBundles:
    """:func:`record_batches_to_bundles_py`, compiled: same arguments, results, errors."""
    assert speedups is not None
    _check_fetch(from_offset, after_seq, max_decompressed)
    bundles, next_offset, refused = speedups.kafka_batches_to_bundles(
        records, from_offset, after_seq, max_decompressed, MAX_BATCH_SIZE, UpstreamBundle)
    error = None if refused is None else _key_refusal(*refused)
    return FetchedBundles(bundles, next_offset, error)


# ------------------------------------------------------------------------------ dispatch

#: The extension has these loops (one built before them runs the references, and the
#: selection test fails).
_COMPILED: Final = speedups is not None and hasattr(speedups, "kafka_batches_to_bundles")
_produce: Final = _bundles_to_record_batch_native if _COMPILED else bundles_to_record_batch_py
_fetch: Final = (_record_batches_to_bundles_native if _COMPILED
                 else record_batches_to_bundles_py)


def bundles_to_record_batch(
    bundles: Sequence[bytes | memoryview], *, producer_id: int, producer_epoch: int,
    base_sequence: int, now_ms: int, compression: Compression = Compression.NONE,
) -> tuple[bytes, int]:
    """ONE Kafka magic-2 record batch holding every message of ``bundles`` in order:
    ``(batch, count)``.

    ``bundles`` are unframed, plain (not sparse) Tank bundles, codec none or Snappy (as
    ``ProduceBatch.bundle`` holds them). The batch: base offset 0, offset deltas
    0..count-1, partition leader epoch -1, attributes the codec only, the producer's
    stamp; base timestamp the first message's, max timestamp the largest, a message
    timestamp of 0 (none) taken as ``now_ms``; keys kept (null when the message has
    none), values kept, no headers; the records section compressed with ``compression``.

    Raises ``ValueError`` for no bundles, a sparse bundle, a stamp field outside its
    Kafka type or a timestamp over int64, and ``ProtocolError`` for a malformed bundle
    (as :func:`~protocols.tank.bundle.decode_bundle` does).
    """
    return _produce(bundles, producer_id=producer_id, producer_epoch=producer_epoch,
                    base_sequence=base_sequence, now_ms=now_ms, compression=compression)


def record_batches_to_bundles(
    records: bytes | bytearray | memoryview, *, from_offset: int, after_seq: int | None,
    max_decompressed: int = MAX_DECOMPRESSED_SIZE,
) -> FetchedBundles:
    """The framed Tank bundles of one partition's fetched ``records`` (zero or more
    magic-2 record batches, maybe ending in a cut one, left for the next fetch).

    Records with offset < ``from_offset`` are skipped (the broker answers the whole
    batch holding it); control batches are skipped but advance ``next_offset``; every
    codec is read (decompressed sections bounded by ``max_decompressed``). One
    uncompressed bundle per batch that keeps a record, ``first_seq`` its first offset
    + 1; plain when its offsets are consecutive and it continues the previous bundle
    (for the first: ``after_seq``, the last sequence number before it; None: any), else
    sparse. A key over 255 bytes stops the read at its record (``error``).

    Raises ``CorruptBatch`` (a ``ProtocolError``) for a bad CRC or framing, offset
    deltas that do not increase or pass the batch's lastOffsetDelta, batches that
    overlap or a negative base offset; the other errors of
    :func:`~protocols.kafka.batch.open_batch`; ``ValueError`` for bad arguments.
    """
    return _fetch(records, from_offset=from_offset, after_seq=after_seq,
                  max_decompressed=max_decompressed)
