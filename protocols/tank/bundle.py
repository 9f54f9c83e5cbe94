"""Tank bundles: the unit of produce, consume and segment storage.

Layout (``../shared/seeds/tank_encoding.md``, corrected by the "Bundles" section of
``../shared/notes/protocol-facts.md``), all integers little-endian::

    bundle   = flags:u8 [count:varint] [sparse: firstSeq:u64 [last-first-1:varint]] messageSet
    flags    = bits 0-1 codec (0 none, 1 raw Snappy of the whole message set),
               bits 2-5 message count 1..15 (0: a varint count follows), bit 6 sparse,
               bit 7 never set (documented as "extra flags", implemented nowhere: refused)
    message  = flags:u8 [delta:varint] [ts:u64] [keyLen:u8 key] valueLen:varint value
    msgflags = HaveKey 1, UseLastSpecifiedTS 2, SeqNumPrevPlusOne 4 (other bits refused)

Sequence numbers are not stored in a plain bundle: the reader knows the first one
(a segment's base, a Consume response's ``baseSeq``) and counts. A sparse bundle names
its first and last in the header; a middle message either has SeqNumPrevPlusOne or a
``varint(seq - prev - 1)`` after its flags.

Timestamps: like Tank's own decoder, the "last specified" timestamp starts at 0 in every
bundle, so a UseLastSpecifiedTS on the first message yields timestamp 0 (Tank's encoder
never writes that). SeqNumPrevPlusOne is ignored outside the middle of a sparse bundle,
as Tank does, except that on a sparse bundle's last message it must agree with the header.

Everything here is pure: bytes in, values out. Bad input raises ``ProtocolError`` and
nothing else; bad arguments to the encoder raise ``ValueError``.

:func:`validate_bundle` and :func:`decode_chunk` are the compiled twins in
``protocols._speedups`` when the extension is in use (:mod:`protocols.native`), else the
pure-Python references ``validate_bundle_py`` and ``decode_chunk_py``; the differential
tests hold the two to the same results and the same errors.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Final

import snappy

from protocols.errors import ProtocolError
from protocols.native import speedups
from protocols.wire import U64LE, UINT64_MAX, decode_varint, encode_varint

__all__ = [
    "MAX_BUNDLE_SIZE",
    "MAX_UNCOMPRESSED_SIZE",
    "SPARSE_FLAG",
    "BundleInfo",
    "ChunkResult",
    "Codec",
    "Message",
    "bundle_last_seq",
    "choose_codec",
    "chunk_end",
    "decode_bundle",
    "decode_chunk",
    "decode_chunk_py",
    "encode_bundle",
    "frame_bundle",
    "iter_framed_bundles",
    "parse_bundle_header",
    "plain_size",
    "read_framed_header",
    "validate_bundle",
    "validate_bundle_py",
]

#: A Snappy message set announcing a larger uncompressed size is refused unread.
MAX_UNCOMPRESSED_SIZE: Final = 256 * 1024 * 1024
#: A framed bundle can not be longer than the largest Tank frame (256 MiB).
MAX_BUNDLE_SIZE: Final = 256 * 1024 * 1024

HAVE_KEY: Final = 1
USE_LAST_SPECIFIED_TS: Final = 2
SEQ_NUM_PREV_PLUS_ONE: Final = 4
_MSG_FLAGS_MAX: Final = 7

#: Bundle flags bit 6: the bundle names its own sequence numbers.
SPARSE_FLAG: Final = 0x40
_SPARSE_BIT: Final = SPARSE_FLAG
_RESERVED_BIT: Final = 0x80
_MAX_INLINE_COUNT: Final = 15
#: The smallest message: flags byte and a one-byte value length (empty value).
_MIN_MESSAGE_SIZE: Final = 2

_unpack_u64 = U64LE.unpack_from
_pack_u64 = U64LE.pack


class Codec(IntEnum):
    """Compression of a bundle's message set (bundle flags bits 0-1)."""

    NONE = 0
    SNAPPY = 1


_CODECS: Final = (Codec.NONE, Codec.SNAPPY)


@dataclass(slots=True)
class Message:
    """One message of a bundle.

    ``seq`` is the absolute sequence number: set by the decoders; the encoder reads it
    only for sparse bundles. ``timestamp`` is u64 milliseconds. ``key`` is at most
    255 bytes; ``b""`` and ``None`` are kept distinct on the wire.
    """

    value: bytes
    key: bytes | None = None
    timestamp: int = 0
    seq: int = 0


@dataclass(frozen=True, slots=True)
class BundleInfo:
    """What a bundle header says, without decoding any message."""

    msg_count: int
    codec: Codec
    sparse: bool
    #: Sparse bundles only: the first message's sequence number.
    first_seq: int | None
    #: Sparse bundles only: the last message's sequence number.
    last_seq: int | None


@dataclass(slots=True)
class ChunkResult:
    """What :func:`decode_chunk` found in a run of framed bundles."""

    #: Messages with ``seq >= min_seq``, in order.
    messages: list[Message]
    #: Where the next fetch should start.
    next_seq: int
    #: Bytes of the chunk taken by whole bundles.
    consumed: int
    #: A partial last bundle's full framed length (a lower bound when the cut falls inside
    #: its length varint); ``None`` when the chunk ended on a bundle boundary.
    partial_bundle_len: int | None


# ---------------------------------------------------------------------------- encoding

# The header of the commonest message: no key, same timestamp, value shorter than 128.
_SHORT_HEADERS: Final = tuple(bytes((USE_LAST_SPECIFIED_TS, n)) for n in range(0x80))


def choose_codec(messages: Sequence[Message]) -> Codec:
    """Tank's client rule: Snappy for > 512 messages or > 1024 bytes of keys and values."""
    if len(messages) > 512:
        return Codec.SNAPPY
    total = 0
    for m in messages:
        total += len(m.value)
        if m.key:
            total += len(m.key)
        if total > 1024:
            return Codec.SNAPPY
    return Codec.NONE


def encode_bundle(
    messages: Sequence[Message], *, codec: Codec | None = None, sparse: bool = False
) -> bytes:
    """Encode ``messages`` as one bundle (without the length prefix; see :func:`frame_bundle`).

    ``codec=None`` applies :func:`choose_codec`. With ``sparse=True`` every message's
    ``seq`` is written (they must strictly increase); otherwise ``seq`` is ignored.
    Raises ``ValueError`` for an empty list, a key over 255 bytes, a timestamp or sequence
    number outside u64, or non-increasing sparse sequence numbers. (Tank's own readers
    decode sparse gaps as 32-bit varints: keep gaps under 2**32 for data Tank must read.)
    """
    count = len(messages)
    if count == 0:
        raise ValueError("a bundle holds at least one message")
    codec = choose_codec(messages) if codec is None else Codec(codec)
    flags = codec | (_SPARSE_BIT if sparse else 0)
    head = bytearray()
    if count <= _MAX_INLINE_COUNT:
        head.append(flags | count << 2)
    else:
        head.append(flags)
        head += encode_varint(count)
    body: bytes | bytearray
    try:
        if sparse:
            first, last = messages[0].seq, messages[-1].seq
            head += _pack_u64(first)
            if count > 1:
                if not first < last <= UINT64_MAX:
                    raise ValueError("sparse sequence numbers must strictly increase within u64")
                head += encode_varint(last - first - 1)
            body = _encode_sparse_set(messages)
        else:
            body = _encode_plain_set(messages)
    except struct.error as exc:
        raise ValueError(f"timestamp or sequence number outside u64: {exc}") from None
    if codec is Codec.SNAPPY:
        # types-python-snappy says bytes; python-snappy takes any buffer (no copy here).
        body = snappy.compress(body)  # type: ignore[arg-type]
    return b"".join((head, body))


def _encode_plain_set(messages: Sequence[Message]) -> bytearray:
    out = bytearray()
    short_headers = _SHORT_HEADERS
    pack_u64 = _pack_u64
    last_ts = None
    for m in messages:
        value = m.value
        key = m.key
        ts = m.timestamp
        n = len(value)
        if ts == last_ts:
            if key is None and n < 0x80:
                out += short_headers[n]
                out += value
                continue
            if key is None and n < 0x4000:  # two-byte varint length, inline
                out += bytes((USE_LAST_SPECIFIED_TS, (n & 0x7F) | 0x80, n >> 7))
                out += value
                continue
            out.append(USE_LAST_SPECIFIED_TS if key is None else USE_LAST_SPECIFIED_TS | HAVE_KEY)
        else:
            out.append(0 if key is None else HAVE_KEY)
            out += pack_u64(ts)
            last_ts = ts
        if key is not None:
            _append_key(out, key)
        if n < 0x80:
            out.append(n)
        else:
            out += encode_varint(n)
        out += value
    return out


def _encode_sparse_set(messages: Sequence[Message]) -> bytearray:
    out = bytearray()
    final = len(messages) - 1
    last_ts = None
    prev_seq = -1
    for idx, m in enumerate(messages):
        seq = m.seq
        if seq <= prev_seq:
            raise ValueError("sparse sequence numbers must strictly increase")
        flags = 0 if m.key is None else HAVE_KEY
        if m.timestamp == last_ts:
            flags |= USE_LAST_SPECIFIED_TS
        delta = b""
        if 0 < idx < final:
            if seq == prev_seq + 1:
                flags |= SEQ_NUM_PREV_PLUS_ONE
            else:
                delta = encode_varint(seq - prev_seq - 1)
        out.append(flags)
        out += delta
        if not flags & USE_LAST_SPECIFIED_TS:
            last_ts = m.timestamp
            out += _pack_u64(last_ts)
        if m.key is not None:
            _append_key(out, m.key)
        out += encode_varint(len(m.value))
        out += m.value
        prev_seq = seq
    return out


def _append_key(out: bytearray, key: bytes) -> None:
    if len(key) > 0xFF:
        raise ValueError(f"message key longer than 255 bytes: {len(key)}")
    out.append(len(key))
    out += key


def frame_bundle(bundle: bytes) -> bytes:
    """``varint(len(bundle)) | bundle``: the form stored in segments and sent in chunks."""
    return encode_varint(len(bundle)) + bundle


# ----------------------------------------------------------------------------- headers


def _varint(buf: bytes | memoryview, pos: int, end: int, what: str) -> tuple[int, int]:
    decoded = decode_varint(buf, pos, end)
    if decoded is None:
        raise ProtocolError(f"truncated {what} at offset {pos}")
    return decoded


def _parse_header(
    buf: bytes | memoryview, pos: int, end: int, whole: bool = True
) -> tuple[int, int, int | None, int | None, int]:
    """Parse the header of the bundle at ``buf[pos:end]``.

    Returns ``(codec, count, first_seq, last_seq, message_set_offset)``; the sequence
    numbers are ``None`` for a plain bundle. With ``whole`` false, ``buf`` may end after
    the header (the message set is not looked at).
    """
    if pos >= end:
        raise ProtocolError("empty bundle")
    flags = buf[pos]
    pos += 1
    if flags & _RESERVED_BIT:
        raise ProtocolError(f"bundle flags {flags:#04x}: bit 7 is not supported")
    codec = flags & 3
    if codec > Codec.SNAPPY:
        raise ProtocolError(f"unknown bundle codec {codec}")
    count = (flags >> 2) & 0xF
    if count == 0:
        count, pos = _varint(buf, pos, end, "bundle message count")
        if count == 0:
            raise ProtocolError("bundle with no messages")
    first = last = None
    if flags & _SPARSE_BIT:
        if end - pos < 8:
            raise ProtocolError("truncated sparse bundle first sequence number")
        first = last = _unpack_u64(buf, pos)[0]
        pos += 8
        if count > 1:
            gap, pos = _varint(buf, pos, end, "sparse bundle last sequence number")
            last = first + gap + 1
            if last > UINT64_MAX:
                raise ProtocolError("sparse bundle last sequence number overflows u64")
            if last - first + 1 < count:
                raise ProtocolError(
                    f"sparse bundle spans {last - first + 1} sequence numbers for {count} messages"
                )
    if whole and codec == Codec.NONE and count * _MIN_MESSAGE_SIZE > end - pos:
        raise ProtocolError(f"bundle claims {count} messages in {end - pos} bytes")
    return codec, count, first, last, pos


def _info(codec: int, count: int, first: int | None, last: int | None) -> BundleInfo:
    return BundleInfo(count, _CODECS[codec], first is not None, first, last)


def parse_bundle_header(bundle: bytes | memoryview) -> BundleInfo:
    """Read a bundle's header only (cheap). Raises ``ProtocolError`` on a bad or short header."""
    codec, count, first, last, _ = _parse_header(bundle, 0, len(bundle))
    return _info(codec, count, first, last)


def plain_size(bundle: bytes | memoryview) -> int:
    """About how many bytes the (unframed, valid) ``bundle`` takes uncompressed: itself
    when plain; for a Snappy bundle, its header plus the preamble's claim, trusted up to
    32 times the compressed size (this sizes batches and buffers; it checks nothing).
    Raises ``ProtocolError`` on a bad header."""
    codec, _, _, _, pos = _parse_header(bundle, 0, len(bundle), whole=False)
    if codec == Codec.NONE:
        return len(bundle)
    claim = decode_varint(bundle, pos, len(bundle))
    if claim is None:
        return len(bundle)
    return pos + min(claim[0], 32 * len(bundle))


def read_framed_header(
    buf: bytes | memoryview, pos: int, end: int
) -> tuple[int, int, int | None, int | None]:
    """Read the length prefix and header of the framed bundle at ``buf[pos:end]``.

    ``buf`` needs to hold only those, not the message set (a read-ahead window over a
    segment file). Returns ``(framed_length, count, first_seq, last_seq)``, the sequence
    numbers ``None`` for a plain bundle. Raises ``ProtocolError`` on a prefix or header
    that is malformed or cut short.
    """
    # Inline fast paths for the common case (recovery walks whole segments with this):
    # a one-byte length, a plain bundle with its count in the flags.
    length = buf[pos] if pos < end else 0x80
    if length < 0x80:
        hpos = pos + 1
    else:
        decoded = decode_varint(buf, pos, end)
        if decoded is None:
            raise ProtocolError("truncated bundle length")
        length, hpos = decoded
    if length == 0:
        raise ProtocolError("zero-length bundle")
    if hpos < end:
        flags = buf[hpos]
        if flags < _SPARSE_BIT and flags & 3 < 2 and flags >> 2:
            return hpos - pos + length, flags >> 2, None, None
    _, count, first, last, _ = _parse_header(buf, hpos, min(end, hpos + length), False)
    return hpos - pos + length, count, first, last


def bundle_last_seq(info: BundleInfo, base_seq: int | None) -> int:
    """The last message's sequence number: from the header if sparse, else counted from base."""
    if info.sparse:
        assert info.last_seq is not None
        return info.last_seq
    if base_seq is None:
        raise ValueError("a plain bundle needs the base sequence number")
    return base_seq + info.msg_count - 1


# --------------------------------------------------------------------------- decoding


def _message_set(
    buf: bytes | memoryview, pos: int, end: int, codec: int, max_uncompressed: int
) -> tuple[bytes | memoryview, int, int]:
    """The plain message set of the bundle body at ``buf[pos:end]``, as (buffer, pos, end)."""
    if codec == Codec.NONE:
        return buf, pos, end
    size, _ = _varint(buf, pos, end, "snappy uncompressed length")
    if size > max_uncompressed:
        raise ProtocolError(
            f"snappy message set of {size} bytes is over the {max_uncompressed} byte limit"
        )
    try:
        plain = snappy.decompress(bytes(buf[pos:end]))
    except Exception as exc:  # whatever the decompressor says, the input is corrupt
        detail = exc.__cause__ or exc  # python-snappy wraps the real reason
        raise ProtocolError(f"corrupt snappy message set: {detail}") from None
    if len(plain) != size:
        raise ProtocolError("snappy message set length differs from its preamble")
    return plain, 0, len(plain)


def _truncated() -> ProtocolError:
    return ProtocolError("truncated message in bundle message set")


def _walk(
    buf: bytes | memoryview,
    pos: int,
    end: int,
    count: int,
    first: int | None,
    last: int | None,
    out: list[Message] | None,
    plain_decode: bool = False,
) -> None:
    """Check every message of a message set; with ``out``, also decode them.

    ``first``/``last`` are the sparse header's sequence numbers, ``None`` for a plain
    bundle (then only checked), or with ``plain_decode`` a plain bundle decoded into
    ``out``: numbered from ``first``, its count checked only at the end. Decoding requires
    ``buf`` to be ``bytes``, so that the slices are independent copies. The compiled twin
    is ``_walk`` of ``protocols/_speedups.pyx``, which has the same two modes.

    The hot loop of the pure-Python decoder: a plain bundle's message with no key, the
    last timestamp and a short value takes the first branch.
    """
    sparse = first is not None and not plain_decode
    final = count - 1
    seq = first or 0
    last_seq = 0 if last is None else last  # set whenever sparse
    ts = 0
    idx = 0
    unpack_u64 = _unpack_u64
    message = Message
    append = out.append if out is not None else None
    try:
        while pos < end:
            flags = buf[pos]
            if plain_decode:
                if flags == USE_LAST_SPECIFIED_TS:
                    n = buf[pos + 1]
                    if n < 0x80:
                        pos += 2
                        vend = pos + n
                        if vend > end:
                            raise _truncated()
                        append(message(buf[pos:vend], None, ts, seq))  # type: ignore[misc, arg-type]
                        seq += 1
                        pos = vend
                        continue
            elif idx == count:
                raise ProtocolError(f"message set holds more than the {count} messages counted")
            pos += 1
            if flags > _MSG_FLAGS_MAX:
                raise ProtocolError(f"invalid message flags {flags:#04x}")
            if sparse and idx:  # the first message's seq is the header's first
                if idx == final:
                    if last_seq <= seq or (flags & SEQ_NUM_PREV_PLUS_ONE and seq + 1 != last_seq):
                        raise ProtocolError("sparse sequence numbers disagree with the header")
                    seq = last_seq
                else:
                    if flags & SEQ_NUM_PREV_PLUS_ONE:
                        seq += 1
                    else:
                        gap, pos = _varint(buf, pos, end, "sparse sequence delta")
                        seq += gap + 1
                    if seq >= last_seq:
                        raise ProtocolError("sparse sequence numbers disagree with the header")
            if not flags & USE_LAST_SPECIFIED_TS:
                if pos + 8 > end:
                    raise _truncated()
                ts = unpack_u64(buf, pos)[0]
                pos += 8
            key = None
            if flags & HAVE_KEY:
                kend = pos + 1 + buf[pos]
                if kend > end:
                    raise _truncated()
                if append is not None:
                    key = buf[pos + 1 : kend]
                pos = kend
            n = buf[pos]
            if n < 0x80:
                pos += 1
            else:
                n, pos = _varint(buf, pos, end, "message length")
            vend = pos + n
            if vend > end:
                raise _truncated()
            if append is not None:
                # Decoding has bytes (see the docstring): the slices are bytes.
                append(message(buf[pos:vend], key, ts, seq))  # type: ignore[arg-type]
            if plain_decode:
                seq += 1
            pos = vend
            idx += 1
    except IndexError:
        raise _truncated() from None
    if plain_decode:
        if seq != (first or 0) + count:  # idx does not count the first branch's messages
            raise ProtocolError(
                f"bundle header says {count} messages, message set holds more or less")
    elif idx != count:
        raise ProtocolError(f"bundle header says {count} messages, message set holds {idx}")


def _as_bytes(buf: bytes | bytearray | memoryview) -> bytes:
    # One copy up front, so every value sliced out later is already an independent bytes.
    return buf if type(buf) is bytes else bytes(buf)


def validate_bundle_py(
    bundle: bytes | memoryview, *, max_uncompressed: int = MAX_UNCOMPRESSED_SIZE
) -> BundleInfo:
    """Check a whole bundle (no length prefix) without building messages.

    Header, decompression, every message's framing, sparse sequence numbers (strictly
    increasing, ending at the header's last) and no trailing bytes. Returns the header.
    """
    end = len(bundle)
    codec, count, first, last, pos = _parse_header(bundle, 0, end)
    if codec != Codec.NONE:
        bundle, pos, end = _message_set(bundle, pos, end, codec, max_uncompressed)
    _walk(bundle, pos, end, count, first, last, None)
    return _info(codec, count, first, last)


def _validate_bundle_native(
    bundle: bytes | memoryview, *, max_uncompressed: int = MAX_UNCOMPRESSED_SIZE
) -> BundleInfo:
    """:func:`validate_bundle_py`, compiled: same arguments, results and errors."""
    assert speedups is not None
    count, codec, first, last = speedups.validate_bundle(bundle, max_uncompressed)
    return _info(codec, count, first, last)


validate_bundle: Callable[..., BundleInfo] = (
    validate_bundle_py if speedups is None else _validate_bundle_native)


def decode_bundle(
    bundle: bytes | memoryview,
    base_seq: int | None = None,
    *,
    max_uncompressed: int = MAX_UNCOMPRESSED_SIZE,
) -> list[Message]:
    """Decode every message of a bundle (no length prefix).

    ``base_seq`` is the first message's sequence number; required for a plain bundle,
    ignored for a sparse one (its header names its sequence numbers).
    """
    buf = _as_bytes(bundle)
    codec, count, first, last, pos = _parse_header(buf, 0, len(buf))
    out: list[Message] = []
    _decode_into(buf, pos, len(buf), codec, count, first, last, base_seq, out, max_uncompressed)
    return out


def _decode_into(
    buf: bytes,
    pos: int,
    end: int,
    codec: int,
    count: int,
    first: int | None,
    last: int | None,
    base_seq: int | None,
    out: list[Message],
    max_uncompressed: int,
) -> None:
    buf, pos, end = _message_set(  # type: ignore[assignment]  # bytes in, bytes out
        buf, pos, end, codec, max_uncompressed)
    if first is not None:
        _walk(buf, pos, end, count, first, last, out)
        return
    if base_seq is None:
        raise ProtocolError("a plain bundle needs a base sequence number")
    if base_seq + count - 1 > UINT64_MAX:
        raise ProtocolError("bundle sequence numbers overflow u64")
    _walk(buf, pos, end, count, base_seq, None, out, plain_decode=True)


# ----------------------------------------------------------------------------- chunks


def _frame_at(buf: bytes | memoryview, pos: int, end: int, max_bundle_size: int) -> tuple[int, int]:
    """Read a bundle length prefix at ``pos``: ``(bundle_start, bundle_end)``.

    ``bundle_end`` may lie past ``end`` (a partial bundle). When the prefix itself is cut,
    returns ``(-1, lower_bound_of_framed_length)``.
    """
    length = buf[pos]
    if length < 0x80:
        start = pos + 1
    else:
        decoded = decode_varint(buf, pos, end)
        if decoded is None:
            # The cut varint has at least one more (non-zero) group: a lower bound.
            have = end - pos
            partial = sum((buf[pos + i] & 0x7F) << (7 * i) for i in range(have))
            need = have + 1 + partial + (1 << (7 * have))
            if need > max_bundle_size:
                raise ProtocolError(f"bundle length prefix at offset {pos} over the limit")
            return -1, need
        length, start = decoded
    if length == 0:
        raise ProtocolError(f"zero-length bundle at offset {pos}")
    if length > max_bundle_size:
        raise ProtocolError(f"bundle of {length} bytes at offset {pos} is over the limit")
    return start, start + length


def decode_chunk_py(
    chunk: bytes | memoryview,
    base_seq: int | None,
    min_seq: int = 0,
    *,
    max_bundle_size: int = MAX_BUNDLE_SIZE,
    max_uncompressed: int = MAX_UNCOMPRESSED_SIZE,
) -> ChunkResult:
    """Decode a run of ``varint bundleLen | bundle`` (a Consume chunk or a segment range).

    ``base_seq`` numbers the first bundle's first message (``None`` when that bundle is
    sparse); each later plain bundle continues from the previous bundle's last message.
    Messages below ``min_seq`` are dropped; whole bundles below it are skipped unread.
    A bundle cut short at the end is reported in ``partial_bundle_len``, not raised.
    """
    buf = _as_bytes(chunk)
    end = len(buf)
    pos = 0
    out: list[Message] = []
    prev_last: int | None = None
    partial = None
    while pos < end:
        start, bend = _frame_at(buf, pos, end, max_bundle_size)
        if start < 0 or bend > end:
            partial = bend if start < 0 else bend - pos
            break
        codec, count, first, last, mpos = _parse_header(buf, start, bend)
        if first is None:
            first = base_seq if prev_last is None else prev_last + 1
            if first is None:
                raise ProtocolError("chunk starts with a plain bundle but no base sequence")
            last = first + count - 1
            if last > UINT64_MAX:
                raise ProtocolError("bundle sequence numbers overflow u64")
            sparse_first = None
        else:
            if prev_last is not None and first <= prev_last:
                raise ProtocolError("sparse bundle goes back in sequence numbers")
            assert last is not None  # a sparse header has both
            sparse_first = first
        if last >= min_seq:
            # A bundle straddling min_seq is decoded aside, then trimmed.
            into = out if first >= min_seq else []
            _decode_into(
                buf, mpos, bend, codec, count, sparse_first, last, first, into, max_uncompressed
            )
            if into is not out:
                out += [m for m in into if m.seq >= min_seq]
        prev_last = last
        pos = bend
    after = (base_seq or 0) if prev_last is None else prev_last + 1
    next_seq = max(min_seq, after)
    return ChunkResult(out, next_seq, pos, partial)


def _decode_chunk_native(
    chunk: bytes | memoryview,
    base_seq: int | None,
    min_seq: int = 0,
    *,
    max_bundle_size: int = MAX_BUNDLE_SIZE,
    max_uncompressed: int = MAX_UNCOMPRESSED_SIZE,
) -> ChunkResult:
    """:func:`decode_chunk_py`, compiled: same arguments, results and errors."""
    assert speedups is not None
    return ChunkResult(*speedups.decode_chunk(chunk, base_seq, min_seq, max_bundle_size,
                                              max_uncompressed))


decode_chunk: Callable[..., ChunkResult] = (
    decode_chunk_py if speedups is None else _decode_chunk_native)


def iter_framed_bundles(
    buf: bytes | memoryview,
    pos: int = 0,
    end: int | None = None,
    *,
    max_bundle_size: int = MAX_BUNDLE_SIZE,
) -> Iterator[tuple[int, int, BundleInfo]]:
    """Yield ``(offset, framed_length, info)`` for each whole framed bundle in ``buf[pos:end]``.

    Stops quietly at a partial last bundle (compare the last offset + length with ``end``
    to see one). Checks headers only; raises ``ProtocolError`` on a corrupt one, so the
    caller knows the last good boundary is the end of the last bundle yielded.
    """
    if end is None:
        end = len(buf)
    while pos < end:
        start, bend = _frame_at(buf, pos, end, max_bundle_size)
        if start < 0 or bend > end:
            return
        codec, count, first, last, _ = _parse_header(buf, start, bend)
        yield pos, bend - pos, _info(codec, count, first, last)
        pos = bend


#: Flag bits of a bundle header that take it off :func:`chunk_end`'s inline path: sparse,
#: reserved.
_NOT_PLAIN: Final = SPARSE_FLAG | 0x80


def chunk_end(data: bytes, base_seq: int | None, min_seq: int) -> tuple[int, int | None]:
    """Where a chunk read from ``min_seq`` leaves its reader: ``(next_seq,
    partial_bundle_len)`` as :func:`decode_chunk` reports them, from
    the bundles' headers alone (one step a bundle, no message looked at; anything but a
    whole plain bundle's header is left to :func:`read_framed_header`,
    and one that can not be read to ``decode_chunk``, which says what is wrong)."""
    end = len(data)
    pos = 0
    prev_last: int | None = None
    try:
        while pos < end:
            # Inline: a plain bundle's length prefix and message count (a fan-out pays
            # this per chunk before anything is encoded).
            got = decode_varint(data, pos, end)
            if got is not None and got[0] and got[1] + got[0] <= end and not (
                    data[got[1]] & _NOT_PLAIN):
                length, hpos = got
                count = data[hpos] >> 2
                if not count:
                    got = decode_varint(data, hpos + 1, hpos + length)
                    if got is None:
                        raise ProtocolError("truncated bundle message count")
                    count = got[0]
                framed, last = hpos - pos + length, None
            else:
                framed, count, _, last = read_framed_header(data, pos, end)
                if pos + framed > end:
                    after = (base_seq or 0) if prev_last is None else prev_last + 1
                    return max(min_seq, after), framed
            if last is None:
                start = base_seq if prev_last is None else prev_last + 1
                if start is None:
                    raise ProtocolError("chunk starts with a plain bundle but no base sequence")
                last = start + count - 1
            prev_last = last
            pos += framed
    except ProtocolError:
        found = decode_chunk(data, base_seq, min_seq)
        return found.next_seq, found.partial_bundle_len
    after = (base_seq or 0) if prev_last is None else prev_last + 1
    return max(min_seq, after), None
