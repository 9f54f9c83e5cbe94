"""Writing DataFrame rows to a topic: the ``figtank`` batch and streaming sink.

Columns: ``value`` (binary or string, required), ``key`` (binary or string, optional,
null for none), ``partition`` (int, optional) and ``timestamp`` (timestamp, optional;
else the time of the write). Other columns (``topic``, ``sequence`` of a DataFrame read
from figtank) are ignored: the target is the ``topic`` option.

A row goes to its ``partition``; without one, to ``crc32(key) % partitions`` when it
has a key, else to one partition per Produce, moving on after each (sticky round-robin).
Each Spark task produces its rows in bundles of up to ``batchMessages`` messages /
``batchBytes`` bytes, one Produce per flush covering every partition it holds rows for
(:mod:`gateway.spark.producer`).

Streaming writes are exactly-once (:mod:`gateway.spark.exactly_once`): a micro-batch
Spark replays after a crash or a task failure appends nothing twice. With
``exactlyOnce=false``, and for batch writes (``df.write``), writes are at-least-once: a
task Spark retries produces its rows again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

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

from gateway.client.tank_blocking import BlockingTankClient
from gateway.spark.exactly_once import OnceProducer, TaskIdentity, record_commit
from gateway.spark.options import TankOptions
from gateway.spark.producer import Producer, WriteFailed, WriteReport

try:  # PySpark >= 4.1
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase
    STREAM_ARROW = True
except ImportError:  # pragma: no cover - PySpark 4.0
    _StreamWriterBase = DataSourceStreamWriter  # type: ignore[misc,assignment]
    STREAM_ARROW = False

__all__ = ["FigtankStreamWriter", "FigtankWriter", "WriteFailed", "WriteReport",
           "check_schema", "write_batches", "write_rows"]


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


def _binary(column: pa.Array[Any]) -> list[Any]:
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        column = column.cast(pa.binary())
    return column.to_pylist()


def _millis(column: pa.Array[Any]) -> list[Any]:
    ms = column.cast(pa.timestamp("ms", tz=column.type.tz), safe=False)
    return ms.cast(pa.int64()).to_pylist()


def write_batches(options: TankOptions, batches: Iterable[pa.RecordBatch],
                  task: TaskIdentity | None = None) -> WriteReport:
    """Produce the rows of Arrow batches (a task's share of the DataFrame); exactly once
    when ``task`` names the micro-batch and task (:mod:`gateway.spark.exactly_once`)."""
    with BlockingTankClient(options.host, options.port, **options.client_options()) as client:
        producer = Producer(options, client) if task is None else OnceProducer(
            options, client, task)
        if isinstance(producer, OnceProducer) and producer.committed:
            return producer.finish()  # a replay of a committed batch: nothing to write
        for batch in batches:
            names = batch.schema.names
            column = batch.column
            producer.add(
                _binary(column(names.index("value"))),
                _binary(column(names.index("key"))) if "key" in names else None,
                column(names.index("partition")).to_pylist() if "partition" in names else None,
                _millis(column(names.index("timestamp"))) if "timestamp" in names else None)
        return producer.finish()


#: A Row's ``value`` or ``key``: text, bytes (PySpark gives a binary column's as a
#: bytearray), or null.
_Binary = str | bytes | bytearray | None


def write_rows(options: TankOptions, rows: Iterator[Any],
               task: TaskIdentity | None = None) -> WriteReport:
    """:func:`write_batches` for Spark Rows (PySpark 4.0's streaming sink)."""
    def as_bytes(v: _Binary) -> bytes | None:
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

    return write_batches(options, batches(), task)


def _rows_batch(rows: list[dict[str, Any]], as_bytes: Callable[[_Binary], bytes | None]
                ) -> pa.RecordBatch:
    columns: dict[str, pa.Array[Any]] = {
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

    # PySpark's DataSourceArrowWriter.write takes Arrow batches; mypy holds it to the
    # Row iterator of DataSourceWriter's.
    def write(self, iterator: Iterator[pa.RecordBatch]  # type: ignore[override]
              ) -> WriteReport:
        return write_batches(self.options, iterator)


class FigtankStreamWriter(_StreamWriterBase):
    """Streaming sink: every micro-batch's rows are produced exactly once (unless
    ``exactlyOnce=false``: then as the batch sink does, at least once)."""

    def __init__(self, options: TankOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> WriteReport:
        task = TaskIdentity.current() if self.options.exactly_once else None
        if STREAM_ARROW:
            return write_batches(self.options, iterator, task)
        return write_rows(self.options, iterator, task)  # pragma: no cover - PySpark 4.0

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # Each task's produce was acknowledged already; exactly once, the commit record
        # tells a replay of this batch that there is nothing left to write.
        if self.options.exactly_once:
            record_commit(self.options, messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass  # produced messages can not be taken back
