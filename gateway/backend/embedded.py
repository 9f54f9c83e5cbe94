"""The default backend: the embedded log store in Tank's on-disk format."""

from __future__ import annotations

import math
import operator
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Final

import structlog
import trio

from gateway.backend.shared import SharedReads, read_outcome
from gateway.core.contract import (
    AutoCreate,
    BackendStatus,
    CreateTopicCode,
    FastAppender,
    FetchOutcome,
    FetchRequest,
    FetchStatus,
    PartitionInfo,
    ProduceBatch,
    ProduceCode,
    ProduceOutcome,
    Refusal,
    ReloadConfCode,
    TailChange,
    TopicConfigs,
    TopicInfo,
    TopicRefused,
    produce_and_wait,
)
from gateway.core.metrics import GaugeCollector, Metrics
from gateway.core.sections import Section, setting
from gateway.store import (
    AppendResult,
    BundleTooLarge,
    ConfigBounds,
    InvalidBundle,
    InvalidConfig,
    InvalidSequence,
    InvalidTopicName,
    LimitReached,
    LogStore,
    OutOfRange,
    Partition,
    SegmentCheckPending,
    StoreError,
    StoreIOError,
    StoreSettings,
    TopicConfig,
    TopicExists,
    UnknownPartition,
    UnknownTopic,
    open_store,
)
from gateway.store.descriptors import descriptor_limits, open_descriptors
from gateway.store.durability import Durability
from gateway.store.partition import AppendEntry
from gateway.store.producers import StoredProducer

log = structlog.get_logger("figtank.embedded")


def _version_number() -> int:
    """The package version as Tank's Status reports it: major*10000 + minor*100 + patch."""
    try:
        parts = [int(p) for p in version("figtank").split(".")[:3] if p.isdigit()]
    except PackageNotFoundError:
        return 0
    parts += [0] * (3 - len(parts))
    return parts[0] * 10000 + parts[1] * 100 + parts[2]


class EmbeddedBackend:
    """Serves both listeners from a :class:`LogStore` on this machine."""

    #: Whether produce outcomes carry the offsets (see the Backend contract).
    reports_offsets = True
    #: No upstream to lose (see the Backend contract).
    has_upstream = False

    def __init__(self, store: LogStore, *, auto_create_topics: bool = True,
                 metrics: Metrics | None = None, share_reads: bool = True) -> None:
        self.store = store
        self.auto_create = AutoCreate(auto_create_topics, store.settings.default_partitions,
                                      explain=self._explain_refusal)
        self._metrics = metrics
        #: ``(topic, why)`` of the last creation a limit or a store fault refused (read by
        #: auto-creation).
        self._refusal: tuple[str, Refusal] | None = None
        if metrics is not None:
            store.open_files.on_evict = partial(metrics.limit_hit, "max_open_segments")
        self._opened_at = time.time()
        #: The reads shared by the readers at one partition position until its next
        #: change (None: every reader reads for itself, as the tests' reference does).
        self.shared_reads: SharedReads | None = SharedReads() if share_reads else None
        #: Appends to topics being created, by topic, in arrival order.
        self._awaiting_topic: dict[str, list[tuple[int, list[AppendEntry], _Report]]] = {}
        #: The appenders made by :meth:`fast_appender`, one per partition asked about
        #: (every connection producing to a partition shares it).
        self._appenders: dict[tuple[str, int], FastAppender] = {}

    # -- produce -----------------------------------------------------------------------------------

    async def produce(self, batches: Sequence[ProduceBatch]) -> list[ProduceOutcome]:
        """Append every batch; partitions proceed in parallel, one partition in order."""
        return await produce_and_wait(self, batches)

    def unavailable(self) -> None:
        """Never: the store is on this machine (see the Backend contract)."""
        return None

    def produce_nowait(self, batches: Sequence[ProduceBatch],
                       on_done: Callable[[list[ProduceOutcome]], None]) -> None:
        """Append every batch now (one partition's batches in order, one fsync round for
        them); ``on_done(outcomes)`` runs in the trio thread once all are durable, possibly
        before this returns. A topic that must be created first is appended to by a task
        of the store."""
        if len(batches) == 1 and self._produce_one_nowait(batches[0], on_done):
            return
        call = _ProduceCall(len(batches), on_done, self._metrics)
        by_partition: dict[tuple[str, int], list[int]] = {}
        for i, batch in enumerate(batches):
            by_partition.setdefault((batch.topic, batch.partition), []).append(i)
        for (topic, index), indexes in by_partition.items():
            call.expect()
            entries: list[AppendEntry] = [
                (batches[i].bundle, batches[i].base_seq, batches[i].info, batches[i].producer)
                for i in indexes]
            report = partial(call.partition_done, batches, indexes)
            waiting = self._awaiting_topic.get(topic)
            if waiting is not None:  # behind appends that wait for the topic's creation
                waiting.append((index, entries, report))
                continue
            partition = self._writable_partition_nowait(topic, index)
            if partition is None:  # the topic must be created first
                self._awaiting_topic[topic] = [(index, entries, report)]
                self.store.spawn(self._create_then_append, topic)
            elif isinstance(partition, ProduceOutcome):
                call.refused(indexes, partition)
            else:
                partition.append_nowait(entries, report)
        call.release()

    def _produce_one_nowait(self, batch: ProduceBatch,
                            on_done: Callable[[list[ProduceOutcome]], None]) -> bool:
        """:meth:`produce_nowait` of one batch to a partition that is there (the usual
        Produce): the same outcome and metrics without the per-partition bookkeeping.
        False, having done nothing, when the general path must take it."""
        topic = batch.topic
        if self._awaiting_topic and self._awaiting_topic.get(topic) is not None:
            return False
        partition = self.store.find_partition(topic, batch.partition)
        if partition is None:
            return False
        metrics = self._metrics
        started = _perf_counter()

        def report(results: list[AppendResult | StoreError]) -> None:
            result = results[0]
            elapsed = _perf_counter() - started
            if type(result) is AppendResult:  # the answer first, the metrics after
                on_done([ProduceOutcome(_OK, result.first_seq, result.last_seq)])
                if metrics is not None:
                    metrics.appended(topic, result.last_seq - result.first_seq + 1,
                                     result.size)
                    metrics.append_seconds.observe(elapsed)
                return
            on_done([_outcome(batch, result)])
            if metrics is not None:
                metrics.append_seconds.observe(elapsed)

        partition.append_nowait([(batch.bundle, batch.base_seq, batch.info, batch.producer)],
                                 report)
        return True

    async def issue_producer_id(self) -> None:
        """None: the Kafka listener numbers producers itself."""
        return None

    def fast_appender(self, topic: str, partition: int) -> FastAppender | None:
        """An appender for ``topic``'s ``partition`` (see
        :meth:`~gateway.core.contract.Backend.fast_appender`): the partition's
        :meth:`~gateway.store.partition.Partition.append_plain`, counted as
        :meth:`produce_nowait` counts it. It looks the partition up on every call, so a
        topic deleted and created again is found. None in ``fsync`` durability."""
        if self.store.settings.durability != Durability.OS.value:
            return None
        key = (topic, partition)
        appender = self._appenders.get(key)
        if appender is None:
            if len(self._appenders) >= self.store.settings.max_partitions:
                self._appenders.clear()  # names of partitions gone since: start again
            appender = self._appenders[key] = self._make_appender(topic, partition)
        return appender

    def _make_appender(self, topic: str, partition: int) -> FastAppender:
        find = self.store.find_partition
        metrics = self._metrics

        def append(bundle: bytes, msg_count: int) -> bool:
            if self._awaiting_topic and self._awaiting_topic.get(topic) is not None:
                return False  # what waits for the topic's creation goes first
            target = find(topic, partition)
            if target is None:
                return False
            started = _perf_counter()
            result = target.append_plain(bundle, msg_count)
            if result is None:
                return False
            if metrics is not None:
                metrics.appended(topic, msg_count, result.size)
                metrics.append_seconds.observe(_perf_counter() - started)
            return True

        return append

    def _writable_partition_nowait(self, topic: str, index: int
                                   ) -> Partition | ProduceOutcome | None:
        """The partition to append to, why not, or None when its topic must be created."""
        try:
            return self.store.partition(topic, index)
        except UnknownTopic as exc:
            if self.auto_create.allows(topic):
                return None
            return ProduceOutcome(ProduceCode.UNKNOWN_TOPIC, reason=str(exc))
        except UnknownPartition as exc:
            return ProduceOutcome(ProduceCode.UNKNOWN_PARTITION, reason=str(exc))

    async def _create_then_append(self, topic: str) -> None:
        """Create ``topic``, then append what waited for it, in arrival order."""
        error: StoreError | None = None
        try:
            await self.auto_create.create(topic, self.create_topic)
        except TopicRefused as exc:  # answered as an unknown topic, saying why
            # ... unless the store could not write it: a server fault, not the client's.
            error = StoreIOError(str(exc), exc.fault) if exc.fault else UnknownTopic(str(exc))
        waiting = self._awaiting_topic.pop(topic)
        for index, entries, report in waiting:
            try:
                if error is not None:
                    raise error
                partition = self.store.partition(topic, index)
            except StoreError as exc:
                report([exc] * len(entries))
                continue
            partition.append_nowait(entries, report)

    # -- fetch -------------------------------------------------------------------------------------

    def fetch_nowait(self, requests: Sequence[FetchRequest]) -> list[FetchOutcome] | None:
        """What :meth:`fetch` answers at once, or None when every partition is at its tail
        (or waits for a damage check of a segment it needs: see :meth:`fetch`)."""
        partitions = [self._readable_partition(r) for r in requests]
        outcomes = [self._read(p, r.seq, r.fetch_size, [], i)
                    for i, (p, r) in enumerate(zip(partitions, requests, strict=True))]
        if any(_answers_now(o) for o in outcomes):
            return outcomes
        return None  # empty chunks: nothing to close

    def watch_tail(self, topic: str, partition: int, seq: int,
                   on_change: TailChange) -> None:
        """None: readers at the tail long-poll the store (:meth:`fetch`)."""
        return None

    async def fetch(self, requests: Sequence[FetchRequest], *, max_wait_ms: int,
                    min_bytes: int) -> list[FetchOutcome]:
        """Read each partition; long-poll per Tank's rules when all are at their tail.

        A partition whose read needs a rolled segment checked for damage first (the
        first read of a big one, in a worker thread) is read once the check is done,
        whatever ``max_wait_ms``: the check is part of the read, not a wait for data.
        """
        partitions = [self._readable_partition(r) for r in requests]
        outcomes = await self._read_checked(partitions, [(r.seq, r.fetch_size)
                                                         for r in requests])
        if max_wait_ms <= 0 or any(_answers_now(o) for o in outcomes):
            return outcomes
        # Every partition is at its tail: wait from the sequences just resolved (a
        # request for the tail, UINT64_MAX, must not move on with the high-water mark).
        waiting = [(p, o.resolved_seq or 0) for p, o in zip(partitions, outcomes, strict=True)
                   if isinstance(p, Partition)]
        appended_at_start = [p.appended_bytes for p, _ in waiting]
        deadline = trio.current_time() + max_wait_ms / 1000
        needed = max(min_bytes, 1)
        while True:
            if not await _wait_any_change([p for p, _ in waiting], deadline):
                break
            grown = sum(p.appended_bytes - start
                        for (p, _), start in zip(waiting, appended_at_start, strict=True))
            if grown >= needed:
                break
        resolved = iter(seq for _, seq in waiting)
        again = [(next(resolved) if isinstance(p, Partition) else r.seq, r.fetch_size)
                 for p, r in zip(partitions, requests, strict=True)]
        return await self._read_checked(partitions, again)

    async def _read_checked(self, partitions: list[Partition | FetchOutcome],
                            reads: list[tuple[int, int]]) -> list[FetchOutcome]:
        """Read ``(seq, fetch_size)`` from each partition, waiting for the damage checks
        a read needs and reading again after them."""
        pending: list[int] = []
        outcomes = [self._read(p, seq, size, pending, i)
                    for i, (p, (seq, size)) in enumerate(zip(partitions, reads, strict=True))]
        while pending:
            waiting, pending = pending, []
            for i in waiting:
                partition = partitions[i]
                assert isinstance(partition, Partition)
                await partition.wait_checks()
                outcomes[i] = self._read(partition, *reads[i], pending, i)
        return outcomes

    def _readable_partition(self, request: FetchRequest) -> Partition | FetchOutcome:
        try:
            return self.store.partition(request.topic, request.partition)
        except UnknownTopic:
            return FetchOutcome(FetchStatus.UNKNOWN_TOPIC)
        except UnknownPartition:
            return FetchOutcome(FetchStatus.UNKNOWN_PARTITION)

    def _read(self, partition: Partition | FetchOutcome, seq: int, fetch_size: int,
              pending: list[int], i: int) -> FetchOutcome:
        """One partition's read; a read that must wait for a damage check adds ``i`` to
        ``pending`` and finds nothing for now. A read the partition's other readers made
        since its last change is shared (:attr:`shared_reads`)."""
        if isinstance(partition, FetchOutcome):
            return partition
        shared = self.shared_reads
        if shared is not None:
            hit = shared.get(partition, seq, fetch_size)
            if hit is not None:
                return hit
        try:
            result = partition.read(seq, fetch_size)
        except SegmentCheckPending:
            pending.append(i)
            return FetchOutcome(FetchStatus.DATA, high_water_mark=partition.high_water_mark,
                                first_available=partition.first_available, resolved_seq=seq)
        except OutOfRange as exc:
            return FetchOutcome(FetchStatus.BOUNDARY, high_water_mark=exc.high_water_mark,
                                first_available=exc.first_available)
        except StoreError as exc:
            log.error("read_failed", topic=partition.topic, partition=partition.index,
                      seq=seq, error=str(exc))
            return FetchOutcome(FetchStatus.FAULT, high_water_mark=partition.high_water_mark,
                                first_available=partition.first_available)
        if result.at_tail:
            result.close()
            return FetchOutcome(FetchStatus.DATA, high_water_mark=result.high_water_mark,
                                first_available=result.first_available,
                                resolved_seq=result.seq)
        if shared is not None and result.fileno() == -1:  # in memory: shareable
            outcome = shared.share(partition, seq, fetch_size, result)
            if outcome is not None:
                return outcome
        return read_outcome(result, result)

    # -- admin -------------------------------------------------------------------------------------

    async def create_topic(self, name: str, partitions: int, config: str = ""
                           ) -> CreateTopicCode:
        if partitions <= 0:
            return CreateTopicCode.INVALID
        try:
            await self.store.create_topic(name, partitions, config)
        except TopicExists:
            return CreateTopicCode.EXISTS
        except InvalidTopicName:
            return CreateTopicCode.INVALID
        except InvalidConfig as exc:
            log.warning("create_topic_bad_config", topic=name, error=str(exc))
            return CreateTopicCode.BAD_CONFIG
        except LimitReached as exc:
            if self._metrics is not None:
                self._metrics.limit_hit(exc.limit)
            log.warning("topic_limit_reached", limit=exc.limit, topic=name,
                        partitions=partitions, topics_held=self.store.topic_count,
                        partitions_held=self.store.partition_count, error=str(exc))
            self._refusal = (name, Refusal(str(exc)))
            return CreateTopicCode.SYSTEM_ERROR
        except StoreIOError as exc:  # logged by the store
            self._refusal = (name, Refusal(str(exc), exc.kind))
            return CreateTopicCode.SYSTEM_ERROR
        except StoreError as exc:
            log.error("create_topic_failed", topic=name, error=str(exc))
            return CreateTopicCode.SYSTEM_ERROR
        return CreateTopicCode.OK

    def _explain_refusal(self, topic: str) -> Refusal | None:
        """Why creating ``topic`` was just refused, if a limit or a store fault did."""
        refusal, self._refusal = self._refusal, None
        return refusal[1] if refusal is not None and refusal[0] == topic else None

    def not_writable(self) -> str | None:
        """Why the store can not write now (``/health`` is not ready meanwhile), or None."""
        why = self.store.not_writable()
        return None if why is None else f"store not writable: {why}"

    async def discover_partitions(self, topic: str) -> list[PartitionInfo] | None:
        found = self.store.topic(topic)
        if found is None:
            return None
        return [PartitionInfo(p.first_available, p.high_water_mark) for p in found.partitions]

    async def discover_topics(self) -> list[TopicInfo]:
        return [TopicInfo(name, len(self.store.topic(name).partitions))  # type: ignore[union-attr]
                for name in self.store.topics()]

    async def reload_conf(self, topic: str, partition: int) -> ReloadConfCode:
        try:
            await self.store.reload_config(topic, partition)
        except UnknownTopic:
            return ReloadConfCode.UNKNOWN_TOPIC
        except UnknownPartition:
            return ReloadConfCode.UNKNOWN_PARTITION
        except InvalidConfig as exc:
            log.warning("reload_conf_bad_config", topic=topic, partition=partition,
                        error=str(exc))
            return ReloadConfCode.PARSE_ERROR
        except (OSError, StoreError):
            return ReloadConfCode.IO_ERROR
        return ReloadConfCode.OK

    def topic_configs(self) -> TopicConfigs:
        """The store's topic settings: its defaults, bounds and each topic's."""
        settings = self.store.settings
        return TopicConfigs(settings.topic_defaults, settings.config_bounds, self._topic_config)

    def _topic_config(self, name: str) -> TopicConfig | None:
        topic = self.store.topic(name)
        return topic.config if topic is not None else None

    async def status(self) -> BackendStatus:
        topics = [self.store.topic(name) for name in self.store.topics()]
        partitions = sum(len(t.partitions) for t in topics if t is not None)
        return BackendStatus(
            topics=len(topics), partitions=partitions, open_partitions=partitions,
            open_time_ms=int((time.time() - self._opened_at) * 1000) & 0xFFFFFFFF,
            startup_ts=int(self._opened_at) & 0xFFFFFFFF, version=_version_number())

    def partition_sizes(self) -> list[tuple[list[str], float]]:
        """``([topic, partition], bytes)`` for every partition: the store-size gauge. Safe
        in the endpoint's worker thread: it only reads (``topics()`` is a copy)."""
        samples = []
        for name in self.store.topics():
            topic = self.store.topic(name)
            for p in topic.partitions if topic is not None else ():
                samples.append(([name, str(p.index)], float(p.size_bytes)))
        return samples

    def stored_producer(self, topic: str, partition: int, producer_id: int
                        ) -> StoredProducer | None:
        """What the partition durably remembers of an idempotent Kafka producer (kept with
        its batches, so it outlives a restart), or None."""
        try:
            return self.store.partition(topic, partition).stored_producer(producer_id)
        except StoreError:
            return None

    async def aclose(self) -> None:
        await self.store.aclose()


_OK: Final = ProduceCode.OK
_perf_counter: Final = time.perf_counter


def _outcome(batch: ProduceBatch, result: AppendResult | StoreError) -> ProduceOutcome:
    if isinstance(result, AppendResult):
        return ProduceOutcome(ProduceCode.OK, result.first_seq, result.last_seq)
    if isinstance(result, InvalidSequence):
        return ProduceOutcome(ProduceCode.INVALID_SEQUENCE, reason=str(result))
    if isinstance(result, UnknownTopic):
        return ProduceOutcome(ProduceCode.UNKNOWN_TOPIC, reason=str(result))
    if isinstance(result, StoreIOError):  # the store logged it (rate-limited)
        return ProduceOutcome(ProduceCode.IO_FAULT, reason=str(result), fault=result.kind)
    if not isinstance(result, (InvalidBundle, BundleTooLarge)):
        log.error("append_failed", topic=batch.topic, partition=batch.partition,
                  error=str(result))
    return ProduceOutcome(ProduceCode.IO_FAULT, reason=str(result))


def _answers_now(outcome: FetchOutcome) -> bool:
    return outcome.status is not FetchStatus.DATA or outcome.chunk.length > 0


async def _wait_any_change(partitions: list[Partition], deadline: float) -> bool:
    """Park until any partition makes an append visible; False once the deadline passes.

    No task per partition: one partition's readers share its event, and a wait on several
    registers one event with each of them.
    """
    if not partitions:
        await trio.sleep_until(deadline)
        return False
    if len(partitions) == 1:
        with trio.move_on_at(deadline) as scope:
            await partitions[0].wait_changed()
        return not scope.cancelled_caught
    event = trio.Event()
    for p in partitions:
        p.add_waiter(event)
    try:
        with trio.move_on_at(deadline) as scope:
            await event.wait()
    finally:
        for p in partitions:
            p.remove_waiter(event)
    return not scope.cancelled_caught


_Report = Callable[[list[AppendResult | StoreError]], None]


class _ProduceCall:
    """The outcomes of one :meth:`EmbeddedBackend.produce_nowait`, partition by partition."""

    __slots__ = ("_metrics", "_on_done", "_outcomes", "_started", "_waiting")

    def __init__(self, size: int, on_done: Callable[[list[ProduceOutcome]], None],
                 metrics: Metrics | None) -> None:
        self._outcomes: list[ProduceOutcome | None] = [None] * size
        self._on_done = on_done
        self._metrics = metrics
        self._started = time.perf_counter()
        self._waiting = 1  # released by release(), once every partition is under way

    def expect(self) -> None:
        self._waiting += 1

    def refused(self, indexes: list[int], outcome: ProduceOutcome) -> None:
        for i in indexes:
            self._outcomes[i] = outcome
        self.release()

    def partition_done(self, batches: Sequence[ProduceBatch], indexes: list[int],
                       results: list[AppendResult | StoreError]) -> None:
        appended = appended_bytes = 0
        for i, result in zip(indexes, results, strict=True):
            self._outcomes[i] = _outcome(batches[i], result)
            if isinstance(result, AppendResult):
                appended += result.last_seq - result.first_seq + 1
                appended_bytes += result.size
        self.release()  # the answer first, the metrics after
        if self._metrics is not None and appended:
            topic = batches[indexes[0]].topic
            self._metrics.appended(topic, appended, appended_bytes)

    def release(self) -> None:
        self._waiting -= 1
        if self._waiting:
            return
        elapsed = time.perf_counter() - self._started
        self._on_done(self._outcomes)  # type: ignore[arg-type]  # every slot filled
        if self._metrics is not None:
            self._metrics.append_seconds.observe(elapsed)


@dataclass(frozen=True, slots=True)
class EmbeddedSettings(Section):
    """What the embedded store backend is configured with (``store.*``, the topics'
    defaults and the store's limits)."""

    data_dir: Path = setting("store.data_dir")
    durability: str = setting("store.durability")
    max_bundle_bytes: int = setting("store.max_bundle_bytes")
    retention_check_secs: float = setting("store.retention_check_secs")
    check_rolled_segments: str = setting("store.check_rolled_segments")
    tail_cache_bytes: int = setting("store.tail_cache_bytes")
    min_free_bytes: int = setting("store.min_free_bytes")
    min_free_percent: float = setting("store.min_free_percent")
    max_prefill_bytes: int = setting("store.max_prefill_bytes")
    auto_create_topics: bool = setting("topics.auto_create")
    default_partitions: int = setting("topics.default_partitions")
    topic_config: dict[str, str] = setting("topics.config")
    max_topics: int = setting("limits.max_topics")
    max_partitions: int = setting("limits.max_partitions")
    max_open_segments: int = setting("limits.max_open_segments")
    open_files: int = setting("limits.open_files")
    max_producer_states: int = setting("limits.max_producer_states")


def store_settings(settings: EmbeddedSettings, config_bounds: ConfigBounds | None = None,
                   connection_slots: int = 0) -> StoreSettings:
    """The store's settings derived from the gateway's (``config_bounds``: the default
    minimums of client-set topic config unless given, for tests; ``connection_slots``:
    the connections every listener together may hold, each a descriptor)."""
    return StoreSettings(
        durability=settings.durability,
        max_bundle_size=settings.max_bundle_bytes,
        default_partitions=settings.default_partitions,
        topic_defaults=TopicConfig().with_keys(settings.topic_config),
        maintenance_interval=settings.retention_check_secs or math.inf,
        tail_cache_bytes=settings.tail_cache_bytes,
        max_open_segments=settings.max_open_segments,
        max_topics=settings.max_topics,
        max_partitions=settings.max_partitions,
        config_bounds=config_bounds or ConfigBounds(),
        check_rolled_segments=settings.check_rolled_segments,
        descriptor_allowance=settings.max_open_segments + connection_slots,
        raise_descriptor_limit=settings.open_files == 0,
        max_producer_states=settings.max_producer_states,
        min_free_bytes=settings.min_free_bytes,
        min_free_percent=settings.min_free_percent,
        max_prefill_bytes=settings.max_prefill_bytes,
    )


@asynccontextmanager
async def open_embedded_backend(settings: EmbeddedSettings, metrics: Metrics | None = None, *,
                                config_bounds: ConfigBounds | None = None,
                                connection_slots: int = 0
                                ) -> AsyncIterator[EmbeddedBackend]:
    """Open (and recover) the store in ``settings.data_dir`` and serve it as a backend.

    On exit, pending appends finish and are fsynced before the store closes.
    ``config_bounds`` replaces the minimums of client-set topic config (tests that force
    small segments through CreateTopic). ``connection_slots``: the connections the
    server's listeners together may hold (each a descriptor: the store's descriptor
    budget leaves them room).
    """
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    observe = None if metrics is None else metrics.fsync_seconds.observe
    on_data_loss = None if metrics is None else metrics.data_lost
    on_evicted = None if metrics is None else partial(metrics.limit_hit, "max_producer_states")
    on_failure = None if metrics is None else _count_failures(metrics)
    async with open_store(settings.data_dir,
                          store_settings(settings, config_bounds, connection_slots),
                          observe_fsync=observe, on_data_loss=on_data_loss,
                          on_producer_evicted=on_evicted,
                          on_write_failure=on_failure) as store:
        backend = EmbeddedBackend(store, auto_create_topics=settings.auto_create_topics,
                                  metrics=metrics)
        if metrics is not None:
            metrics.include(metrics.fsync_seconds, metrics.data_loss_events,
                            metrics.data_loss_messages, metrics.data_loss_bytes,
                            metrics.store_write_failures)
            metrics.add_collector(GaugeCollector(
                "figtank_partition_bytes", "Bytes held by each partition's segments.",
                ["topic", "partition"],
                lambda: metrics.fold_topics(backend.partition_sizes(), operator.add)))
            metrics.add_collector(GaugeCollector(
                "figtank_tail_cache_bytes",
                "Bytes of the newest bundles held in memory for the readers at the tail.",
                [], lambda: [([], float(store.tail_cache.size))]))
            _add_store_gauges(metrics, store)
        try:
            yield backend
        finally:
            await backend.aclose()


def _add_store_gauges(metrics: Metrics, store: LogStore) -> None:
    """Gauges of what the store holds against its limits, and of the descriptors."""
    def gauge(name: str, help: str, value: Callable[[], float | None]) -> None:
        def samples() -> list[tuple[list[str], float]]:
            v = value()
            return [] if v is None else [([], float(v))]
        metrics.add_collector(GaugeCollector(name, help, [], samples))

    gauge("figtank_topics", "Topics held (limits.max_topics).", lambda: store.topic_count)
    gauge("figtank_partitions", "Partitions of all topics (limits.max_partitions).",
          lambda: store.partition_count)
    gauge("figtank_stored_producer_states",
          "Idempotent Kafka producers remembered durably by all partitions together "
          "(limits.max_producer_states).", lambda: store.producers.held)
    gauge("figtank_open_segment_files",
          "Rolled segment files open for readers (limits.max_open_segments).",
          lambda: len(store.open_files))
    gauge("figtank_open_descriptors", "File descriptors the process has open.",
          open_descriptors)
    gauge("figtank_descriptor_limit", "The process's descriptor limit (soft RLIMIT_NOFILE).",
          lambda: descriptor_limits()[0])
    _add_disk_gauges(metrics, store)


def _count_failures(metrics: Metrics) -> Callable[[str], None]:
    """``figtank_store_write_failures{kind}``, counted as the store reports them."""
    children = {kind: metrics.store_write_failures.labels(kind)
                for kind in ("below_floor", "no_space", "read_only", "io_error", "fsync")}

    def count(kind: str) -> None:
        child = children.get(kind)
        if child is None:
            child = children[kind] = metrics.store_write_failures.labels(kind)
        child.inc()
    return count


def _add_disk_gauges(metrics: Metrics, store: LogStore) -> None:
    """Gauges of the data directory's disk, as the store last looked at it (every
    second)."""
    disk = store.disk
    where = [store.data_dir]

    def of(value: Callable[[], float]) -> Callable[[], list[tuple[list[str], float]]]:
        return lambda: [(where, float(value()))]

    for name, help, value in (
            ("figtank_store_free_bytes", "Bytes free to the store on its data directory's "
             "filesystem (statvfs f_bavail), by data directory.", lambda: disk.free),
            ("figtank_store_min_free_bytes", "The floor of free space the store keeps "
             "(store.min_free_bytes, capped at store.min_free_percent of the filesystem).",
             lambda: disk.floor),
            ("figtank_store_writable", "1 while the store can write, 0 while it can not "
             "(disk full or below the floor, read-only, failing writes or fsyncs: /health "
             "says why).", lambda: disk.not_writable() is None)):
        metrics.add_collector(GaugeCollector(name, help, ["directory"], of(value)))
    metrics.add_collector(GaugeCollector(
        "figtank_store_prefill_bytes", "Zeros written ahead of the active segments in fsync "
        "durability, all together (store.max_prefill_bytes).", [],
        lambda: [([], float(disk.prefill_bytes))]))
