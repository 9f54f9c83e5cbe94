"""Fetch: a long poll through :meth:`Backend.fetch`, bundles turned into record batches.

A partition is read from Tank sequence ``fetch_offset + 1``. Whole bundles only: the
first batch may start before the asked offset (clients skip those records), and a bundle
larger than the partition's ``partition_max_bytes`` is still sent whole when it is the
first (as Kafka does, KIP-74). The response's ``max_bytes`` stops adding partitions' data
once reached (the first partition with data always gets its batches). An offset before
the first available one or past the end is OFFSET_OUT_OF_RANGE; at the end it is a wait.
Only ``read_uncommitted`` exists (there are no transactions).
"""

from __future__ import annotations

from typing import Any, Final

from gateway.auth.guard import ConnectionAccess
from gateway.auth.policy import Operation
from gateway.backend.contract import Backend, FetchOutcome, FetchRequest, FetchStatus
from protocols.kafka.bundles import bundles_to_batches
from protocols.kafka.records import FetchableTopicResponse, FetchResponse, PartitionData
from protocols.kafka.types import ErrorCode
from protocols.tank.bundle import decode_chunk

_ERRORS: Final = {
    FetchStatus.BOUNDARY: ErrorCode.OFFSET_OUT_OF_RANGE,
    FetchStatus.UNKNOWN_TOPIC: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    FetchStatus.UNKNOWN_PARTITION: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    FetchStatus.FAULT: ErrorCode.KAFKA_STORAGE_ERROR,
    FetchStatus.DENIED: ErrorCode.TOPIC_AUTHORIZATION_FAILED,
}
#: Bytes read for a partition asking for less than one byte.
_MIN_FETCH: Final = 1024


def log_start_offset(first_available: int) -> int:
    """The Kafka offset of a partition's first available message (0 when empty)."""
    return max(first_available, 1) - 1


async def fetch(backend: Backend, body: Any, access: ConnectionAccess) -> FetchResponse:
    """Answer a Fetch request ``body``; waits up to its ``max_wait_ms`` when no asked
    partition has data."""
    slots: list[tuple[str, int, int | FetchRequest]] = []  # error code, or what to read
    wanted: list[FetchRequest] = []
    for topic in body.topics:
        allowed = access.may(topic.topic, Operation.SUBSCRIBE)
        if not allowed:
            access.refused(topic.topic, Operation.SUBSCRIBE, "fetch",
                           "topic_authorization_failed")
        for part in topic.partitions:
            if not allowed:
                slots.append((topic.topic, part.partition, ErrorCode.TOPIC_AUTHORIZATION_FAILED))
            elif part.fetch_offset < 0:
                slots.append((topic.topic, part.partition, ErrorCode.OFFSET_OUT_OF_RANGE))
            else:
                request = FetchRequest(topic.topic, part.partition, part.fetch_offset + 1,
                                       max(part.partition_max_bytes, _MIN_FETCH))
                wanted.append(request)
                slots.append((topic.topic, part.partition, request))
    outcomes: list[FetchOutcome] = []
    if wanted:
        got = backend.fetch_nowait(wanted)
        if got is None:
            got = await backend.fetch(wanted, max_wait_ms=max(body.max_wait_ms, 0),
                                      min_bytes=max(body.min_bytes, 0))
        outcomes = got
    by_request = dict(zip(map(id, wanted), outcomes, strict=True))
    budget = body.max_bytes if body.max_bytes > 0 else 1 << 31
    responses: dict[str, list[PartitionData]] = {}
    for name, index, what in slots:
        if isinstance(what, int):
            data = PartitionData(partition_index=index, error_code=what, high_watermark=-1,
                                 records=b"")
        else:
            data, size = await _partition(backend, what, by_request[id(what)], budget)
            budget -= size
        responses.setdefault(name, []).append(data)
    return FetchResponse(responses=[FetchableTopicResponse(topic=name, partitions=parts)
                                    for name, parts in responses.items()])


async def _partition(backend: Backend, request: FetchRequest, outcome: FetchOutcome,
                     budget: int) -> tuple[PartitionData, int]:
    """One partition's answer and the record bytes it carries."""
    hwm = outcome.high_water_mark
    start = log_start_offset(outcome.first_available)
    if outcome.status is not FetchStatus.DATA:
        outcome.chunk.close()
        return PartitionData(partition_index=request.partition,
                             error_code=_ERRORS[outcome.status], high_watermark=hwm,
                             last_stable_offset=hwm, log_start_offset=start,
                             records=b""), 0
    try:
        chunk = outcome.chunk.read_bytes() if budget > 0 else b""
    finally:
        outcome.chunk.close()
    records = b""
    if chunk:
        batches = bundles_to_batches(chunk, outcome.base_seq)
        if not batches.consumed and batches.partial:
            # The first bundle is larger than the partition's max bytes: send it whole.
            need = decode_chunk(chunk, outcome.base_seq).partial_bundle_len or len(chunk) * 2
            again = await backend.fetch([FetchRequest(request.topic, request.partition,
                                                      request.seq, need)],
                                        max_wait_ms=0, min_bytes=0)
            retry = again[0]
            try:
                chunk = (retry.chunk.read_bytes() if retry.status is FetchStatus.DATA
                         else b"")
            finally:
                retry.chunk.close()
            batches = bundles_to_batches(chunk, retry.base_seq) if chunk else batches
        records = batches.records
    return PartitionData(partition_index=request.partition, error_code=0,
                         high_watermark=hwm, last_stable_offset=hwm,
                         log_start_offset=start, records=records), len(records)
