r"""One Figg connection on the server: read big, parse every frame, dispatch in batches.

The reader task receives up to 256 KiB, turns every complete frame into events in one pass
with :meth:`FiggConnection.next_batch`, and handles them: PUBLISHes (already grouped into
:class:`~protocols.translate.PublishBatch`\ es) become one append per partition for the whole
read (:class:`~gateway.figg.publisher.Publishing`), PING is answered at once, ATTACH starts
a :class:`~gateway.figg.subscription.Subscription`, DETACH stops one. Everything sent goes
through the connection's one :class:`~gateway.figg.outbox.Outbox`. Bad input closes this
connection only, with the reason logged (Figg has no error message).
"""

from __future__ import annotations

import time
from typing import Any, Final

import structlog
import trio

from gateway.backend.contract import Backend, TopicRefused, ensure_topic
from gateway.figg.feed import TailFeeds
from gateway.figg.frames import DataFrameCache
from gateway.figg.offsets import InvalidTopic, TankPartition, attach_start, figg_to_tank
from gateway.figg.outbox import Outbox
from gateway.figg.publisher import AckQueue, Publishing
from gateway.figg.subscription import Subscription, SubscriptionError
from gateway.server.config import Settings
from gateway.server.listening import (
    DRAIN_SECS,
    CloseConnection,
    protocol_close,
    receive_or_close,
)
from gateway.server.metrics import Metrics
from protocols.connection import CLOSED, Role
from protocols.errors import ProtocolError
from protocols.figg.connection import FiggConnection
from protocols.figg.messages import FAST, Attach, Detach, MessageType, Ping
from protocols.translate import PublishBatch
from protocols.wire import UINT64_MAX

#: Published bytes a connection may have waiting for their ACK before it stops reading.
PUBLISH_INFLIGHT_BYTES: Final = 8 * 1024 * 1024

#: Closes after which pending ACKs and replies are still sent (the socket works).
_DRAIN_ON: Final = frozenset({"protocol_error", "frame_too_large", "invalid_topic", "unknown_topic",
                              "unknown_partition"})

_encode_attached = FAST[MessageType.ATTACHED].encode_frame
_encode_detached = FAST[MessageType.DETACHED].encode_frame
_encode_pong = FAST[MessageType.PONG].encode_frame


class FiggSession:
    """Serves one accepted Figg connection until it closes; see :meth:`run`."""

    def __init__(self, stream: trio.SocketStream, *, backend: Backend, settings: Settings,
                 metrics: Metrics, frames: DataFrameCache, feeds: TailFeeds,
                 log: structlog.typing.FilteringBoundLogger) -> None:
        self._stream = stream
        self._backend = backend
        self._settings = settings
        self._metrics = metrics
        self._frames = frames
        self._feeds = feeds
        self._log = log
        self._outbox = Outbox(stream, settings.subscriber_buffer_bytes)
        self._acks = AckQueue(self._outbox, self._publish_failed)
        self._publishing = Publishing(backend, self._acks)
        self._subs: dict[str, Subscription] = {}
        self._partitions: dict[str, TankPartition] = {}
        self._nursery: trio.Nursery | None = None
        self._close: CloseConnection | None = None
        #: Around the reads from the client: cancelled by shutdown().
        self._reading = trio.CancelScope()
        self._requests = metrics.requests
        self._published_ok = metrics.requests.labels("figg", "publish", "ok")
        self.messages_received = 0

    @property
    def bytes_sent(self) -> int:
        return self._outbox.bytes_sent

    @property
    def published(self) -> int:
        """PUBLISHes acknowledged on this connection."""
        return self._acks.acked

    async def run(self) -> CloseConnection:
        """Serve the connection; returns why it ended. The caller closes the stream."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._write)
            try:
                with self._reading:
                    await self._read()
            except CloseConnection as close:
                self._close = self._close or close
                if close.kind in _DRAIN_ON:
                    # The client misbehaved but its earlier publishes still get their ACK.
                    await self._drain()
            if self._reading.cancelled_caught:
                self._close = self._close or CloseConnection("shutdown", "server shutting down")
                await self._drain()
            nursery.cancel_scope.cancel()
        self._acks.close()
        for sub in self._subs.values():
            sub.detached = True
        return self._close or CloseConnection("eof", "peer closed the connection")

    def shutdown(self) -> None:
        """The server is stopping: read nothing more from the client, stop delivery, send
        the ACKs of the publishes already read (once durable) and what is queued, then
        close. An idle connection closes at once."""
        self._reading.cancel()

    def _closing(self, close: CloseConnection) -> None:
        """Record the first reason to close and stop every task of the connection."""
        if self._close is None:
            self._close = close
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def _publish_failed(self, reason: str) -> None:
        # Read nothing more, but let what is queued before the failed publish go out (its
        # ACKs, a PONG): a client tells a refused publish from an outage by that PONG.
        if self._close is None:
            self._close = CloseConnection("publish_failed", reason)
        self._reading.cancel()

    # ------------------------------------------------------------------------- tasks

    async def _write(self) -> None:
        try:
            await self._outbox.run()
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._closing(CloseConnection("send_failed", f"send failed: {exc!r}"))

    async def _read(self) -> None:
        conn = FiggConnection(Role.SERVER, max_frame_size=self._settings.max_frame_bytes)
        stream = self._stream
        outbox = self._outbox
        acks = self._acks
        while True:
            # Backpressure: no more input while replies or publishes are piling up.
            await outbox.wait_writable()
            await acks.wait_below(PUBLISH_INFLIGHT_BYTES)
            conn.receive_data(await receive_or_close(stream))
            while True:  # once more after events: a bad frame after them raises then
                try:
                    events = conn.next_batch(int(time.time() * 1000))
                except ProtocolError as exc:
                    raise protocol_close(exc) from None
                if not events:
                    break
                if await self._handle(events):
                    await self._drain()
                    return

    async def _drain(self) -> None:
        """After a clean EOF: stop delivery, let pending ACKs and replies go out."""
        for sub in self._subs.values():
            sub.detach()
        with trio.move_on_after(DRAIN_SECS):
            await self._acks.wait_below(1)
            await self._outbox.wait_empty()

    # ---------------------------------------------------------------------- dispatch

    async def _handle(self, events: list[Any]) -> bool:
        """Handle a batch of events in order; True when the peer closed after them."""
        publishing = self._publishing
        published = 0
        counts: dict[str, int] = {}
        closed = False
        try:
            for event in events:
                kind = type(event)
                if kind is PublishBatch:
                    self.messages_received += event.count
                    publishing.add(self._partition_of(event.topic), event)
                    continue
                self.messages_received += 1
                if event is CLOSED:
                    closed = True
                    continue
                counts[kind.__name__] = counts.get(kind.__name__, 0) + 1
                if kind is Ping:
                    self._outbox.put_urgent(_encode_pong(event.timestamp))
                elif kind is Attach:
                    published += publishing.submit()  # what came before is appended first
                    await self._attach(event)
                elif kind is Detach:
                    self._detach(event.topic)
        finally:
            published += publishing.submit()
            if published:
                self._published_ok.inc(published)
            for name, n in counts.items():
                self._requests.labels("figg", name.lower(), "ok").inc(n)
        return closed

    def _partition_of(self, figg_topic: str) -> TankPartition:
        where = self._partitions.get(figg_topic)
        if where is None:
            try:
                where = figg_to_tank(figg_topic)
            except InvalidTopic as exc:
                raise CloseConnection("invalid_topic", str(exc)) from None
            if len(self._partitions) < 1024:
                self._partitions[figg_topic] = where
        return where

    async def _attach(self, event: Any) -> None:
        topic = event.topic
        sub = self._subs.get(topic)
        if sub is not None:
            # One subscription per topic and connection: say where it stands now.
            self._outbox.put_nowait(_encode_attached(topic.encode(), sub.position))
            return
        where = self._partition_of(topic)
        first_available, high_water_mark = await self._bounds(where)
        start = attach_start(event.flags, event.offset, first_available, high_water_mark)
        sub = Subscription(topic, where, start.first_seq, backend=self._backend,
                           outbox=self._outbox, frames=self._frames, feeds=self._feeds,
                           metrics=self._metrics, log=self._log)
        self._subs[topic] = sub
        self._outbox.put_nowait(_encode_attached(topic.encode(), start.attached_offset))
        assert self._nursery is not None
        self._nursery.start_soon(self._subscribe, sub)
        self._log.debug("figg_attached", topic=topic, flags=event.flags,
                        requested=event.offset, first_seq=start.first_seq)

    async def _subscribe(self, sub: Subscription) -> None:
        try:
            await sub.run()
        except SubscriptionError as exc:
            self._closing(CloseConnection("subscription_failed", str(exc)))
        except trio.Cancelled:
            raise
        except Exception as exc:  # a backend fault ends this connection, not the server
            self._closing(CloseConnection("backend_error", f"{sub.figg_topic}: {exc!r}"))

    async def _bounds(self, where: TankPartition) -> tuple[int, int]:
        """``(first_available, high_water_mark)`` of a partition, its topic created first
        if the backend's auto-creation allows. A partition that never held a message
        reports first available 1."""
        name = f"{where.topic}/{where.partition}"
        try:
            infos = await ensure_topic(self._backend, where.topic)
        except TopicRefused as exc:
            raise CloseConnection("unknown_topic", str(exc)) from None
        except Exception as exc:
            raise CloseConnection("backend_error", f"{name}: {exc!r}") from None
        if where.partition >= len(infos):
            raise CloseConnection("unknown_partition", f"unknown partition {name}")
        info = infos[where.partition]
        if info.first_available == UINT64_MAX:
            raise CloseConnection("unknown_partition", f"partition {name} can not be served")
        return info.first_available, info.high_water_mark

    def _detach(self, topic: str) -> None:
        sub = self._subs.pop(topic, None)
        if sub is not None:
            sub.detach()
        # Behind every frame of the subscription still queued: none is sent after this.
        self._outbox.put_nowait(_encode_detached(topic.encode()))
