"""The ``figtank-segments`` data source: a data directory's segment files, read directly.

::

    spark.read.format("figtank-segments").option("topic", "orders").load("/srv/figtank/data")

Reads Tank's on-disk layout (``<data>/<topic>/<partition>/<base>_<ts>.log`` and
``<base>-<last>_<ts>.ilog``) without a broker, for bulk history: one Spark task per
segment file, and more for a segment over ``maxBytesPerSplit`` bytes or
``maxMessagesPerSplit`` messages (cut at the bundle boundaries its sparse index names).
The files are only read, so a directory in use by figtank or a Tank broker can be read;
the active segment is read up to its size when the query was planned. Every executor
must see the directory at the same path (local mode, or a shared file system).

Same schema as the ``figtank`` source. Options: ``topic`` (default: every topic),
``partitions``, ``startingSequence`` (``earliest`` or a sequence number),
``endingSequence`` (``latest`` or a sequence number, exclusive), ``maxBytesPerSplit``
(default 16 MiB), ``maxMessagesPerSplit`` (default 250000), ``arrow`` (default true).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from gateway.spark.options import Position, SegmentOptions, segment_options
from gateway.spark.rows import SCHEMA, to_record_batch, to_tuples
from gateway.store.index import entries_are_sane
from gateway.store.inspect import SegmentFile, list_segments, read_segment
from gateway.store.segment import MAX_REL_SEQ
from protocols.tank.bundle import Message
from protocols.topics import is_valid_topic_name
from protocols.wire import UINT64_MAX

__all__ = [
    "FigtankSegmentsDataSource", "FigtankSegmentsReader", "SegmentSplit", "plan_segments",
    "read_split", "topic_names",
]


@dataclass(frozen=True)
class SegmentSplit(InputPartition):
    """Bytes ``[start_offset, end_offset)`` of one segment file (bundle boundaries), whose
    first bundle starts at sequence ``base_seq``; rows with ``min_seq <= seq < end_seq``."""

    topic: str
    partition: int
    path: str
    base_seq: int
    start_offset: int
    end_offset: int
    rolled: bool
    min_seq: int
    end_seq: int


def _bound(position: Position, if_latest: int) -> int:
    if position.kind == "earliest":
        return 0
    if position.kind == "latest":
        return if_latest
    return position.seq


def topic_names(root: str, topic: str | None) -> list[str]:
    """The topics of data directory ``root`` to read: ``[topic]`` when it has that topic
    (else FileNotFoundError naming it), every topic when ``topic`` is None."""
    if topic is not None:
        if not os.path.isdir(os.path.join(root, topic)):
            raise FileNotFoundError(f"no topic {topic!r} in {root}")
        return [topic]
    return sorted(name for name in os.listdir(root)
                  if is_valid_topic_name(name) and os.path.isdir(os.path.join(root, name)))


def _partitions(topic_dir: str, wanted: Sequence[int] | None) -> list[int]:
    found = sorted(int(name) for name in os.listdir(topic_dir)
                   if name.isdigit() and os.path.isdir(os.path.join(topic_dir, name)))
    if wanted is None:
        return found
    missing = [p for p in wanted if p not in found]
    if missing:
        raise FileNotFoundError(f"{topic_dir}: no partition {missing}")
    return list(wanted)


def _cuts(segment: SegmentFile, max_bytes: int, max_messages: int) -> list[tuple[int, int]]:
    """``(first seq, file offset)`` of each split of a segment, from its index entries:
    a new split once the current one spans ``max_bytes`` or ``max_messages``."""
    rels = [r for r, _ in segment.index_entries]
    offsets = [o for _, o in segment.index_entries]
    cuts = [(segment.base_seq, 0)]
    if not entries_are_sane(rels, offsets, segment.size, MAX_REL_SEQ):
        return cuts  # no trustworthy bundle boundaries: the whole file in one task
    for rel, offset in segment.index_entries:
        seq = segment.base_seq + rel
        if offset - cuts[-1][1] >= max_bytes or seq - cuts[-1][0] >= max_messages:
            cuts.append((seq, offset))
    return cuts


def plan_segments(options: SegmentOptions) -> list[SegmentSplit]:
    """The splits of every selected segment holding sequence numbers in range."""
    root = os.path.abspath(options.path)
    splits: list[SegmentSplit] = []
    for topic in topic_names(root, options.topic):
        topic_dir = os.path.join(root, topic)
        for partition in _partitions(topic_dir, options.partitions):
            directory = os.path.join(topic_dir, str(partition))
            lo = _bound(options.starting.get(partition), UINT64_MAX)
            hi = _bound(options.ending.get(partition), UINT64_MAX)
            for segment in list_segments(directory):
                if segment.size == 0 or segment.base_seq >= hi:
                    continue
                if segment.last_seq is not None and segment.last_seq < lo:
                    continue
                cuts = _cuts(segment, options.max_bytes_per_split,
                             options.max_messages_per_split)
                ends = [*[seq for seq, _ in cuts[1:]], None]
                offsets = [*[offset for _, offset in cuts[1:]], segment.size]
                for (first, start), next_first, end in zip(cuts, ends, offsets, strict=True):
                    if (next_first is not None and next_first <= lo) or first >= hi:
                        continue
                    splits.append(SegmentSplit(
                        topic, partition, os.path.join(directory, segment.name), first, start,
                        end, segment.rolled, lo, hi))
    return splits


def read_split(split: SegmentSplit) -> Iterator[list[Message]]:
    """The messages of a split, a window of bundles at a time."""
    for batch in read_segment(split.path, split.base_seq, split.start_offset, split.end_offset,
                              min_seq=split.min_seq, end_seq=split.end_seq,
                              torn_tail_ok=not split.rolled):
        yield batch.messages


class FigtankSegmentsReader(DataSourceReader):
    def __init__(self, options: SegmentOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        return plan_segments(self.options)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, SegmentSplit):
            return  # Spark asks for one partition even when the plan has none
        for messages in read_split(partition):
            if self.options.arrow:
                yield to_record_batch(partition.topic, partition.partition, messages)
            else:
                yield from to_tuples(partition.topic, partition.partition, messages)


class FigtankSegmentsDataSource(DataSource):
    """``spark.read.format("figtank-segments").load(data_dir)``."""

    @classmethod
    def name(cls) -> str:
        return "figtank-segments"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> FigtankSegmentsReader:
        return FigtankSegmentsReader(segment_options(self.options))
