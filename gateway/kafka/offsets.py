"""ListOffsets: a partition's bounds, or the first message at or after a time.

Earliest (-2) is the first available sequence - 1 (0 for an empty partition), latest (-1)
the high-water mark (the next offset). A timestamp is looked up by reading the
partition's bundles from the start (the backend has no time index yet): linear in the
partition's size, which is fine for the occasional ``offsets_for_times`` and not for a
hot path. No message at or after it: offset -1, as Kafka answers.
"""

from __future__ import annotations

from typing import Any, Final

from gateway.auth.guard import ConnectionAccess
from gateway.auth.policy import Operation
from gateway.backend.contract import Backend, FetchRequest, FetchStatus
from gateway.kafka.fetch import log_start_offset
from protocols.kafka.records import (
    ListOffsetsPartitionResponse,
    ListOffsetsResponse,
    ListOffsetsTopicResponse,
)
from protocols.kafka.types import ErrorCode
from protocols.tank.bundle import decode_chunk

LATEST: Final = -1
EARLIEST: Final = -2
#: Bytes read per step of a lookup by time.
SCAN_BYTES: Final = 1024 * 1024


async def list_offsets(backend: Backend, body: Any, access: ConnectionAccess
                       ) -> ListOffsetsResponse:
    """Answer a ListOffsets request ``body``."""
    topics = []
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
                                          info.first_available)
                answers.append(ListOffsetsPartitionResponse(index, 0, when, at, 0))
        topics.append(ListOffsetsTopicResponse(topic.name, answers))
    return ListOffsetsResponse(topics=topics)


async def _by_time(backend: Backend, topic: str, partition: int, timestamp: int,
                   first: int) -> tuple[int, int]:
    """``(offset, timestamp)`` of the first message at or after ``timestamp``, or
    ``(-1, -1)``."""
    seq = max(first, 1)
    size = SCAN_BYTES
    while True:
        wanted = [FetchRequest(topic, partition, seq, size)]
        got = backend.fetch_nowait(wanted)
        if got is None:
            got = await backend.fetch(wanted, max_wait_ms=0, min_bytes=0)
        outcome = got[0]
        try:
            if outcome.status is not FetchStatus.DATA:
                return -1, -1
            chunk = outcome.chunk.read_bytes()
        finally:
            outcome.chunk.close()
        if not chunk:
            return -1, -1
        found = decode_chunk(chunk, outcome.base_seq, seq)
        for message in found.messages:
            if message.timestamp >= timestamp:
                return message.seq - 1, message.timestamp
        if not found.consumed:  # one bundle larger than the step: read it whole
            size = max(size * 2, found.partial_bundle_len or 0)
            continue
        seq = found.next_seq
