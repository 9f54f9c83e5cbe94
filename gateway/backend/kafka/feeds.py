"""Tail feeds: one upstream read of a partition serves every reader there.

Each partition being read has a :class:`PartitionFeed`: a task that fetches the partition
from its leader, one long-polling Fetch after the other
(:func:`~gateway.backend.kafka.fetcher.fetch_partition`, whose record batches become
bundles in one compiled call, once for all readers). The feed keeps its newest bundles
(``cache_bytes``); every reader whose position falls in them is answered from memory,
and readers at the tail wait together on the feed's arrival event. A reader older than
the cache, or ahead of the feed's position, is not served here
(:mod:`gateway.backend.kafka.history` reads for it). A feed does not read more than
``cache_bytes`` ahead of its furthest reader, and drops what a reader was served first:
it waits for the readers instead of dropping what they have not read.

Batches the gateway itself produced to a partition with a feed are written through
(:meth:`TailFeeds.stored`): the Produce answer names where the upstream stored the batch,
and when that is right after the feed's position, the batch's records (the same bytes the
upstream stored, its base offset set) become the feed's next bundles at once, by the
same compiled conversion as a fetched answer. While its own answers keep a feed at the
tail that way, the feed sends no Fetch (the data is already there), and it reads again
within ``quiet_secs`` of the last one, or once one shows a gap (another producer wrote in
between: the fetch reads it). A publisher and its subscribers on one gateway then cost one
upstream round trip a batch, not two. Not written through: a batch whose timestamps the
upstream set (LogAppendTime), one that does not follow the feed's position, and any
while the feed's readers are a cache behind.

A feed nobody read for ``idle_secs`` is dropped. The number of feeds is bounded by the
partitions that exist; their memory by twice ``cache_bytes`` each (or one batch, when
the upstream holds a batch larger than that).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeAlias

import structlog
import trio

from gateway.backend.kafka.cluster import STALE_METADATA, Cluster
from gateway.backend.kafka.fetcher import fetch_partition
from gateway.backend.kafka.wire import BrokerLost
from gateway.core.contract import TailChange
from gateway.core.metrics import Metrics
from gateway.io.newest import NewestBundles
from protocols.errors import ProtocolError
from protocols.kafka.types import ErrorCode
from protocols.kafka.upstream_codec import UpstreamBundle, record_batches_to_bundles

log = structlog.get_logger("figtank.upstream_kafka")

TopicPartition: TypeAlias = tuple[str, int]
#: A record batch's base offset: its first 8 bytes (outside its CRC).
_BASE_OFFSET = struct.Struct(">q")
#: How long a feed written through by the gateway's own produce answers stays off the
#: upstream after the last one (seconds): past it, another producer's records are
#: fetched as before.
QUIET_SECS = 0.01
#: Errors after which a feed reads on (after a pause): the leader moved, or was away.
_PASSING = frozenset(ErrorCode(c).name for c in STALE_METADATA
                     if c != ErrorCode.UNKNOWN_TOPIC_OR_PARTITION) | {
    "REQUEST_TIMED_OUT", "NETWORK_EXCEPTION", "KAFKA_STORAGE_ERROR", "REPLICA_NOT_AVAILABLE"}


@dataclass(slots=True)
class PartitionFeed:
    """The newest bundles read from one partition, and where the read is."""

    topic: str
    partition: int
    #: Which opening of the partition this is.
    generation: int
    #: The sequence the upstream read is at: the first one not yet cached.
    next_seq: int
    #: The newest bundles, under the feed's own budget (:meth:`NewestBundles.trim`).
    bundles: NewestBundles[UpstreamBundle] = field(default_factory=NewestBundles)
    #: Kafka's high watermark (next offset) = Tank's high-water mark (last sequence).
    high_water_mark: int = 0
    #: Set (and replaced) when bundles or an error arrive.
    arrived: trio.Event = field(default_factory=trio.Event)
    #: Set (and replaced) when a reader was served: a feed waiting for its readers reads on.
    consumed: trio.Event = field(default_factory=trio.Event)
    #: The last sequence served to a reader.
    read_to: int = 0
    #: The error that stopped the read (Kafka's name, text), None while it goes on.
    error: tuple[str, str] | None = None
    last_used: float = 0.0
    readers: int = 0
    #: When the gateway's own produce answer last wrote the feed through (trio time).
    fed_at: float = -math.inf
    #: Set (and replaced) when a quiet feed must read again (a gap, or dropped).
    resume: trio.Event = field(default_factory=trio.Event)
    #: While the feed is quiet: the scope its task waits in, until the deadline the
    #: gateway's write-throughs keep moving on.
    quiet: trio.CancelScope | None = None
    #: The last sequence of the last bundle appended (the next read continues it).
    last_appended: int | None = None
    #: Called at each arrival (True) and when the read fails or ends (False):
    #: :meth:`TailFeeds.watch`.
    watchers: list[TailChange] = field(default_factory=list)

    @property
    def first_cached(self) -> int:
        """The first sequence the cache holds (``next_seq`` when it is empty)."""
        first = self.bundles.first_seq
        return self.next_seq if first is None else first

    @property
    def cached_bytes(self) -> int:
        """Bytes of bundles cached."""
        return self.bundles.size

    def unread_bytes(self) -> int:
        """Cached bytes after the last sequence a reader was served."""
        return self.bundles.bytes_after(self.read_to)


class TailFeeds:
    """The feeds and their reading tasks; see the module doc."""

    def __init__(self, cluster: Cluster, *, cache_bytes: int = 1024 * 1024,
                 idle_secs: float = 30.0, max_wait_ms: int = 250, timeout: float = 5.0,
                 quiet_secs: float = QUIET_SECS, metrics: Metrics | None = None,
                 on_trouble: Callable[[], None] | None = None) -> None:
        self._cluster = cluster
        self.cache_bytes = cache_bytes
        self.idle_secs = idle_secs
        self.quiet_secs = quiet_secs
        self.max_wait_ms = max_wait_ms
        self.timeout = timeout
        self._metrics = metrics
        # Counted at every produce answer and arrival: without the counters' lock.
        self._written_through = (None if metrics is None else
                                 metrics.loop_count(metrics.upstream_feed_written_through))
        self._pushes = (None if metrics is None else
                        metrics.loop_count(metrics.upstream_feed_pushes))
        self._on_trouble = on_trouble or (lambda: None)
        self.feeds: dict[TopicPartition, PartitionFeed] = {}
        self._generation = 0
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Run the feeds' tasks and drop idle feeds until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            while True:
                await trio.sleep(max(self.idle_secs / 4, 0.05))
                now = trio.current_time()
                for key, feed in list(self.feeds.items()):
                    if not feed.readers and now - feed.last_used > self.idle_secs:
                        self._drop(key)

    def open(self, topic: str, partition: int, seq: int) -> PartitionFeed:
        """The feed of ``topic``/``partition``, opened at ``seq`` if there is none."""
        key = (topic, partition)
        feed = self.feeds.get(key)
        if feed is not None:
            return feed
        self._generation += 1
        feed = PartitionFeed(topic, partition, self._generation, seq, read_to=seq - 1,
                             last_used=trio.current_time())
        self.feeds[key] = feed
        assert self._nursery is not None, "TailFeeds.run is not running"
        self._nursery.start_soon(self._follow, feed)
        return feed

    def reopen(self, feed: PartitionFeed, seq: int) -> PartitionFeed:
        """Drop ``feed`` (its read failed) and open a new one at ``seq``."""
        key = (feed.topic, feed.partition)
        if self.feeds.get(key) is feed:
            self._drop(key)
        return self.open(feed.topic, feed.partition, seq)

    def watch(self, feed: PartitionFeed, on_change: TailChange) -> Callable[[], None]:
        """Call ``on_change`` at each of ``feed``'s arrivals, from the task that brought
        it, until the returned function is called; a watcher counts as a reader (the
        feed is not dropped as idle meanwhile)."""
        feed.watchers.append(on_change)
        feed.readers += 1

        def unwatch() -> None:
            if on_change in feed.watchers:
                feed.watchers.remove(on_change)
                feed.readers -= 1

        return unwatch

    def served_from(self, feed: PartitionFeed, last_seq: int) -> None:
        """A reader was served ``feed``'s bundles up to ``last_seq``."""
        feed.last_used = trio.current_time()
        if last_seq > feed.read_to:
            feed.read_to = last_seq
            feed.consumed.set()
            feed.consumed = trio.Event()

    def stored(self, topic: str, partition: int, base_offset: int,
               batch: bytes | bytearray) -> None:
        """The gateway's own record ``batch`` was stored at ``base_offset`` of
        ``topic``/``partition`` (its Produce answer): written through to the partition's
        feed when it follows the feed's position (see the module doc)."""
        feed = self.feeds.get((topic, partition))
        if feed is None or feed.error is not None:
            return
        first_seq = base_offset + 1
        if first_seq > feed.next_seq:  # another producer wrote before it: fetch that
            self._resume(feed)
            return
        if first_seq < feed.next_seq or feed.unread_bytes() >= self.cache_bytes:
            return  # fetched already; or the readers are behind: the fetches go on
        data = bytearray(batch)
        _BASE_OFFSET.pack_into(data, 0, base_offset)
        try:
            got = record_batches_to_bundles(data, from_offset=base_offset,
                                            after_seq=feed.last_appended)
        except ProtocolError:  # not expected (the gateway built it): let a fetch read it
            self._resume(feed)
            return
        if got.error is not None or not got.bundles:
            self._resume(feed)
            return
        self._append(feed, got.bundles, got.next_offset)
        feed.fed_at = now = trio.current_time()
        quiet = feed.quiet
        if quiet is not None and quiet.deadline - now < self.quiet_secs / 2:
            # (Moved only once half of it has passed: a deadline move costs a few µs.)
            quiet.deadline = now + self.quiet_secs
        if self._written_through is not None:
            self._written_through.value += sum(b.count for b in got.bundles)
        self._arrived(feed)

    def _resume(self, feed: PartitionFeed) -> None:
        """A quiet feed reads from the upstream again now."""
        feed.fed_at = -math.inf
        feed.resume.set()
        feed.resume = trio.Event()

    def _append(self, feed: PartitionFeed, bundles: list[UpstreamBundle],
                next_offset: int) -> bool:
        """Cache ``bundles`` after the feed's position (those before it are skipped);
        False when one straddles the position (the upstream's batches are not the ones
        cached: the next fetch reads on from the position, records before it skipped)."""
        whole = True
        for bundle in bundles:
            if bundle.last_seq < feed.next_seq:
                continue
            if bundle.first_seq < feed.next_seq:
                whole = False
                break
            feed.bundles.append(bundle, bundle.framed)
            feed.next_seq = bundle.last_seq + 1
            feed.last_appended = bundle.last_seq
        if whole and next_offset + 1 > feed.next_seq:  # control batches, compaction gaps
            feed.next_seq = next_offset + 1
        if feed.next_seq - 1 > feed.high_water_mark:
            feed.high_water_mark = feed.next_seq - 1
        feed.bundles.trim(self.cache_bytes, feed.read_to)
        return whole

    def _arrived(self, feed: PartitionFeed) -> None:
        feed.arrived.set()
        feed.arrived = trio.Event()
        if feed.watchers:
            ok = feed.error is None
            if ok and self._pushes is not None:
                self._pushes.value += len(feed.watchers)
            for watcher in list(feed.watchers):
                watcher(ok)

    def _drop(self, key: TopicPartition) -> None:
        feed = self.feeds.pop(key, None)
        if feed is not None:
            feed.error = feed.error or ("_DROPPED", "the feed was closed")
            feed.arrived.set()
            feed.consumed.set()
            feed.resume.set()
            for watcher in list(feed.watchers):
                watcher(False)

    async def _follow(self, feed: PartitionFeed) -> None:
        """Read ``feed``'s partition until it is dropped or its read fails."""
        key = (feed.topic, feed.partition)
        lane = f"feed {feed.topic}/{feed.partition} {feed.generation}"
        try:
            await self._read(feed, key, lane)
        finally:
            self._cluster.release(lane)

    async def _read(self, feed: PartitionFeed, key: TopicPartition, lane: str) -> None:
        pause = 0.0
        fetch_bytes = max(self.cache_bytes // 2, 64 * 1024)
        while self.feeds.get(key) is feed:
            if pause:
                await trio.sleep(pause)
                if self.feeds.get(key) is not feed:
                    return
            quiet_until = feed.fed_at + self.quiet_secs
            if quiet_until > trio.current_time():
                # Written through by the gateway's own produce answers: nothing to fetch.
                # The answers move the deadline on (stored()): one wake-up when they stop,
                # not one per quiet period while they go on.
                resume = feed.resume
                with trio.CancelScope(deadline=quiet_until) as feed.quiet:
                    await resume.wait()
                feed.quiet = None
                continue
            if feed.unread_bytes() >= self.cache_bytes:
                consumed = feed.consumed
                with trio.move_on_after(self.idle_secs):
                    await consumed.wait()
                continue
            try:
                # Never more than the readers left room for (the upstream still answers
                # with one whole batch, however large: KIP-74).
                room = max(self.cache_bytes - feed.unread_bytes(), 1)
                got = await fetch_partition(self._cluster, feed.topic, feed.partition,
                                            feed.next_seq - 1, max_wait_ms=self.max_wait_ms,
                                            max_bytes=min(fetch_bytes, room),
                                            after_seq=feed.last_appended,
                                            timeout=self.timeout, lane=lane)
            except BrokerLost as exc:
                log.debug("upstream_tail_fetch_failed", topic=feed.topic,
                          partition=feed.partition, error=str(exc))
                self._on_trouble()
                self._cluster.forget(feed.topic, feed.partition)
                pause = min(max(pause * 2, 0.05), 1.0)
                continue
            if self.feeds.get(key) is not feed:
                return
            if got.error is not None and got.error[0] in _PASSING:
                pause = min(max(pause * 2, 0.05), 1.0)
                continue
            pause = 0.0
            if got.high_watermark > feed.high_water_mark:
                feed.high_water_mark = got.high_watermark
            if not self._append(feed, got.bundles, got.next_offset):
                feed.last_appended = None  # read on from the position, any boundary
            if got.error is not None:
                feed.error = got.error
                if self._metrics is not None:
                    self._metrics.upstream_errors.labels("fetch", got.error[0]).inc()
            self._arrived(feed)
            if got.error is not None:
                return
