"""Tail feeds: one upstream read of a partition serves every reader there.

Each partition being read has a :class:`PartitionFeed`: the partition assigned (with the
offset to start at) to the one shared tail consumer, whose records a dedicated thread
polls (``consume`` blocks, so it never runs in the event loop), turns into bundles
(:func:`protocols.kafka.upstream.records_to_bundles`, once for all readers) and hands to
the trio thread in one ``run_sync_soon`` per poll. The feed keeps its newest bundles
(``cache_bytes``); every reader whose position falls in them is answered from memory,
and readers at the tail wait together on the feed's arrival event. A reader older than
the cache, or ahead of the feed's position, is not served here
(:mod:`gateway.backend.kafka.history` reads for it).

A feed nobody read for ``idle_secs`` is dropped and its partition unassigned. The
number of feeds is bounded by the partitions that exist; their memory by
``cache_bytes`` each plus librdkafka's prefetch (``queued.max.messages.kbytes``).
"""

from __future__ import annotations

import bisect
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import structlog
import trio

from gateway.server.metrics import Metrics
from protocols.kafka.batch import InvalidRecord
from protocols.kafka.upstream import ClientRecord, UpstreamBundle, records_to_bundles

log = structlog.get_logger("figtank.upstream_kafka")

TopicPartition: TypeAlias = tuple[str, int]
#: What the poll thread hands over for one partition: its bundles (or an error name and
#: text) and the high watermark librdkafka last saw.
Arrival: TypeAlias = tuple[TopicPartition, int, list[UpstreamBundle], tuple[str, str] | None,
                           int]


@dataclass(slots=True)
class PartitionFeed:
    """The newest bundles read from one partition, and where the read is."""

    topic: str
    partition: int
    #: Which assignment of the partition this is (arrivals of an older one are dropped).
    generation: int
    #: The sequence the upstream read is at: the first one not yet cached.
    next_seq: int
    bundles: deque[UpstreamBundle] = field(default_factory=deque)
    cached_bytes: int = 0
    #: Kafka's high watermark (next offset) = Tank's high-water mark (last sequence).
    high_water_mark: int = 0
    #: Set (and replaced) when bundles or an error arrive.
    arrived: trio.Event = field(default_factory=trio.Event)
    #: The error that stopped the read (librdkafka's name, text), None while it goes on.
    error: tuple[str, str] | None = None
    last_used: float = 0.0
    readers: int = 0

    @property
    def first_cached(self) -> int:
        """The first sequence the cache holds (``next_seq`` when it is empty)."""
        return self.bundles[0].first_seq if self.bundles else self.next_seq

    def bundles_from(self, seq: int, max_bytes: int) -> tuple[list[UpstreamBundle], int]:
        """The cached bundles from the one holding ``seq`` (or the first after it), about
        ``max_bytes`` of them (one at least), and the index of the first."""
        lasts = [b.last_seq for b in self.bundles]
        at = bisect.bisect_left(lasts, seq)
        out: list[UpstreamBundle] = []
        size = 0
        for bundle in list(self.bundles)[at:]:
            if out and size + len(bundle.framed) > max_bytes:
                break
            out.append(bundle)
            size += len(bundle.framed)
        return out, at


class TailFeeds:
    """The feeds and the tail consumer behind them; see the module doc.

    ``consumer`` is a ``confluent_kafka.Consumer`` used only through this class;
    ``make_partition(topic, partition, offset)`` builds a ``TopicPartition``.
    """

    def __init__(self, consumer: Any, make_partition: Callable[..., Any],
                 token: trio.lowlevel.TrioToken, *, cache_bytes: int = 1024 * 1024,
                 idle_secs: float = 30.0, metrics: Metrics | None = None) -> None:
        self._consumer = consumer
        self._partition = make_partition
        self._token = token
        self.cache_bytes = cache_bytes
        self.idle_secs = idle_secs
        self._metrics = metrics
        self.feeds: dict[TopicPartition, PartitionFeed] = {}
        self._generation = 0
        # Shared with the poll thread, under the lock: each assigned partition's
        # generation and the last sequence bundled for it.
        self._lock = threading.Lock()
        self._assigned: dict[TopicPartition, list[int | None]] = {}
        self._arrivals: list[Arrival] = []
        # librdkafka's (incremental) assign blocks while another thread consumes: the
        # poll thread applies the assignment changes itself, between its polls.
        self._commands: list[tuple[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="figtank-upstream-tail",
                                        daemon=True)
        self._thread.start()
        #: Upstream reads started (feeds opened) and reads served from a feed.
        self.opened = 0
        self.served = 0

    # ------------------------------------------------------------------ trio thread

    def open(self, topic: str, partition: int, seq: int) -> PartitionFeed:
        """The feed of ``topic``/``partition``, opened at ``seq`` if there is none."""
        key = (topic, partition)
        feed = self.feeds.get(key)
        if feed is not None:
            return feed
        self._generation += 1
        feed = PartitionFeed(topic, partition, self._generation, seq,
                             last_used=trio.current_time())
        self.feeds[key] = feed
        self.opened += 1
        with self._lock:
            self._assigned[key] = [feed.generation, None]
            self._commands.append(("assign", self._partition(topic, partition, seq - 1)))
        return feed

    def reopen(self, feed: PartitionFeed, seq: int) -> PartitionFeed:
        """Drop ``feed`` (its read failed) and open a new one at ``seq``."""
        key = (feed.topic, feed.partition)
        if self.feeds.get(key) is feed:
            self._unassign(key)
        return self.open(feed.topic, feed.partition, seq)

    def _unassign(self, key: TopicPartition) -> None:
        self._drop(key)
        with self._lock:
            self._commands.append(("unassign", self._partition(*key)))

    def _drop(self, key: TopicPartition) -> None:
        feed = self.feeds.pop(key, None)
        with self._lock:
            self._assigned.pop(key, None)
        if feed is not None:
            feed.error = feed.error or ("_DROPPED", "the feed was closed")
            feed.arrived.set()

    async def expire(self) -> None:
        """Drop the feeds nobody read for ``idle_secs``, until cancelled."""
        while True:
            await trio.sleep(max(self.idle_secs / 4, 0.05))
            now = trio.current_time()
            for key, feed in list(self.feeds.items()):
                if not feed.readers and now - feed.last_used > self.idle_secs:
                    self._unassign(key)

    def _arrive(self) -> None:
        """The poll thread's arrivals into their feeds (the trio thread)."""
        with self._lock:
            arrivals, self._arrivals = self._arrivals, []
        for key, generation, bundles, error, high in arrivals:
            feed = self.feeds.get(key)
            if feed is None or feed.generation != generation:
                continue
            if high > feed.high_water_mark:
                feed.high_water_mark = high
            if error is not None:
                feed.error = error
                if self._metrics is not None:
                    self._metrics.upstream_errors.labels("fetch", error[0]).inc()
            for bundle in bundles:
                if bundle.first_seq < feed.next_seq:
                    continue  # read again after a seek: already cached
                feed.bundles.append(bundle)
                feed.cached_bytes += len(bundle.framed)
                feed.next_seq = bundle.last_seq + 1
            if feed.next_seq - 1 > feed.high_water_mark:
                feed.high_water_mark = feed.next_seq - 1
            while len(feed.bundles) > 1 and feed.cached_bytes > self.cache_bytes:
                feed.cached_bytes -= len(feed.bundles.popleft().framed)
            feed.arrived.set()
            feed.arrived = trio.Event()

    # ------------------------------------------------------------------ poll thread

    def _poll(self) -> None:
        consume = self._consumer.consume
        while not self._stop.is_set():
            try:
                self._apply_commands()
                messages = consume(2000, 0.05)
            except Exception as exc:  # closed under us at shutdown, or a fatal error
                if self._stop.is_set():
                    return
                log.warning("upstream_tail_poll_failed", error=repr(exc))
                self._stop.wait(0.5)
                continue
            if not messages:
                continue
            arrivals = self._bundle(messages)
            if not arrivals:
                continue
            with self._lock:
                self._arrivals += arrivals
            try:
                self._token.run_sync_soon(self._arrive)
            except trio.RunFinishedError:
                return

    def _apply_commands(self) -> None:
        with self._lock:
            commands, self._commands = self._commands, []
        for command, where in commands:
            try:
                if command == "assign":
                    self._consumer.incremental_assign([where])
                else:
                    self._consumer.incremental_unassign([where])
            except Exception as exc:  # unassigning what is not assigned: nothing to undo
                log.debug("upstream_assignment_failed", command=command,
                          topic=where.topic, partition=where.partition, error=repr(exc))

    def _bundle(self, messages: list[Any]) -> list[Arrival]:
        """Group one poll's messages by partition and bundle them (the poll thread)."""
        records: dict[TopicPartition, list[ClientRecord]] = {}
        errors: dict[TopicPartition, tuple[str, str]] = {}
        for m in messages:
            key = (m.topic(), m.partition())
            error = m.error()
            if error is not None:
                if error.name() != "_PARTITION_EOF":
                    errors[key] = (error.name(), error.str())
                else:
                    records.setdefault(key, [])
                continue
            records.setdefault(key, []).append(
                (m.offset(), m.timestamp()[1], m.key(), m.value()))
        arrivals: list[Arrival] = []
        for key in records.keys() | errors.keys():
            with self._lock:
                state = self._assigned.get(key)
                if state is None:
                    continue
                generation, after = state
            error = errors.get(key)
            bundles: list[UpstreamBundle] = []
            got = records.get(key, [])
            if got:
                try:
                    bundles = records_to_bundles(got, after_seq=after)
                except (InvalidRecord, ValueError) as exc:
                    error = ("_INVALID_RECORD", f"a record Tank can not hold: {exc}")
            high = self._high_water_mark(key)
            if bundles:
                with self._lock:
                    if self._assigned.get(key) is state:
                        state[1] = bundles[-1].last_seq
            arrivals.append((key, generation, bundles, error, high))
        return arrivals

    def _high_water_mark(self, key: TopicPartition) -> int:
        try:
            _, high = self._consumer.get_watermark_offsets(self._partition(*key),
                                                           cached=True)
        except Exception:
            return 0
        return max(int(high), 0)

    def close(self) -> None:
        """Stop the poll thread and close the consumer (blocking: a worker thread)."""
        self._stop.set()
        self._thread.join()
        self._consumer.close()
