"""One Figg subscription: a reader of the log at its own position.

A :class:`Subscription` fetches from the backend starting at its next sequence number,
long-polling at the end of the log, turns the chunk into DATA frames (or takes them from
the listener's :class:`~gateway.figg.frames.DataFrameCache`, when another subscriber at the
same position made them) and queues them on the connection's
:class:`~gateway.figg.outbox.Outbox`. It waits for the outbox to be under
its budget before reading, so a slow client makes its subscriptions lag in the log, never
makes the server buffer. History and live messages come from the same loop, so the switch
between them has no gap and no duplicate.
"""

from __future__ import annotations

from typing import Final

import structlog
import trio

from gateway.backend import Backend, Chunk, FetchRequest, FetchStatus
from gateway.figg.frames import DataFrameCache
from gateway.figg.outbox import Outbox
from gateway.metrics import Metrics
from gateway.offsets import TankPartition
from protocols.errors import ProtocolError
from protocols.translate import DataFrames, data_frames

#: Bytes asked for per fetch (the backend returns whole bundles, so possibly more).
FETCH_SIZE: Final = 256 * 1024
#: Long-poll time of a fetch at the end of the log; the loop simply asks again.
MAX_WAIT_MS: Final = 30_000
#: Pause before retrying a partition the backend could not read (bridge outage).
FAULT_RETRY_SECS: Final = 0.5


class SubscriptionError(Exception):
    """The subscription can not continue (its topic or partition is gone, corrupt data)."""


class Subscription:
    """Delivers ``figg_topic`` from sequence ``first_seq`` on, until detached or cancelled."""

    def __init__(self, figg_topic: str, where: TankPartition, first_seq: int, *,
                 backend: Backend, outbox: Outbox, frames: DataFrameCache, metrics: Metrics,
                 log: structlog.typing.FilteringBoundLogger) -> None:
        self.figg_topic = figg_topic
        self.where = where
        #: The sequence number of the next message to queue.
        self.next_seq = first_seq
        self.detached = False
        self._topic_bytes = figg_topic.encode()
        self._backend = backend
        self._outbox = outbox
        self._cache = frames
        self._lag = metrics.reader_lag
        self._messages_out = metrics.messages_out.labels(where.topic)
        self._bytes_out = metrics.bytes_out.labels(where.topic)
        self._log = log
        self._scope = trio.CancelScope()

    @property
    def position(self) -> int:
        """The offset of the last message queued (what ATTACHED reports for it now)."""
        return self.next_seq - 1

    def detach(self) -> None:
        """Stop at once: no frame of this subscription is queued or sent after this call."""
        self.detached = True
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
        where = self.where
        fetch_size = FETCH_SIZE
        outbox = self._outbox
        while True:
            await outbox.wait_writable()
            request = FetchRequest(where.topic, where.partition, self.next_seq, fetch_size)
            [outcome] = await self._backend.fetch([request], max_wait_ms=MAX_WAIT_MS,
                                                  min_bytes=1)
            status = outcome.status
            self._lag.update(self, "figg", where.topic, where.partition, self.next_seq,
                             outcome.high_water_mark)
            if status is FetchStatus.DATA:
                chunk = outcome.chunk
                try:
                    if not chunk.length:
                        continue
                    # The outbox may have filled while we waited for data.
                    await outbox.wait_writable()
                    frames = self._frames_of(chunk, outcome.base_seq)
                finally:
                    chunk.close()
                fetch_size = self._queue(frames, fetch_size)
                self._lag.update(self, "figg", where.topic, where.partition, self.next_seq,
                                 outcome.high_water_mark)
            elif status is FetchStatus.BOUNDARY:
                self._skip_to(outcome.first_available, outcome.high_water_mark)
            elif status is FetchStatus.FAULT:
                await trio.sleep(FAULT_RETRY_SECS)
            else:
                raise SubscriptionError(
                    f"{self.figg_topic}: {status.value} while reading sequence {self.next_seq}")

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

    def _queue(self, frames: DataFrames, fetch_size: int) -> int:
        """Queue the DATA frames of a chunk; returns the fetch size to use next."""
        if frames.count:
            self._outbox.put_nowait(frames.frames, self)
            self._messages_out.inc(frames.count)
            self._bytes_out.inc(len(frames.frames))
        if frames.next_seq > self.next_seq:
            self.next_seq = frames.next_seq
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
