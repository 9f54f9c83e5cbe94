r"""One Figg connection on the server: read big, parse every frame, dispatch in batches.

The reader task receives up to 256 KiB, turns every complete frame into events in one pass
with :meth:`FiggConnection.next_batch`, and handles them: PUBLISHes (already grouped into
:class:`~protocols.translate.PublishBatch`\ es) become one append per partition for the whole
read (:class:`~gateway.figg.publisher.Publishing`), PING is answered at once, ATTACH starts
a :class:`~gateway.figg.subscription.Subscription`, DETACH stops one. Everything sent goes
through the connection's one :class:`~gateway.figg.outbox.Outbox`. Bad input closes this
connection only, with the reason logged (Figg has no error message).

What one connection may hold is bounded: it stops being read while the frames queued for
it reach ``limits.subscriber_buffer_bytes`` or its publishes waiting for their ACK reach
``limits.unacked_bytes`` (each episode counts once as a hit of that limit and logs
``connection_held_back`` at debug level); an ATTACH beyond ``limits.max_requests_in_flight``
subscriptions closes it (``subscription_limit``). A frame not complete
``limits.frame_timeout_secs`` after it began closes it (``frame_timeout``), and so does
sending nothing for ``limits.idle_timeout_secs`` with no subscription and no publish
waiting for its ACK (``idle``; the Figg clients ping every 2 s).

Under a quota of its principal (:mod:`gateway.auth.quotas`) the connection's reads wait
for the bytes-in and requests tokens (each frame is a request) and its subscriptions wait
for the bytes-out tokens before reading the log; PONGs and ACKs are not held.
"""

from __future__ import annotations

import time

import structlog
import trio

from gateway.auth.guard import OPEN, AccessGuard
from gateway.auth.policy import Operation
from gateway.auth.principal import Principal
from gateway.auth.quotas import PrincipalQuota
from gateway.core.contract import Backend, TopicRefused, ensure_topic
from gateway.core.metrics import Metrics
from gateway.core.sections import ConnectionLimits
from gateway.figg.frames import DataFrameCache
from gateway.figg.offsets import InvalidTopic, TankPartition, attach_start, figg_to_tank
from gateway.figg.outbox import Outbox
from gateway.figg.publisher import AckQueue, Publishing
from gateway.figg.settings import FiggSettings
from gateway.figg.subscription import Subscription, SubscriptionError
from gateway.serving.session import PROTOCOL_ERRORS, CloseConnection, Session
from gateway.tail.reader import TailReaders
from protocols.connection import CLOSED, Role
from protocols.figg.connection import FiggConnection
from protocols.figg.messages import FAST, Attach, Detach, MessageType, Ping
from protocols.translate import PublishBatch
from protocols.wire import UINT64_MAX

_encode_attached = FAST[MessageType.ATTACHED].encode_frame
_encode_detached = FAST[MessageType.DETACHED].encode_frame
_encode_pong = FAST[MessageType.PONG].encode_frame


class FiggSession(Session):
    """Serves one accepted Figg connection until it closes; see :meth:`Session.run`."""

    #: Closes after which pending ACKs and replies are still sent (the socket works): the
    #: client misbehaved, but its earlier publishes still get their ACK.
    DRAIN_ON = frozenset({"protocol_error", "frame_too_large", "invalid_topic",
                          "unknown_topic", "unknown_partition", "frame_timeout",
                          "subscription_limit", "access_denied", "store_fault"})
    IDLE_REASON = "nothing received for {:g} s with no subscription and nothing in flight"

    __slots__ = ("_access", "_acks", "_backend", "_conn", "_frames", "_held_by",
                 "_log", "_max_subscriptions", "_max_unacked", "_metrics", "_partitions",
                 "_published_error", "_published_ok", "_publishing", "_readers",
                 "_requests", "_subs",
                 "messages_received", "principal")

    _outbox: Outbox

    def __init__(self, stream: trio.abc.Stream, *, backend: Backend, settings: FiggSettings,
                 limits: ConnectionLimits, metrics: Metrics, frames: DataFrameCache,
                 readers: TailReaders,
                 log: structlog.typing.FilteringBoundLogger,
                 principal: Principal | None = None,
                 guard: AccessGuard | None = None,
                 quota: PrincipalQuota | None = None) -> None:
        super().__init__(stream, Outbox(stream, settings.subscriber_buffer_bytes),
                         frame_timeout=limits.frame_timeout_secs,
                         idle_timeout=limits.idle_timeout_secs, quota=quota)
        #: Who the connection acts as (its listener, or its certificate's subject).
        self.principal = principal or Principal("figg")
        #: What the access policy lets it do; a reload looks at its subscriptions again.
        self._access = (guard or OPEN).connection(self.principal, log)
        if guard is not None:
            guard.watch(self)
        self._backend = backend
        self._metrics = metrics
        self._frames = frames
        self._readers = readers
        self._log = log
        self._conn = FiggConnection(Role.SERVER, max_frame_size=limits.max_frame_bytes)
        self._acks = AckQueue(self._outbox, self._publish_failed, self._published)
        self._publishing = Publishing(backend, self._acks)
        self._subs: dict[str, Subscription] = {}
        self._partitions: dict[str, TankPartition] = {}
        self._max_unacked = limits.unacked_bytes
        self._max_subscriptions = limits.max_requests_in_flight
        #: The limit holding the connection back now (its setting's name), or None.
        self._held_by: str | None = None
        self._requests = metrics.requests
        self._published_ok = metrics.requests.labels("figg", "publish", "ok")
        self._published_error = metrics.requests.labels("figg", "publish", "error")
        self.messages_received = 0

    @property
    def published(self) -> int:
        """PUBLISHes acknowledged on this connection."""
        return self._acks.acked

    def _ended(self) -> None:
        self._acks.close()
        for sub in self._subs.values():
            sub.detached = True

    def _published(self, acked: int, refused: int) -> None:
        """Count PUBLISHes by outcome (acknowledged, refused), never on submission."""
        if acked:
            self._published_ok.inc(acked)
        if refused:
            self._published_error.inc(refused)

    def _publish_failed(self, reason: str) -> None:
        # Read nothing more, but let what is queued before the failed publish go out (its
        # ACKs, a PONG): a client tells a refused publish from an outage by that PONG.
        if self._close is None:
            self._close = CloseConnection("publish_failed", reason)
        self._reading.cancel()

    # ------------------------------------------------------------------------- reading

    async def _wait_readable(self) -> None:
        # Backpressure: no more input while replies or publishes are piling up.
        outbox, acks = self._outbox, self._acks
        if outbox.full or acks.in_flight_bytes >= self._max_unacked:
            while True:
                if outbox.full:
                    self._held("subscriber_buffer_bytes")
                    await outbox.wait_writable()
                elif acks.in_flight_bytes >= self._max_unacked and not acks.closed:
                    self._held("unacked_bytes")
                    await acks.wait_below(self._max_unacked)
                else:
                    break
        elif self._held_by is not None:
            self._held_by = None  # the episode is over

    def _held(self, limit: str) -> None:
        """The connection is held back by ``limit``: count it once per episode."""
        if limit != self._held_by:
            self._held_by = limit
            self._metrics.limit_hit(limit)
            self._log.debug("connection_held_back", limit=limit,
                            queued_bytes=self._outbox.queued_bytes,
                            unacked_bytes=self._acks.in_flight_bytes)

    async def _received(self, data: bytes | bytearray) -> bool:
        conn = self._conn
        conn.receive_data(data)
        while True:  # once more after events: a bad frame after them raises then
            with PROTOCOL_ERRORS:
                events = conn.next_batch(int(time.time() * 1000))
            if not events:
                return False
            if await self._handle(events):
                return True

    def _buffered(self) -> int:
        return self._conn.buffered

    def _request_count(self) -> int:
        return self.messages_received

    def _busy(self) -> bool:
        return bool(self._subs) or self._acks.in_flight_bytes > 0

    async def _settle(self) -> None:
        """Stop delivery; wait for the ACKs of the publishes already read."""
        for sub in self._subs.values():
            sub.detach()
        await self._acks.wait_below(1)

    # ---------------------------------------------------------------------- dispatch

    async def _handle(self, events: list[object]) -> bool:
        """Handle a batch of events in order; True when the peer closed after them."""
        publishing = self._publishing
        counts: dict[str, int] = {}
        closed = False
        access = self._access
        try:
            for event in events:
                if type(event) is PublishBatch:
                    self.messages_received += event.count
                    where = self._partition_of(event.topic)
                    if not access.open and not self._may_publish(where.topic):
                        await self._check_publish(where.topic)
                    publishing.add(where, event)
                    continue
                self.messages_received += 1
                if event is CLOSED:
                    closed = True
                    continue
                kind = type(event)
                counts[kind.__name__] = counts.get(kind.__name__, 0) + 1
                if type(event) is Ping:
                    self._outbox.put_urgent(_encode_pong(event.timestamp))
                elif type(event) is Attach:
                    publishing.submit()  # what came before is appended first
                    await self._attach(event)
                elif type(event) is Detach:
                    self._detach(event.topic)
        finally:
            publishing.submit()  # counted by outcome (_published)
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

    async def _attach(self, event: Attach) -> None:
        topic = event.topic
        sub = self._subs.get(topic)
        if sub is not None:
            # One subscription per topic and connection: say where it stands now.
            self._outbox.put_nowait(_encode_attached(topic.encode(), sub.position))
            return
        if len(self._subs) >= self._max_subscriptions:
            self._metrics.limit_hit("max_requests_in_flight")
            raise CloseConnection("subscription_limit", f"ATTACH {topic!r} beyond "
                                  f"{self._max_subscriptions} subscriptions on one connection")
        where = self._partition_of(topic)
        if not self._access.may(where.topic, Operation.SUBSCRIBE):
            self._refuse(where.topic, Operation.SUBSCRIBE, "attach")
        first_available, high_water_mark = await self._bounds(where)
        start = attach_start(event.flags, event.offset, first_available, high_water_mark)
        sub = Subscription(topic, where, start.first_seq, backend=self._backend,
                           outbox=self._outbox, frames=self._frames,
                           readers=self._readers,
                           metrics=self._metrics, log=self._log, quota=self._quota)
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
        may_create = self._access.may(where.topic, Operation.CREATE)
        try:
            if may_create:
                infos = await ensure_topic(self._backend, where.topic)
            else:  # the policy refuses its creation: only look
                found = await self._backend.discover_partitions(where.topic)
                if found is None:
                    raise TopicRefused(f"unknown topic {where.topic!r}")
                infos = found
        except TopicRefused as exc:
            if exc.fault:  # the store could not create it: the disk, not the client
                raise CloseConnection("store_fault", str(exc)) from None
            if not may_create and self._backend.auto_create.allows(where.topic):
                self._refuse(where.topic, Operation.CREATE, "attach")
            raise CloseConnection("unknown_topic", str(exc)) from None
        except Exception as exc:
            raise CloseConnection("backend_error", f"{name}: {exc!r}") from None
        if where.partition >= len(infos):
            raise CloseConnection("unknown_partition", f"unknown partition {name}")
        info = infos[where.partition]
        if info.first_available == UINT64_MAX:
            raise CloseConnection("unknown_partition", f"partition {name} can not be served")
        return info.first_available, info.high_water_mark

    # ------------------------------------------------------------------ access policy

    def _may_publish(self, topic: str) -> bool:
        access = self._access
        return (access.may(topic, Operation.PUBLISH)
                and not access.must_look_up(topic, self._backend.auto_create.enabled))

    async def _check_publish(self, topic: str) -> None:
        """Close the connection unless it may publish to ``topic`` (and, when the topic
        is missing, create it)."""
        access = self._access
        if not access.may(topic, Operation.PUBLISH):
            self._refuse(topic, Operation.PUBLISH, "publish")
        try:
            if await self._backend.discover_partitions(topic) is not None:
                access.seen(topic)
                return
        except Exception as exc:
            raise CloseConnection("backend_error", f"{topic}: {exc!r}") from None
        self._refuse(topic, Operation.CREATE, "publish")

    def _refuse(self, topic: str, operation: Operation, request: str) -> None:
        """Count and log a refusal, and close the connection (Figg has no error)."""
        self._access.refused(topic, operation, request, "connection closed")
        raise CloseConnection("access_denied", f"{self.principal.name} may not "
                              f"{operation.value} {topic!r}")

    def access_changed(self) -> None:
        """The policy was reloaded: a subscription it no longer allows closes the
        connection (the client sees its subscriptions end as after any close)."""
        for sub in list(self._subs.values()):
            topic = sub.where.topic
            if not sub.detached and not self._access.may(topic, Operation.SUBSCRIBE):
                try:
                    self._refuse(topic, Operation.SUBSCRIBE, "subscription")
                except CloseConnection as close:
                    self._closing(close)
                return

    def _detach(self, topic: str) -> None:
        sub = self._subs.pop(topic, None)
        if sub is not None:
            sub.detach()
        # Behind every frame of the subscription still queued: none is sent after this.
        self._outbox.put_nowait(_encode_detached(topic.encode()))
