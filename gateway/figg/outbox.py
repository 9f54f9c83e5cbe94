"""The send side of one Figg connection: frames in order, with a byte budget.

Every frame the server sends on a connection (ACK, PONG, ATTACHED, DETACHED, DATA) goes
through one :class:`Outbox`, drained by one writer task that owns the socket's send side
and writes whatever is queued with one ``send_all``. The budget is what keeps a slow
reader from making the server buffer without bound: subscriptions call
:meth:`Outbox.wait_writable` before reading the log, so they stop reading while the
connection is behind.

Two lanes: the ordered one (ATTACHED, DATA, DETACHED: DETACHED must follow the last DATA
of its topic) and an urgent one for PONG and ACK, which may overtake DATA, so a client
that is behind on a busy subscription still gets its PONGs (and keeps the connection).
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

import trio
from trio.lowlevel import ParkingLot

from gateway.server.listening import SendBudget, send_now, socket_fd

#: Largest write handed to the socket at once (items bigger than this go alone).
MAX_WRITE = 1024 * 1024


class Owner(Protocol):
    """Whoever queued a frame; frames of a detached owner are never sent."""

    detached: bool


class Outbox:
    """An ordered queue of frames for one connection, bounded by ``limit`` bytes.

    ``put_nowait`` never blocks (replies are bounded by what the reader admits, and DATA
    is bounded because subscriptions wait for :meth:`wait_writable` first), so the queue
    holds at most ``limit`` bytes plus what was put since the last wait: one chunk.
    """

    def __init__(self, stream: trio.abc.SendStream, limit: int) -> None:
        self._stream = stream
        self._fd = socket_fd(stream)
        self._budget = SendBudget(limit)
        self._items: deque[tuple[Owner | None, bytes]] = deque()
        self._urgent: deque[bytes] = deque()
        self._writer_idle = False
        self._has_items = ParkingLot()
        #: Bytes written to the socket so far.
        self.bytes_sent = 0

    @property
    def queued_bytes(self) -> int:
        """Bytes queued or being written."""
        return self._budget.queued

    @property
    def full(self) -> bool:
        """At or over the budget: whoever produces frames should wait."""
        return self._budget.queued >= self._budget.limit

    async def wait_writable(self) -> None:
        """Wait until the queue is under its budget (no checkpoint when it already is)."""
        await self._budget.wait_writable()

    async def wait_empty(self) -> None:
        """Wait until everything queued has been written to the socket."""
        await self._budget.wait_empty()

    def put_nowait(self, frames: bytes, owner: Owner | None = None) -> None:
        """Queue ``frames`` (one or more whole frames) behind everything queued so far.

        Frames of an ``owner`` that is already detached are dropped.
        """
        if not frames or (owner is not None and owner.detached):
            return
        if self._writer_idle:
            rest = send_now(self._fd, frames)
            self.bytes_sent += len(frames) - len(rest)
            if not rest:
                return
            if len(rest) < len(frames):
                owner = None  # the rest of a frame already begun: never dropped
            frames = rest
        self._items.append((owner, frames))
        self._budget.add(len(frames))
        if self._writer_idle:
            self._writer_idle = False
            self._has_items.unpark_all()

    def put_urgent(self, frames: bytes) -> None:
        """Queue frames that may overtake queued DATA (PONG, ACK): in order among
        themselves, ahead of the ordered queue, so a backlog of DATA never delays them."""
        if not frames:
            return
        if self._writer_idle:
            rest = send_now(self._fd, frames)
            self.bytes_sent += len(frames) - len(rest)
            if not rest:
                return
            frames = rest
        self._urgent.append(frames)
        self._budget.add(len(frames))
        if self._writer_idle:
            self._writer_idle = False
            self._has_items.unpark_all()

    def drop(self, owner: Owner) -> int:
        """Remove the frames of ``owner`` not yet handed to the socket; returns their size."""
        kept: deque[tuple[Owner | None, bytes]] = deque()
        dropped = 0
        for item in self._items:
            if item[0] is owner:
                dropped += len(item[1])
            else:
                kept.append(item)
        if dropped:
            self._items = kept
            self._budget.release(dropped)
        return dropped

    async def run(self) -> None:
        """The writer task: send queued frames until cancelled or the socket breaks.

        Raises ``trio.BrokenResourceError`` / ``trio.ClosedResourceError`` from the stream.
        """
        stream = self._stream
        urgent = self._urgent
        while True:
            while not self._items and not urgent:
                self._writer_idle = True
                await self._has_items.park()
            parts = []
            size = 0
            while urgent:
                frames = urgent.popleft()
                parts.append(frames)
                size += len(frames)
            items = self._items
            while items and (not size or size + len(items[0][1]) <= MAX_WRITE):
                frames = items.popleft()[1]
                parts.append(frames)
                size += len(frames)
            await stream.send_all(parts[0] if len(parts) == 1 else b"".join(parts))
            self.bytes_sent += size
            self._budget.release(size)
