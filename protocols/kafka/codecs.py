"""The compression codecs of Kafka record batches (attributes bits 0-2).

Each codec compresses a batch's records section (everything after the record count).
Decompression is bounded: a stream that would inflate past ``limit`` bytes raises
``ProtocolError`` before the excess is held in memory. Any failure of a decompressor
is a ``ProtocolError`` (the input is corrupt), never the library's own exception.

Formats, as the clients write and read them:

- gzip: the gzip container (Java's ``GZIPOutputStream``); zlib streams are read too.
- snappy: the Java client writes snappy-java's "xerial" framing (a 16-byte header
  ``0x82 SNAPPY 0x00 | u32 version | u32 compat``, then ``u32be len | raw snappy`` blocks);
  librdkafka writes a bare raw snappy stream. Both are read (the header decides). We write
  the xerial framing: every Kafka client must read it, as it is what a Java producer
  stores on a real broker (librdkafka, kafka-python and the Java client all detect it).
- lz4: the LZ4 frame format (KIP-57), written with independent 64 KiB blocks, no content
  size and no checksums: the subset every client's reader accepts.
- zstd: zstandard frames, possibly several, possibly without a content size.
"""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Callable
from enum import IntEnum
from typing import Final, TypeAlias

import cramjam
import lz4.frame
import zstandard

from protocols.errors import ProtocolError
from protocols.wire import decode_varint

__all__ = [
    "MAX_DECOMPRESSED_SIZE",
    "UNSUPPORTED_COMPRESSION_TYPE",
    "Compression",
    "UnsupportedCompression",
    "compress",
    "decompress",
]

#: Kafka's error code for a codec the broker does not know (attributes codec 5-7).
UNSUPPORTED_COMPRESSION_TYPE: Final = 76
#: What the compressors take.
Buffer: TypeAlias = bytes | bytearray | memoryview
#: Default bound on a decompressed records section.
MAX_DECOMPRESSED_SIZE: Final = 256 * 1024 * 1024


class Compression(IntEnum):
    """A record batch's codec (attributes bits 0-2)."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


class UnsupportedCompression(ProtocolError):
    """A batch names a codec Kafka does not define (5, 6 or 7)."""

    def __init__(self, codec: int) -> None:
        super().__init__(f"unknown record batch compression codec {codec}",
                         error_code=UNSUPPORTED_COMPRESSION_TYPE)
        self.codec = codec


XERIAL_MAGIC: Final = b"\x82SNAPPY\x00"
_XERIAL_HEADER: Final = XERIAL_MAGIC + struct.pack(">ii", 1, 1)
#: Bytes per xerial block written. snappy-java writes 32 KiB blocks, but every reader
#: (snappy-java, librdkafka, kafka-python, Go's xerial) takes a block of any size (each has
#: its length before it): a batch in one block costs one compression and one
#: decompression call, not one per 32 KiB (a 512 KiB batch: 1 instead of 16 each way).
_XERIAL_BLOCK: Final = 1024 * 1024
_U32BE: Final = struct.Struct(">I")
_ZSTD_LEVEL: Final = 3
_GZIP_LEVEL: Final = 6


def _too_big(limit: int) -> ProtocolError:
    return ProtocolError(f"compressed records inflate past the {limit} byte limit")


# ------------------------------------------------------------------------------ writing


def _gzip(data: Buffer, level: int = _GZIP_LEVEL) -> bytes:
    # zlib with wbits 31 writes the gzip container with mtime 0: deterministic bytes.
    c = zlib.compressobj(level, zlib.DEFLATED, 31)
    return c.compress(data) + c.flush()


def _snappy_xerial(data: Buffer) -> bytes:
    parts: list[Buffer] = [_XERIAL_HEADER]
    with memoryview(data) as view:
        for start in range(0, len(view), _XERIAL_BLOCK):
            block = memoryview(cramjam.snappy.compress_raw(view[start:start + _XERIAL_BLOCK]))
            parts.append(_U32BE.pack(len(block)))
            parts.append(block)
        return b"".join(parts)


def _lz4(data: Buffer) -> bytes:
    return bytes(lz4.frame.compress(
        data, block_size=lz4.frame.BLOCKSIZE_MAX64KB, block_linked=False,
        content_checksum=False, store_size=False))


def _zstd(data: Buffer) -> bytes:
    return bytes(zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compress(data))


def compress(codec: Compression, data: Buffer, *, gzip_level: int = _GZIP_LEVEL) -> bytes:
    """``data`` (any bytes-like object, not kept) compressed with ``codec`` (``NONE``
    returns it as bytes); gzip at ``gzip_level`` (1-9; 6, the Java client's, by
    default)."""
    if codec == Compression.NONE:
        return data if isinstance(data, bytes) else bytes(data)
    if codec == Compression.GZIP:
        return _gzip(data, gzip_level)
    if codec == Compression.SNAPPY:
        return _snappy_xerial(data)
    if codec == Compression.LZ4:
        return _lz4(data)
    if codec == Compression.ZSTD:
        return _zstd(data)
    raise ValueError(f"unknown codec {codec}")


# ------------------------------------------------------------------------------ reading


def _gunzip(data: bytes, limit: int) -> bytes:
    d = zlib.decompressobj(47)  # 32 + 15: gzip or zlib header, detected
    out = d.decompress(data, limit + 1)
    if len(out) > limit:
        raise _too_big(limit)
    if not d.eof:
        raise ProtocolError("truncated gzip records section")
    # Concatenated gzip members (allowed by the format) follow one another.
    parts = [out]
    total = len(out)
    rest = d.unused_data
    while rest:
        d = zlib.decompressobj(47)
        more = d.decompress(rest, limit - total + 1)
        total += len(more)
        if total > limit:
            raise _too_big(limit)
        if not d.eof:
            raise ProtocolError("truncated gzip records section")
        parts.append(more)
        rest = d.unused_data
    return b"".join(parts) if len(parts) > 1 else out


def _snappy_claim(data: Buffer, limit: int) -> int:
    """The uncompressed length a raw snappy stream announces, within ``limit``."""
    head = decode_varint(data, 0, min(len(data), 10))
    if head is None:
        raise ProtocolError("truncated snappy length preamble")
    if head[0] > limit:
        raise _too_big(limit)
    return head[0]


def _raw_snappy(data: Buffer, limit: int) -> bytes:
    _snappy_claim(data, limit)
    # cramjam directly: python-snappy's decompress wraps it five times slower.
    return bytes(cramjam.snappy.decompress_raw(data))


def _unsnappy(data: bytes, limit: int) -> bytes | bytearray:
    if not data.startswith(XERIAL_MAGIC):
        return _raw_snappy(data, limit)
    if len(data) < 16:
        raise ProtocolError("truncated xerial snappy header")
    with memoryview(data) as view:
        # The blocks' spans and announced sizes first, then each decompressed straight
        # into its place in one buffer (no copy per block, no join).
        blocks = []
        pos, end = 16, len(data)
        total = 0
        while pos < end:
            if end - pos < 4:
                raise ProtocolError("truncated xerial snappy block length")
            size = _U32BE.unpack_from(data, pos)[0]
            pos += 4
            if size > end - pos:
                raise ProtocolError("truncated xerial snappy block")
            claim = _snappy_claim(view[pos:pos + size], limit - total)
            blocks.append((pos, pos + size, total, claim))
            total += claim
            pos += size
        plain = bytearray(total)
        with memoryview(plain) as into:
            for start, stop, at, claim in blocks:
                written = cramjam.snappy.decompress_raw_into(view[start:stop],
                                                             into[at:at + claim])
                if written != claim:
                    raise ProtocolError("xerial snappy block shorter than its preamble")
        return plain


def _unlz4(data: bytes, limit: int) -> bytes:
    d = lz4.frame.LZ4FrameDecompressor()
    out: bytes = d.decompress(data, max_length=limit + 1)
    if len(out) > limit:
        raise _too_big(limit)
    if not d.eof:
        raise ProtocolError("truncated lz4 frame")
    if d.unused_data:
        raise ProtocolError("bytes after the lz4 frame")
    return out


def _unzstd(data: bytes, limit: int) -> bytes:
    reader = zstandard.ZstdDecompressor().stream_reader(
        io.BytesIO(data), read_across_frames=True)
    parts = []
    total = 0
    while True:
        chunk = reader.read(min(1 << 20, limit - total + 1))
        if not chunk:
            break
        total += len(chunk)
        if total > limit:
            raise _too_big(limit)
        parts.append(chunk)
    return b"".join(parts)


_READERS: Final[dict[int, Callable[[bytes, int], bytes | bytearray]]] = {
    Compression.GZIP: _gunzip,
    Compression.SNAPPY: _unsnappy,
    Compression.LZ4: _unlz4,
    Compression.ZSTD: _unzstd,
}


def decompress(codec: int, data: bytes, limit: int = MAX_DECOMPRESSED_SIZE) -> bytes | bytearray:
    """The records section ``data`` decompressed with ``codec``.

    Raises ``UnsupportedCompression`` for codecs 5-7 and ``ProtocolError`` for a corrupt,
    truncated or over-``limit`` stream.
    """
    if codec == Compression.NONE:
        return data
    reader = _READERS.get(codec)
    if reader is None:
        raise UnsupportedCompression(codec)
    try:
        return reader(data, limit)
    except ProtocolError:
        raise
    except Exception as exc:  # whatever the decompressor says, the input is corrupt
        detail = exc.__cause__ or exc
        raise ProtocolError(
            f"corrupt {Compression(codec).name.lower()} records section: {detail}") from None
