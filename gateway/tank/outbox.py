"""The send side of one Tank connection: whole responses in order, chunks by ``sendfile``.

Every frame the listener sends on a connection goes through one :class:`TankOutbox`, a
:class:`~gateway.io.writer.FrameWriter` drained by one writer task, so responses never
interleave. A Consume response is queued as its head (frame header and response header)
plus its :class:`~gateway.core.contract.Chunk`\\ s (:meth:`TankOutbox.put_consume_nowait`):
the writer sends the head and then each file-backed chunk with ``os.sendfile`` straight
from the segment file, or the chunk's bytes when it is held in memory or the stream is not
a plain socket (TLS, tests).
"""

from __future__ import annotations

from gateway.io.writer import FrameWriter, ShortChunk

__all__ = ["ShortChunk", "TankOutbox"]


class TankOutbox(FrameWriter):
    """An ordered queue of responses for one connection, bounded by ``limit`` bytes.

    ``put_*_nowait`` never blocks; the connection's reader calls :meth:`wait_writable`
    before reading more requests, so a client that does not read its responses stops being
    read.
    """

    __slots__ = ()

    #: Queue a Consume response: its head, then its chunks (the outbox closes them).
    put_consume_nowait = FrameWriter.put_chunks_nowait
