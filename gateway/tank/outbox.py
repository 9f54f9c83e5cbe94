"""The send side of one Tank connection: whole responses in order, chunks by ``sendfile``.

Every frame the listener sends on a connection goes through one :class:`TankOutbox`,
drained by one writer task, so responses never interleave. A Consume response is queued
as its head (frame header and response header) plus its
:class:`~gateway.backend.contract.Chunk`\\ s;
the writer sends the head and then each file-backed chunk with ``os.sendfile`` straight
from the segment file, or the chunk's bytes when it is held in memory or the stream is not
a plain socket (TLS, tests). Every chunk is closed once sent, and also when the outbox is
closed with chunks still queued.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Sequence

import trio
from trio.lowlevel import ParkingLot

from gateway.backend.contract import Chunk
from gateway.server.listening import SendBudget, send_now, socket_fd

#: Largest run of queued frames joined into one write.
MAX_WRITE = 1024 * 1024
#: Largest count handed to one ``os.sendfile`` call.
_SENDFILE_STEP = 1 << 30


class ShortChunk(OSError):
    """A segment file ended before the chunk announced in the response head was sent."""


class _Reply:
    """A Consume response: its head bytes, then its chunks in header order."""

    __slots__ = ("chunks", "head", "size")

    def __init__(self, head: bytes, chunks: Sequence[Chunk]) -> None:
        self.head = head
        self.chunks = list(chunks)
        self.size = len(head) + sum(c.length for c in chunks)

    def close(self) -> None:
        for chunk in self.chunks:
            chunk.close()


class TankOutbox:
    """An ordered queue of responses for one connection, bounded by ``limit`` bytes.

    ``put_*_nowait`` never blocks; the connection's reader calls :meth:`wait_writable`
    before reading more requests, so a client that does not read its responses stops being
    read. Queued file-backed chunks count at their length: they are work for the socket
    even if they take no memory.
    """

    def __init__(self, stream: trio.abc.SendStream, limit: int) -> None:
        self._stream = stream
        # sendfile needs the socket itself; any other stream gets the chunks' bytes.
        self._socket = stream.socket if isinstance(stream, trio.SocketStream) else None
        self._fd = socket_fd(stream)
        self._writer_idle = False
        self._budget = SendBudget(limit)
        self._items: deque[bytes | _Reply] = deque()
        self._has_items = ParkingLot()
        #: Bytes written to the socket so far.
        self.bytes_sent = 0
        #: Set to ``trio.current_time()`` whenever the queue becomes empty.
        self.drained_at = 0.0

    @property
    def queued_bytes(self) -> int:
        """Bytes queued or being written."""
        return self._budget.queued

    async def wait_writable(self) -> None:
        """Wait until the queue is under its budget (no checkpoint when it already is)."""
        await self._budget.wait_writable()

    async def wait_empty(self) -> None:
        """Wait until everything queued has been written."""
        await self._budget.wait_empty()

    def put_nowait(self, frame: bytes) -> None:
        """Queue one or more whole frames behind everything queued so far."""
        if self._budget.closed or not frame:
            return
        if self._writer_idle:
            # Nothing queued and the writer parked: write now, no task hand-off.
            rest = send_now(self._fd, frame)
            self.bytes_sent += len(frame) - len(rest)
            if not rest:
                return
            frame = rest
        self._push(frame, len(frame))

    def put_consume_nowait(self, head: bytes, chunks: Sequence[Chunk]) -> None:
        """Queue a Consume response; the outbox now owns ``chunks`` and closes them."""
        if self._socket is not None and all(c.sendfile_source() is None for c in chunks):
            # Held in memory (the tail cache): one write of head and chunks.
            try:
                frame = b"".join([head, *(c.read_bytes() for c in chunks)])
            finally:
                for chunk in chunks:
                    chunk.close()
            self.put_nowait(frame)
            return
        reply = _Reply(head, chunks)
        if self._budget.closed:
            reply.close()
            return
        self._push(reply, reply.size)

    def _push(self, item: bytes | _Reply, size: int) -> None:
        self._items.append(item)
        self._writer_idle = False
        self._budget.add(size)
        if len(self._items) == 1:
            self._has_items.unpark_all()

    def close(self) -> None:
        """Drop everything queued, closing its chunks; later puts are dropped too."""
        for item in self._items:
            if type(item) is _Reply:
                item.close()
        self._items.clear()
        self._budget.close()

    # ------------------------------------------------------------------------- writer

    async def run(self) -> None:
        """The writer task: send queued responses until cancelled or the socket breaks.

        Raises ``trio.BrokenResourceError`` / ``trio.ClosedResourceError`` when the peer is
        gone, :class:`ShortChunk` when a segment file is shorter than its chunk. Whatever
        is still queued when it ends is closed.
        """
        try:
            await self._run()
        finally:
            self.close()

    async def _run(self) -> None:
        items = self._items
        while True:
            while not items:
                self._writer_idle = True
                await self._has_items.park()
            parts: list[bytes] = []
            size = 0
            while items:
                item = items[0]
                if type(item) is bytes:
                    if size and size + len(item) > MAX_WRITE:
                        break
                    items.popleft()
                    parts.append(item)
                    size += len(item)
                    continue
                items.popleft()
                await self._send_reply(parts, size, item)
                parts, size = [], 0
                break
            if parts:
                await self._send(parts)
                self._sent(size)

    async def _send_reply(self, parts: list[bytes], size: int, reply: _Reply) -> None:
        """Send the frames before ``reply``, then ``reply``'s head and chunks."""
        try:
            parts.append(reply.head)
            size += len(reply.head)
            for chunk in reply.chunks:
                source = chunk.sendfile_source() if self._socket is not None else None
                if source is None:
                    parts.append(chunk.read_bytes())
                    size += chunk.length
                    continue
                # No MSG_MORE on the head: Linux keeps the tail of the sendfile that
                # follows corked (~200 ms per response).
                await self._send(parts)
                self._sent(size)
                parts.clear()
                size = 0
                await self._sendfile(*source, chunk.length)
                self._sent(chunk.length)
            if parts:
                await self._send(parts)
                self._sent(size)
        finally:
            reply.close()

    def _sent(self, size: int) -> None:
        self._budget.release(size)
        if not self._budget.queued:
            self.drained_at = trio.current_time()

    async def _send(self, parts: list[bytes]) -> None:
        if not parts:
            return
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        sock = self._socket
        if sock is None:
            await self._stream.send_all(data)
            self.bytes_sent += len(data)
            return
        with memoryview(data) as view:
            sent = 0
            total = len(data)
            while sent < total:
                try:
                    sent += await sock.send(view[sent:])
                except OSError as exc:
                    raise trio.BrokenResourceError(f"send failed: {exc!r}") from exc
        self.bytes_sent += total

    async def _sendfile(self, fd: int, offset: int, count: int) -> None:
        sock = self._socket
        assert sock is not None
        out = sock.fileno()
        while count:
            try:
                sent = os.sendfile(out, fd, offset, min(count, _SENDFILE_STEP))
            except BlockingIOError:
                await trio.lowlevel.wait_writable(sock)
                continue
            except OSError as exc:
                raise trio.BrokenResourceError(f"sendfile failed: {exc!r}") from exc
            if sent == 0:
                raise ShortChunk(f"segment file ended {count} bytes before the chunk's end")
            offset += sent
            count -= sent
            self.bytes_sent += sent
            # A client that keeps up never makes sendfile block: let other tasks run.
            await trio.lowlevel.checkpoint()
