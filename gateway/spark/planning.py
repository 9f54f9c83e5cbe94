"""Planning reads: sequence ranges per partition, split into Spark input partitions.

Pure functions over partition bounds (what DiscoverPartitions answers); no I/O, so the
rules are tested without Spark or a broker.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

from gateway.client.tank import PartitionBounds
from gateway.spark.options import Positions


class DataLossError(RuntimeError):
    """Messages a read needs were removed by retention (``failOnDataLoss=false`` skips)."""


@dataclass(frozen=True)
class SequenceRange(InputPartition):
    """Messages ``start <= seq < end`` of one partition: one Spark task."""

    topic: str
    partition: int
    start: int
    end: int


def split_range(topic: str, partition: int, start: int, end: int, max_messages: int
                ) -> list[SequenceRange]:
    """``[start, end)`` in pieces of at most ``max_messages`` sequence numbers."""
    return [SequenceRange(topic, partition, lo, min(lo + max_messages, end))
            for lo in range(start, end, max_messages)]


def select(bounds: Sequence[PartitionBounds], partitions: Iterable[int] | None
           ) -> list[PartitionBounds]:
    """The bounds of the partitions asked for (all when None); unknown ones are an error."""
    if partitions is None:
        return list(bounds)
    by_number = {b.partition: b for b in bounds}
    missing = [p for p in partitions if p not in by_number]
    if missing:
        raise ValueError(f"the topic has {len(bounds)} partitions; no partition {missing}")
    return [by_number[p] for p in partitions]


def check_served(topic: str, bounds: Iterable[PartitionBounds]) -> None:
    for b in bounds:
        if b.error:
            raise RuntimeError(f"{topic}/{b.partition}: the broker can not serve it "
                               f"(code {b.error})")


def resolve_start(topic: str, b: PartitionBounds, positions: Positions,
                  fail_on_data_loss: bool) -> int:
    """Where reading ``b`` starts; an explicit sequence below the first available one is
    data loss (raised, or moved up to the first available)."""
    start = positions.get(b.partition).resolve(b.first_available, b.high_water_mark)
    first = b.first_available or b.high_water_mark + 1
    if start < first:
        if fail_on_data_loss and start > 0:
            raise DataLossError(f"{topic}/{b.partition}: sequence {start} was removed; the "
                                f"first available is {first} (failOnDataLoss=false skips)")
        start = first
    return start


def plan_batch(topic: str, bounds: Sequence[PartitionBounds], starting: Positions,
               ending: Positions, *, fail_on_data_loss: bool, max_messages: int
               ) -> list[SequenceRange]:
    """Input partitions of a batch read: ``[start, end)`` per partition, split."""
    check_served(topic, bounds)
    ranges: list[SequenceRange] = []
    for b in bounds:
        start = resolve_start(topic, b, starting, fail_on_data_loss)
        end = min(ending.get(b.partition).resolve(b.first_available, b.high_water_mark),
                  b.high_water_mark + 1)
        ranges += split_range(topic, b.partition, start, end, max_messages)
    return ranges


def plan_stream(topic: str, start: Mapping[int, int], end: Mapping[int, int],
                max_messages: int) -> list[SequenceRange]:
    """Input partitions of one micro-batch, from the offsets Spark checkpointed."""
    ranges: list[SequenceRange] = []
    for partition, stop in sorted(end.items()):
        ranges += split_range(topic, partition, start.get(partition, stop), stop, max_messages)
    return ranges


def admit(start: Mapping[int, int], available: Mapping[int, int], limit: int | None
          ) -> dict[int, int]:
    """End offsets admitting at most ``limit`` messages past ``start`` in all.

    Water-filling: every partition with a backlog gets an equal share, and shares a
    partition can not use go to the others, so a busy partition never starves a quiet
    one. ``available`` is the end each partition could reach (its high-water mark + 1).
    """
    backlog = {p: max(0, available[p] - start.get(p, available[p])) for p in available}
    if limit is None:
        take = backlog
    else:
        take = dict.fromkeys(backlog, 0)
        left = limit
        waiting = sorted((n, p) for p, n in backlog.items() if n > 0)
        while waiting and left > 0:
            share, extra = divmod(left, len(waiting))
            n, p = waiting[0]
            if n <= share:
                take[p] = n
                left -= n
                waiting.pop(0)
                continue
            for i, (_, p) in enumerate(waiting):  # every remaining backlog exceeds the share
                take[p] = share + (i < extra)
            break
    return {p: start.get(p, available[p]) + take[p] for p in available}
