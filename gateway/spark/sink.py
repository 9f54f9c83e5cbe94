"""Writing DataFrame rows to a topic: the ``figtank`` batch and streaming sink.

Columns: ``value`` (binary or string, required), ``key`` (binary or string, optional,
null for none), ``partition`` (int, optional) and ``timestamp`` (timestamp, optional;
else the time of the write). Other columns (``topic``, ``sequence`` of a DataFrame read
from figtank) are ignored: the target is the ``topic`` option.

A row goes to its ``partition``; without one, to ``crc32(key) % partitions`` when it
has a key, else to one partition per Produce, moving on after each (sticky round-robin).
Each Spark task produces its rows in bundles of up to ``batchMessages`` messages /
``batchBytes`` bytes, one Produce per flush covering every partition it holds rows for.
Writes are at-least-once: a task Spark retries produces its rows again.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any
from zlib import crc32

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from gateway.client.errors import ProduceFailed, UnknownTopicError
from gateway.client.tank_blocking import BlockingTankClient
from gateway.spark.options import TankOptions
from protocols.tank.bundle import Message

try:  # PySpark >= 4.1
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase
    STREAM_ARROW = True
except ImportError:  # pragma: no cover - PySpark 4.0
    _StreamWriterBase = DataSourceStreamWriter  # type: ignore[misc]
    STREAM_ARROW = False

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
    """What one task wrote: messages per partition."""

    counts: dict[int, int] = field(default_factory=dict)


def check_schema(schema: StructType) -> None:
    """Refuse, on the driver, a DataFrame the sink can not write."""
    types = {f.name: f.dataType for f in schema.fields}
    wanted = {"value": (BinaryType, StringType), "key": (BinaryType, StringType),
              "partition": (IntegerType, LongType, ShortType),
              "timestamp": (TimestampType, TimestampNTZType)}
    if "value" not in types:
        raise WriteFailed(f"figtank writes need a 'value' column; got {schema.simpleString()}")
    for name, allowed in wanted.items():
        if name in types and not isinstance(types[name], allowed):
            raise WriteFailed(f"column {name!r} is {types[name].simpleString()}; expected "
                              f"{' or '.join(t.typeName() for t in allowed)}")


class _Producer:
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
            raise WriteFailed(_describe(self.options, exc)) from None
        for p, msgs in self.pending.items():
            self.counts[p] = self.counts.get(p, 0) + len(msgs)
        self.pending = {}
        self.pending_count = self.pending_bytes = 0
        self._sticky = (self._sticky + 1) % self.partition_count


def _describe(options: TankOptions, exc: ProduceFailed) -> str:
    parts = [f"{t}/{p}: {PRODUCE_CODES.get(code, 'error')} (Tank code {code})"
             for (t, p), code in sorted(exc.errors.items())]
    return f"the broker at {options.endpoint} refused the write: {'; '.join(parts)}"


def _binary(column: pa.Array) -> list[Any]:
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        column = column.cast(pa.binary())
    return column.to_pylist()


def _millis(column: pa.Array) -> list[Any]:
    ms = column.cast(pa.timestamp("ms", tz=column.type.tz), safe=False)
    return ms.cast(pa.int64()).to_pylist()


def write_batches(options: TankOptions, batches: Iterable[pa.RecordBatch]) -> WriteReport:
    """Produce the rows of Arrow batches (a task's share of the DataFrame)."""
    with BlockingTankClient(options.host, options.port, **options.client_options()) as client:
        producer = _Producer(options, client)
        for batch in batches:
            names = batch.schema.names
            column = batch.column
            producer.add(
                _binary(column(names.index("value"))),
                _binary(column(names.index("key"))) if "key" in names else None,
                column(names.index("partition")).to_pylist() if "partition" in names else None,
                _millis(column(names.index("timestamp"))) if "timestamp" in names else None)
        producer.flush()
        return WriteReport(producer.counts)


def write_rows(options: TankOptions, rows: Iterator[Any]) -> WriteReport:
    """:func:`write_batches` for Spark Rows (PySpark 4.0's streaming sink)."""
    def as_bytes(v: Any) -> bytes | None:
        return v.encode() if isinstance(v, str) else (None if v is None else bytes(v))

    def batches() -> Iterator[pa.RecordBatch]:
        chunk: list[Any] = []
        for row in rows:
            chunk.append(row.asDict())
            if len(chunk) >= options.batch_messages:
                yield _rows_batch(chunk, as_bytes)
                chunk = []
        if chunk:
            yield _rows_batch(chunk, as_bytes)

    return write_batches(options, batches())


def _rows_batch(rows: list[dict[str, Any]], as_bytes: Any) -> pa.RecordBatch:
    columns: dict[str, pa.Array] = {
        "value": pa.array([as_bytes(r["value"]) for r in rows], pa.binary())}
    if "key" in rows[0]:
        columns["key"] = pa.array([as_bytes(r["key"]) for r in rows], pa.binary())
    if "partition" in rows[0]:
        columns["partition"] = pa.array([r["partition"] for r in rows], pa.int64())
    if "timestamp" in rows[0]:
        columns["timestamp"] = pa.array([r["timestamp"] for r in rows], pa.timestamp("us"))
    return pa.RecordBatch.from_pydict(columns)


class FigtankWriter(DataSourceArrowWriter):
    """Batch sink: ``df.write.format("figtank").option("topic", ...).mode("append")``."""

    def __init__(self, options: TankOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteReport:
        return write_batches(self.options, iterator)


class FigtankStreamWriter(_StreamWriterBase):  # type: ignore[misc,valid-type]
    """Streaming sink: every micro-batch's rows are produced as the batch sink does."""

    def __init__(self, options: TankOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> WriteReport:
        if STREAM_ARROW:
            return write_batches(self.options, iterator)
        return write_rows(self.options, iterator)  # pragma: no cover - PySpark 4.0

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass  # each task's produce was acknowledged already

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass  # produced messages can not be taken back
