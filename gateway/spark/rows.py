"""The rows both figtank sources return, as Arrow record batches or as tuples.

Schema: ``topic string, partition int, sequence bigint, timestamp timestamp, key binary,
value binary``. Only ``key`` may be null. Tank timestamps are milliseconds; Spark's are
microseconds (UTC).

Arrow batches are the default: Spark takes them as they are, where tuples cost a Python
conversion per value (a ``datetime`` per timestamp); see ``gateway/bench/micro/spark.py``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

import pyarrow as pa
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from protocols.tank.bundle import Message

SCHEMA = StructType([
    StructField("topic", StringType(), False),
    StructField("partition", IntegerType(), False),
    StructField("sequence", LongType(), False),
    StructField("timestamp", TimestampType(), False),
    StructField("key", BinaryType(), True),
    StructField("value", BinaryType(), False),
])

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS_TS = pa.timestamp("ms", tz="UTC")


@cache
def arrow_schema() -> pa.Schema:
    """:data:`SCHEMA` as Spark's Python worker expects a data source's batches to be."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(SCHEMA, timezone="UTC")


def to_record_batch(topic: str, partition: int, messages: Sequence[Message]) -> pa.RecordBatch:
    """One Arrow batch of rows for messages of one partition."""
    schema = arrow_schema()
    n = len(messages)
    return pa.RecordBatch.from_arrays([
        pa.array([topic] * n, pa.string()),
        pa.array([partition] * n, pa.int32()),
        pa.array([m.seq for m in messages], pa.int64()),
        pa.array([m.timestamp for m in messages], _MS_TS).cast(schema.field(3).type),
        pa.array([m.key for m in messages], pa.binary()),
        pa.array([m.value for m in messages], pa.binary()),
    ], schema=schema)


def to_tuples(topic: str, partition: int, messages: Sequence[Message]
              ) -> Iterator[tuple[Any, ...]]:
    """The same rows as tuples (what Spark converts one value at a time)."""
    for m in messages:
        yield (topic, partition, m.seq, _EPOCH + timedelta(milliseconds=m.timestamp),
               m.key, m.value)
