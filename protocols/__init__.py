"""Sans-IO protocol layer for figtank: bytes in, events out.

Nothing in this package opens a socket or a file, reads a clock, or imports trio.
"""

from protocols.errors import ProtocolError

__all__ = ["ProtocolError"]
