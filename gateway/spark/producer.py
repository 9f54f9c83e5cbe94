"""Buffering a Spark task's rows per target partition and producing them in bundles.

A row goes to its ``partition``; without one, to ``crc32(key) % partitions`` when it
has a key, else to the *sticky* partition (:class:`Producer`: one per Produce, moving on
after each; :class:`~gateway.spark.exactly_once.OnceProducer`: one per task and batch).
Rows are buffered until ``batchMessages`` messages or ``batchBytes`` bytes are pending,
then produced in one request covering every partition they go to (one bundle each).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from zlib import crc32

from pyspark.sql.datasource import WriterCommitMessage

from gateway.client.errors import ProduceFailed, UnknownTopicError
from gateway.client.tank_blocking import BlockingTankClient
from gateway.spark.options import TankOptions
from protocols.tank.bundle import Message

#: Tank's per-partition Produce codes, as a person reads them.
PRODUCE_CODES = {
    1: "unknown partition", 2: "I/O fault or invalid bundle", 3: "ack timeout",
    4: "insufficient replicas", 10: "invalid sequence numbers", 0xFC: "not the leader",
    0xFD: "no leader", 0xFE: "read-only broker", 0xFF: "unknown topic",
}


class WriteFailed(RuntimeError):
    """The broker refused (part of) a write; the message carries its answer."""


@dataclass
class WriteReport(WriterCommitMessage):
    """What one task wrote: messages per partition; for an exactly-once write also the
    messages an earlier attempt had written already (``skipped``), and the query and
    run the task belongs to (the driver names the commit topic by them)."""

    counts: dict[int, int] = field(default_factory=dict)
    skipped: int = 0
    query_id: str = ""
    run_id: str = ""


class Producer:
    """Buffers one task's messages per partition and produces them in bundles."""

    # One Produce at a time: pipelining two from a thread measured no faster (building
    # messages and encoding bundles both hold the GIL).

    def __init__(self, options: TankOptions, client: BlockingTankClient) -> None:
        self.options = options
        self.client = client
        self.pending: dict[int, list[Message]] = {}
        self.pending_count = 0
        self.pending_bytes = 0
        self.counts: dict[int, int] = {}
        try:
            self.partition_count = len(client.discover_partitions(options.topic))
        except UnknownTopicError:
            self.partition_count = 1  # produce auto-creates it (when the broker allows)
        # Rows with neither key nor partition stick to one partition per flush (fewer,
        # larger bundles than row-by-row round-robin).
        self._sticky = 0

    def add(self, values: list[Any], keys: list[Any] | None, partitions: list[Any] | None,
            timestamps: list[Any] | None) -> None:
        if not values:
            return
        # Slices of about batchBytes each (by the batch's mean row size), so a bundle stays
        # near the limit whatever the rows weigh.
        mean = (sum(map(len, values)) + (sum(len(k) for k in keys if k) if keys else 0)
                ) // len(values)
        step = max(1, min(self.options.batch_messages, self.options.batch_bytes // max(1, mean)))
        for lo in range(0, len(values), step):
            hi = lo + step
            self._add(values[lo:hi], None if keys is None else keys[lo:hi],
                      None if partitions is None else partitions[lo:hi],
                      None if timestamps is None else timestamps[lo:hi])
            if (self.pending_count >= self.options.batch_messages
                    or self.pending_bytes >= self.options.batch_bytes):
                self.flush()

    def _add(self, values: list[Any], keys: list[Any] | None, partitions: list[Any] | None,
             timestamps: list[Any] | None) -> None:
        n = len(values)
        if None in values:
            raise WriteFailed("a row to write has a null 'value'")
        count, sticky = self.partition_count, self._sticky
        if keys is None:
            keys = [None] * n
        if partitions is None:
            partitions = [sticky if k is None else crc32(k) % count for k in keys]
        elif None in partitions:
            partitions = [(sticky if k is None else crc32(k) % count) if p is None else p
                          for p, k in zip(partitions, keys, strict=True)]
        pending = self.pending
        for p, v, k, t in zip(partitions, values, keys, timestamps or [0] * n, strict=True):
            bucket = pending.get(p)
            if bucket is None:
                bucket = pending[p] = []
            bucket.append(Message(v, k, t or 0))
        self.pending_count += n
        self.pending_bytes += sum(map(len, values)) + sum(len(k) for k in keys if k)

    def flush(self) -> None:
        if not self.pending:
            return
        batches = {(self.options.topic, p): msgs for p, msgs in self.pending.items()}
        try:
            self.client.produce(batches, codec=self.options.codec)
        except ProduceFailed as exc:
            raise WriteFailed(describe(self.options, exc)) from None
        for p, msgs in self.pending.items():
            self.counts[p] = self.counts.get(p, 0) + len(msgs)
        self.pending = {}
        self.pending_count = self.pending_bytes = 0
        self._sticky = (self._sticky + 1) % self.partition_count

    def finish(self) -> WriteReport:
        """Produce what is still buffered; what the task wrote."""
        self.flush()
        return WriteReport(self.counts)


def describe(options: TankOptions, exc: ProduceFailed) -> str:
    parts = [f"{t}/{p}: {PRODUCE_CODES.get(code, 'error')} (Tank code {code})"
             for (t, p), code in sorted(exc.errors.items())]
    return f"the broker at {options.endpoint} refused the write: {'; '.join(parts)}"
