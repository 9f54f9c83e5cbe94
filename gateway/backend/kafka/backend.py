"""The upstream-Kafka backend: every listener served from a Kafka-protocol cluster.

:class:`KafkaBackend` implements :class:`~gateway.core.contract.Backend` with figtank's
own Kafka client (:mod:`gateway.backend.kafka.wire`, :mod:`~gateway.backend.kafka.cluster`):
figtank keeps no log, no offsets and no group state of its own, so gateways in front of
one cluster are interchangeable. Positions are the cluster's: **Figg offset = Tank
sequence = Kafka offset + 1**.

- produce: each bundle is checked (as the other backends do) and queued whole to the
  idempotent producer (:mod:`gateway.backend.kafka.produce`), which sends a partition's
  queued bundles as one record batch; the outcome comes when the upstream acknowledged
  it (``acks=all``). A bundle naming its own sequence numbers (sparse, or
  ProduceWithSeqnum) is refused with INVALID_SEQUENCE: the upstream numbers records. A
  missing topic is created with CreateTopics when
  :class:`~gateway.core.contract.AutoCreate` allows it.
- fetch: from the partition's tail feed (:mod:`gateway.backend.kafka.feeds`) when the
  position is in its cache or at its tail (the long poll waits on the feed), else one
  Fetch from the position (:mod:`gateway.backend.kafka.history`).
- admin and bounds: Metadata, ListOffsets and CreateTopics.

While the upstream does not answer (:mod:`gateway.backend.kafka.health`), calls give the
answers the front ends turn into their "unavailable": produce I/O fault, fetch FAULT,
create_topic system error, and discovery raises
:class:`~gateway.core.contract.UpstreamUnavailable`, after waiting for it up to
``wait_secs`` into the outage (a fetch: within its ``max_wait``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Final

import structlog
import trio

from gateway.backend.forwarding import (
    DEFAULT_WAIT_SECS,
    Forwarding,
    checked_bundle,
    refuse_topic_name,
    valid_new_topic,
)
from gateway.backend.kafka.cluster import Cluster
from gateway.backend.kafka.feeds import PartitionFeed, TailFeeds
from gateway.backend.kafka.fetcher import NO_WAIT_MS, fetch_partition
from gateway.backend.kafka.health import UpstreamHealth
from gateway.backend.kafka.history import HistoryRead, HistoryReader
from gateway.backend.kafka.produce import UpstreamProducer
from gateway.backend.kafka.wire import BrokerConnection, BrokerLost, error_name
from gateway.core.contract import (
    AutoCreate,
    BackendStatus,
    BytesChunk,
    CreateTopicCode,
    FetchOutcome,
    FetchRequest,
    FetchStatus,
    PartitionInfo,
    ProduceBatch,
    ProduceCode,
    ProduceDone,
    ProduceOutcome,
    ReloadConfCode,
    TailChange,
    TopicInfo,
    UpstreamUnavailable,
)
from gateway.core.metrics import Metrics
from gateway.io.newest import join
from protocols.kafka.records import (
    CreatableTopic,
    CreateTopicsRequest,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
)
from protocols.kafka.types import ApiKey, ErrorCode
from protocols.kafka.upstream_codec import UpstreamBundle
from protocols.tank.bundle import BundleInfo
from protocols.topics import is_valid_topic_name
from protocols.wire import UINT64_MAX

log = structlog.get_logger("figtank.upstream_kafka")

#: How long a fetch waits for a feed that is reading data known to exist, whatever its
#: own max wait (a feed opened for it, catching up).
CATCH_UP_SECS: Final = 2.0
#: How long one metadata or watermark request may take.
REQUEST_TIMEOUT_SECS: Final = 5.0


#: Kafka's name of the upstream's "no such topic" (counted under it).
UNKNOWN_TOPIC: Final = "UNKNOWN_TOPIC_OR_PARTITION"
#: ListOffsets' timestamp for a partition's first offset.
_EARLIEST: Final = -2
#: Kafka's names of the upstream's authorization failures.
_DENIED: Final = ("TOPIC_AUTHORIZATION_FAILED", "CLUSTER_AUTHORIZATION_FAILED")


class UpstreamRefused(Exception):
    """The upstream answered a partition's request with an error that is not an outage
    (an authorization failure, an unknown topic): ``error`` is Kafka's name."""

    def __init__(self, error: str, text: str) -> None:
        super().__init__(f"{error}: {text}")
        self.error = error


class KafkaBackend(Forwarding):
    """Serves the listeners from an upstream Kafka cluster; see the module doc."""

    #: Whether produce outcomes carry the offsets (see the Backend contract).
    reports_offsets = True

    def __init__(self, *, cluster: Cluster, producer: UpstreamProducer, feeds: TailFeeds,
                 history: HistoryReader, health: UpstreamHealth,
                 auto_create_topics: bool = True, default_partitions: int = 1,
                 replication_factor: int = -1, max_bundle_bytes: int = 64 * 1024 * 1024,
                 wait_secs: float = DEFAULT_WAIT_SECS, metrics: Metrics | None = None) -> None:
        self.cluster = cluster
        self.producer = producer
        self.feeds = feeds
        self.history = history
        self.health = health
        self.auto_create = AutoCreate(auto_create_topics, default_partitions)
        self.replication_factor = replication_factor
        self.max_bundle_bytes = max_bundle_bytes
        self.wait_secs = wait_secs
        self._metrics = metrics
        #: Partition counts of the topics seen (topics are not deleted while serving;
        #: a partition past the count asks again).
        self._partitions: dict[str, int] = {}
        self._waiting: deque[tuple[Sequence[ProduceBatch],
                                   Callable[[int, ProduceOutcome], None]]] = deque()
        self._draining = False
        #: Starts background tasks (set by open_kafka_backend).
        self._spawn: Callable[..., Any] = _no_nursery
        self._started = int(time.time() * 1000)

    def unavailable(self) -> str | None:
        """Why the gateway can not serve now (the upstream does not answer, or gives the
        producer no id, so no publish can succeed), or None."""
        return self.health.unavailable() or self.producer.unavailable()

    async def issue_producer_id(self) -> int:
        """A producer id from the upstream (InitProducerId) for a Kafka client in front:
        unique across every gateway of the cluster, so a client that reconnects to another
        gateway keeps an id no other client there has. ``ConnectionError`` when the
        upstream does not give one."""
        return (await self.producer.producer_id())[0]

    # -- helpers -----------------------------------------------------------------------------

    def _count(self, operation: str, error: str) -> None:
        if self._metrics is not None:
            self._metrics.upstream_errors.labels(operation, error).inc()

    async def _ready(self) -> None:
        # Up to wait_secs into an outage, not from each call: look-ups queued behind each
        # other (produce_nowait's, one at a time) would each wait it again.
        left = max(self.wait_secs - self.health.down_for(), 0.0)
        if not await self.health.wait_up(trio.current_time() + left):
            raise UpstreamUnavailable(self.health.unavailable() or "upstream unreachable")

    async def partition_count(self, topic: str, *, fresh: bool = False) -> int | None:
        """Partitions of ``topic`` upstream; None when it does not exist."""
        if not fresh and topic in self._partitions:
            return self._partitions[topic]
        await self._ready()
        try:
            metadata = await self.cluster.metadata([topic])
        except BrokerLost as exc:
            self.health.suspect()
            raise UpstreamUnavailable(f"metadata of {topic!r}: {exc}") from exc
        found = next((t for t in metadata.topics if t.name == topic), None)
        if found is None or found.error_code or not found.partitions:
            if found is not None and found.error_code and \
                    found.error_code != ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                self._count("metadata", error_name(found.error_code))
            return None
        self._partitions[topic] = len(found.partitions)
        return len(found.partitions)

    async def _watermarks(self, topic: str, partition: int, operation: str = "fetch"
                          ) -> tuple[int, int]:
        """The upstream's low and high watermarks; a refusal is counted under
        ``operation`` and raised as :class:`UpstreamRefused`."""
        try:
            connection = await self.cluster.leader(topic, partition)
            low, high = await self._offsets(connection, topic, partition, operation)
        except BrokerLost as exc:
            self.health.suspect()
            raise UpstreamUnavailable(f"watermarks of {topic}/{partition}: {exc}") from exc
        return low, high

    async def _offsets(self, connection: BrokerConnection, topic: str, partition: int,
                       operation: str) -> tuple[int, int]:
        """The first offset (ListOffsets earliest) and the high watermark, as a Fetch from
        that offset tells it: ListOffsets latest is not what every broker gets right
        (Tansu answers the last batch's base offset + 1)."""
        answer = await connection.call(ApiKey.LIST_OFFSETS, ListOffsetsRequest(
            replica_id=-1, isolation_level=0, topics=[ListOffsetsTopic(topic, [
                ListOffsetsPartition(partition_index=partition, timestamp=_EARLIEST)])]),
            timeout=REQUEST_TIMEOUT_SECS)
        parts = [p for t in answer.topics for p in t.partitions
                 if p.partition_index == partition]
        if not parts:
            raise BrokerLost(f"ListOffsets of {topic}/{partition}: left out")
        self._refusal(parts[0].error_code, topic, partition, operation)
        low = max(parts[0].offset, 0)
        got = await fetch_partition(self.cluster, topic, partition, low,
                                    max_wait_ms=NO_WAIT_MS, max_bytes=1, after_seq=None,
                                    timeout=REQUEST_TIMEOUT_SECS, convert=False)
        self._refusal(got.error_code, topic, partition, operation)
        return low, max(got.high_watermark, low)

    def _refusal(self, code: int, topic: str, partition: int, operation: str) -> None:
        """Raise for an error ``code`` of a bounds request: :class:`UpstreamRefused` when
        the upstream refuses the gateway the partition, else ``BrokerLost`` (an outage or a
        moved leader: asked again)."""
        if not code:
            return
        name = error_name(code)
        if read_refusal(name) is FetchStatus.FAULT:
            self.cluster.forget(topic, partition)
            raise BrokerLost(f"bounds of {topic}/{partition}: {name}")
        self._count(operation, name)
        raise UpstreamRefused(name, f"bounds of {topic}/{partition}")

    # -- produce -----------------------------------------------------------------------------

    async def produce(self, batches: Sequence[ProduceBatch]) -> list[ProduceOutcome]:
        """Append each batch upstream; outcomes in the same order."""
        outcomes: list[ProduceOutcome | None] = [None] * len(batches)
        done = trio.Event()
        left = len(batches)

        def finish(i: int, outcome: ProduceOutcome) -> None:
            nonlocal left
            outcomes[i] = outcome
            left -= 1
            if not left:
                done.set()

        if not batches:
            return []
        await self._send(batches, finish)
        await done.wait()
        return outcomes  # type: ignore[return-value]  # every slot filled

    def produce_nowait(self, batches: Sequence[ProduceBatch], on_done: ProduceDone) -> None:
        """:meth:`produce` without waiting: bundles of known topics are queued to the
        producer before this returns (so calls keep their order); ``on_done`` gets the
        outcomes once the upstream acknowledged them."""
        outcomes: list[ProduceOutcome | None] = [None] * len(batches)
        left = len(batches)
        if not batches:
            on_done([])
            return

        def finish(i: int, outcome: ProduceOutcome) -> None:
            nonlocal left
            outcomes[i] = outcome
            left -= 1
            if not left:
                on_done(outcomes)  # type: ignore[arg-type]  # every slot filled

        if self._all_known(batches) and not self._waiting:
            self._queue(batches, finish)
        else:  # a topic to look up or create first: later calls wait behind it
            self._waiting.append((batches, finish))
            if not self._draining:
                self._draining = True
                self._spawn(self._drain_waiting)

    def _all_known(self, batches: Sequence[ProduceBatch]) -> bool:
        known = self._partitions
        return all(b.topic in known for b in batches)

    async def _drain_waiting(self) -> None:
        """Queue the calls that waited for a topic's lookup, in call order."""
        try:
            while self._waiting:
                batches, finish = self._waiting[0]
                await self._look_up(batches)
                self._waiting.popleft()
                self._queue(batches, finish)
        finally:
            self._draining = False

    async def _send(self, batches: Sequence[ProduceBatch],
                    finish: Callable[[int, ProduceOutcome], None]) -> None:
        await self._look_up(batches)
        self._queue(batches, finish)

    async def _look_up(self, batches: Sequence[ProduceBatch]) -> None:
        """Learn the partitions of the batches' topics not known yet, creating those
        missing as :attr:`auto_create` allows (a failure fails their batches later)."""
        for topic in dict.fromkeys(b.topic for b in batches):
            if topic in self._partitions or not is_valid_topic_name(topic):
                continue
            try:
                count = await self.partition_count(topic)
                if count is None and self.auto_create.allows(topic):
                    await self.auto_create.create(topic, self.create_topic)
                    await self.partition_count(topic, fresh=True)
            except Exception as exc:  # unavailable, refused: those batches fail below
                log.debug("upstream_topic_lookup_failed", topic=topic, error=repr(exc))

    def _queue(self, batches: Sequence[ProduceBatch],
               finish: Callable[[int, ProduceOutcome], None]) -> None:
        # Away for longer than a call waits (or never seen): fail now, not at the
        # delivery timeout.
        down = not self.health.up and (not self.health.ever_up
                                       or self.health.down_for() > self.wait_secs)
        for i, batch in enumerate(batches):
            checked = self._check(batch)
            if isinstance(checked, ProduceOutcome):
                finish(i, checked)
                continue
            if down:
                finish(i, ProduceOutcome(ProduceCode.IO_FAULT,
                                         reason=self.unavailable() or "upstream"))
                continue
            started = time.perf_counter()

            def done(outcome: ProduceOutcome, i: int = i, batch: ProduceBatch = batch,
                     count: int = checked.msg_count, started: float = started) -> None:
                if self._metrics is not None:
                    self._metrics.append_seconds.observe(time.perf_counter() - started)
                    if outcome.code is ProduceCode.OK:
                        self._metrics.appended(batch.topic, count, len(batch.bundle))
                finish(i, outcome)

            self.producer.send(batch.topic, batch.partition, batch.bundle,
                               checked.msg_count, done, stamp=batch.producer, kick=False)
        self.producer.kick()

    def _check(self, batch: ProduceBatch) -> ProduceOutcome | BundleInfo:
        """The outcome refusing ``batch`` before it goes upstream, or its bundle's header."""
        count = self._partitions.get(batch.topic)
        refused = refuse_topic_name(batch)
        if refused is not None:
            return refused
        if count is None:
            if self.health.up:  # else it was not looked up: the upstream did not answer
                self._count("produce", UNKNOWN_TOPIC)
            return ProduceOutcome(ProduceCode.UNKNOWN_TOPIC,
                                  reason=f"unknown topic {batch.topic!r}")
        if not 0 <= batch.partition < count:
            self._partitions.pop(batch.topic, None)  # it may have grown: ask next time
            return ProduceOutcome(ProduceCode.UNKNOWN_PARTITION)
        if batch.base_seq is not None:
            return ProduceOutcome(ProduceCode.INVALID_SEQUENCE, reason=(
                "the upstream Kafka cluster numbers records: a produce can not name "
                "its sequence numbers"))
        # The header only: the producer's conversion reads every message (once, not twice),
        # and refuses a bundle that does not convert on its own (UpstreamProducer._build).
        info = checked_bundle(batch, self.max_bundle_bytes, whole=False)
        if isinstance(info, ProduceOutcome):
            return info
        if info.sparse:
            return ProduceOutcome(ProduceCode.INVALID_SEQUENCE, reason=(
                "a sparse bundle names its sequence numbers; the upstream numbers records"))
        if not info.msg_count:
            return ProduceOutcome(ProduceCode.IO_FAULT, reason="invalid bundle: no messages")
        return info

    # -- fetch -------------------------------------------------------------------------------

    def fetch_nowait(self, requests: Sequence[FetchRequest]) -> list[FetchOutcome] | None:
        """What the feeds' caches answer at once, or None."""
        outcomes = []
        for r in requests:
            feed = self.feeds.feeds.get((r.topic, r.partition))
            if feed is None or feed.error is not None:
                return None
            outcome = self._from_feed(feed, r)
            if outcome is None:
                return None
            outcomes.append(outcome)
        return outcomes if any(o.chunk.length for o in outcomes) else None

    def watch_tail(self, topic: str, partition: int, seq: int,
                   on_change: TailChange) -> Callable[[], None] | None:
        """Pushes from the partition's feed (:meth:`TailFeeds.watch`: its fetches and the
        gateway's own batches written through) while it reads at ``seq``."""
        feed = self.feeds.feeds.get((topic, partition))
        if feed is None or feed.error is not None or feed.next_seq != seq or \
                not self.health.up:
            return None
        return self.feeds.watch(feed, on_change)

    async def fetch(self, requests: Sequence[FetchRequest], *, max_wait_ms: int,
                    min_bytes: int) -> list[FetchOutcome]:
        """Each partition from its feed or a history read; waits at the tail when none
        has data (``min_bytes`` is taken as 1: any arrival answers)."""
        deadline = trio.current_time() + max(max_wait_ms, 0) / 1000
        outcomes: list[FetchOutcome | None] = [None] * len(requests)
        feeds: dict[int, PartitionFeed] = {}
        requests = list(requests)

        async def resolve(i: int, r: FetchRequest) -> None:
            outcomes[i], feed, seq = await self._fetch_one(r)
            if feed is not None:
                feeds[i] = feed
                requests[i] = FetchRequest(r.topic, r.partition, seq, r.fetch_size)

        if len(requests) == 1:  # the common case (a subscriber's read): no task
            await resolve(0, requests[0])
        else:
            async with trio.open_nursery() as nursery:
                for i, r in enumerate(requests):
                    nursery.start_soon(resolve, i, r)
        if any(feed.high_water_mark >= requests[i].seq for i, feed in feeds.items()):
            # The data is there and the feed still on its way to it: no empty answer.
            deadline = max(deadline, trio.current_time() + CATCH_UP_SECS)
        while (not any(o is not None and (o.status is not FetchStatus.DATA or o.chunk.length)
                       for o in outcomes)
               and feeds and trio.current_time() < deadline):
            # Every partition is at its feed's tail: wait for any of them.
            for feed in feeds.values():
                feed.readers += 1
            try:
                with trio.move_on_at(deadline):
                    await _any_arrival(list(feeds.values()))
            finally:
                for feed in feeds.values():
                    feed.readers -= 1
            passed = False
            for i, feed in feeds.items():
                got = self._from_feed(feed, requests[i])
                if got is not None:
                    outcomes[i] = got
                elif feed.error is not None and (
                        status := read_refusal(feed.error[0])) is not FetchStatus.FAULT:
                    # Refused (counted by the feed); a fault is retried by the next fetch.
                    outcomes[i] = FetchOutcome(status)
                elif feed.next_seq != requests[i].seq:
                    # The feed went past this reader in one go (catching up, it can move
                    # more than its cache between two wake-ups): waiting on it would last
                    # until the deadline. Answer now; the next fetch reads from the
                    # reader's position.
                    passed = True
            if passed:
                break
        return [o if o is not None else FetchOutcome(FetchStatus.FAULT) for o in outcomes]

    async def _fetch_one(self, r: FetchRequest
                         ) -> tuple[FetchOutcome, PartitionFeed | None, int]:
        """One partition's answer now, and the feed to wait on when it is at the tail
        with the sequence it waits for."""
        seq = r.seq
        if not is_valid_topic_name(r.topic):
            return FetchOutcome(FetchStatus.UNKNOWN_TOPIC), None, seq
        if not self.health.up:
            return FetchOutcome(FetchStatus.FAULT), None, seq
        try:
            count = self._partitions.get(r.topic)
            if count is None or r.partition >= count:
                count = await self.partition_count(r.topic, fresh=True)
            if count is None:
                self._count("fetch", UNKNOWN_TOPIC)
                return FetchOutcome(FetchStatus.UNKNOWN_TOPIC), None, seq
            if not 0 <= r.partition < count:
                return FetchOutcome(FetchStatus.UNKNOWN_PARTITION), None, seq
            feed = self.feeds.feeds.get((r.topic, r.partition))
            if seq in (0, UINT64_MAX) or feed is None or feed.error is not None:
                low, high = await self._watermarks(r.topic, r.partition)
                first = low + 1
                if seq == 0:
                    seq = first
                elif seq == UINT64_MAX:
                    seq = high + 1
                elif not first <= seq <= high + 1:
                    return FetchOutcome(FetchStatus.BOUNDARY, high_water_mark=high,
                                        first_available=first if high else 0), None, seq
                if feed is None or feed.error is not None:
                    # A feed follows the tail. A reader behind it reads the history (one
                    # Fetch of its own size a read) until it gets there: a feed opened at
                    # its position would crawl through the log a feed's fetch at a time.
                    tail = high + 1
                    feed = (self.feeds.open(r.topic, r.partition, tail) if feed is None
                            else self.feeds.reopen(feed, tail))
                    feed.high_water_mark = max(feed.high_water_mark, high)
        except UpstreamUnavailable:
            return FetchOutcome(FetchStatus.FAULT), None, seq
        except UpstreamRefused as refused:
            return FetchOutcome(read_refusal(refused.error)), None, seq
        except ConnectionError:
            return FetchOutcome(FetchStatus.FAULT), None, seq
        feed.last_used = trio.current_time()
        request = FetchRequest(r.topic, r.partition, seq, r.fetch_size)
        got = self._from_feed(feed, request)
        if got is not None:
            return got, None, seq
        if seq == feed.next_seq:
            return FetchOutcome(FetchStatus.DATA, high_water_mark=feed.high_water_mark,
                                resolved_seq=seq), feed, seq
        # Older than the cache, or ahead of the feed: read from there (and read ahead
        # up to where the feed's cache takes over).
        read = await self.history.read(
            r.topic, r.partition, seq, max(r.fetch_size, 1),
            ahead_before=feed.first_cached)
        return self._from_history(r, seq, read), None, seq

    def _from_feed(self, feed: PartitionFeed, r: FetchRequest) -> FetchOutcome | None:
        """The answer from the feed's cache, or None (not cached there, or at its tail)."""
        if not feed.bundles or not feed.first_cached <= r.seq < feed.next_seq:
            return None
        span = feed.bundles.span(r.seq, max(r.fetch_size, 1))
        if span is None:
            return None
        self.feeds.served_from(feed, span.last.last_seq)
        return _outcome(span.join(), span.first, span.last.last_seq, feed.high_water_mark,
                        r.seq)

    def _from_history(self, r: FetchRequest, seq: int, read: HistoryRead) -> FetchOutcome:
        if read.error is not None:
            name, _ = read.error
            self._count("fetch", name)
            if name == "OFFSET_OUT_OF_RANGE":
                return FetchOutcome(FetchStatus.BOUNDARY, high_water_mark=read.high_water_mark)
            return FetchOutcome(read_refusal(name))
        if not read.bundles:
            return FetchOutcome(FetchStatus.DATA, high_water_mark=read.high_water_mark,
                                resolved_seq=seq)
        high = max(read.high_water_mark, read.bundles[-1].last_seq)
        return _outcome(join([b.framed for b in read.bundles]), read.bundles[0],
                        read.bundles[-1].last_seq, high, seq)

    # -- admin -------------------------------------------------------------------------------

    async def create_topic(self, name: str, partitions: int, config: str = ""
                           ) -> CreateTopicCode:
        """CreateTopics upstream (Tank config keys are not Kafka's: ``config`` is not
        passed on)."""
        if not valid_new_topic(name, partitions):
            return CreateTopicCode.INVALID
        try:
            await self._ready()
        except UpstreamUnavailable:
            return CreateTopicCode.SYSTEM_ERROR
        try:
            code = await self._create_topic(name, partitions)
        except BrokerLost as exc:
            self.health.suspect()
            log.info("upstream_create_topic_failed", topic=name, reason=str(exc))
            return CreateTopicCode.SYSTEM_ERROR
        if code == ErrorCode.TOPIC_ALREADY_EXISTS:
            return CreateTopicCode.EXISTS
        if code:
            name_of_code = error_name(code)
            self._count("create_topic", name_of_code)
            log.info("upstream_create_topic_refused", topic=name, error=name_of_code)
            if code in (ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                        ErrorCode.CLUSTER_AUTHORIZATION_FAILED, ErrorCode.POLICY_VIOLATION):
                return CreateTopicCode.READ_ONLY
            if code in (ErrorCode.INVALID_PARTITIONS, ErrorCode.INVALID_REPLICATION_FACTOR,
                        ErrorCode.INVALID_CONFIG, ErrorCode.INVALID_TOPIC_EXCEPTION):
                return CreateTopicCode.BAD_CONFIG
            return CreateTopicCode.SYSTEM_ERROR
        self._partitions[name] = partitions
        return CreateTopicCode.OK

    async def _create_topic(self, name: str, partitions: int) -> int:
        """CreateTopics at the controller (asked again when it moved): the error code."""
        for _ in range(3):
            if self.cluster.controller < 0:
                await self.cluster.metadata([])
            connection = (await self.cluster.node(self.cluster.controller)
                          if self.cluster.controller >= 0 else await self.cluster.any_broker())
            answer = await connection.call(ApiKey.CREATE_TOPICS, CreateTopicsRequest(
                topics=[CreatableTopic(name=name, num_partitions=partitions,
                                       replication_factor=self.replication_factor)],
                timeout_ms=int(REQUEST_TIMEOUT_SECS * 1000)),
                timeout=REQUEST_TIMEOUT_SECS + 1)
            code = next((t.error_code for t in answer.topics if t.name == name),
                        ErrorCode.UNKNOWN_SERVER_ERROR)
            if code != ErrorCode.NOT_CONTROLLER:
                return int(code)
            self.cluster.controller = -1
        return int(ErrorCode.NOT_CONTROLLER)

    async def discover_partitions(self, topic: str) -> list[PartitionInfo] | None:
        """The upstream's bounds: ``(low + 1, high)`` per partition, ``(0, 0)`` when it
        never held a record."""
        if not is_valid_topic_name(topic):
            return None
        count = await self.partition_count(topic, fresh=True)
        if count is None:
            if not self.auto_create.allows(topic):  # else the caller may create it
                self._count("metadata", UNKNOWN_TOPIC)
            return None
        infos = []
        for partition in range(count):
            try:
                low, high = await self._watermarks(topic, partition, "metadata")
            except UpstreamRefused as refused:
                if refused.error not in _DENIED:
                    return None  # gone
                # Listed, but its bounds may not be read: shown (a Kafka client then
                # fetches and is told TOPIC_AUTHORIZATION_FAILED), its reads refused.
                low = high = 0
            infos.append(PartitionInfo(low + 1, high) if high else PartitionInfo(0, 0))
        return infos

    async def discover_topics(self) -> list[TopicInfo]:
        await self._ready()
        try:
            metadata = await self.cluster.metadata(None)
        except BrokerLost as exc:
            self.health.suspect()
            raise UpstreamUnavailable(f"metadata: {exc}") from exc
        topics = []
        for topic in sorted(metadata.topics, key=lambda t: t.name or ""):
            name = topic.name
            if not topic.error_code and name and is_valid_topic_name(name) \
                    and not topic.is_internal:
                self._partitions[name] = len(topic.partitions)
                topics.append(TopicInfo(name, len(topic.partitions)))
        return topics

    async def reload_conf(self, topic: str, partition: int) -> ReloadConfCode:
        """Nothing to reload: the upstream owns its topics' configuration."""
        if await self.partition_count(topic) is None:
            return ReloadConfCode.UNKNOWN_TOPIC
        return ReloadConfCode.OK

    async def status(self) -> BackendStatus:
        topics = await self.discover_topics()
        return BackendStatus(len(topics), sum(t.partitions for t in topics),
                             len(self.feeds.feeds), 0, self._started, 0)

    async def aclose(self) -> None:
        """Nothing here: :func:`open_kafka_backend` flushes and closes the clients."""


def read_refusal(error_name: str) -> FetchStatus:
    """The fetch status of a read the upstream refused with ``error_name`` (Kafka's):
    DENIED for an authorization failure, UNKNOWN_TOPIC for a topic it does not have,
    else FAULT (a reader retries)."""
    if error_name in _DENIED:
        return FetchStatus.DENIED
    if error_name == UNKNOWN_TOPIC:
        return FetchStatus.UNKNOWN_TOPIC
    return FetchStatus.FAULT


def _no_nursery(*args: object) -> None:
    raise RuntimeError("the backend runs inside open_kafka_backend")


async def _any_arrival(feeds: list[PartitionFeed]) -> None:
    """Wait until one of ``feeds`` has news: one feed is waited on directly (a
    subscriber's read, no task), several are raced."""
    if len(feeds) == 1:
        await feeds[0].arrived.wait()
        return
    arrived = trio.Event()

    async def wait_one(feed: PartitionFeed) -> None:
        await feed.arrived.wait()
        arrived.set()

    async with trio.open_nursery() as nursery:
        for feed in feeds:
            nursery.start_soon(wait_one, feed)
        await arrived.wait()
        nursery.cancel_scope.cancel()


def _outcome(chunk: bytes, first: UpstreamBundle, last_seq: int, high_water_mark: int,
             seq: int) -> FetchOutcome:
    """DATA: ``chunk``, bundles from ``first`` to the one ending at ``last_seq``."""
    return FetchOutcome(FetchStatus.DATA, high_water_mark=max(high_water_mark, last_seq),
                        base_seq=first.first_seq if first.plain else None,
                        chunk=BytesChunk(chunk), resolved_seq=seq, next_seq=last_seq + 1)
