"""Fetch: a long poll through :meth:`Backend.fetch`, bundles turned into record batches.

A partition is read from Tank sequence ``fetch_offset + 1``. Whole bundles only: the
first batch may start before the asked offset (clients skip those records), and a bundle
larger than the partition's ``partition_max_bytes`` is still sent whole when it is the
first (as Kafka does, KIP-74). The response's ``max_bytes`` stops adding partitions' data
once reached (the first partition with data always gets its batches). An offset before
the first available one or past the end is OFFSET_OUT_OF_RANGE; at the end it is a wait.
Only ``read_uncommitted`` exists (there are no transactions). Compressed bundles are
served in the codec :class:`~gateway.kafka.fetch_codecs.FetchCompression` chooses for the
topic and the request's version.

A partition answered from a shared read (:class:`~gateway.backend.shared.SharedChunk`: the
readers one append woke at the same position) has its record batches converted once per
codec, by its first reader; a Fetch of that one partition is answered with a
:class:`SharedFetch`, whose response body is encoded once per version and shared as well
(the response header, with the correlation id, stays per request).
"""

from __future__ import annotations

from typing import Final

from gateway.auth.guard import ConnectionAccess
from gateway.auth.policy import Operation
from gateway.backend.shared import SharedChunk
from gateway.core.contract import Backend, FetchOutcome, FetchRequest, FetchStatus
from gateway.io.writer import JOIN_BELOW
from gateway.kafka.fetch_codecs import FetchCompression
from protocols.kafka.bundles import FetchCodecs, bundles_to_batches
from protocols.kafka.connection import encode_body_parts
from protocols.kafka.records import FetchableTopicResponse, FetchResponse, PartitionData
from protocols.kafka.records import FetchRequest as KafkaFetchRequest
from protocols.kafka.types import ApiKey, ErrorCode
from protocols.tank.bundle import decode_chunk

_ERRORS: Final = {
    FetchStatus.BOUNDARY: ErrorCode.OFFSET_OUT_OF_RANGE,
    FetchStatus.UNKNOWN_TOPIC: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    FetchStatus.UNKNOWN_PARTITION: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    FetchStatus.FAULT: ErrorCode.KAFKA_STORAGE_ERROR,
    FetchStatus.DENIED: ErrorCode.TOPIC_AUTHORIZATION_FAILED,
}
#: What a shared chunk keeps its record batches and Fetch response bodies under.
_BATCHES_KEY: Final = "kafka-batches"
_BODY_KEY: Final = "kafka-fetch-body"
#: Bytes read for a partition asking for less than one byte.
_MIN_FETCH: Final = 1024


def log_start_offset(first_available: int) -> int:
    """The Kafka offset of a partition's first available message (0 when empty)."""
    return max(first_available, 1) - 1


class SharedFetch:
    """A Fetch response for one partition, from a shared read: :attr:`record` is the
    response; :meth:`body` its encoded body, built by the first of the readers of
    ``chunk`` that asked for that partition at that version."""

    __slots__ = ("_chunk", "_key", "record")

    def __init__(self, record: FetchResponse, chunk: SharedChunk, key: tuple[str, int]
                 ) -> None:
        self.record = record
        self._chunk = chunk
        self._key = key

    def body(self, version: int) -> list[bytes]:
        """The response body's bytes at ``version``, as pieces to send in order (one
        piece when smaller than :data:`~gateway.io.writer.JOIN_BELOW`)."""
        def encode() -> list[bytes]:
            pieces = encode_body_parts(ApiKey.FETCH, self.record, version)
            if sum(map(len, pieces)) < JOIN_BELOW:
                return [b"".join(pieces)]
            return [bytes(p) for p in pieces]

        return self._chunk.encoded((_BODY_KEY, version, *self._key), encode)


async def fetch(backend: Backend, body: KafkaFetchRequest, access: ConnectionAccess,
                compression: FetchCompression, version: int) -> FetchResponse | SharedFetch:
    """Answer a Fetch request ``body`` of ``version``; waits up to its ``max_wait_ms``
    when no asked partition has data."""
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
    shared = True
    for name, index, what in slots:
        if isinstance(what, int):
            data = PartitionData(partition_index=index, error_code=what, high_watermark=-1,
                                 records=b"")
            shared = False
        else:
            codecs = compression.codecs(name, version)
            data, size, shared_data = await _partition(backend, what, by_request[id(what)],
                                                       budget, codecs)
            budget -= size
            shared = shared and shared_data
        responses.setdefault(name, []).append(data)
    response = FetchResponse(responses=[FetchableTopicResponse(topic=name, partitions=parts)
                                        for name, parts in responses.items()])
    if shared and len(slots) == 1:
        chunk = outcomes[0].chunk
        assert type(chunk) is SharedChunk
        return SharedFetch(response, chunk, slots[0][:2])
    return response


async def _partition(backend: Backend, request: FetchRequest, outcome: FetchOutcome,
                     budget: int, codecs: FetchCodecs) -> tuple[PartitionData, int, bool]:
    """One partition's answer, its batches in ``codecs``, the record bytes it carries and
    whether it is all from a shared read (its batches converted once for every reader)."""
    hwm = outcome.high_water_mark
    start = log_start_offset(outcome.first_available)
    if outcome.status is not FetchStatus.DATA:
        outcome.chunk.close()
        return PartitionData(partition_index=request.partition,
                             error_code=_ERRORS[outcome.status], high_watermark=hwm,
                             last_stable_offset=hwm, log_start_offset=start,
                             records=b""), 0, False
    shared = outcome.chunk
    if type(shared) is SharedChunk and budget > 0:
        chunk = shared.data
        base_seq = outcome.base_seq
        batches = shared.encoded((_BATCHES_KEY, codecs), lambda: bundles_to_batches(
            chunk, base_seq, codecs=codecs))
        if batches.consumed or not batches.partial:
            return PartitionData(partition_index=request.partition, error_code=0,
                                 high_watermark=hwm, last_stable_offset=hwm,
                                 log_start_offset=start, records=batches.records
                                 ), len(batches.records), True
    try:
        chunk = outcome.chunk.read_bytes() if budget > 0 else b""
    finally:
        outcome.chunk.close()
    records: bytes | bytearray = b""
    if chunk:
        batches = bundles_to_batches(chunk, outcome.base_seq, codecs=codecs)
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
            batches = (bundles_to_batches(chunk, retry.base_seq, codecs=codecs) if chunk
                       else batches)
        records = batches.records
    return PartitionData(partition_index=request.partition, error_code=0,
                         high_watermark=hwm, last_stable_offset=hwm,
                         log_start_offset=start, records=records), len(records), False
