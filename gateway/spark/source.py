"""The ``figtank`` data source: topics over the Tank protocol, read and written by Spark.

Works against any Tank-protocol endpoint (figtank, figtank in bridge mode, a Tank broker).
Options are listed in :mod:`gateway.spark`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import StructType

from gateway.client.errors import UnknownTopicError
from gateway.client.tank import PartitionBounds
from gateway.client.tank_blocking import BlockingTankClient
from gateway.spark.fetch import read_range
from gateway.spark.options import TankOptions, tank_options
from gateway.spark.planning import (
    SequenceRange,
    admit,
    check_served,
    plan_batch,
    plan_stream,
    resolve_start,
    select,
)
from gateway.spark.rows import SCHEMA
from gateway.spark.sink import FigtankStreamWriter, FigtankWriter, check_schema

try:  # PySpark >= 4.2: admission control and Trigger.AvailableNow
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover - older PySpark: every trigger reads all available
    ReadLimit = ReadMaxRows = ReadAllAvailable = object  # type: ignore[misc,assignment]

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass


def discover(options: TankOptions, *, missing_ok: bool = False) -> list[PartitionBounds]:
    """Bounds of the partitions the options select (a short-lived connection)."""
    with BlockingTankClient(options.host, options.port, **options.client_options()) as client:
        try:
            bounds = client.discover_partitions(options.topic)
        except UnknownTopicError:
            if missing_ok:
                return []
            raise
    chosen = select(bounds, options.partitions)
    check_served(options.topic, chosen)
    return chosen


class FigtankDataSource(DataSource):
    """``spark.read.format("figtank")`` / ``readStream`` / ``write`` / ``writeStream``."""

    @classmethod
    def name(cls) -> str:
        return "figtank"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> FigtankReader:
        return FigtankReader(tank_options(self.options))

    def streamReader(self, schema: StructType) -> FigtankStreamReader:
        return FigtankStreamReader(tank_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> FigtankWriter:
        check_schema(schema)
        return FigtankWriter(tank_options(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> FigtankStreamWriter:
        check_schema(schema)
        return FigtankStreamWriter(tank_options(self.options))


class FigtankReader(DataSourceReader):
    """Batch read: ranges resolved once on the driver, each read by one task."""

    def __init__(self, options: TankOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        o = self.options
        return plan_batch(o.topic, discover(o), o.starting, o.ending,
                          fail_on_data_loss=o.fail_on_data_loss,
                          max_messages=o.max_messages_per_split)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, SequenceRange):
            return iter(())  # Spark asks for one partition even when the plan has none
        return read_range(self.options, partition)


# Offsets Spark checkpoints: {"topic": name, "partitions": {"0": next_seq, ...}}, plus
# "starts": {"2": seq} in the end offset of the batch that first reads a new partition.

def _offset(topic: str, positions: dict[int, int], starts: dict[int, int] | None = None
            ) -> dict[str, Any]:
    offset: dict[str, Any] = {
        "topic": topic, "partitions": {str(p): s for p, s in sorted(positions.items())}}
    if starts:
        offset["starts"] = {str(p): s for p, s in sorted(starts.items())}
    return offset


def _positions(topic: str, offset: dict[str, Any], key: str = "partitions") -> dict[int, int]:
    if offset.get("topic") != topic:
        raise ValueError(f"the checkpoint is for topic {offset.get('topic')!r}, the query reads "
                         f"{topic!r}: use a new checkpoint location")
    return {int(p): int(s) for p, s in offset.get(key, {}).items()}


class FigtankStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Streaming read: the offset is the next sequence number of every partition.

    Each micro-batch reads ``[previous end, end)`` per partition, and Spark checkpoints
    the ends before reading, so a restarted query replays an unfinished batch exactly and
    continues after the last one: no gap, no duplicate. Partitions that appear later are
    read from their first message.
    """

    def __init__(self, options: TankOptions) -> None:
        self.options = options
        #: Trigger.AvailableNow: the ends fixed when the query started.
        self.target: dict[int, int] | None = None

    def initialOffset(self) -> dict[str, Any]:
        o = self.options
        return _offset(o.topic, {b.partition: resolve_start(o.topic, b, o.starting,
                                                            o.fail_on_data_loss)
                                 for b in discover(o, missing_ok=True)})

    def _available(self, start: dict[int, int]) -> tuple[dict[int, int], dict[int, int]]:
        """``(start, end)`` with partitions new since ``start`` added at their first message."""
        start = dict(start)
        available = {}
        for b in discover(self.options, missing_ok=True):
            if b.partition not in start:
                start[b.partition] = b.first_available or b.high_water_mark + 1
            available[b.partition] = max(start[b.partition], b.high_water_mark + 1)
        if self.target is not None:
            available = {p: min(end, max(start[p], self.target.get(p, start[p])))
                         for p, end in available.items()}
        return start, available

    def latestOffset(self, start: dict[str, Any] | None = None,
                     limit: ReadLimit | None = None) -> dict[str, Any]:
        topic = self.options.topic
        known = {} if start is None else _positions(topic, start)
        begin, available = self._available(known)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        end = admit(begin, available, max_rows)
        return _offset(topic, end, {p: s for p, s in begin.items()
                                    if p not in known and end[p] > s})

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_messages_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = {b.partition: b.high_water_mark + 1
                       for b in discover(self.options, missing_ok=True)}

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return _offset(self.options.topic, {b.partition: b.high_water_mark + 1
                                            for b in discover(self.options, missing_ok=True)})

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        topic = self.options.topic
        begin = _positions(topic, end, "starts") | _positions(topic, start)
        return plan_stream(topic, begin, _positions(topic, end),
                           self.options.max_messages_per_split)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, SequenceRange):
            return iter(())  # Spark asks for one partition even when the plan has none
        return read_range(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        pass  # a Tank broker keeps no consumer positions: Spark's checkpoint is the record
