"""The default backend: the embedded log store in Tank's on-disk format."""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version

import structlog
import trio

from gateway.backend import (
    EMPTY_CHUNK,
    BackendStatus,
    CreateTopicCode,
    FetchOutcome,
    FetchRequest,
    FetchStatus,
    PartitionInfo,
    ProduceBatch,
    ProduceCode,
    ProduceOutcome,
    ReloadConfCode,
    TopicInfo,
)
from gateway.config import Settings
from gateway.metrics import GaugeCollector, Metrics
from gateway.store import (
    AppendResult,
    BundleTooLarge,
    InvalidBundle,
    InvalidConfig,
    InvalidSequence,
    InvalidTopicName,
    LogStore,
    OutOfRange,
    Partition,
    StoreError,
    StoreSettings,
    TopicConfig,
    TopicExists,
    UnknownPartition,
    UnknownTopic,
    open_store,
)

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

    def __init__(self, store: LogStore, *, auto_create_topics: bool = True,
                 metrics: Metrics | None = None) -> None:
        self.store = store
        self.auto_create_topics = auto_create_topics
        self._metrics = metrics
        self._opened_at = time.time()

    # -- produce -----------------------------------------------------------------------------------

    async def produce(self, batches: Sequence[ProduceBatch]) -> list[ProduceOutcome]:
        """Append every batch; partitions proceed in parallel, one partition in order."""
        started = time.perf_counter()
        outcomes: list[ProduceOutcome | None] = [None] * len(batches)
        by_partition: dict[tuple[str, int], list[int]] = {}
        for i, batch in enumerate(batches):
            by_partition.setdefault((batch.topic, batch.partition), []).append(i)
        groups = list(by_partition.values())
        if len(groups) == 1:
            await self._append_in_order(batches, groups[0], outcomes)
        else:
            async with trio.open_nursery() as nursery:
                for indexes in groups:
                    nursery.start_soon(self._append_in_order, batches, indexes, outcomes)
        if self._metrics is not None:
            self._metrics.append_seconds.observe(time.perf_counter() - started)
        return outcomes  # type: ignore[return-value]  # every slot filled above

    async def _append_in_order(self, batches: Sequence[ProduceBatch], indexes: list[int],
                               outcomes: list[ProduceOutcome | None]) -> None:
        first = batches[indexes[0]]
        partition = await self._writable_partition(first.topic, first.partition)
        if isinstance(partition, ProduceOutcome):
            for i in indexes:
                outcomes[i] = partition
            return
        # One call writes them all and waits once: they share a group fsync.
        results = await partition.append_many(
            [(batches[i].bundle, batches[i].base_seq) for i in indexes])
        appended = appended_bytes = 0
        for i, result in zip(indexes, results, strict=True):
            outcomes[i] = _outcome(first, result)
            if isinstance(result, AppendResult):
                appended += result.last_seq - result.first_seq + 1
                appended_bytes += result.size
        if self._metrics is not None and appended:
            self._metrics.messages_in.labels(first.topic).inc(appended)
            self._metrics.bytes_in.labels(first.topic).inc(appended_bytes)

    async def _writable_partition(self, topic: str, index: int) -> Partition | ProduceOutcome:
        """The partition to append to (its topic auto-created if allowed), or why not."""
        try:
            if self.auto_create_topics:
                await self.store.ensure_topic(topic)  # returns at once if the topic exists
            return self.store.partition(topic, index)
        except (UnknownTopic, InvalidTopicName) as exc:
            return ProduceOutcome(ProduceCode.UNKNOWN_TOPIC, reason=str(exc))
        except UnknownPartition as exc:
            return ProduceOutcome(ProduceCode.UNKNOWN_PARTITION, reason=str(exc))
        except StoreError as exc:
            return ProduceOutcome(ProduceCode.IO_FAULT, reason=str(exc))

    # -- fetch -------------------------------------------------------------------------------------

    async def fetch(self, requests: Sequence[FetchRequest], *, max_wait_ms: int,
                    min_bytes: int) -> list[FetchOutcome]:
        """Read each partition; long-poll per Tank's rules when all are at their tail."""
        partitions = [self._readable_partition(r) for r in requests]
        outcomes = [self._read(p, r.seq, r.fetch_size) for p, r in zip(partitions, requests,
                                                                      strict=True)]
        if max_wait_ms <= 0 or any(_answers_now(o) for o in outcomes):
            return outcomes
        # Every partition is at its tail: wait from the sequences just resolved (a
        # request for the tail, UINT64_MAX, must not move on with the high-water mark).
        waiting = [(p, o.base_seq or 0) for p, o in zip(partitions, outcomes, strict=True)
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
        return [self._read(p, next(resolved), r.fetch_size) if isinstance(p, Partition) else o
                for p, r, o in zip(partitions, requests, outcomes, strict=True)]

    def _readable_partition(self, request: FetchRequest) -> Partition | FetchOutcome:
        try:
            return self.store.partition(request.topic, request.partition)
        except UnknownTopic:
            return FetchOutcome(FetchStatus.UNKNOWN_TOPIC)
        except UnknownPartition:
            return FetchOutcome(FetchStatus.UNKNOWN_PARTITION)

    @staticmethod
    def _read(partition: Partition | FetchOutcome, seq: int, fetch_size: int) -> FetchOutcome:
        if isinstance(partition, FetchOutcome):
            return partition
        try:
            result = partition.read(seq, fetch_size)
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
            # base_seq carries the resolved sequence for the long-poll's re-read.
            return FetchOutcome(FetchStatus.DATA, high_water_mark=result.high_water_mark,
                                first_available=result.first_available,
                                base_seq=result.seq, chunk=EMPTY_CHUNK)
        return FetchOutcome(
            FetchStatus.DATA, high_water_mark=result.high_water_mark,
            first_available=result.first_available,
            base_seq=None if result.first_bundle_sparse else result.base_seq, chunk=result)

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
        except InvalidConfig:
            return CreateTopicCode.BAD_CONFIG
        except StoreError as exc:
            log.error("create_topic_failed", topic=name, error=str(exc))
            return CreateTopicCode.SYSTEM_ERROR
        return CreateTopicCode.OK

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
        except InvalidConfig:
            return ReloadConfCode.PARSE_ERROR
        except (OSError, StoreError):
            return ReloadConfCode.IO_ERROR
        return ReloadConfCode.OK

    async def status(self) -> BackendStatus:
        topics = [self.store.topic(name) for name in self.store.topics()]
        partitions = sum(len(t.partitions) for t in topics if t is not None)
        return BackendStatus(
            topics=len(topics), partitions=partitions, open_partitions=partitions,
            open_time_ms=int((time.time() - self._opened_at) * 1000) & 0xFFFFFFFF,
            startup_ts=int(self._opened_at) & 0xFFFFFFFF, version=_version_number())

    def partition_sizes(self) -> list[tuple[list[str], float]]:
        """``([topic, partition], bytes)`` for every partition: the store-size gauge."""
        samples = []
        for name in self.store.topics():
            topic = self.store.topic(name)
            for p in topic.partitions if topic is not None else ():
                samples.append(([name, str(p.index)], float(p.size_bytes)))
        return samples

    async def aclose(self) -> None:
        await self.store.aclose()


def _outcome(batch: ProduceBatch, result: AppendResult | StoreError) -> ProduceOutcome:
    if isinstance(result, AppendResult):
        return ProduceOutcome(ProduceCode.OK, result.first_seq, result.last_seq)
    if isinstance(result, InvalidSequence):
        return ProduceOutcome(ProduceCode.INVALID_SEQUENCE, reason=str(result))
    if not isinstance(result, (InvalidBundle, BundleTooLarge)):
        log.error("append_failed", topic=batch.topic, partition=batch.partition,
                  error=str(result))
    return ProduceOutcome(ProduceCode.IO_FAULT, reason=str(result))


def _answers_now(outcome: FetchOutcome) -> bool:
    return outcome.status is not FetchStatus.DATA or outcome.chunk.length > 0


async def _wait_any_change(partitions: list[Partition], deadline: float) -> bool:
    """Park until any partition makes an append visible; False once the deadline passes."""
    if not partitions:
        await trio.sleep_until(deadline)
        return False
    events = [p.changed_event() for p in partitions]
    with trio.move_on_at(deadline) as scope:
        if len(events) == 1:
            await events[0].wait()
        else:
            async with trio.open_nursery() as nursery:
                for event in events:
                    nursery.start_soon(_wait_then_cancel, event, nursery.cancel_scope)
    return not scope.cancelled_caught


async def _wait_then_cancel(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


def store_settings(settings: Settings) -> StoreSettings:
    """The store's settings derived from the gateway's."""
    return StoreSettings(
        durability=settings.durability,
        max_bundle_size=settings.max_bundle_bytes,
        default_partitions=settings.default_partitions,
        topic_defaults=TopicConfig().with_keys(settings.topic_config),
        maintenance_interval=settings.retention_check_secs or math.inf,
    )


@asynccontextmanager
async def open_embedded_backend(settings: Settings, metrics: Metrics | None = None
                                ) -> AsyncIterator[EmbeddedBackend]:
    """Open (and recover) the store in ``settings.data_dir`` and serve it as a backend.

    On exit, pending appends finish and are fsynced before the store closes.
    """
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    observe = None if metrics is None else metrics.fsync_seconds.observe
    async with open_store(settings.data_dir, store_settings(settings),
                          observe_fsync=observe) as store:
        backend = EmbeddedBackend(store, auto_create_topics=settings.auto_create_topics,
                                  metrics=metrics)
        if metrics is not None:
            metrics.add_collector(GaugeCollector(
                "figtank_partition_bytes", "Bytes held by each partition's segments.",
                ["topic", "partition"], backend.partition_sizes))
        try:
            yield backend
        finally:
            await backend.aclose()
