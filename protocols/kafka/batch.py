"""Kafka record batches (magic v2): the ``records`` field of Produce and Fetch.

Layout (Kafka's "Record Batch" documentation), integers big-endian, offsets from the
batch start::

     0 baseOffset: int64
     8 batchLength: int32        bytes after this field (partitionLeaderEpoch..end)
    12 partitionLeaderEpoch: int32
    16 magic: int8               2 (0 and 1 are the older message sets: refused)
    17 crc: uint32               CRC32C of attributes..end
    21 attributes: int16         bits 0-2 codec, 3 timestampType (1 = LogAppendTime),
                                 4 isTransactional, 5 isControlBatch
    23 lastOffsetDelta: int32
    27 baseTimestamp: int64
    35 maxTimestamp: int64
    43 producerId: int64
    51 producerEpoch: int16
    53 baseSequence: int32
    57 records count: int32
    61 records                   compressed as a whole when the codec is not none

    record = length: varint | attributes: int8 | timestampDelta: varlong
             | offsetDelta: varint | keyLength: varint | key | valueLength: varint | value
             | headers count: varint | headers
    header = keyLength: varint | key | valueLength: varint | value

The varints of records are zigzag-encoded signed LEB128 (varint: int32, at most 5 bytes;
varlong: int64, at most 10). A length of -1 is a null key or value.

Readers return a value, report that more bytes are needed, or raise ``ProtocolError``
(a subclass carrying the Kafka error code where Kafka has one); nothing else. A run of
batches may end in a partial batch (Fetch responses are cut at the byte limit): that is
reported, not raised. Encoders raise ``ValueError`` on arguments they cannot represent.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Final

import crc32c

from protocols.errors import ProtocolError
from protocols.kafka.codecs import (
    MAX_DECOMPRESSED_SIZE,
    Compression,
    UnsupportedCompression,
    compress,
    decompress,
)

__all__ = [
    "BATCH_HEADER_SIZE",
    "CORRUPT_MESSAGE",
    "INVALID_RECORD",
    "MAX_BATCH_SIZE",
    "MESSAGE_TOO_LARGE",
    "UNSUPPORTED_FOR_MESSAGE_FORMAT",
    "UNSUPPORTED_VERSION",
    "BatchHead",
    "BatchRun",
    "BatchTooLarge",
    "Compression",
    "CorruptBatch",
    "InvalidRecord",
    "Record",
    "RecordBatch",
    "UnsupportedCompression",
    "UnsupportedMagic",
    "decode_records",
    "encode_batch",
    "encode_records",
    "open_batch",
    "read_batch",
    "read_batches",
]

# Kafka error codes the readers' exceptions carry.
CORRUPT_MESSAGE: Final = 2
MESSAGE_TOO_LARGE: Final = 10
UNSUPPORTED_VERSION: Final = 35
UNSUPPORTED_FOR_MESSAGE_FORMAT: Final = 43
INVALID_RECORD: Final = 87

#: Bytes before the records: the fixed header.
BATCH_HEADER_SIZE: Final = 61
#: Bytes needed to see a batch's magic byte.
_UP_TO_MAGIC: Final = 17
#: Bytes before batchLength starts counting.
_LOG_OVERHEAD: Final = 12
_CRC_START: Final = 21
_MIN_BATCH_LENGTH: Final = BATCH_HEADER_SIZE - _LOG_OVERHEAD
#: Default bound on one batch (batchLength + 12): Tank's largest frame.
MAX_BATCH_SIZE: Final = 256 * 1024 * 1024
#: The smallest record: length, attributes, timestampDelta, offsetDelta, key length,
#: value length, headers count: one byte each.
_MIN_RECORD_SIZE: Final = 7

_ATTR_CODEC: Final = 0x07
_ATTR_LOG_APPEND_TIME: Final = 0x08
_ATTR_TRANSACTIONAL: Final = 0x10
_ATTR_CONTROL: Final = 0x20

_INT64_MIN: Final = -(1 << 63)
_INT64_MAX: Final = (1 << 63) - 1

_LENGTH: Final = struct.Struct(">qi")
_HEAD: Final = struct.Struct(">qiibIhiqqqhii")  # the 61-byte header, as written
_AFTER_CRC: Final = struct.Struct(">hiqqqhii")  # attributes .. records count
_I32: Final = struct.Struct(">i")


class UnsupportedMagic(ProtocolError):
    """A batch in an older message format (magic 0 or 1) or an unknown one.

    Carries UNSUPPORTED_VERSION (what the issue asks the listener to answer); a
    listener that prefers Kafka's broker behaviour maps it to
    UNSUPPORTED_FOR_MESSAGE_FORMAT (43) instead.
    """

    def __init__(self, magic: int) -> None:
        super().__init__(f"record batch magic {magic}: only magic 2 (Kafka 0.11+) is supported",
                         error_code=UNSUPPORTED_VERSION)
        self.magic = magic


class CorruptBatch(ProtocolError):
    """A batch whose CRC, lengths or records do not hold together (CORRUPT_MESSAGE)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, error_code=CORRUPT_MESSAGE)


class BatchTooLarge(ProtocolError):
    """A batch longer than the reader's ``max_batch_size`` (MESSAGE_TOO_LARGE)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"record batch of {size} bytes is over the {limit} byte limit",
                         error_code=MESSAGE_TOO_LARGE)
        self.size = size


class InvalidRecord(ProtocolError):
    """A well-formed record the log cannot hold (INVALID_RECORD): see ``bundles``."""

    def __init__(self, message: str) -> None:
        super().__init__(message, error_code=INVALID_RECORD)


@dataclass(slots=True)
class Record:
    """One record of a batch. ``headers`` are ``(key, value)`` pairs, value maybe null."""

    offset_delta: int
    timestamp_delta: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[bytes, bytes | None], ...] = ()
    attributes: int = 0


@dataclass(slots=True)
class RecordBatch:
    """One magic-2 record batch, its records decoded (decompressed if need be)."""

    base_offset: int
    base_timestamp: int
    max_timestamp: int
    last_offset_delta: int
    records: list[Record] = field(default_factory=list)
    attributes: int = 0
    partition_leader_epoch: int = -1
    producer_id: int = -1
    producer_epoch: int = -1
    base_sequence: int = -1
    #: The CRC as read (encoding computes its own).
    crc: int = 0

    @property
    def compression(self) -> int:
        """The codec number (attributes bits 0-2): a :class:`Compression` value."""
        return self.attributes & _ATTR_CODEC

    @property
    def log_append_time(self) -> bool:
        """timestampType: the broker, not the producer, set the timestamps."""
        return bool(self.attributes & _ATTR_LOG_APPEND_TIME)

    @property
    def transactional(self) -> bool:
        return bool(self.attributes & _ATTR_TRANSACTIONAL)

    @property
    def control(self) -> bool:
        """A control batch (transaction markers), not data."""
        return bool(self.attributes & _ATTR_CONTROL)


@dataclass(slots=True)
class BatchRun:
    """What :func:`read_batches` found in a ``records`` field."""

    batches: list[RecordBatch]
    #: Bytes taken by whole batches.
    consumed: int
    #: A partial last batch's full length when its length field was read, else the bytes
    #: needed to read it (a lower bound); ``None`` when the run ended on a batch boundary.
    partial: int | None


# ----------------------------------------------------------------------------- varints


def _zigzag(buf: bytes, pos: int, end: int, max_len: int, what: str) -> tuple[int, int]:
    """A zigzag varint at ``buf[pos:end]`` of at most ``max_len`` bytes: (value, next)."""
    raw = 0
    shift = 0
    stop = min(end, pos + max_len)
    while pos < stop:
        byte = buf[pos]
        pos += 1
        raw |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7
    if pos >= end:
        raise CorruptBatch(f"truncated {what}")
    raise CorruptBatch(f"{what}: varint longer than {max_len} bytes")


def _zz32(buf: bytes, pos: int, end: int, what: str) -> tuple[int, int]:
    # One-byte fast path: the commonest lengths and deltas.
    if pos < end:
        b = buf[pos]
        if b < 0x80:
            return (b >> 1) ^ -(b & 1), pos + 1
    value, pos = _zigzag(buf, pos, end, 5, what)
    if not -(1 << 31) <= value < (1 << 31):
        raise CorruptBatch(f"{what}: varint outside int32")
    return value, pos


def _put_zigzag(out: bytearray, value: int) -> None:
    raw = (value << 1) ^ (value >> 63)
    while raw >= 0x80:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)


# Encoded zigzag varints of small values (-64..63 fit in one byte).
_ZZ1: Final = {v: bytes((((v << 1) ^ (v >> 63)) & 0xFF,)) for v in range(-64, 64)}


# ----------------------------------------------------------------------------- records


def decode_records(buf: bytes, pos: int, end: int, count: int) -> list[Record]:
    """Decode ``count`` records from ``buf[pos:end]``, which they must fill exactly.

    The Produce-path inner loop (one pass, no copies but the keys and values).
    """
    if count * _MIN_RECORD_SIZE > end - pos:
        raise CorruptBatch(f"batch claims {count} records in {end - pos} bytes")
    out: list[Record] = []
    append = out.append
    zz = _zz32
    for _ in range(count):
        length, pos = zz(buf, pos, end, "record length")
        rend = pos + length
        if length < 6 or rend > end:
            raise CorruptBatch(f"record length {length} does not fit the batch")
        attributes = buf[pos]
        ts_delta, pos = _zigzag(buf, pos + 1, rend, 10, "record timestamp delta")
        if not _INT64_MIN <= ts_delta <= _INT64_MAX:
            raise CorruptBatch("record timestamp delta outside int64")
        off_delta, pos = zz(buf, pos, rend, "record offset delta")
        klen, pos = zz(buf, pos, rend, "record key length")
        key = None
        if klen >= 0:
            if pos + klen > rend:
                raise CorruptBatch("record key overruns the record")
            key = buf[pos:pos + klen]
            pos += klen
        elif klen != -1:
            raise CorruptBatch(f"record key length {klen}")
        vlen, pos = zz(buf, pos, rend, "record value length")
        value = None
        if vlen >= 0:
            if pos + vlen > rend:
                raise CorruptBatch("record value overruns the record")
            value = buf[pos:pos + vlen]
            pos += vlen
        elif vlen != -1:
            raise CorruptBatch(f"record value length {vlen}")
        nheaders, pos = zz(buf, pos, rend, "record header count")
        headers: tuple[tuple[bytes, bytes | None], ...] = ()
        if nheaders:
            pos, headers = _decode_headers(buf, pos, rend, nheaders)
        if pos != rend:
            raise CorruptBatch("record length disagrees with its fields")
        append(Record(off_delta, ts_delta, key, value, headers, attributes))
    if pos != end:
        raise CorruptBatch(f"{end - pos} bytes after the batch's {count} records")
    return out


def _decode_headers(buf: bytes, pos: int, end: int, count: int
                    ) -> tuple[int, tuple[tuple[bytes, bytes | None], ...]]:
    if count < 0 or count * 2 > end - pos:
        raise CorruptBatch(f"record header count {count} does not fit the record")
    headers = []
    for _ in range(count):
        klen, pos = _zz32(buf, pos, end, "header key length")
        if klen < 0 or pos + klen > end:
            raise CorruptBatch(f"header key length {klen} does not fit the record")
        key = buf[pos:pos + klen]
        pos += klen
        vlen, pos = _zz32(buf, pos, end, "header value length")
        value = None
        if vlen >= 0:
            if pos + vlen > end:
                raise CorruptBatch("header value overruns the record")
            value = buf[pos:pos + vlen]
            pos += vlen
        elif vlen != -1:
            raise CorruptBatch(f"header value length {vlen}")
        headers.append((key, value))
    return pos, tuple(headers)


def encode_records(records: list[Record]) -> bytearray:
    """The uncompressed records section for ``records`` (the Fetch-path inner loop)."""
    out = bytearray()
    zz1 = _ZZ1
    put = _put_zigzag
    body = bytearray()
    for r in records:
        body.clear()
        body.append(r.attributes)
        td = r.timestamp_delta
        if -64 <= td < 64:
            body += zz1[td]
        else:
            put(body, td)
        od = r.offset_delta
        if -64 <= od < 64:
            body += zz1[od]
        else:
            put(body, od)
        for blob in (r.key, r.value):
            if blob is None:
                body.append(1)  # zigzag(-1)
            else:
                put(body, len(blob))
                body += blob
        put(body, len(r.headers))
        for hkey, hvalue in r.headers:
            put(body, len(hkey))
            body += hkey
            if hvalue is None:
                body.append(1)
            else:
                put(body, len(hvalue))
                body += hvalue
        put(out, len(body))
        out += body
    return out


# ----------------------------------------------------------------------------- batches


def encode_batch(batch: RecordBatch, records_section: bytes | bytearray | None = None,
                 count: int | None = None, *, gzip_level: int | None = None) -> bytes:
    """Encode ``batch`` (codec from its attributes), computing length and CRC.

    ``records_section`` is the uncompressed records bytes when the caller already has
    them, ``count`` the number of records in it; by default both come from
    ``batch.records``. ``gzip_level``: of a gzip batch (None: the codec's default).
    """
    codec = batch.attributes & _ATTR_CODEC
    if codec > Compression.ZSTD:
        raise ValueError(f"unknown codec {codec}")
    if records_section is None:
        records_section = encode_records(batch.records)
        count = len(batch.records)
    elif count is None:
        raise ValueError("count is required with records_section")
    level = {} if gzip_level is None else {"gzip_level": gzip_level}
    body = compress(Compression(codec), bytes(records_section), **level)
    try:
        tail = _AFTER_CRC.pack(
            batch.attributes, batch.last_offset_delta, batch.base_timestamp,
            batch.max_timestamp, batch.producer_id, batch.producer_epoch,
            batch.base_sequence, count)
        head = _LENGTH.pack(batch.base_offset, BATCH_HEADER_SIZE - _LOG_OVERHEAD + len(body))
        crc = crc32c.crc32c(body, crc32c.crc32c(tail))
        mid = struct.pack(">ibI", batch.partition_leader_epoch, 2, crc)
    except struct.error as exc:
        raise ValueError(f"record batch field out of range: {exc}") from None
    return b"".join((head, mid, tail, body))


def read_batch(
    buf: bytes | bytearray | memoryview,
    pos: int = 0,
    end: int | None = None,
    *,
    max_batch_size: int = MAX_BATCH_SIZE,
    max_uncompressed: int = MAX_DECOMPRESSED_SIZE,
) -> tuple[RecordBatch, int] | int:
    """Read the batch at ``buf[pos:end]``.

    Returns ``(batch, next_pos)``, or, when ``buf`` ends inside the batch, the number of
    bytes the whole batch takes (a lower bound while its header is cut). Raises
    ``UnsupportedMagic``, ``CorruptBatch``, ``BatchTooLarge``, ``UnsupportedCompression``
    or ``ProtocolError``.
    """
    if end is None:
        end = len(buf)
    got = open_batch(buf, pos, end, max_batch_size=max_batch_size,
                     max_uncompressed=max_uncompressed)
    if isinstance(got, int):
        return got
    head, section, start, stop, after = got
    (base_offset, _, epoch, _, crc, attributes, last_delta, base_ts, max_ts, producer_id,
     producer_epoch, base_seq, count) = head
    if not isinstance(section, bytes):  # keys and values are bytes
        section, start, stop = bytes(section[start:stop]), 0, stop - start
    records = decode_records(section, start, stop, count)
    batch = RecordBatch(base_offset, base_ts, max_ts, last_delta, records, attributes, epoch,
                        producer_id, producer_epoch, base_seq, crc)
    return batch, after


@dataclass(frozen=True, slots=True)
class ProducerStamp:
    """What an idempotent producer's sequence check needs of one batch."""

    producer_id: int
    producer_epoch: int
    base_sequence: int
    last_offset_delta: int


def producer_stamps(buf: bytes | bytearray | memoryview) -> list[ProducerStamp]:
    """Each batch's producer fields, read from the headers only (no CRC check, no
    decompression): for a ``records`` field already checked whole (e.g. by
    :func:`~protocols.kafka.bundles.records_to_bundles`)."""
    stamps = []
    pos, end = 0, len(buf)
    while pos + BATCH_HEADER_SIZE <= end:
        head = _HEAD.unpack_from(buf, pos)
        stamps.append(ProducerStamp(head[9], head[10], head[11], head[6]))
        pos += _LOG_OVERHEAD + head[1]
    return stamps


#: The 13 fields of a batch header, as :data:`_HEAD` unpacks them.
BatchHead = tuple[int, int, int, int, int, int, int, int, int, int, int, int, int]


def open_batch(
    buf: bytes | bytearray | memoryview,
    pos: int,
    end: int,
    *,
    max_batch_size: int = MAX_BATCH_SIZE,
    max_uncompressed: int = MAX_DECOMPRESSED_SIZE,
) -> tuple[BatchHead, bytes | bytearray | memoryview, int, int, int] | int:
    """The batch at ``buf[pos:end]`` checked (length, magic, CRC, count) and its records
    section uncompressed, records not decoded: ``(head, section, start, stop, next_pos)``
    with the records in ``section[start:stop]`` (the input itself when uncompressed: no
    copy), or the bytes the whole batch needs (see :func:`read_batch`). Same errors.
    """
    have = end - pos
    if have < _UP_TO_MAGIC:
        return _UP_TO_MAGIC
    _, length = _LENGTH.unpack_from(buf, pos)
    magic = buf[pos + 16]
    if magic != 2:
        raise UnsupportedMagic(magic)
    if length < _MIN_BATCH_LENGTH:
        raise CorruptBatch(f"record batch length {length} is under the header's")
    size: int = _LOG_OVERHEAD + length
    if size > max_batch_size:
        raise BatchTooLarge(size, max_batch_size)
    if have < size:
        return size
    head: BatchHead = _HEAD.unpack_from(buf, pos)
    crc, attributes, count = head[4], head[5], head[12]
    with memoryview(buf) as view:
        actual = crc32c.crc32c(view[pos + _CRC_START:pos + size])
    if actual != crc:
        raise CorruptBatch(f"record batch CRC {crc:#010x}, computed {actual:#010x}")
    if count < 0:
        raise CorruptBatch(f"record batch count {count}")
    codec = attributes & _ATTR_CODEC
    if codec == Compression.NONE:
        return head, buf, pos + BATCH_HEADER_SIZE, pos + size, pos + size
    section = decompress(codec, bytes(buf[pos + BATCH_HEADER_SIZE:pos + size]),
                         max_uncompressed)
    return head, section, 0, len(section), pos + size


def read_batches(
    buf: bytes | bytearray | memoryview,
    *,
    max_batch_size: int = MAX_BATCH_SIZE,
    max_uncompressed: int = MAX_DECOMPRESSED_SIZE,
) -> BatchRun:
    """Every whole batch of a ``records`` field, and what a partial last one needs.

    A Produce request must hold whole batches only (the caller checks ``partial``);
    a Fetch response may end in a partial batch, which a consumer skips.
    """
    pos = 0
    end = len(buf)
    batches = []
    partial = None
    while pos < end:
        got = read_batch(buf, pos, end, max_batch_size=max_batch_size,
                         max_uncompressed=max_uncompressed)
        if isinstance(got, int):
            partial = got
            break
        batch, pos = got
        batches.append(batch)
    return BatchRun(batches, pos, partial)
