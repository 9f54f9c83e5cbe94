"""Consume: the request to backend fetches, the fetch outcomes to a response head and chunks.

The long poll (maxWait, minBytes) happens inside :meth:`Backend.fetch`; this module only
translates. Per partition, by :class:`~gateway.core.contract.FetchStatus`:

- DATA: flag 0x00 with the first bundle's base sequence, or 0xfe when that bundle is sparse
  (it names its own sequences). An empty chunk after a timed-out wait sends, as its base
  sequence, the sequence the request resolved to (0 and UINT64_MAX made concrete:
  ``FetchOutcome.resolved_seq``), or 0xfe where the backend does not know it;
- BOUNDARY: 0x01 with the high-water mark and the first available sequence;
- UNKNOWN_PARTITION: 0xff; FAULT: 0xfb;
- UNKNOWN_TOPIC for every partition of a topic: the topic's ``u16 0xFFFF`` sentinel;
- DENIED (an upstream Kafka cluster refused the read) as UNKNOWN_TOPIC: hidden, as the
  access policy hides a topic one may not read.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from gateway.backend.shared import SharedChunk
from gateway.core.contract import Chunk, FetchOutcome, FetchRequest, FetchStatus
from gateway.io.writer import JOIN_BELOW
from protocols.tank.connection import FRAME_HEADER, encode_consume_response_head
from protocols.tank.messages import (
    ConsumePartitionResult,
    ConsumeRequest,
    ConsumeResponse,
    ConsumeTopicResult,
)
from protocols.tank.types import ConsumeFlags

#: Largest fetch size honoured for one partition (the Tank broker clamps it the same way).
MAX_FETCH_SIZE: Final = 64 * 1024 * 1024

_ERROR_FLAGS: Final = {
    FetchStatus.UNKNOWN_PARTITION: ConsumeFlags.UNKNOWN_PARTITION,
    FetchStatus.FAULT: ConsumeFlags.SYSTEM_FAULT,
    # A single partition reported as an unknown topic while its siblings were found.
    FetchStatus.UNKNOWN_TOPIC: ConsumeFlags.UNKNOWN_PARTITION,
    FetchStatus.DENIED: ConsumeFlags.UNKNOWN_PARTITION,
}
#: Statuses a consumer sees as "no such topic": a read the upstream denies is answered
#: as the access policy answers one it denies itself.
_HIDDEN: Final = (FetchStatus.UNKNOWN_TOPIC, FetchStatus.DENIED)
_DATA: Final = FetchStatus.DATA
#: A Consume response's ``u32 reqId``: after the frame header and ``u32 headerLen``.
_REQUEST_ID: Final = struct.Struct("<I")
_REQUEST_ID_AT: Final = FRAME_HEADER.size + 4
#: What a shared chunk keeps the Consume head under (with the topic and partition).
_HEAD_KEY: Final = "tank-consume-head"


def fetch_requests(request: ConsumeRequest) -> list[FetchRequest]:
    """One :class:`FetchRequest` per requested partition, in request order."""
    return [FetchRequest(topic.name, part.partition, part.seq_num,
                         min(part.fetch_size, MAX_FETCH_SIZE))
            for topic in request.topics for part in topic.partitions]


@dataclass(slots=True)
class ConsumeReply:
    """What to send for one Consume: the head bytes, then ``chunks`` in order (none: the
    head is the whole frame)."""

    head: bytes
    chunks: list[Chunk]
    #: Chunk bytes by topic, for the bytes-out metric.
    bytes_by_topic: dict[str, int]
    #: False when any partition got an error flag.
    ok: bool


def consume_reply(request: ConsumeRequest, outcomes: Sequence[FetchOutcome]) -> ConsumeReply:
    """Build the response to ``request`` from its fetches' outcomes (in request order).

    Empty chunks are closed here; the others are in ``chunks`` for the caller to send and
    close. On an exception every chunk of ``outcomes`` is closed.

    A request for one partition answered from a shared read (a
    :class:`~gateway.backend.shared.SharedChunk`, as the readers woken by one append get)
    takes its head from the one the first of those readers built: the same bytes but
    for the request id. A small one is a whole frame (the chunk's bytes joined to the
    head once for all of them, ``chunks`` empty).
    """
    if len(outcomes) == 1:
        outcome = outcomes[0]
        chunk = outcome.chunk
        if type(chunk) is SharedChunk and outcome.status is _DATA:
            topics = request.topics
            if len(topics) == 1 and len(topics[0].partitions) == 1:
                return _shared_reply(request, outcome, chunk)
    try:
        return _build(request, outcomes)
    except BaseException:
        for outcome in outcomes:
            outcome.chunk.close()
        raise


def _shared_reply(request: ConsumeRequest, outcome: FetchOutcome, chunk: SharedChunk
                  ) -> ConsumeReply:
    """The reply to a one-partition ``request`` from a shared read: the head's bytes
    around the request id are built once per read (by :func:`_build`) and kept with it."""
    topic = request.topics[0]
    name = topic.name
    # Under the size the outbox would join them at anyway: one frame, built once.
    whole = chunk.length < JOIN_BELOW

    def template() -> tuple[bytes, bytes]:
        head = _build(request, [outcome]).head
        after = head[_REQUEST_ID_AT + _REQUEST_ID.size:]
        return head[:_REQUEST_ID_AT], after + chunk.data if whole else after

    before, after = chunk.encoded((_HEAD_KEY, name, topic.partitions[0].partition),
                                  template)
    head = before + _REQUEST_ID.pack(request.request_id) + after
    return ConsumeReply(head, [] if whole else [chunk], {name: chunk.length}, True)


def _build(request: ConsumeRequest, outcomes: Sequence[FetchOutcome]) -> ConsumeReply:
    topics = []
    chunks: list[Chunk] = []
    bytes_by_topic: dict[str, int] = {}
    ok = True
    i = 0
    for topic in request.topics:
        parts = topic.partitions
        mine = outcomes[i:i + len(parts)]
        i += len(parts)
        if mine and all(o.status in _HIDDEN for o in mine):
            topics.append(ConsumeTopicResult(topic.name, [], True, len(parts)))
            ok = False
            continue
        results = []
        sent = 0
        for part, outcome in zip(parts, mine, strict=True):
            status = outcome.status
            if status is FetchStatus.DATA:
                chunk = outcome.chunk
                length = chunk.length
                if length:
                    chunks.append(chunk)
                    sent += length
                else:
                    chunk.close()
                base = outcome.base_seq if length else outcome.resolved_seq
                if base is None:
                    results.append(ConsumePartitionResult(
                        part.partition, ConsumeFlags.SPARSE_FIRST_BUNDLE,
                        high_water_mark=outcome.high_water_mark, chunk_length=length))
                else:
                    results.append(ConsumePartitionResult(
                        part.partition, ConsumeFlags.OK, base, outcome.high_water_mark,
                        length))
                continue
            ok = False
            outcome.chunk.close()
            if status is FetchStatus.BOUNDARY:
                results.append(ConsumePartitionResult(
                    part.partition, ConsumeFlags.BOUNDARY_CHECK,
                    high_water_mark=outcome.high_water_mark,
                    first_available_seq_num=outcome.first_available))
            else:
                results.append(ConsumePartitionResult(part.partition, _ERROR_FLAGS[status]))
        if sent:
            bytes_by_topic[topic.name] = bytes_by_topic.get(topic.name, 0) + sent
        topics.append(ConsumeTopicResult(topic.name, results))
    head = encode_consume_response_head(ConsumeResponse(request.request_id, topics))
    return ConsumeReply(head, chunks, bytes_by_topic, ok)
