"""Reads away from the tail: a reader older than its partition's feed cache, or a lookup.

A read assigns one partition, at the reader's offset, to a consumer of a small pool and
polls it until it has about the bytes asked, has taken what librdkafka had prefetched,
reaches the partition's end, or a short wait passes with nothing; all of it in a worker
thread (``assign`` and ``consume`` block). A consumer is lent to one read at a time and
kept assigned afterwards, so the next read of the same reader (which continues where the
last ended) finds its records already prefetched.
``max_consumers`` bounds the consumers (and so the concurrent history reads: more wait
their turn).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from protocols.kafka.batch import InvalidRecord
from protocols.kafka.upstream import ClientRecord, UpstreamBundle, records_to_bundles

#: Records taken from librdkafka at a time.
_BATCH = 500


@dataclass(slots=True)
class HistoryRead:
    """What one read found: bundles, or an error (librdkafka's name, text); the
    partition's high watermark as last seen (0: unknown)."""

    bundles: list[UpstreamBundle] = field(default_factory=list)
    error: tuple[str, str] | None = None
    high_water_mark: int = 0
    #: The read reached the end of the partition.
    at_end: bool = False


@dataclass(slots=True)
class _Pooled:
    consumer: Any
    #: ``(topic, partition, next offset)`` the consumer is positioned at, if any.
    position: tuple[str, int, int] | None = None


class HistoryReader:
    """Reads from a position with a pool of consumers; see the module doc.

    ``make_consumer()`` builds a ``confluent_kafka.Consumer``; ``make_partition(topic,
    partition, offset)`` a ``TopicPartition``.
    """

    def __init__(self, make_consumer: Callable[[], Any], make_partition: Callable[..., Any],
                 *, max_consumers: int = 8, wait_secs: float = 0.5) -> None:
        self._make_consumer = make_consumer
        self._partition = make_partition
        self.max_consumers = max_consumers
        self.wait_secs = wait_secs
        self._idle: list[_Pooled] = []
        self._made = 0
        self._limiter = trio.CapacityLimiter(max_consumers)
        #: Reads made, and those that found their consumer already in place.
        self.reads = 0
        self.continued = 0

    async def read(self, topic: str, partition: int, seq: int, max_bytes: int) -> HistoryRead:
        """Read ``topic``/``partition`` from sequence ``seq`` (offset ``seq - 1``)."""
        async with self._limiter:
            pooled = self._take(topic, partition, seq - 1)
            self.reads += 1
            try:
                return await trio.to_thread.run_sync(
                    self._read, pooled, topic, partition, seq - 1, max_bytes,
                    limiter=trio.CapacityLimiter(1))
            finally:
                self._idle.append(pooled)

    def _take(self, topic: str, partition: int, offset: int) -> _Pooled:
        for i, pooled in enumerate(self._idle):
            if pooled.position == (topic, partition, offset):
                self.continued += 1
                return self._idle.pop(i)
        if self._made < self.max_consumers or not self._idle:
            self._made += 1
            return _Pooled(self._make_consumer())
        return self._idle.pop(0)

    def _read(self, pooled: _Pooled, topic: str, partition: int, offset: int,
              max_bytes: int) -> HistoryRead:
        """The read itself (a worker thread)."""
        consumer = pooled.consumer
        where = self._partition(topic, partition, offset)
        if pooled.position != (topic, partition, offset):
            pooled.position = None
            consumer.assign([where])
        result = HistoryRead()
        records: list[ClientRecord] = []
        size = 0
        deadline = time.monotonic() + self.wait_secs
        while size < max_bytes:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            # Once something arrived, take only what librdkafka already holds: a read
            # answers with what there is (a Kafka fetch's min bytes of 1) rather than
            # waiting out its deadline for the bytes asked.
            messages = consumer.consume(_BATCH, 0 if records else min(left, 0.1))
            for m in messages:
                error = m.error()
                if error is not None:
                    if error.name() == "_PARTITION_EOF":
                        result.at_end = True
                    else:
                        result.error = (error.name(), error.str())
                    continue
                records.append((m.offset(), m.timestamp()[1], m.key(), m.value()))
                size += len(m.value() or b"") + len(m.key() or b"")
            if result.at_end or result.error is not None or (
                    records and len(messages) < _BATCH):
                break
        try:
            _, high = consumer.get_watermark_offsets(where, cached=True)
            result.high_water_mark = max(int(high), 0)
        except Exception:
            pass
        if result.error is not None and not records:
            consumer.unassign()
            return result
        result.error = None
        if records:
            try:
                result.bundles = records_to_bundles(records)
            except (InvalidRecord, ValueError) as exc:
                result.error = ("_INVALID_RECORD", f"a record Tank can not hold: {exc}")
                consumer.unassign()
                return result
            pooled.position = (topic, partition, records[-1][0] + 1)
        else:
            pooled.position = (topic, partition, offset)
        return result

    def close(self) -> None:
        """Close every idle consumer (blocking: a worker thread)."""
        for pooled in self._idle:
            pooled.consumer.close()
        self._idle.clear()
