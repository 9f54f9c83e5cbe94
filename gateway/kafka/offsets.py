"""ListOffsets: a partition's bounds, or the first message at or after a time.

Earliest (-2) is the first available sequence - 1 (0 for an empty partition), latest (-1)
the high-water mark (the next offset). A timestamp is looked up by bisecting the
partition's sequence numbers (:mod:`gateway.backend.timelookup`: O(log n) bundle reads,
on either backend). No message at or after it: offset -1, as Kafka answers.

A partition named more than once in one request gets INVALID_REQUEST for every entry,
as Kafka answers (its broker refuses duplicates rather than pick one). librdkafka never
sends them: its offsets_for_times merges entries for the same partition before asking,
the last one's time winning, and gives that one answer to all of them.
"""

from __future__ import annotations

from collections import Counter
from typing import Final

from gateway.auth.guard import ConnectionAccess
from gateway.auth.policy import Operation
from gateway.backend.timelookup import find_by_time
from gateway.core.contract import Backend
from gateway.kafka.fetch import log_start_offset
from protocols.kafka.records import (
    ListOffsetsPartitionResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListOffsetsTopicResponse,
)
from protocols.kafka.types import ErrorCode

LATEST: Final = -1
EARLIEST: Final = -2


async def list_offsets(backend: Backend, body: ListOffsetsRequest, access: ConnectionAccess
                       ) -> ListOffsetsResponse:
    """Answer a ListOffsets request ``body``."""
    topics = []
    named = Counter((t.name, p.partition_index) for t in body.topics for p in t.partitions)
    for topic in body.topics:
        answers = []
        allowed = access.may(topic.name, Operation.SUBSCRIBE)
        if not allowed:
            access.refused(topic.name, Operation.SUBSCRIBE, "list_offsets",
                           "topic_authorization_failed")
        infos = await backend.discover_partitions(topic.name) if allowed else None
        for part in topic.partitions:
            index = part.partition_index
            if not allowed:
                answers.append(ListOffsetsPartitionResponse(
                    index, ErrorCode.TOPIC_AUTHORIZATION_FAILED))
                continue
            if named[topic.name, index] > 1:
                answers.append(ListOffsetsPartitionResponse(
                    index, ErrorCode.INVALID_REQUEST, -1, -1))
                continue
            if infos is None or not 0 <= index < len(infos):
                answers.append(ListOffsetsPartitionResponse(
                    index, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
                continue
            info = infos[index]
            if part.timestamp == EARLIEST:
                answers.append(ListOffsetsPartitionResponse(
                    index, 0, -1, log_start_offset(info.first_available), 0))
            elif part.timestamp < 0:  # latest, and max-timestamp (-3) answered as latest
                answers.append(ListOffsetsPartitionResponse(
                    index, 0, -1, info.high_water_mark, 0))
            else:
                at, when = await _by_time(backend, topic.name, index, part.timestamp,
                                          info.first_available, info.high_water_mark)
                answers.append(ListOffsetsPartitionResponse(index, 0, when, at, 0))
        topics.append(ListOffsetsTopicResponse(topic.name, answers))
    return ListOffsetsResponse(topics=topics)


async def _by_time(backend: Backend, topic: str, partition: int, timestamp: int,
                   first: int, high_water_mark: int) -> tuple[int, int]:
    """``(offset, timestamp)`` of the first message at or after ``timestamp``, or
    ``(-1, -1)``."""
    found = await find_by_time(backend, topic, partition, timestamp, first, high_water_mark)
    return (-1, -1) if found.seq is None else (found.seq - 1, found.timestamp)
