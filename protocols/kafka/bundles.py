"""Kafka record batches <-> Tank bundles: the Produce and Fetch paths of the Kafka listener.

The rule for positions is **Kafka offset = Tank sequence - 1**. A record's key, value and
timestamp become a Tank message's; one batch becomes one bundle and one bundle one batch.

What a Tank message cannot hold is refused with :class:`InvalidRecord` (Kafka's
INVALID_RECORD, 87, which clients show with its message), never dropped:

- a key over 255 bytes (Tank stores ``u8 keyLen``);
- record headers (a Tank message has none);
- a null value (Tank values are byte strings; an empty value is kept and is not null);
- a negative timestamp (Tank's are u64 milliseconds) other than -1 ("none"), which takes
  the append time given by the caller;
- control and transactional batches (transactions are not supported);
- offset deltas other than 0, 1, 2, ... (a producer's batch is contiguous; the log, not
  the producer, numbers it).

Codecs. Produce: a compressed Kafka batch (any codec) becomes a Snappy Tank bundle, Tank's
only codec, and an uncompressed one stays uncompressed: the producer's choice of whether to
compress is kept. The Kafka codec cannot be kept as such: Tank compresses its own message
layout, not Kafka's records section. Fetch: a Tank bundle is one batch, a Snappy bundle a
snappy batch (xerial framing) and a plain one an uncompressed batch; any Kafka codec may be
asked for instead. Re-compressing is cheap next to the per-record work (measured with
``python -m protocols.kafka.bench``: snappy batches within 2% of uncompressed ones).

Timestamps are milliseconds on both sides. Kafka's batch base timestamp is the first
record's, as the Java producer writes it; records keep their own order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from protocols.errors import ProtocolError
from protocols.kafka.batch import (
    Compression,
    InvalidRecord,
    RecordBatch,
    encode_batch,
)
from protocols.tank.bundle import (
    Codec,
    Message,
    decode_chunk,
    encode_bundle,
    iter_framed_bundles,
)

__all__ = [
    "DEFAULT_FETCH_COMPRESSION",
    "MAX_KEY_SIZE",
    "FetchBatches",
    "batch_to_bundle",
    "batch_to_messages",
    "bundles_to_batches",
]

#: Tank keys are ``u8 len | key``.
MAX_KEY_SIZE: Final = 255
#: The Kafka codec of a fetched batch for each Tank bundle codec (see the module docstring).
DEFAULT_FETCH_COMPRESSION: Final = {Codec.NONE: Compression.NONE,
                                    Codec.SNAPPY: Compression.SNAPPY}
_INT32_MAX: Final = (1 << 31) - 1
_INT64_MAX: Final = (1 << 63) - 1
_NO_TIMESTAMP: Final = -1


def _refuse(index: int, batch: RecordBatch, why: str) -> InvalidRecord:
    return InvalidRecord(f"record at offset delta {index} of the batch at base offset "
                         f"{batch.base_offset}: {why}")


def batch_to_messages(
    batch: RecordBatch, *, append_time: int | None = None, keep_offsets: bool = False
) -> list[Message]:
    """The Tank messages of a produced batch.

    By default offset deltas must be 0, 1, 2, ... and ``seq`` is left 0 (the log numbers
    the messages). With ``keep_offsets`` (mirroring a batch read back from a log) each
    message's ``seq`` is its offset + 1 and offsets need only increase, gaps allowed.
    ``append_time`` (ms) stands for records without a timestamp (-1) and for every record
    of a LogAppendTime batch; without it such records are refused. Raises
    :class:`InvalidRecord` for what Tank cannot hold (see the module docstring).
    """
    if batch.control:
        raise InvalidRecord("control batches (transaction markers) are not supported")
    if batch.transactional:
        raise InvalidRecord("transactional batches are not supported")
    records = batch.records
    if not records:
        raise InvalidRecord(f"the batch at base offset {batch.base_offset} has no records")
    if not keep_offsets and batch.last_offset_delta != len(records) - 1:
        raise InvalidRecord(f"batch lastOffsetDelta {batch.last_offset_delta} for "
                            f"{len(records)} records")
    seq_base = batch.base_offset + 1
    prev = -1
    base_ts = batch.base_timestamp
    forced = None
    if batch.log_append_time:
        if append_time is None:
            raise InvalidRecord("a LogAppendTime batch needs the broker's append time")
        forced = append_time
    out: list[Message] = []
    append = out.append
    for index, r in enumerate(records):
        delta = r.offset_delta
        if keep_offsets:
            if delta <= prev or seq_base + delta < 1:
                raise _refuse(index, batch, f"offset delta {delta} after {prev}")
            prev = delta
        elif delta != index:
            raise _refuse(index, batch, f"offset delta {delta}, expected {index}")
        key = r.key
        value = r.value
        if value is None:
            raise _refuse(index, batch, "null value (Tank messages always have a value; "
                          "send an empty value instead)")
        if key is not None and len(key) > MAX_KEY_SIZE:
            raise _refuse(index, batch, f"key of {len(key)} bytes (Tank keys are at most "
                          f"{MAX_KEY_SIZE})")
        if r.headers:
            raise _refuse(index, batch, f"{len(r.headers)} record header(s) (Tank messages "
                          "have no headers)")
        ts = forced if forced is not None else base_ts + r.timestamp_delta
        if ts < 0:
            if ts != _NO_TIMESTAMP or append_time is None:
                raise _refuse(index, batch, f"timestamp {ts} (Tank timestamps are "
                              "milliseconds since 1970)")
            ts = append_time
        append(Message(value, key, ts, seq_base + delta if keep_offsets else 0))
    if keep_offsets and prev != batch.last_offset_delta:
        raise InvalidRecord(f"batch lastOffsetDelta {batch.last_offset_delta}, "
                            f"last record's {prev}")
    return out


def batch_to_bundle(
    batch: RecordBatch,
    *,
    codec: Codec | None = None,
    append_time: int | None = None,
    keep_offsets: bool = False,
) -> bytes:
    """One Tank bundle (unframed) holding ``batch``'s records in order.

    Plain by default (the Produce path); with ``keep_offsets`` a sparse bundle naming
    each message's sequence number (offset + 1), so that a batch built from the log
    maps back to the same bundle contents. ``codec`` overrides the rule of the module
    docstring (Snappy when the batch was compressed, none otherwise).
    """
    messages = batch_to_messages(batch, append_time=append_time, keep_offsets=keep_offsets)
    if codec is None:
        codec = Codec.NONE if batch.compression == Compression.NONE else Codec.SNAPPY
    return encode_bundle(messages, codec=codec, sparse=keep_offsets)


class FetchBatches:
    """What :func:`bundles_to_batches` built: a Fetch response's ``records`` bytes."""

    __slots__ = ("consumed", "next_seq", "partial", "records")

    def __init__(self, records: bytes, consumed: int, next_seq: int, partial: bool) -> None:
        #: The record batches, one per whole bundle, back to back.
        self.records = records
        #: Bytes of the chunk taken by whole bundles.
        self.consumed = consumed
        #: The Tank sequence after the last whole bundle (Kafka offset ``next_seq - 1``).
        self.next_seq = next_seq
        #: The chunk ended inside a bundle (left out).
        self.partial = partial


def _kafka_records(messages: Sequence[Message], first_seq: int, base_ts: int) -> bytearray:
    """The uncompressed records section for one bundle's messages.

    The Fetch-path inner loop: one pass, writing each record's bytes directly.
    """
    out = bytearray()
    body = bytearray()
    for m in messages:
        body.clear()
        body.append(0)  # record attributes
        _zz(body, m.timestamp - base_ts)
        _zz(body, m.seq - first_seq)
        key = m.key
        if key is None:
            body.append(1)  # zigzag(-1): null
        else:
            _zz(body, len(key))
            body += key
        _zz(body, len(m.value))
        body += m.value
        body.append(0)  # no headers
        _zz(out, len(body))
        out += body
    return out


def _zz(out: bytearray, value: int) -> None:
    raw = (value << 1) ^ (value >> 63)
    while raw >= 0x80:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)


def bundles_to_batches(
    chunk: bytes | memoryview,
    base_seq: int | None,
    *,
    compression: Compression | None = None,
) -> FetchBatches:
    """Kafka record batches for a run of framed Tank bundles (a store read or Consume chunk).

    ``base_seq`` numbers the first bundle's first message (``None`` when it is sparse);
    plain bundles continue from the previous one. Each whole bundle becomes one batch with
    ``baseOffset = first seq - 1`` and each message's offset its ``seq - 1`` (sparse gaps
    kept), timestamps preserved (``baseTimestamp`` the first message's), compressed with
    ``compression`` or, when ``None``, :data:`DEFAULT_FETCH_COMPRESSION`. A partial last
    bundle is left out. Raises ``ProtocolError`` for a corrupt bundle or a bundle Kafka
    cannot carry (a timestamp over int64, a sparse gap over int32).
    """
    view = memoryview(chunk)
    parts: list[bytes] = []
    seq = base_seq
    consumed = 0
    for offset, framed_len, info in iter_framed_bundles(view):
        first = info.first_seq if info.sparse else seq
        if first is None:
            raise ProtocolError("chunk starts with a plain bundle but no base sequence")
        # One bundle through the (compiled) chunk decoder: its messages with their seqs.
        messages = decode_chunk(view[offset:offset + framed_len], first).messages
        last = messages[-1].seq
        if last - first > _INT32_MAX:
            raise ProtocolError(f"bundle spans {last - first + 1} sequence numbers: "
                                "over a Kafka batch's int32 offset deltas")
        base_ts = messages[0].timestamp
        max_ts = max(m.timestamp for m in messages)
        if max_ts > _INT64_MAX:
            raise ProtocolError(f"timestamp {max_ts} is over Kafka's int64")
        batch = RecordBatch(
            base_offset=first - 1, base_timestamp=base_ts, max_timestamp=max_ts,
            last_offset_delta=last - first,
            attributes=int(DEFAULT_FETCH_COMPRESSION[info.codec] if compression is None
                           else compression))
        section = _kafka_records(messages, first, base_ts)
        parts.append(encode_batch(batch, section, len(messages)))
        seq = last + 1
        consumed = offset + framed_len
    partial = consumed < len(view)
    next_seq = seq if seq is not None else 0
    return FetchBatches(b"".join(parts), consumed, next_seq, partial)
