"""One connection's send side: frames and file chunks in order, one send per batch, a budget.

Every byte a listener or a client sends on a connection goes through one
:class:`FrameWriter`, drained by one writer task (:meth:`FrameWriter.run`) that owns the
socket's send side, so frames never interleave. What it queues:

- byte strings (one or more whole frames), joined into one write of up to
  :data:`~gateway.io.limits.MAX_WRITE` bytes;
- frames of an *owner* (a Figg subscription) that :meth:`FrameWriter.drop` can take back
  while unsent, and that are never sent once the owner is ``detached``;
- an urgent lane (:meth:`FrameWriter.put_urgent`) that overtakes the ordered queue at the
  next write;
- buffers that make whole frames (:meth:`FrameWriter.put_parts_nowait`: a Kafka Fetch
  response with its records, a Tank Consume response held in memory), written with
  vectored writes (``os.writev``) as they are, never joined into one copy, on a plain
  socket (joined on any other stream);
- a head and its file chunks (a Tank Consume response): the head is written, then each
  file-backed chunk with ``os.sendfile`` straight from its file, or its bytes when it is
  held in memory. On a stream that is not a plain socket (TLS, tests) sendfile can not
  be used: a file-backed chunk is read in pieces of up to :data:`READ_PIECE` bytes, each
  sent with one ``send_all`` as soon as it is read (one encryption and one socket write
  per MiB; memory stays at one piece however long the chunk). Every chunk is closed
  once sent, and also when the writer is closed with it still queued.

The byte budget (:class:`SendBudget`) is the backpressure: ``put_*`` never block, and
whoever produces output calls :meth:`FrameWriter.wait_writable` before making more, so a
peer that does not read stops being served instead of growing the queue.

With ``direct`` (the listeners), a put that finds the writer task idle writes what the
socket takes at once (:func:`send_now`) instead of waking the task: a reply leaves the
moment it is made. The clients leave it off, so that a burst of requests is batched into
one write.

A listener's connection runs its writer task only while there is something to write
(:meth:`FrameWriter.on_demand`): the task is started when a put leaves bytes the socket
did not take, and :meth:`FrameWriter.retire` (the idle sweeper's) lets a parked one end.
An idle connection whose replies all went out at once never has one; its queues are
given back whenever they empty, so an idle writer holds no deque either.
"""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol, cast

import trio
from trio.lowlevel import ParkingLot

from gateway.io.limits import MAX_WRITE, SENDFILE_STEP

#: Bytes of a file-backed chunk read and sent at once on a stream without sendfile (TLS).
READ_PIECE = 1024 * 1024
#: Buffers under this many bytes in all are joined (one small copy) rather than queued
#: apart for a vectored write.
JOIN_BELOW = 64 * 1024
#: Most buffers handed to one ``os.writev`` (Linux's IOV_MAX).
IOV_MAX = 1024

#: A piece of a frame: any contiguous bytes.
Buffer = bytes | bytearray | memoryview


class ShortChunk(OSError):
    """A file ended before the chunk announced in the head was sent."""


class FileChunk(Protocol):
    """A run of bytes in memory or in a file (:class:`gateway.core.contract.Chunk`)."""

    @property
    def length(self) -> int: ...

    def read_bytes(self) -> bytes: ...

    def sendfile_source(self) -> tuple[int, int] | None: ...

    def close(self) -> None: ...


class Owner(Protocol):
    """Whoever queued frames; frames of a detached owner are never sent."""

    detached: bool


def socket_fd(stream: object) -> int:
    """The descriptor of a plain TCP stream, for :func:`send_now`; -1 for anything else
    (TLS, memory streams in tests)."""
    if isinstance(stream, trio.SocketStream):
        return stream.socket.fileno()
    return -1


def send_now(fd: int, data: bytes) -> bytes:
    """Write what the socket ``fd`` takes at once, without waiting; returns the rest.

    Any failure (a full buffer, a broken connection, no plain socket: ``fd`` -1) writes
    nothing here: the writer task sends the rest and meets the error itself.
    """
    if fd < 0:
        return data
    try:
        sent = os.write(fd, data)
    except OSError:
        return data
    return data[sent:] if sent else data


class SendBudget:
    """The bytes queued for one connection's socket, against the connection's limit.

    The writer calls :meth:`add` when it queues and :meth:`release` once bytes are written
    (or dropped); producers of output call :meth:`wait_writable` before making more.
    :meth:`close` releases every waiter for good. ``limit`` may be ``math.inf`` (never
    full).
    """

    __slots__ = ("_drained", "_has_space", "closed", "limit", "queued")

    def __init__(self, limit: float) -> None:
        if limit <= 0:
            raise ValueError("the outbox limit must be positive")
        self.limit = limit
        #: Bytes queued or being written.
        self.queued = 0
        self.closed = False
        # Made when someone first waits: most connections never do.
        self._has_space: ParkingLot | None = None
        self._drained: ParkingLot | None = None

    def add(self, size: int) -> None:
        self.queued += size

    def release(self, size: int) -> None:
        """``size`` bytes left the queue: wake whoever waits for space or for empty."""
        self.queued -= size
        if self.queued < self.limit:
            if self._has_space is not None:
                self._has_space.unpark_all()
            if not self.queued and self._drained is not None:
                self._drained.unpark_all()

    def close(self) -> None:
        self.closed = True
        self.queued = 0
        if self._has_space is not None:
            self._has_space.unpark_all()
        if self._drained is not None:
            self._drained.unpark_all()

    async def wait_writable(self) -> None:
        """Wait until the queue is under its limit (no checkpoint when it already is)."""
        while self.queued >= self.limit and not self.closed:
            if self._has_space is None:
                self._has_space = ParkingLot()
            await self._has_space.park()

    async def wait_empty(self) -> None:
        """Wait until everything queued has been written."""
        while self.queued and not self.closed:
            if self._drained is None:
                self._drained = ParkingLot()
            await self._drained.park()


class _Owned:
    """Frames an owner may take back while they are queued."""

    __slots__ = ("data", "owner")

    def __init__(self, owner: Owner, data: bytes) -> None:
        self.owner = owner
        self.data = data


class _Parts:
    """Buffers sent in order with vectored writes (never joined)."""

    __slots__ = ("buffers", "size")

    def __init__(self, buffers: list[Buffer], size: int) -> None:
        self.buffers = buffers
        self.size = size


class _Chunks:
    """A head, then its chunks in order."""

    __slots__ = ("chunks", "head", "size")

    def __init__(self, head: bytes, chunks: Sequence[FileChunk]) -> None:
        self.head = head
        self.chunks = list(chunks)
        self.size = len(head) + sum(c.length for c in chunks)

    def close(self) -> None:
        for chunk in self.chunks:
            chunk.close()


Item = bytes | _Owned | _Parts | _Chunks
#: What the writer sends from when nothing is queued (never appended to).
_NOTHING: deque[Item] = deque(maxlen=0)


class FrameWriter:
    """An ordered queue of frames and file chunks for one connection; see the module doc.

    ``limit`` bounds the queued bytes that :meth:`wait_writable` lets through
    (``math.inf``: no bound); file-backed chunks count at their length: they are work for
    the socket even if they take no memory. ``direct``: write at once when the writer task
    is idle.
    """

    __slots__ = ("_budget", "_fd", "_has_items", "_idle", "_items", "_on_queue", "_parked",
                 "_retiring", "_running", "_socket", "_spawn", "_special", "_stream",
                 "_urgent", "bytes_sent", "drained_at")

    def __init__(self, stream: trio.abc.SendStream, limit: float = math.inf, *,
                 direct: bool = True) -> None:
        self._stream = stream
        # sendfile and the sends need the socket itself; any other stream gets send_all.
        self._socket = stream.socket if isinstance(stream, trio.SocketStream) else None
        self._fd = socket_fd(stream) if direct else -1
        self._budget = SendBudget(limit)
        #: The ordered queue and the urgent lane; None while empty (an idle connection
        #: holds no deque).
        self._items: deque[Item] | None = None
        self._urgent: list[bytes] | None = None
        #: Items in ``_items`` that are not plain byte strings.
        self._special = 0
        #: Nothing is queued and no writer task is busy: a put may write at once.
        self._idle = False
        self._has_items: ParkingLot | None = None  # made when the writer first parks
        #: The writer task is parked in ``_has_items``.
        self._parked = False
        #: Starts a writer task (on_demand), None: the owner runs :meth:`run` itself.
        self._spawn: Callable[[], None] | None = None
        #: A writer task started by ``_spawn`` is running.
        self._running = False
        #: The parked writer task is to end (:meth:`retire`).
        self._retiring = False
        #: Bytes written to the socket so far.
        self.bytes_sent = 0
        #: Set to ``trio.current_time()`` whenever a write empties the queue.
        self.drained_at = 0.0
        #: Called (once) when bytes are queued: writers of a fan-out that send to the
        #: socket directly stop (see :mod:`gateway.io.fanout`).
        self._on_queue: list[Callable[[], None]] | None = None

    @property
    def fd(self) -> int:
        """The socket's descriptor when writes may go to it directly, else -1."""
        return self._fd

    @property
    def free(self) -> bool:
        """Nothing queued, the writer task parked, a plain socket: bytes written to the
        socket directly now keep their order (a fan-out's fast path)."""
        return self._idle and not self._budget.queued and self._fd >= 0 and (
            not self._budget.closed)

    def on_queue(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once, the next time bytes are queued (not written at once)
        or the writer closes."""
        if self._on_queue is None:
            self._on_queue = [callback]
        else:
            self._on_queue.append(callback)

    def forget_on_queue(self, callback: Callable[[], None]) -> None:
        callbacks = self._on_queue
        if callbacks is not None and callback in callbacks:
            callbacks.remove(callback)
            if not callbacks:
                self._on_queue = None

    def _queued(self) -> None:
        callbacks, self._on_queue = self._on_queue, None
        if callbacks is not None:
            for callback in callbacks:
                callback()

    def on_demand(self, spawn: Callable[[], None]) -> None:
        """Run the writer task only while there is something to write: ``spawn()`` starts
        a task that awaits :meth:`run`, which returns once :meth:`retire` lets it go. Call
        before anything is put; the owner calls :meth:`close` when the connection ends
        (there may be no writer task then to do it)."""
        self._spawn = spawn
        self._idle = True

    def retire(self) -> None:
        """Let a writer task started on demand end if it is parked with nothing to write
        (it is started again when there is); no effect otherwise."""
        if self._spawn is not None and self._parked and not self._retiring:
            self._retiring = True
            assert self._has_items is not None
            self._has_items.unpark_all()

    @property
    def queued_bytes(self) -> int:
        """Bytes queued or being written."""
        return self._budget.queued

    @property
    def room(self) -> float:
        """Bytes that may still be queued before the queue is :attr:`full` (0 when it is)."""
        return max(0, self._budget.limit - self._budget.queued)

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

    # --------------------------------------------------------------------------- puts

    def put_nowait(self, data: bytes, owner: Owner | None = None) -> None:
        """Queue ``data`` (one or more whole frames) behind everything queued so far.

        Frames of an ``owner`` that is already detached, and anything put after
        :meth:`close`, are dropped.
        """
        budget = self._budget
        if budget.closed or not data:
            return
        if owner is not None:
            if owner.detached:
                return
        elif not self._idle:
            # The common case, kept short: the writer task is busy or already woken.
            items = self._items
            if items is None:
                items = self._items = deque()
            items.append(data)
            budget.queued += len(data)
            return
        rest = self._write_now(data)
        if not rest:
            return
        if len(rest) < len(data):
            owner = None  # the rest of a frame already begun: never dropped
        self._push(rest if owner is None else _Owned(owner, rest), len(rest))

    def put_urgent(self, data: bytes) -> None:
        """Queue frames that may overtake the ordered queue (Figg's PONG and ACK): in order
        among themselves, at the next write, so a backlog never delays them."""
        if not data or self._budget.closed:
            return
        rest = self._write_now(data)
        if not rest:
            return
        if self._on_queue is not None:
            self._queued()
        if self._urgent is None:
            self._urgent = []
        self._urgent.append(rest)
        self._budget.add(len(rest))
        self._wake()

    def put_parts_nowait(self, buffers: Sequence[Buffer]) -> None:
        """Queue ``buffers`` (together one or more whole frames) behind everything queued,
        to be written as they are: a vectored write, no copy into one payload. The
        buffers must not change until written. Few bytes in all, or a stream that is not
        a plain socket, and they are joined into one :meth:`put_nowait`."""
        size = sum(map(len, buffers))
        if size < JOIN_BELOW or self._socket is None:
            self.put_nowait(b"".join(buffers))
            return
        if self._budget.closed:
            return
        rest: list[Buffer] = list(buffers)
        if self._idle and self._fd >= 0:
            sent = _writev_now(self._fd, rest)
            self.bytes_sent += sent
            if sent == size:
                return
            rest = _advance(rest, sent)
            size -= sent
        self._push(_Parts(rest, size), size)

    def put_chunks_nowait(self, head: bytes, chunks: Sequence[FileChunk]) -> None:
        """Queue ``head`` followed by ``chunks``; the writer now owns the chunks and
        closes them. With no chunks, ``head`` is a whole frame."""
        if not chunks:
            self.put_nowait(head)
            return
        if self._socket is not None and all(c.sendfile_source() is None for c in chunks):
            # Held in memory (the tail cache): head and chunks in one vectored write.
            try:
                buffers = [head, *(c.read_bytes() for c in chunks)]
            finally:
                for chunk in chunks:
                    chunk.close()
            self.put_parts_nowait(buffers)
            return
        item = _Chunks(head, chunks)
        if self._budget.closed:
            item.close()
            return
        self._push(item, item.size)

    def _write_now(self, data: bytes) -> bytes:
        """With nothing queued and the writer parked, write what the socket takes now (no
        task hand-off); returns the rest, all of ``data`` when the writer is busy."""
        if not self._idle or self._fd < 0:
            return data
        rest = send_now(self._fd, data)
        self.bytes_sent += len(data) - len(rest)
        return rest

    def _push(self, item: Item, size: int) -> None:
        if self._on_queue is not None:
            self._queued()
        items = self._items
        if items is None:
            items = self._items = deque()
        items.append(item)
        if type(item) is not bytes:
            self._special += 1
        self._budget.add(size)
        self._wake()

    def _wake(self) -> None:
        if self._idle:
            self._idle = False
            if self._parked:
                assert self._has_items is not None
                self._has_items.unpark_all()
            elif self._spawn is not None and not self._running:
                self._running = True
                self._spawn()

    def drop(self, owner: Owner) -> int:
        """Remove the frames of ``owner`` not yet handed to the socket; returns their size."""
        if not self._items:
            return 0
        kept: deque[Item] = deque()
        dropped = 0
        for item in self._items:
            if type(item) is _Owned and item.owner is owner:
                dropped += len(item.data)
                self._special -= 1
            else:
                kept.append(item)
        if dropped:
            self._items = kept
            self._budget.release(dropped)
        return dropped

    def close(self) -> None:
        """Drop everything queued, closing its chunks; later puts are dropped too."""
        if self._on_queue is not None:
            self._queued()
        for item in self._items or ():
            if type(item) is _Chunks:
                item.close()
        self._items = self._urgent = None
        self._special = 0
        self._spawn = None  # it holds the owner's nursery and task: no cycle left behind
        self._budget.close()

    # ------------------------------------------------------------------------- writer

    async def run(self) -> None:
        """The writer task: send what is queued until cancelled or the socket breaks.

        Raises ``trio.BrokenResourceError`` / ``trio.ClosedResourceError`` when the peer is
        gone, :class:`ShortChunk` when a file is shorter than its chunk, and the
        ``OSError`` of reading a chunk's bytes. Whatever is still queued when it fails or is
        cancelled is closed. Started on demand (:meth:`on_demand`), it returns once
        :meth:`retire` lets it go.
        """
        try:
            await self._run()
        except BaseException:
            self.close()
            raise
        finally:
            self._running = False

    async def _run(self) -> None:
        budget = self._budget
        while True:
            # Read on every round: drop() replaces the deque, an idle writer drops both.
            items, urgent = self._items, self._urgent
            if not items and not urgent:
                self._items = self._urgent = None  # give their memory back while idle
                self._idle = True
                if self._retiring:
                    self._retiring = False
                    return
                if self._has_items is None:
                    self._has_items = ParkingLot()
                self._parked = True
                try:
                    await self._has_items.park()
                finally:
                    self._parked = False
                continue
            if not self._special and budget.queued <= MAX_WRITE:
                # Byte strings only, few enough for one write: all of them at once.
                parts = cast("deque[bytes]", items or _NOTHING)
                if urgent:
                    data = b"".join([*urgent, *parts])
                    urgent.clear()
                else:
                    data = parts[0] if len(parts) == 1 else b"".join(parts)
                parts.clear()
                await self._send(data)
                self._sent(len(data))
                continue
            await self._send_batch(urgent or [], items or _NOTHING)

    async def _send_batch(self, urgent: list[bytes], items: deque[Item]) -> None:
        """Send the urgent lane and the queue's head, up to MAX_WRITE, a head with
        chunks (sent whole) or buffers (sent whole, with the frames before them in the
        same vectored writes)."""
        parts: list[bytes] = urgent[:]
        size = sum(map(len, urgent))
        urgent.clear()
        while items:
            item = items[0]
            if isinstance(item, _Chunks):
                items.popleft()
                self._special -= 1
                await self._send_chunks(parts, size, item)
                return
            if isinstance(item, _Parts):
                items.popleft()
                self._special -= 1
                await self._writev([*parts, *item.buffers])
                self._sent(size + item.size)
                return
            if isinstance(item, _Owned):
                data = item.data
                if size and size + len(data) > MAX_WRITE:
                    break
                self._special -= 1
            else:
                data = item
                if size and size + len(data) > MAX_WRITE:
                    break
            items.popleft()
            parts.append(data)
            size += len(data)
        if parts:
            await self._send_parts(parts)
            self._sent(size)

    async def _send_chunks(self, parts: list[bytes], size: int, item: _Chunks) -> None:
        """Send the frames before ``item``, then ``item``'s head and chunks."""
        try:
            parts.append(item.head)
            size += len(item.head)
            for chunk in item.chunks:
                source = chunk.sendfile_source()
                if source is None or (self._socket is None and chunk.length <= READ_PIECE):
                    parts.append(chunk.read_bytes())
                    size += chunk.length
                    if self._socket is None and size >= READ_PIECE:
                        await self._send_parts(parts)
                        self._sent(size)
                        parts.clear()
                        size = 0
                    continue
                if self._socket is None:
                    # The pieces go out as they are read; the frames before go with the first.
                    await self._send_read(parts, size, *source, chunk.length)
                    parts.clear()
                    size = 0
                    continue
                # No MSG_MORE on the head: Linux keeps the tail of the sendfile that
                # follows corked (~200 ms per response).
                await self._send_parts(parts)
                self._sent(size)
                parts.clear()
                size = 0
                await self._sendfile(*source, chunk.length)
                self._sent(chunk.length)
            if parts:
                await self._send_parts(parts)
                self._sent(size)
        finally:
            item.close()

    def _sent(self, size: int) -> None:
        self._budget.release(size)
        if not self._budget.queued:
            self.drained_at = trio.current_time()

    async def _send_parts(self, parts: list[bytes]) -> None:
        if parts:
            await self._send(parts[0] if len(parts) == 1 else b"".join(parts))

    async def _send(self, data: bytes) -> None:
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
                    raise trio.BrokenResourceError(f"socket connection broken: {exc!r}"
                                                   ) from exc
        self.bytes_sent += total

    async def _writev(self, buffers: list[Buffer]) -> None:
        """Write ``buffers`` in order on the socket with vectored writes."""
        sock = self._socket
        assert sock is not None
        fd = sock.fileno()
        while buffers:
            try:
                sent = os.writev(fd, buffers[:IOV_MAX])
            except BlockingIOError:
                await trio.lowlevel.wait_writable(sock)
                continue
            except OSError as exc:
                raise trio.BrokenResourceError(f"socket connection broken: {exc!r}"
                                               ) from exc
            self.bytes_sent += sent
            buffers = _advance(buffers, sent)
            # A peer that keeps up never makes the write block: let other tasks run.
            await trio.lowlevel.checkpoint()

    async def _send_read(self, parts: list[bytes], size: int, fd: int, offset: int,
                         count: int) -> None:
        """Send ``parts`` (``size`` bytes), then ``count`` bytes of file ``fd`` from
        ``offset``, read in pieces of up to :data:`READ_PIECE` (no sendfile: TLS)."""
        while count:
            piece = os.pread(fd, min(count, READ_PIECE), offset)
            if not piece:
                raise ShortChunk(f"segment file ended {count} bytes before the chunk's end")
            parts.append(piece)
            await self._send_parts(parts)
            self._sent(size + len(piece))
            parts.clear()
            size = 0
            offset += len(piece)
            count -= len(piece)

    async def _sendfile(self, fd: int, offset: int, count: int) -> None:
        sock = self._socket
        assert sock is not None
        out = sock.fileno()
        while count:
            try:
                sent = os.sendfile(out, fd, offset, min(count, SENDFILE_STEP))
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
            # A peer that keeps up never makes sendfile block: let other tasks run.
            await trio.lowlevel.checkpoint()


def _writev_now(fd: int, buffers: list[Buffer]) -> int:
    """What the socket ``fd`` takes of ``buffers`` at once, without waiting (0 on any
    failure: the writer task meets it); as :func:`send_now`."""
    try:
        return os.writev(fd, buffers[:IOV_MAX])
    except OSError:
        return 0


def _advance(buffers: list[Buffer], sent: int) -> list[Buffer]:
    """``buffers`` without their first ``sent`` bytes (a view of a buffer begun)."""
    for i, buffer in enumerate(buffers):
        size = len(buffer)
        if sent < size:
            rest = buffers[i:]
            if sent:
                rest[0] = memoryview(buffer)[sent:]
            return rest
        sent -= size
    return []
