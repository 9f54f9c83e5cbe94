"""One subscriber's position in a partition, and waiting for the next batch of several.

A :class:`Cursor` serves its subscriber from the partition's
:class:`~gateway.http.tail.PartitionTail` when its position is in the tail's buffer (no
read, no decoding: the events are shared), and reads the log on its own when it is behind
the buffer (history, a resume from an old position). A cursor that was live (served from
the buffer) and falls further behind than ``limit`` bytes, or off the buffer, raises
:class:`Behind`: the subscriber is closed with its position, to resume from it, instead
of the server holding data for it.

While the partition can not be read (the backend's upstream is away) a cursor with nothing
buffered to deliver raises :class:`Unavailable`: its subscriber tells its client, waits
with :meth:`Cursor.until_available` and goes on from the same position.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Final

import trio

from gateway.core.contract import (
    Backend,
    BackendUnavailable,
    FetchRequest,
    FetchStatus,
)
from gateway.http.messages import decode_messages
from gateway.http.tail import PartitionTail, TailEvent, events_of
from gateway.io.writer import FrameWriter
from protocols.errors import ProtocolError

#: Bytes asked per read of the log by a subscriber that is behind.
LOG_READ_BYTES: Final = 256 * 1024


class Behind(Exception):
    """A live subscriber fell too far behind (or its client took nothing for too long);
    the message says where it stands, ``limit`` names the setting it hit."""

    def __init__(self, message: str, limit: str = "http_subscriber_buffer_bytes") -> None:
        super().__init__(message)
        self.limit = limit


async def wait_for_room(outbox: FrameWriter, stall: float) -> None:
    """Return once ``outbox`` has room; :class:`Behind` when its client took nothing for
    ``stall`` seconds (``limits.idle_timeout_secs``)."""
    if outbox.full:
        with trio.move_on_after(stall):
            await outbox.wait_writable()
        if outbox.full:
            raise Behind(f"the client took nothing for {stall:g} s", "idle_timeout_secs")


class Unavailable(Exception):
    """The partition can not be read now (the backend's upstream is away); the message
    says why. The cursor stays where it was."""


class Gone(Exception):
    """The partition can not be read any more (its topic went away, corrupt data)."""


class Cursor:
    """Delivers ``tail``'s partition from ``next_seq`` on."""

    __slots__ = ("_backend", "limit", "live", "next_seq", "partition", "tail", "topic")

    def __init__(self, backend: Backend, tail: PartitionTail, next_seq: int, limit: int
                 ) -> None:
        self._backend = backend
        self.tail = tail
        self.topic = tail.topic
        self.partition = tail.partition
        #: The sequence of the next message to deliver.
        self.next_seq = next_seq
        #: Bytes the subscriber may fall behind while live.
        self.limit = limit
        self.live = False

    @property
    def position(self) -> int:
        """The offset of the last message delivered (what resumes after it)."""
        return self.next_seq - 1

    def has_more(self) -> bool:
        return self.next_seq < self.tail.next_seq or self.tail.failed is not None

    async def take(self, max_bytes: int) -> list[TailEvent]:
        """The next events (possibly none), and move past them."""
        tail = self.tail
        if tail.failed is not None:
            raise Gone(tail.failed)
        events = tail.since(self.next_seq, max_bytes)
        if events is None:
            if self.live:
                raise Behind(f"fell off the newest {tail.budget} bytes kept for live "
                             f"subscribers at offset {self.position}")
            events = await self._read_log(max_bytes)
        elif events:
            if not self.live:
                self.live = True
            elif tail.bytes_after(self.next_seq) > self.limit:
                raise Behind(f"more than {self.limit} bytes behind at offset {self.position}")
        elif tail.unavailable is not None:
            raise Unavailable(tail.unavailable)
        if events:
            self.next_seq = events[-1].seq + 1
        return events

    async def _read_log(self, max_bytes: int) -> list[TailEvent]:
        request = FetchRequest(self.topic, self.partition, self.next_seq,
                               max(max_bytes, LOG_READ_BYTES))
        try:
            [outcome] = await self._backend.fetch([request], max_wait_ms=0, min_bytes=0)
        except BackendUnavailable as exc:
            self.tail.reader.outage(str(exc))
            raise Unavailable(str(exc)) from None
        status = outcome.status
        if status is FetchStatus.DATA:
            chunk = outcome.chunk
            try:
                data = chunk.read_bytes() if chunk.length else b""
            finally:
                chunk.close()
            if not data:
                return []
            try:
                found = decode_messages(data, outcome.base_seq, self.next_seq)
            except ProtocolError as exc:
                raise Gone(f"undecodable data at offset {self.next_seq}: {exc}") from None
            if not found.messages:
                self.next_seq = max(self.next_seq, found.next_seq)
            return events_of(self.topic, self.partition, found.messages)
        if status is FetchStatus.BOUNDARY:
            if self.next_seq < outcome.first_available:
                self.next_seq = outcome.first_available  # retention took the rest
            elif self.next_seq > outcome.high_water_mark + 1:
                self.next_seq = outcome.high_water_mark + 1
            return []
        if status is FetchStatus.FAULT:
            reason = self._backend.unavailable()
            if reason is not None:
                self.tail.reader.outage(reason)  # the reader says when it is back
                raise Unavailable(reason)
            await trio.sleep(0.5)
            return []
        raise Gone(f"{status.value}: {self.topic}/{self.partition}")

    async def until_available(self, heartbeat: float = math.inf,
                              beat: Callable[[], object] | None = None) -> None:
        """Return once the partition can be read again (at once when it can), calling
        ``beat`` every ``heartbeat`` seconds meanwhile. One waker waits with the tail
        across the heartbeats (an outage may last for hours)."""
        tail = self.tail
        while tail.unavailable is not None and tail.failed is None:
            waker = trio.Event()
            tail.wake_me(waker)
            while not waker.is_set():
                with trio.move_on_after(heartbeat):
                    await waker.wait()
                if not waker.is_set() and beat is not None:
                    beat()


async def next_batch(cursors: list[Cursor], max_bytes: int, timeout: float
                     ) -> list[tuple[Cursor, list[TailEvent]]]:
    """The next events of any of ``cursors`` (one batch each), waiting up to ``timeout``
    seconds for some; empty when none came in time. :class:`Unavailable` only when no
    cursor has events: those taken (the cursors moved past them) are never dropped."""
    deadline = trio.current_time() + timeout
    while True:
        out = []
        away: Unavailable | None = None
        for cursor in cursors:
            try:
                events = await cursor.take(max_bytes)
            except Unavailable as exc:
                away = exc
                continue
            if events:
                out.append((cursor, events))
        if out:
            return out
        if away is not None:
            raise away
        if any(c.has_more() for c in cursors):
            continue  # appended while a cursor read the log
        waker = trio.Event()
        for cursor in cursors:
            cursor.tail.wake_me(waker)
        with trio.move_on_at(deadline):
            await waker.wait()
        if not waker.is_set():
            return []
