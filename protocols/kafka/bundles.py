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
layout, not Kafka's records section. Fetch: a Tank bundle is one batch, in the Kafka codec
:data:`FetchCodecs` names for the bundle's codec (:func:`fetch_codecs`): by default a plain
bundle an uncompressed batch and a Snappy one an uncompressed batch too
(:data:`DEFAULT_FETCH_CODECS`), which every Kafka client reads (stock kafkajs reads no
snappy, lz4 or zstd) and which costs the least CPU; the Kafka listener chooses per topic
and request (``kafka.fetch_compression``). What each choice costs is measured by
``python -m protocols.kafka.bench`` (the ``fetch`` rows).

Timestamps are milliseconds on both sides. Kafka's batch base timestamp is the first
record's, as the Java producer writes it; records keep their own order.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Final

import crc32c
import snappy

from protocols.errors import ProtocolError
from protocols.kafka.batch import (
    BATCH_HEADER_SIZE,
    MAX_BATCH_SIZE,
    Compression,
    InvalidRecord,
    RecordBatch,
    open_batch,
    read_batches,
)
from protocols.kafka.codecs import MAX_DECOMPRESSED_SIZE, compress
from protocols.native import speedups
from protocols.tank.bundle import (
    MAX_BUNDLE_SIZE,
    MAX_UNCOMPRESSED_SIZE,
    Codec,
    Message,
    decode_chunk_py,
    encode_bundle,
    iter_framed_bundles,
)
from protocols.wire import encode_varint

__all__ = [
    "DEFAULT_FETCH_CODECS",
    "FETCH_GZIP_LEVEL",
    "MAX_KEY_SIZE",
    "FetchBatches",
    "FetchCodecs",
    "KafkaSections",
    "batch_to_bundle",
    "batch_to_messages",
    "bundles_to_batches",
    "fetch_codecs",
    "kafka_sections",
    "kafka_sections_py",
    "records_to_bundles",
    "records_to_bundles_py",
]

#: Tank keys are ``u8 len | key``.
MAX_KEY_SIZE: Final = 255
#: The Kafka codec of a fetched batch for each Tank bundle codec, indexed by the bundle's
#: :class:`~protocols.tank.bundle.Codec` (``codecs[Codec.SNAPPY]``).
FetchCodecs = tuple[Compression, Compression]


def fetch_codecs(compressed: Compression, plain: Compression = Compression.NONE
                 ) -> FetchCodecs:
    """Fetched batches of Snappy bundles in ``compressed``, of plain ones in ``plain``."""
    return (Compression(plain), Compression(compressed))


#: What a fetch serves unless told otherwise: uncompressed batches (see the module
#: docstring).
DEFAULT_FETCH_CODECS: Final = fetch_codecs(Compression.NONE)
_INT32_MAX: Final = (1 << 31) - 1
_INT64_MAX: Final = (1 << 63) - 1
_NO_TIMESTAMP: Final = -1
_ATTR_LOG_APPEND_TIME: Final = 0x08
_ATTR_TRANSACTIONAL: Final = 0x10
_ATTR_CONTROL: Final = 0x20
_MAX_INLINE_COUNT: Final = 15
#: gzip level of fetched batches: each fetch compresses again, and level 1 is ~3x as fast
#: as the Java client's 6 for ~13% more bytes (``python -m protocols.kafka.bench``).
FETCH_GZIP_LEVEL: Final = 1


def _refuse(index: int, batch: RecordBatch, why: str) -> InvalidRecord:
    return InvalidRecord(f"record at offset delta {index} of the batch at base offset "
                         f"{batch.base_offset}: {why}")


def _batch_refusal(attributes: int, base_offset: int, count: int, last_offset_delta: int,
                   append_time: int | None, keep_offsets: bool = False) -> InvalidRecord | None:
    """What refuses a whole batch before its records are looked at, if anything."""
    if attributes & _ATTR_CONTROL:
        return InvalidRecord("control batches (transaction markers) are not supported")
    if attributes & _ATTR_TRANSACTIONAL:
        return InvalidRecord("transactional batches are not supported")
    if not count:
        return InvalidRecord(f"the batch at base offset {base_offset} has no records")
    if not keep_offsets and last_offset_delta != count - 1:
        return InvalidRecord(f"batch lastOffsetDelta {last_offset_delta} for {count} records")
    if attributes & _ATTR_LOG_APPEND_TIME and append_time is None:
        return InvalidRecord("a LogAppendTime batch needs the broker's append time")
    return None


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
    records = batch.records
    refusal = _batch_refusal(batch.attributes, batch.base_offset, len(records),
                             batch.last_offset_delta, append_time, keep_offsets)
    if refusal is not None:
        raise refusal
    seq_base = batch.base_offset + 1
    prev = -1
    base_ts = batch.base_timestamp
    forced = append_time if batch.log_append_time else None
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

    def __init__(self, records: bytes | bytearray, consumed: int, next_seq: int,
                 partial: bool) -> None:
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


#: One bundle's batch: ``(first_seq, last_seq, base_ts, max_ts, count, tank_codec, start,
#: end)``, its uncompressed records in ``buffer[start:end]`` after 61 free bytes.
SectionInfo = tuple[int, int, int, int, int, int, int, int]
#: ``(buffer, bundles, next_seq, consumed, partial_bundle_len)``: see :func:`kafka_sections_py`.
KafkaSections = tuple[bytearray, list[SectionInfo], int, int, int | None]

_HEAD: Final = struct.Struct(">qiibIhiqqqhii")
_CRC: Final = struct.Struct(">I")
_CRC_AT: Final = 17
_CRC_START: Final = 21
_LOG_OVERHEAD: Final = 12


def kafka_sections_py(
    chunk: bytes | memoryview,
    base_seq: int | None,
    max_bundle_size: int = MAX_BUNDLE_SIZE,
    max_uncompressed: int = MAX_UNCOMPRESSED_SIZE,
) -> KafkaSections:
    """Every whole framed bundle of ``chunk`` as the uncompressed records section of one
    Kafka batch (the Fetch path's per-message work; the reference of the compiled twin).

    Returns ``(buffer, bundles, next_seq, consumed, partial_bundle_len)``: ``buffer``
    holds, for each bundle, 61 zero bytes (room for its batch header) then its records;
    ``bundles`` one :data:`SectionInfo` per bundle. The chunk is decoded as
    :func:`~protocols.tank.bundle.decode_chunk_py` does (same errors); then the first
    bundle a batch can not carry (a timestamp over int64, a span over int32 offset
    deltas, a sequence number over int64 offsets) raises ``ProtocolError``.
    """
    decoded = decode_chunk_py(chunk, base_seq, max_bundle_size=max_bundle_size,
                              max_uncompressed=max_uncompressed)
    messages = decoded.messages
    buffer = bytearray()
    bundles: list[SectionInfo] = []
    at = 0
    for _, _, info in iter_framed_bundles(chunk, 0, decoded.consumed,
                                          max_bundle_size=max_bundle_size):
        mine = messages[at:at + info.msg_count]
        at += info.msg_count
        first, last = mine[0].seq, mine[-1].seq
        base_ts = mine[0].timestamp
        buffer += bytes(BATCH_HEADER_SIZE)
        start = len(buffer)
        buffer += _kafka_records(mine, first, base_ts)
        bundles.append((first, last, base_ts, max(m.timestamp for m in mine), len(mine),
                        int(info.codec), start, len(buffer)))
    for first, last, _, max_ts, _, _, _, _ in bundles:
        if last - 1 > _INT64_MAX:
            raise ProtocolError(f"sequence number {last} is over Kafka's int64 offsets")
        if last - first > _INT32_MAX:
            raise ProtocolError(f"bundle spans {last - first + 1} sequence numbers: "
                                "over a Kafka batch's int32 offset deltas")
        if max_ts > _INT64_MAX:
            raise ProtocolError(f"timestamp {max_ts} is over Kafka's int64")
    return (buffer, bundles, decoded.next_seq, decoded.consumed,
            decoded.partial_bundle_len)


def _kafka_sections_native(
    chunk: bytes | memoryview,
    base_seq: int | None,
    max_bundle_size: int = MAX_BUNDLE_SIZE,
    max_uncompressed: int = MAX_UNCOMPRESSED_SIZE,
) -> KafkaSections:
    """:func:`kafka_sections_py`, compiled: same arguments, results and errors."""
    assert speedups is not None
    got: KafkaSections = speedups.kafka_sections(chunk, base_seq, max_bundle_size,
                                                 max_uncompressed)
    return got


#: The extension has the Kafka loops (an extension built before them still serves the
#: other paths; the Kafka ones then run the references, and the selection test fails).
_COMPILED: Final = speedups is not None and hasattr(speedups, "kafka_to_tank")

kafka_sections: Callable[..., KafkaSections] = (
    _kafka_sections_native if _COMPILED else kafka_sections_py)


def bundles_to_batches(
    chunk: bytes | memoryview,
    base_seq: int | None,
    *,
    codecs: FetchCodecs = DEFAULT_FETCH_CODECS,
) -> FetchBatches:
    """Kafka record batches for a run of framed Tank bundles (a store read or Consume chunk).

    ``base_seq`` numbers the first bundle's first message (``None`` when it is sparse);
    plain bundles continue from the previous one. Each whole bundle becomes one batch with
    ``baseOffset = first seq - 1`` and each message's offset its ``seq - 1`` (sparse gaps
    kept), timestamps preserved (``baseTimestamp`` the first message's), compressed with
    ``codecs[bundle codec]`` (:func:`fetch_codecs`). A partial last
    bundle is left out. Raises ``ProtocolError`` for a corrupt chunk (as
    :func:`~protocols.tank.bundle.decode_chunk` does) or a bundle Kafka cannot carry (a
    timestamp over int64, a sparse gap over int32, an offset over int64).

    The records are written once (by :func:`kafka_sections`); uncompressed batches get
    their header in place, so a fetch of plain bundles builds no other copy.
    """
    buffer, bundles, next_seq, consumed, partial = kafka_sections(chunk, base_seq)
    pack_into = _HEAD.pack_into
    parts: list[bytes | bytearray] = []
    in_place = True
    with memoryview(buffer) as view:
        for first, last, base_ts, max_ts, count, codec, start, end in bundles:
            attributes = codecs[codec]
            at = start - BATCH_HEADER_SIZE
            if attributes == Compression.NONE:
                pack_into(buffer, at, first - 1, end - at - _LOG_OVERHEAD, -1, 2, 0,
                          attributes, last - first, base_ts, max_ts, -1, -1, -1, count)
                _CRC.pack_into(buffer, at + _CRC_AT,
                               crc32c.crc32c(view[at + _CRC_START:end]))
                parts.append(buffer[at:end] if not in_place else b"")
                continue
            if in_place:  # the batches so far, copied out after all
                parts = [buffer[a - BATCH_HEADER_SIZE:e] for *_, a, e in bundles[:len(parts)]]
                in_place = False
            body = compress(Compression(attributes), bytes(view[start:end]),
                            gzip_level=FETCH_GZIP_LEVEL)
            head = bytearray(BATCH_HEADER_SIZE)
            pack_into(head, 0, first - 1, BATCH_HEADER_SIZE - _LOG_OVERHEAD + len(body), -1,
                      2, 0, attributes, last - first, base_ts, max_ts, -1, -1, -1, count)
            crc = crc32c.crc32c(body, crc32c.crc32c(memoryview(head)[_CRC_START:]))
            _CRC.pack_into(head, _CRC_AT, crc)
            parts += (head, body)
    records = buffer if in_place else b"".join(parts)  # no copy of plain batches
    return FetchBatches(records, consumed, next_seq,
                        partial is not None or consumed < len(chunk))


# ------------------------------------------------------------------------- produce path


def _check_append_time(append_time: int | None) -> None:
    if append_time is not None and not 0 <= append_time <= _INT64_MAX:
        raise ValueError(f"append time {append_time} is not milliseconds since 1970")


def records_to_bundles_py(
    records: bytes | bytearray | memoryview,
    *,
    max_batch_size: int = MAX_BATCH_SIZE,
    max_uncompressed: int = MAX_DECOMPRESSED_SIZE,
    append_time: int | None = None,
) -> list[bytes]:
    """The Tank bundles (unframed) of a Produce partition's ``records``: one per batch,
    made by :func:`batch_to_bundle` (the reference of the compiled path).

    Every batch is read first (``CorruptBatch``, ``UnsupportedMagic``, ...; a run ending
    inside a batch is a ``ProtocolError``), then the first record Tank can not hold raises
    :class:`InvalidRecord`. ``append_time`` as for :func:`batch_to_messages`.
    """
    _check_append_time(append_time)
    run = read_batches(records, max_batch_size=max_batch_size,
                       max_uncompressed=max_uncompressed)
    if run.partial is not None:
        raise ProtocolError("the records end inside a batch")
    return [batch_to_bundle(batch, append_time=append_time) for batch in run.batches]


def _records_to_bundles_native(
    records: bytes | bytearray | memoryview,
    *,
    max_batch_size: int = MAX_BATCH_SIZE,
    max_uncompressed: int = MAX_DECOMPRESSED_SIZE,
    append_time: int | None = None,
) -> list[bytes]:
    """:func:`records_to_bundles_py` with each batch's records decoded, checked and
    re-encoded in one compiled pass; same arguments, results and errors."""
    assert speedups is not None
    _check_append_time(append_time)
    to_tank = speedups.kafka_to_tank
    end = len(records)
    pos = 0
    out: list[bytes] = []
    refused: InvalidRecord | None = None
    while pos < end:
        got = open_batch(records, pos, end, max_batch_size=max_batch_size,
                         max_uncompressed=max_uncompressed)
        if isinstance(got, int):
            raise ProtocolError("the records end inside a batch")
        head, section, start, stop, pos = got
        base_offset, attributes, last_delta, base_ts, count = (
            head[0], head[5], head[6], head[7], head[12])
        if refused is None:
            refused = _batch_refusal(attributes, base_offset, count, last_delta, append_time)
        plain = not attributes & 0x07
        forced = append_time if attributes & _ATTR_LOG_APPEND_TIME else None
        built, index, why = to_tank(section, start, stop, count, base_ts, forced, append_time,
                                    refused is None, plain)
        if refused is not None:
            continue
        if built is None:
            refused = InvalidRecord(f"record at offset delta {index} of the batch at base "
                                    f"offset {base_offset}: {why}")
            continue
        if not plain:
            built = b"".join((_bundle_head(Codec.SNAPPY, count), snappy.compress(built)))
        out.append(built)
    if refused is not None:
        raise refused
    return out


def _bundle_head(codec: Codec, count: int) -> bytes:
    """``encode_bundle``'s header of a plain (not sparse) bundle."""
    if count <= _MAX_INLINE_COUNT:
        return bytes((codec | count << 2,))
    return bytes((codec,)) + encode_varint(count)


records_to_bundles: Callable[..., list[bytes]] = (
    _records_to_bundles_native if _COMPILED else records_to_bundles_py)
