"""Primitive encodings shared by Tank (little-endian) and Figg (big-endian).

Fixed-width ints in both byte orders, unsigned LEB128 varints, ``str8`` and u32-length
bytes. Writers are plain functions returning ``bytes``; reading goes through
:class:`Reader`, a cursor over a bounded buffer that raises
:class:`~protocols.errors.ProtocolError` when the input runs out or lies. The spec
engine (:mod:`protocols.spec`) builds its field codecs on these.
"""

from __future__ import annotations

import struct
from typing import Any, Final

from protocols.errors import ProtocolError

U8: Final = struct.Struct("<B")
U16LE: Final = struct.Struct("<H")
U32LE: Final = struct.Struct("<I")
U64LE: Final = struct.Struct("<Q")
U32BE: Final = struct.Struct(">I")

UINT64_MAX: Final = (1 << 64) - 1
#: A u64 varint never needs more than 10 bytes.
MAX_VARINT_LEN: Final = 10


def encode_varint(value: int) -> bytes:
    """Unsigned LEB128: 7 bits a byte, low group first (209 -> d1 01)."""
    if value < 0 or value > UINT64_MAX:
        raise ValueError(f"varint out of range: {value}")
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def varint_size(value: int) -> int:
    """Bytes :func:`encode_varint` produces for ``value``."""
    return max(1, (value.bit_length() + 6) // 7)


def decode_varint(buf: bytes | bytearray | memoryview, pos: int = 0, end: int | None = None
                  ) -> tuple[int, int] | None:
    """Decode a varint at ``buf[pos:end]``.

    Returns ``(value, next_pos)``, or ``None`` when the buffer ends inside the
    varint (more bytes may complete it). Raises ``ProtocolError`` for a varint
    longer than 10 bytes or one that overflows 64 bits.
    """
    if end is None:
        end = len(buf)
    result = 0
    shift = 0
    i = pos
    while i < end:
        byte = buf[i]
        i += 1
        if shift == 63 and byte > 1:
            raise ProtocolError("varint overflows 64 bits")
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            if byte == 0 and shift > 0:
                raise ProtocolError("over-long varint (redundant zero group)")
            return result, i
        shift += 7
        if shift >= 7 * MAX_VARINT_LEN:
            raise ProtocolError("varint longer than 10 bytes")
    return None


def encode_str8(value: str | bytes) -> bytes:
    """``u8 len | bytes``; a str is encoded as UTF-8."""
    raw = value.encode() if isinstance(value, str) else value
    if len(raw) > 0xFF:
        raise ValueError(f"str8 longer than 255 bytes: {len(raw)}")
    return bytes((len(raw),)) + raw


class Reader:
    """A cursor over ``buf[pos:end]`` that never reads past ``end``.

    Every method either returns a value and advances, or raises
    ``ProtocolError`` naming what was being read. It never raises
    ``struct.error`` or ``IndexError``.
    """

    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: bytes | bytearray | memoryview, pos: int = 0,
                 end: int | None = None) -> None:
        self.buf = buf
        self.pos = pos
        self.end = len(buf) if end is None else end
        if not 0 <= pos <= self.end <= len(buf):
            raise ValueError("reader bounds outside the buffer")

    @property
    def remaining(self) -> int:
        """Bytes left before ``end``."""
        return self.end - self.pos

    def _need(self, n: int, what: str) -> int:
        pos = self.pos
        if n > self.end - pos:
            raise ProtocolError(
                f"truncated {what}: need {n} bytes at offset {pos}, {self.end - pos} left")
        self.pos = pos + n
        return pos

    def _fixed(self, codec: struct.Struct, what: str) -> int:
        pos = self._need(codec.size, what)
        value: int = codec.unpack_from(self.buf, pos)[0]
        return value

    def u8(self, what: str = "u8") -> int:
        pos = self._need(1, what)
        return self.buf[pos]

    def u16le(self, what: str = "u16") -> int:
        return self._fixed(U16LE, what)

    def u32le(self, what: str = "u32") -> int:
        return self._fixed(U32LE, what)

    def u64le(self, what: str = "u64") -> int:
        return self._fixed(U64LE, what)

    def u32be(self, what: str = "u32") -> int:
        return self._fixed(U32BE, what)

    def unpack(self, codec: struct.Struct, what: str) -> tuple[Any, ...]:
        """Read several fixed fields at once with a precompiled ``struct.Struct``."""
        pos = self._need(codec.size, what)
        return codec.unpack_from(self.buf, pos)

    def varint(self, what: str = "varint") -> int:
        decoded = decode_varint(self.buf, self.pos, self.end)
        if decoded is None:
            raise ProtocolError(f"truncated {what} at offset {self.pos}")
        value, self.pos = decoded
        return value

    def take(self, n: int, what: str = "bytes") -> bytes:
        """The next ``n`` bytes, copied (never a view of a reusable buffer)."""
        if n < 0:
            raise ProtocolError(f"negative length for {what}")
        pos = self._need(n, what)
        return bytes(self.buf[pos:pos + n])

    def rest(self) -> bytes:
        """Everything up to ``end``, copied."""
        data = bytes(self.buf[self.pos:self.end])
        self.pos = self.end
        return data

    def str8(self, what: str = "str8") -> str:
        length = self.u8(f"{what} length")
        raw = self.take(length, what)
        try:
            return raw.decode()
        except UnicodeDecodeError as exc:
            raise ProtocolError(f"{what} is not UTF-8") from exc

    def bytes8(self, what: str = "bytes8") -> bytes:
        return self.take(self.u8(f"{what} length"), what)

