"""Kafka's variable-length encodings, as the generated codecs in ``records`` call them.

Strings are ``int16 len | UTF-8`` (``-1`` for null), bytes and records ``int32 len``, arrays
``int32 count``; in *flexible* versions all three are *compact*: an unsigned varint holding
``len + 1`` (``0`` for null). Unsigned varints are LEB128, at most 5 bytes (32 bits), as
Kafka writes them. Readers take ``(buf, pos, end, ...)`` and return ``(value, next pos)``;
they raise :class:`~protocols.errors.ProtocolError` for anything the peer should not have
sent, and never read past ``end``. Writers append to a ``bytearray``.
"""

from __future__ import annotations

from struct import Struct
from typing import Final

from protocols.errors import ProtocolError

_I16: Final = Struct(">h")
_I32: Final = Struct(">i")
_U32_MAX: Final = 0xFFFFFFFF


def read_uvarint(buf: bytes, pos: int, end: int, what: str) -> tuple[int, int]:
    """An unsigned varint of at most 5 bytes (a 32-bit value)."""
    result = 0
    shift = 0
    while pos < end:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            if result > _U32_MAX:
                raise ProtocolError(f"{what}: unsigned varint overflows 32 bits")
            return result, pos
        shift += 7
        if shift >= 35:
            raise ProtocolError(f"{what}: unsigned varint longer than 5 bytes")
    raise ProtocolError(f"truncated {what}: payload ends inside a varint")


def write_uvarint(out: bytearray, value: int) -> None:
    """Append an unsigned varint (``0 <= value < 2**32``)."""
    if value < 0x80:
        out.append(value)
        return
    if value > _U32_MAX:
        raise ValueError(f"unsigned varint out of range: {value}")
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _length(buf: bytes, pos: int, end: int, flexible: bool, wide: bool, what: str
            ) -> tuple[int, int]:
    """A length (``-1`` for null): compact, int32 (``wide``) or int16."""
    if flexible:
        if pos < end and buf[pos] < 0x80:
            return buf[pos] - 1, pos + 1
        n, pos = read_uvarint(buf, pos, end, what + " length")
        return n - 1, pos
    size = 4 if wide else 2
    if end - pos < size:
        raise ProtocolError(f"truncated {what} length: payload ends {end - pos} bytes "
                            f"after offset {pos}")
    n = (_I32 if wide else _I16).unpack_from(buf, pos)[0]
    if n < -1:
        raise ProtocolError(f"{what}: negative length {n}")
    return n, pos + size


def read_string(buf: bytes, pos: int, end: int, flexible: bool, what: str
                ) -> tuple[str, int]:
    """A (compact) string that may not be null."""
    if flexible and pos < end and 0 < buf[pos] < 0x80:  # the usual case, inline
        stop = pos + buf[pos]
        if stop > end:
            raise ProtocolError(f"{what}: length {buf[pos] - 1} overruns the payload "
                                f"({end - pos - 1} bytes left)")
        try:
            return buf[pos + 1:stop].decode(), stop
        except UnicodeDecodeError:
            raise ProtocolError(f"{what} is not UTF-8") from None
    value, pos = read_nullable_string(buf, pos, end, flexible, False, what)
    if value is None:  # unreachable: not nullable raises; for the type checker
        raise ProtocolError(f"{what}: null where a string is required")
    return value, pos


def read_bytes(buf: bytes, pos: int, end: int, flexible: bool, what: str
               ) -> tuple[bytes, int]:
    """(Compact) bytes that may not be null."""
    value, pos = read_nullable_bytes(buf, pos, end, flexible, False, what)
    if value is None:  # unreachable: not nullable raises; for the type checker
        raise ProtocolError(f"{what}: null where bytes are required")
    return value, pos


def read_nullable_string(buf: bytes, pos: int, end: int, flexible: bool, nullable: bool,
                         what: str) -> tuple[str | None, int]:
    """A (compact) string; ``None`` only when ``nullable``."""
    n, pos = _length(buf, pos, end, flexible, False, what)
    if n < 0:
        if not nullable:
            raise ProtocolError(f"{what}: null where a string is required")
        return None, pos
    if n > end - pos:
        raise ProtocolError(f"{what}: length {n} overruns the payload ({end - pos} bytes left)")
    try:
        return buf[pos:pos + n].decode(), pos + n
    except UnicodeDecodeError:
        raise ProtocolError(f"{what} is not UTF-8") from None


def read_nullable_bytes(buf: bytes, pos: int, end: int, flexible: bool, nullable: bool,
                        what: str) -> tuple[bytes | None, int]:
    """(Compact) bytes or records; ``None`` only when ``nullable``."""
    n, pos = _length(buf, pos, end, flexible, True, what)
    if n < 0:
        if not nullable:
            raise ProtocolError(f"{what}: null where bytes are required")
        return None, pos
    if n > end - pos:
        raise ProtocolError(f"{what}: length {n} overruns the payload ({end - pos} bytes left)")
    return buf[pos:pos + n], pos + n


def read_records(buf: bytes, pos: int, end: int, flexible: bool, what: str
                 ) -> tuple[bytes | memoryview, int]:
    """:func:`read_nullable_records` that may not be null."""
    value, pos = read_nullable_records(buf, pos, end, flexible, False, what)
    if value is None:  # unreachable: not nullable raises; for the type checker
        raise ProtocolError(f"{what}: null where records are required")
    return value, pos


def read_nullable_records(buf: bytes, pos: int, end: int, flexible: bool, nullable: bool,
                          what: str) -> tuple[bytes | memoryview | None, int]:
    """:func:`read_nullable_bytes` for ``records`` (megabytes in a Produce request): a
    view of ``buf``, not a copy, when ``buf`` is ``bytes`` (it can not change)."""
    if type(buf) is not bytes:
        return read_nullable_bytes(buf, pos, end, flexible, nullable, what)
    n, pos = _length(buf, pos, end, flexible, True, what)
    if n < 0:
        if not nullable:
            raise ProtocolError(f"{what}: null where records are required")
        return None, pos
    if n > end - pos:
        raise ProtocolError(f"{what}: length {n} overruns the payload ({end - pos} bytes left)")
    return memoryview(buf)[pos:pos + n], pos + n


def read_count(buf: bytes, pos: int, end: int, flexible: bool, nullable: bool, what: str
               ) -> tuple[int, int]:
    """An array's element count (``-1``: null, only when ``nullable``). Every element takes
    at least one byte, so a count above the bytes left is refused before any list grows."""
    n, pos = _length(buf, pos, end, flexible, True, what)
    if n < 0 and not nullable:
        raise ProtocolError(f"{what}: null where an array is required")
    if n > end - pos:
        raise ProtocolError(f"{what}: count {n} exceeds the {end - pos} bytes left")
    return n, pos


def read_tag_header(buf: bytes, pos: int, end: int, what: str) -> tuple[int, int, int]:
    """``(tag, end of its value, start of its value)`` of one tagged field."""
    tag, pos = read_uvarint(buf, pos, end, what + " tag")
    size, pos = read_uvarint(buf, pos, end, what + " tag size")
    if size > end - pos:
        raise ProtocolError(f"{what}: tagged field {tag} of {size} bytes overruns the "
                            f"payload ({end - pos} bytes left)")
    return tag, pos + size, pos


def write_string(out: bytearray, value: str | None, flexible: bool) -> None:
    """Append a (compact, nullable) string."""
    if value is None:
        out += b"\x00" if flexible else b"\xff\xff"
        return
    raw = value.encode()
    if flexible:
        write_uvarint(out, len(raw) + 1)
    else:
        if len(raw) > 0x7FFF:
            raise ValueError(f"string of {len(raw)} bytes is longer than 32767")
        out += _I16.pack(len(raw))
    out += raw


def write_bytes(out: bytearray, value: bytes | bytearray | memoryview | None,
                flexible: bool) -> None:
    """Append (compact, nullable) bytes or records."""
    if value is None:
        out += b"\x00" if flexible else b"\xff\xff\xff\xff"
        return
    if flexible:
        write_uvarint(out, len(value) + 1)
    else:
        out += _I32.pack(len(value))
    out += value


#: A ``records`` value at least this long is kept out of a :class:`Parts` encoding's bytes.
PART_MIN: Final = 16 * 1024

#: A piece of an encoding: the encoder's own bytes, or a ``records`` value as given.
Buffer = bytes | bytearray | memoryview


class Parts(bytearray):
    """An encoder's output that keeps large ``records`` values apart instead of copying
    them in: :func:`write_records` ends the current piece there and adds the value itself,
    so that a Fetch response is sent as a list of buffers (a vectored send) without its
    megabytes of records ever being copied into one payload.

    Use it as the ``out`` of a ``write_<message>`` encoder, then :meth:`pieces`.
    """

    __slots__ = ("_pieces",)

    def __init__(self) -> None:
        super().__init__()
        self._pieces: list[Buffer] = []

    def keep(self, value: Buffer) -> None:
        """End the current piece and add ``value`` as the next one (not copied)."""
        self._pieces += (bytearray(self), value)
        self.clear()

    def pieces(self) -> list[Buffer]:
        """Every piece in order; the first is a ``bytearray`` (a size may be patched in)."""
        return [*self._pieces, bytearray(self)]


def write_records(out: bytearray, value: Buffer | None, flexible: bool) -> None:
    """:func:`write_bytes` for ``records``: a large value is kept apart by a :class:`Parts`
    ``out`` (see there), copied into any other ``out``."""
    if value is None or len(value) < PART_MIN or type(out) is not Parts:
        write_bytes(out, value, flexible)
        return
    if flexible:
        write_uvarint(out, len(value) + 1)
    else:
        out += _I32.pack(len(value))
    out.keep(value)


def write_count(out: bytearray, count: int | None, flexible: bool) -> None:
    """Append an array's (compact, nullable) count; ``None`` for a null array."""
    if count is None:
        out += b"\x00" if flexible else b"\xff\xff\xff\xff"
    elif flexible:
        write_uvarint(out, count + 1)
    else:
        out += _I32.pack(count)


def write_tagged(out: bytearray, fields: list[tuple[int, bytearray]]) -> None:
    """Append a tagged-field section: count, then ``tag | size | value`` in tag order."""
    write_uvarint(out, len(fields))
    for tag, value in fields:
        write_uvarint(out, tag)
        write_uvarint(out, len(value))
        out += value


def null_not_allowed(what: str, version: int) -> ValueError:
    return ValueError(f"{what} is null, which version {version} cannot carry")


def not_in_version(what: str, version: int) -> ValueError:
    return ValueError(f"{what} has a value that version {version} cannot carry "
                      f"(the field is not ignorable)")


def skip_tagged(buf: bytes, pos: int, end: int, what: str) -> int:
    """Skip a tagged-field section whose tags are all unknown; the position after it."""
    if pos < end and buf[pos] == 0:  # the usual case: no tagged fields
        return pos + 1
    count, pos = read_uvarint(buf, pos, end, what)
    for _ in range(count):
        _tag, pos, _start = read_tag_header(buf, pos, end, what)
    return pos
