"""The send side of one Figg connection: frames in order, with a byte budget.

Every frame the server sends on a connection (ACK, PONG, ATTACHED, DETACHED, DATA) goes
through one :class:`Outbox`, a :class:`~gateway.io.writer.FrameWriter` drained by one
writer task that owns the socket's send side. The budget is what keeps a slow reader from
making the server buffer without bound: subscriptions call :meth:`Outbox.wait_writable`
before reading the log, so they stop reading while the connection is behind.

Two lanes: the ordered one (ATTACHED, DATA, DETACHED: DETACHED must follow the last DATA
of its topic; DATA is put with its subscription as owner, so a DETACH drops what is still
queued) and the urgent one (:meth:`Outbox.put_urgent`) for PONG and ACK, which may
overtake DATA, so a client that is behind on a busy subscription still gets its PONGs
(and keeps the connection).
"""

from __future__ import annotations

from gateway.io.writer import FrameWriter, Owner

__all__ = ["Outbox", "Owner"]


class Outbox(FrameWriter):
    """An ordered queue of frames for one connection, bounded by ``limit`` bytes.

    ``put_nowait`` never blocks (replies are bounded by what the reader admits, and DATA
    is bounded because subscriptions wait for :meth:`wait_writable` first), so the queue
    holds at most ``limit`` bytes plus what was put since the last wait: one chunk.
    """

    __slots__ = ()
