"""A tiny in-memory :class:`~gateway.core.contract.Backend`: a unit-test aid only.

The Must-show tests run against the embedded store; this one lets the listener's own
logic be tested without files, and lets a test drop old bundles by hand.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import trio

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
    ProduceQueue,
    ReloadConfCode,
    TopicInfo,
    TopicRefused,
)
from protocols.errors import ProtocolError
from protocols.tank.bundle import bundle_last_seq, frame_bundle, validate_bundle
from protocols.wire import UINT64_MAX


@dataclass
class _Partition:
    bundles: list[tuple[int, int, bytes]] = field(default_factory=list)  # first, last, framed
    hwm: int = 0
    first: int = 1

    def read(self, seq: int, fetch_size: int) -> tuple[int, bytes]:
        parts: list[bytes] = []
        size = 0
        base = 0
        for first, last, framed in self.bundles:
            if last < seq:
                continue
            if not parts:
                base = first
            parts.append(framed)
            size += len(framed)
            if size >= max(fetch_size, 32):
                break
        return base, b"".join(parts)


class MemoryBackend:
    """Everything in dicts; ``produce_delay`` slows appends down (group commit tests)."""

    #: No upstream to go away (the tail readers watch none).
    has_upstream = False

    def __init__(self, *, auto_create_topics: bool = True, default_partitions: int = 1) -> None:
        self.auto_create = AutoCreate(auto_create_topics, default_partitions)
        self.topics: dict[str, list[_Partition]] = {}
        self.produce_calls: list[list[ProduceBatch]] = []
        self.produce_delay = 0.0
        #: When set, fetches wait for this event first.
        self.fetch_gate: trio.Event | None = None
        #: Cut chunks at the fetch size, leaving a partial last bundle (TANK 1 style).
        self.cut_chunks = False
        self._changed = trio.Event()
        self._produce_queue: ProduceQueue | None = None

    def unavailable(self) -> None:
        """Never away."""
        return None

    async def produce(self, batches: Sequence[ProduceBatch]) -> list[ProduceOutcome]:
        self.produce_calls.append(list(batches))
        if self.produce_delay:
            await trio.sleep(self.produce_delay)
        else:
            await trio.lowlevel.checkpoint()
        outcomes = []
        for batch in batches:
            if batch.topic not in self.topics:
                try:
                    await self.auto_create.create(batch.topic, self.create_topic)
                except TopicRefused:
                    outcomes.append(ProduceOutcome(ProduceCode.UNKNOWN_TOPIC))
                    continue
            parts = self.topics[batch.topic]
            if batch.partition >= len(parts):
                outcomes.append(ProduceOutcome(ProduceCode.UNKNOWN_PARTITION))
                continue
            p = parts[batch.partition]
            try:
                info = validate_bundle(batch.bundle)
            except ProtocolError as exc:
                outcomes.append(ProduceOutcome(ProduceCode.IO_FAULT, reason=str(exc)))
                continue
            first = p.hwm + 1
            last = bundle_last_seq(info, first)
            p.bundles.append((first, last, frame_bundle(batch.bundle)))
            p.hwm = last
            outcomes.append(ProduceOutcome(ProduceCode.OK, first, last))
        self._notify()
        return outcomes

    def produce_nowait(self, batches: Sequence[ProduceBatch], on_done: ProduceDone) -> None:
        if self._produce_queue is None:
            self._produce_queue = ProduceQueue(self.produce, trio.lowlevel.spawn_system_task)
        self._produce_queue.submit(batches, on_done)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def trim(self, topic: str, partition: int, bundles: int) -> None:
        """Drop the oldest ``bundles`` bundles, as retention would."""
        p = self.topics[topic][partition]
        del p.bundles[:bundles]
        p.first = p.bundles[0][0] if p.bundles else p.hwm + 1

    def fetch_nowait(self, requests: Sequence[FetchRequest]) -> None:
        return None  # everything goes through fetch (with its gate and checkpoints)

    def watch_tail(self, topic: str, partition: int, seq: int, on_change: object) -> None:
        return None  # readers at the tail long-poll fetch

    async def fetch(self, requests: Sequence[FetchRequest], *, max_wait_ms: int,
                    min_bytes: int) -> list[FetchOutcome]:
        if self.fetch_gate is not None:
            await self.fetch_gate.wait()
        with trio.move_on_after(max_wait_ms / 1000):
            while True:
                outcomes = [self._fetch_one(r) for r in requests]
                if any(o.status is not FetchStatus.DATA or o.chunk.length for o in outcomes):
                    await trio.lowlevel.checkpoint()
                    return outcomes
                await self._changed.wait()
        return [self._fetch_one(r) for r in requests]

    def _fetch_one(self, r: FetchRequest) -> FetchOutcome:
        parts = self.topics.get(r.topic)
        if parts is None:
            return FetchOutcome(FetchStatus.UNKNOWN_TOPIC)
        if r.partition >= len(parts):
            return FetchOutcome(FetchStatus.UNKNOWN_PARTITION)
        p = parts[r.partition]
        seq = p.first if r.seq == 0 else p.hwm + 1 if r.seq == UINT64_MAX else r.seq
        if not p.first <= seq <= p.hwm + 1:
            return FetchOutcome(FetchStatus.BOUNDARY, p.hwm, p.first)
        base, data = p.read(seq, r.fetch_size)
        if self.cut_chunks:
            data = data[:r.fetch_size]
        return FetchOutcome(FetchStatus.DATA, p.hwm, p.first, base if data else None,
                            BytesChunk(data), resolved_seq=seq)

    async def create_topic(self, name: str, partitions: int, config: str = ""
                           ) -> CreateTopicCode:
        await trio.lowlevel.checkpoint()
        if name in self.topics:
            return CreateTopicCode.EXISTS
        self.topics[name] = [_Partition() for _ in range(partitions)]
        return CreateTopicCode.OK

    async def discover_partitions(self, topic: str) -> list[PartitionInfo] | None:
        await trio.lowlevel.checkpoint()
        parts = self.topics.get(topic)
        if parts is None:
            return None
        return [PartitionInfo(p.first if p.hwm else 0, p.hwm) for p in parts]

    async def discover_topics(self) -> list[TopicInfo]:
        return [TopicInfo(n, len(p)) for n, p in self.topics.items()]

    async def reload_conf(self, topic: str, partition: int) -> ReloadConfCode:
        return ReloadConfCode.OK

    def topic_configs(self) -> None:
        """None: no topic settings kept."""
        return None

    def fast_appender(self, topic: str, partition: int) -> None:
        """No one-pass appends: every Produce goes through :meth:`produce_nowait`."""
        return None

    async def status(self) -> BackendStatus:
        n = sum(len(p) for p in self.topics.values())
        return BackendStatus(len(self.topics), n, n, 0, 0, 1)

    async def aclose(self) -> None:
        pass
