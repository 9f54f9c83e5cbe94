"""The one exception the protocol layer raises for bad input."""

from __future__ import annotations


class ProtocolError(Exception):
    """The peer sent bytes the protocol does not allow.

    Every decoder in ``protocols`` raises this and nothing else on bad input
    (never ``struct.error``, ``IndexError``, ``UnicodeError`` or a Snappy error).
    ``error_code`` carries a protocol error code when the protocol has one
    for the situation (for example Tank's per-partition codes), else ``None``.
    """

    def __init__(self, message: str, *, error_code: int | None = None) -> None:
        super().__init__(message)
        self.error_code = error_code


class FrameTooLarge(ProtocolError):
    """A frame header announced a payload above the configured maximum."""


class TruncatedFrame(ProtocolError):
    """The peer closed the connection in the middle of a frame.

    The bytes received were not wrong, only cut short: a peer or a path between that died
    mid-send. A client treats it as a lost connection (and redials), not as a peer that
    speaks another protocol.
    """
