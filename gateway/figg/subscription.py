"""One Figg subscription: a reader of the log at its own position.

A :class:`Subscription` fetches from the backend starting at its next sequence number,
turns the chunk into DATA frames (or takes them from the listener's
:class:`~gateway.figg.frames.DataFrameCache`, when another subscriber at the same position
made them) and queues them on the connection's :class:`~gateway.figg.outbox.Outbox`. At
the tail of the log it follows the topic name's :class:`~gateway.figg.feed.TailFeed`, fed
by the partition's one :class:`~gateway.tail.reader.TailReader` (one long poll for every
subscriber that keeps up, whatever its protocol; one conversion per topic name; the
followers whose sockets are free get each delivery in one compiled pass over their
sockets). It waits for the outbox to be under its budget before reading, so a slow client
makes its subscriptions lag in the log, never makes the server buffer. History and live
messages come from the same loop, so the switch between them has no gap and no duplicate.

Under a bytes-out quota of the connection's principal, the DATA bytes queued are taken
from its bucket (a whole chunk at a time) and the subscription waits before reading the
log while the bucket is in debt; at the tail it leaves the feed while in debt, as when
its connection is behind.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import structlog
import trio

from gateway.auth.quotas import PrincipalQuota
from gateway.core.contract import Backend, Chunk, FetchOutcome, FetchRequest, FetchStatus
from gateway.core.metrics import Metrics
from gateway.figg.feed import TailFeed, feed_key
from gateway.figg.frames import DataFrameCache
from gateway.figg.offsets import TankPartition
from gateway.figg.outbox import Outbox
from gateway.tail.reader import TailReaders
from protocols.errors import ProtocolError
from protocols.translate import DataFrames, data_frames

#: Bytes asked for per fetch (the backend returns whole bundles, so possibly more).
FETCH_SIZE: Final = 256 * 1024
#: Long-poll time of a fetch at the end of the log; the loop simply asks again.
MAX_WAIT_MS: Final = 30_000
#: Long-poll time of a fetch at the end of the log while the partition's tail reader
#: reads behind (it catches up, and the subscription follows it then).
REJOIN_WAIT_MS: Final = 500
#: Pause before retrying a partition the backend could not read (bridge outage).
FAULT_RETRY_SECS: Final = 0.5


class SubscriptionError(Exception):
    """The subscription can not continue (its topic or partition is gone, corrupt data)."""


class Subscription:
    """Delivers ``figg_topic`` from sequence ``first_seq`` on, until detached or cancelled."""

    def __init__(self, figg_topic: str, where: TankPartition, first_seq: int, *,
                 backend: Backend, outbox: Outbox, frames: DataFrameCache, readers: TailReaders,
                 metrics: Metrics, log: structlog.typing.FilteringBoundLogger,
                 quota: PrincipalQuota | None = None) -> None:
        self.figg_topic = figg_topic
        self.where = where
        #: The sequence number of the next message to queue.
        self.next_seq = first_seq
        self.detached = False
        self._topic_bytes = figg_topic.encode()
        self._backend = backend
        self._outbox = outbox
        self._cache = frames
        self._readers = readers
        self._feed_key = feed_key(self._topic_bytes)
        self._make_feed = TailFeed.of(self._topic_bytes)
        self._lag = metrics.reader_lag
        self._sent = metrics.sent(where.topic)
        self._log = log
        self._quota = quota
        #: The principal's quota (a feed's fan-out group looks at its bytes-out limit).
        self.quota = quota
        self._scope = trio.CancelScope()
        #: The feed it follows now, if any.
        self._feed: TailFeed | None = None

    @property
    def position(self) -> int:
        """The offset of the last message queued (what ATTACHED reports for it now)."""
        feed = self._feed
        if feed is not None and feed.in_group(self):
            return feed.next_seq - 1  # fed by the group: as far as the feed
        return self.next_seq - 1

    def detach(self) -> None:
        """Stop at once: no frame of this subscription is queued or sent after this call."""
        self.detached = True
        if self._feed is not None:
            self._feed.unfollow(self)  # out of its fan-out group now, not when cancelled
        self._scope.cancel()
        self._outbox.drop(self)

    async def run(self) -> None:
        """Deliver until detached, cancelled, or the subscription fails.

        Raises :class:`SubscriptionError` when it can not go on.
        """
        try:
            with self._scope:
                await self._deliver()
        finally:
            self._lag.remove(self)

    async def _deliver(self) -> None:
        fetch_size = FETCH_SIZE
        outbox = self._outbox
        quota = self._quota
        while True:
            await outbox.wait_writable()
            if quota is not None and quota.out_limited:
                await quota.wait_out()
            request = FetchRequest(self.where.topic, self.where.partition, self.next_seq,
                                   fetch_size)
            outcomes = self._backend.fetch_nowait([request])
            if outcomes is not None:
                [outcome] = outcomes
            else:  # at the tail: follow the partition's reader, or wait on our own
                wait_ms = await self._follow()
                if wait_ms is None:
                    continue
                [outcome] = await self._backend.fetch([request], max_wait_ms=wait_ms,
                                                      min_bytes=1)
            fetch_size = await self._handle(outcome, fetch_size)

    async def _handle(self, outcome: FetchOutcome, fetch_size: int) -> int:
        """Deliver what one fetch found; returns the fetch size to use next."""
        where = self.where
        status = outcome.status
        self._lag.update(self, "figg", where.topic, where.partition, self.next_seq,
                         outcome.high_water_mark)
        if status is FetchStatus.DATA:
            chunk = outcome.chunk
            try:
                if not chunk.length:
                    return fetch_size
                # The outbox may have filled while we waited for data.
                await self._outbox.wait_writable()
                frames = self._frames_of(chunk, outcome.base_seq)
            finally:
                chunk.close()
            fetch_size = self._next_fetch_size(frames, fetch_size)
            self._put(frames.frames, frames.count, frames.next_seq, outcome.high_water_mark)
        elif status is FetchStatus.BOUNDARY:
            self._skip_to(outcome.first_available, outcome.high_water_mark)
        elif status is FetchStatus.FAULT:
            await trio.sleep(FAULT_RETRY_SECS)
        else:
            raise SubscriptionError(
                f"{self.figg_topic}: {status.value} while reading sequence {self.next_seq}")
        return fetch_size

    async def _follow(self) -> int | None:
        """Follow the topic name's feed of the partition's tail reader (started here when
        the partition has none) until released: None then. When the reader is elsewhere
        or can not read now, at once the longest our own read at the tail should wait:
        short while the reader reads behind us (it catches up: follow it then)."""
        where = self.where
        readers = self._readers
        reader = readers.acquire(where.topic, where.partition, self.next_seq)
        try:
            feed = reader.sink(self._feed_key, self._make_feed)
            if not feed.open_at(self.next_seq):
                behind = reader.readable and feed.next_seq < self.next_seq
                return REJOIN_WAIT_MS if behind else MAX_WAIT_MS
            self._feed = feed
            try:
                await feed.follow(self)
            finally:
                self._feed = None
            if reader.failed is not None:
                # Released by a reader that can not read on (refused, say): our own read
                # says why, now (following the next reader would meet it again, unseen).
                return 0
            return None
        finally:
            readers.release(reader)

    def take(self, frames: bytes, count: int, next_seq: int, high_water_mark: int) -> bool:
        """A feed's frames for this follower; False (nothing queued) when the connection
        is too far behind to take them."""
        if self._outbox.full or self._owes():
            return False
        self._put(frames, count, next_seq, high_water_mark)
        return True

    def direct_fd(self) -> int:
        """The socket a feed may write this subscription's frames to directly now (its
        outbox is free and no bytes-out limit is to be charged), or -1."""
        quota = self._quota
        if self.detached or (quota is not None and quota.out_limited):
            return -1
        outbox = self._outbox
        return outbox.fd if outbox.free else -1

    def on_queue(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once when bytes are next queued in the outbox (or it closes)."""
        self._outbox.on_queue(callback)

    def forget_on_queue(self, callback: Callable[[], None]) -> None:
        self._outbox.forget_on_queue(callback)

    def queue_rest(self, rest: bytes, begun: bool) -> None:
        """Queue what a fan-out pass did not write; the rest of a frame ``begun`` on the
        socket is sent even if the subscription detaches (the stream stays whole)."""
        self._outbox.put_nowait(rest, None if begun else self)

    def settle(self, next_seq: int, high_water_mark: int) -> None:
        """Left a feed's fan-out group, having been sent everything before ``next_seq``."""
        self.next_seq = next_seq
        self.report_lag(next_seq, high_water_mark)

    def report_lag(self, next_seq: int, high_water_mark: int) -> None:
        """Record the reader lag as of a delivery up to ``next_seq - 1`` (nothing once
        detached: its entry is gone or going)."""
        if not self.detached:
            where = self.where
            self._lag.update(self, "figg", where.topic, where.partition, next_seq,
                             high_water_mark)

    def count_out(self, messages: int, size: int) -> None:
        """Count DATA sent through a feed's fan-out group (of this topic)."""
        self._sent.add(messages, size)

    def _owes(self) -> bool:
        """Whether the principal's bytes-out quota is in debt (data must wait)."""
        quota = self._quota
        return quota is not None and quota.out_limited and quota.out_in_debt()

    def _put(self, frames: bytes, count: int, next_seq: int, high_water_mark: int) -> None:
        if count:
            self._outbox.put_nowait(frames, self)
            self._sent.add(count, len(frames))
            quota = self._quota
            if quota is not None and quota.out_limited:
                quota.took_out(len(frames))
        self.next_seq = next_seq
        where = self.where
        self._lag.update(self, "figg", where.topic, where.partition, next_seq, high_water_mark)

    def _frames_of(self, chunk: Chunk, base_seq: int | None) -> DataFrames:
        """The DATA frames of ``chunk`` from ``next_seq`` on: made here, or shared by a
        subscriber that was at the same position."""
        where = self.where
        key = (self._topic_bytes, where.topic, where.partition, self.next_seq, base_seq,
               chunk.length)
        frames = self._cache.get(key)
        if frames is None:
            try:
                frames = data_frames(self._topic_bytes, chunk.read_bytes(), base_seq,
                                     self.next_seq)
            except ProtocolError as exc:
                raise SubscriptionError(
                    f"{self.figg_topic}: undecodable chunk at sequence {self.next_seq}: {exc}"
                ) from None
            self._cache.put(key, frames)
        return frames

    def _next_fetch_size(self, frames: DataFrames, fetch_size: int) -> int:
        """The fetch size after ``frames``; raises when the chunk made no progress."""
        if frames.next_seq > self.next_seq:
            return FETCH_SIZE
        if frames.partial_bundle_len and frames.partial_bundle_len > fetch_size:
            # A backend that cuts chunks (TANK 1 style): ask for the whole bundle.
            return frames.partial_bundle_len
        # Data that does not move the position: asking again would spin.
        raise SubscriptionError(
            f"{self.figg_topic}: the backend returned no message at or after sequence "
            f"{self.next_seq}")

    def _skip_to(self, first_available: int, high_water_mark: int) -> None:
        """Re-enter the log after retention (or a truncation) moved its bounds."""
        wanted = self.next_seq
        if wanted < first_available:
            self.next_seq = first_available
        elif wanted > high_water_mark + 1:
            self.next_seq = high_water_mark + 1
        else:  # not a boundary after all; avoid a busy loop on a confused backend
            raise SubscriptionError(f"{self.figg_topic}: boundary error inside the log")
        self._log.warning("figg_subscription_skipped", topic=self.figg_topic,
                          requested=wanted, resumed=self.next_seq,
                          first_available=first_available, high_water_mark=high_water_mark)
