"""What the Figg, Tank and Kafka connection state machines share: roles, sentinels,
framing (:class:`FrameReader`) and the calls every connection answers alike
(:class:`FramedConnection`).

A connection object (after h11) keeps no socket. Its owner feeds it bytes with
``receive_data`` (``b""`` means the peer closed), pulls events with
``next_event`` until it returns :data:`NEED_DATA` (or :data:`CLOSED` after a clean
EOF), and turns events into bytes with ``send``.
"""

from __future__ import annotations

import copy
import enum
import struct
from collections.abc import Callable
from typing import Any, Final

from protocols.errors import FrameTooLarge, ProtocolError, TruncatedFrame

#: The largest frame payload a connection accepts from its peer unless told otherwise
#: (64 MiB): the default of both protocols' connection objects, so of what a figtank
#: server and a Figg client accept. One meaning only; for what a Tank client accepts
#: from a broker see :data:`BROKER_MAX_FRAME`.
DEFAULT_MAX_FRAME: Final = 64 * 1024 * 1024
#: The largest frame payload a Tank client accepts from a broker (256 MiB, the Tank
#: broker's own limit): one Consume response may carry that much, so a client (figtank's
#: Tank client, the bridge's upstream connection) allows more than a server does.
BROKER_MAX_FRAME: Final = 256 * 1024 * 1024


class Sentinel(enum.Enum):
    """What ``next_event`` returns when it has no event: :data:`NEED_DATA` or
    :data:`CLOSED` (an enum, so that a type checker narrows ``event is NEED_DATA``)."""

    NEED_DATA = "NEED_DATA"
    CLOSED = "CLOSED"

    def __repr__(self) -> str:
        return self.value

    __str__ = __repr__


#: ``next_event`` has nothing complete to return: feed more bytes.
NEED_DATA: Final = Sentinel.NEED_DATA
#: The peer closed cleanly at a frame boundary; no more events will come.
CLOSED: Final = Sentinel.CLOSED


def kept(error: ProtocolError) -> ProtocolError:
    """A copy of ``error`` with no traceback or chained exceptions, for a connection to
    keep as its sticky failure. The raised error's traceback holds the frames of whoever
    called the connection (a session that owns it): kept as it is, it would make a
    reference cycle holding the connection and its buffers until the cycle collector runs.
    Raise a fresh ``kept()`` copy each time, too, so the kept one never gets a traceback."""
    return copy.copy(error)


class Role(enum.Enum):
    """Which end of the connection this object plays."""

    CLIENT = "client"
    SERVER = "server"


#: ``reader(buf, pos, end) -> (items, pos, error)``: see :meth:`FrameReader.scan`.
FrameScanner = Callable[[bytearray, int, int], tuple[list[Any], int, ProtocolError | None]]


class FrameReader:
    """Splits a byte stream into ``header | payload`` frames.

    ``header`` is a precompiled struct whose field ``length_index`` is the payload
    length. A length over ``max_payload`` raises :class:`FrameTooLarge` as soon as
    the header is complete, before any buffer is allocated for the payload.
    Payloads are returned as fresh ``bytes``: never a view of the reused buffer.
    """

    __slots__ = ("_buf", "_eof", "_header", "_length_index", "_pos", "max_payload")

    def __init__(self, header: struct.Struct, length_index: int, max_payload: int) -> None:
        if max_payload <= 0:
            raise ValueError("max_payload must be positive")
        self._header = header
        self._length_index = length_index
        self.max_payload = max_payload
        self._buf = bytearray()
        self._pos = 0
        self._eof = False

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned in a frame."""
        return len(self._buf) - self._pos

    @property
    def eof(self) -> bool:
        return self._eof

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Add received bytes; ``b""`` marks the end of the stream."""
        if self._eof:
            if data:
                raise RuntimeError("data received after EOF")
            return
        if not data:
            self._eof = True
            return
        if self._pos and self._pos >= len(self._buf) // 2:
            del self._buf[:self._pos]
            self._pos = 0
        self._buf += data

    def completed_frame(self, data: bytes | bytearray) -> tuple[bytes, int] | None:
        """The frame begun in what is buffered, completed by the leading bytes of ``data``
        (the next bytes of the stream), without consuming anything: ``(frame, used)``, the
        whole frame (header and payload) and how many bytes of ``data`` it takes. None
        when nothing is buffered, or that frame does not end within ``data`` or its
        length is over the limit (:meth:`next_frame` says so once they are fed). After
        the caller has handled the frame, :meth:`drop_buffered` forgets its first part."""
        used = self.rest_of_frame(data)
        if used <= 0 or used > len(data):
            return None
        return bytes(self._buf[self._pos:]) + bytes(data[:used]), used

    def drop_buffered(self) -> None:
        """Forget what is buffered (the caller took it whole: :meth:`completed_frame`)."""
        self._buf.clear()
        self._pos = 0

    def rest_of_frame(self, data: bytes | bytearray) -> int:
        """How many leading bytes of the stream, from ``data`` (its next bytes) on, end the
        frame begun in what is buffered: 0 when nothing is; more than ``len(data)`` when
        that frame does not end within ``data``, or its length is over the limit, or its
        header does not end in ``data`` either (``len(data) + 1``)."""
        buffered = len(self._buf) - self._pos
        if not buffered:
            return 0
        header = self._header
        missing = header.size - buffered
        if missing > 0:
            if len(data) < missing:
                return len(data) + 1
            head = bytes(self._buf[self._pos:]) + bytes(data[:missing])
        else:
            head = bytes(self._buf[self._pos:self._pos + header.size])
        length: int = header.unpack(head)[self._length_index]
        if length > self.max_payload:
            return len(data) + 1
        return header.size + length - buffered

    def next_frame(self) -> tuple[tuple[int, ...], bytes] | Sentinel:
        """The next complete ``(header_fields, payload)``, NEED_DATA or CLOSED."""
        buf = self._buf
        pos = self._pos
        header = self._header
        available = len(buf) - pos
        if available < header.size:
            return self._end_of_input(available)
        fields = header.unpack_from(buf, pos)
        length = fields[self._length_index]
        if length > self.max_payload:
            raise FrameTooLarge(
                f"frame payload of {length} bytes exceeds the maximum of {self.max_payload}")
        end = pos + header.size + length
        if end > len(buf):
            return self._end_of_input(available)
        with memoryview(buf) as view:  # one copy; the view is released before buf resizes
            payload = bytes(view[pos + header.size:end])
        self._pos = end
        if end == len(buf):
            buf.clear()
            self._pos = 0
        return fields, payload

    def scan(self, reader: FrameScanner) -> tuple[list[Any], ProtocolError | None]:
        """Let ``reader`` take every complete frame buffered, in one pass.

        ``reader(buf, pos, end)`` returns ``(items, pos, error)``: what it made of the
        frames, where the first incomplete one starts, and the error that stopped it (if
        any, ``pos`` is ignored). Returns ``(items, error)``; after a clean EOF the items
        end with :data:`CLOSED`, and an EOF in the middle of a frame is the error.
        """
        buf = self._buf
        items, pos, error = reader(buf, self._pos, len(buf))
        if error is not None:
            return items, error
        if pos == len(buf):
            buf.clear()
            self._pos = 0
        else:
            self._pos = pos
        if self._eof:
            try:
                items.append(self._end_of_input(len(buf) - self._pos))
            except ProtocolError as exc:
                return items, exc.with_traceback(None)  # its frames hold the buffer
        return items, None

    def _end_of_input(self, available: int) -> Sentinel:
        if not self._eof:
            return NEED_DATA
        if available:
            raise TruncatedFrame(f"connection closed in the middle of a frame "
                                f"({available} bytes of it received)")
        return CLOSED


class FramedConnection:
    """What every connection object (Figg, Tank, Kafka) answers alike: the peer's bytes go
    to a :class:`FrameReader`, ``_frames``, which the subclass makes with its protocol's
    header."""

    __slots__ = ("_frames",)

    _frames: FrameReader

    @property
    def max_frame_size(self) -> int:
        """The largest payload accepted from the peer."""
        return self._frames.max_payload

    @property
    def buffered(self) -> int:
        """Bytes received and not yet returned as events: after ``NEED_DATA``, the part of
        a frame that has begun (0: the peer stopped at a frame boundary)."""
        return self._frames.buffered

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Add bytes received from the peer; ``b""`` means the peer closed."""
        self._frames.feed(data)
