"""Produce: each record batch becomes one Tank bundle (:mod:`protocols.kafka.bundles`).

A partition's batches are decoded here (Kafka's CRC, codecs and record layout) and
re-encoded as bundles; a batch a Tank message can not hold (a key over 255 bytes,
headers, a null value, transactional or control batches) refuses its partition with
INVALID_RECORD (87) and the reason as the error message, a corrupt one with
CORRUPT_MESSAGE (2); nothing of a refused partition is appended. The answer's base
offset is the first appended sequence - 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from gateway.auth.guard import ConnectionAccess
from gateway.auth.policy import Operation
from gateway.backend.contract import ProduceBatch, ProduceCode, ProduceOutcome
from protocols.errors import ProtocolError
from protocols.kafka.batch import InvalidRecord
from protocols.kafka.bundles import records_to_bundles
from protocols.kafka.records import (
    PartitionProduceResponse,
    ProduceResponse,
    TopicProduceResponse,
)
from protocols.kafka.types import ErrorCode

#: Kafka's error code for each append outcome that is not OK.
_CODES: Final = {
    ProduceCode.UNKNOWN_PARTITION: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ProduceCode.UNKNOWN_TOPIC: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    ProduceCode.IO_FAULT: ErrorCode.KAFKA_STORAGE_ERROR,
    ProduceCode.ACK_TIMEOUT: ErrorCode.REQUEST_TIMED_OUT,
    ProduceCode.INVALID_SEQUENCE: ErrorCode.INVALID_RECORD,
    ProduceCode.READ_ONLY: ErrorCode.TOPIC_AUTHORIZATION_FAILED,
}


@dataclass(slots=True)
class _Part:
    index: int
    start: int = 0
    count: int = 0
    error: int = 0
    message: str | None = None


@dataclass(slots=True)
class ProducePlan:
    """A Produce request turned into backend batches, and how to answer it."""

    batches: list[ProduceBatch] = field(default_factory=list)
    topics: list[tuple[str, list[_Part]]] = field(default_factory=list)
    #: Record bytes of the request (for the unacked budget).
    size: int = 0
    #: Partitions refused by the access policy, by topic.
    denied: set[str] = field(default_factory=set)


def plan_produce(body: Any, access: ConnectionAccess, max_batch: int) -> ProducePlan:
    """Decode every partition's batches into bundles (ProtocolErrors of a batch refuse
    that partition only)."""
    plan = ProducePlan()
    for topic in body.topic_data:
        name = topic.name
        allowed = access.may(name, Operation.PUBLISH)
        if not allowed:
            plan.denied.add(name)
            access.refused(name, Operation.PUBLISH, "produce", "topic_authorization_failed")
        parts = []
        for data in topic.partition_data:
            part = _Part(data.index)
            parts.append(part)
            records = data.records or b""
            plan.size += len(records)
            if not allowed:
                part.error = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                continue
            try:
                # One compiled pass per batch: records checked and written as a bundle.
                bundles = records_to_bundles(records, max_batch_size=max_batch)
            except InvalidRecord as exc:
                part.error, part.message = ErrorCode.INVALID_RECORD, str(exc)
                continue
            except ProtocolError as exc:
                part.error, part.message = ErrorCode.CORRUPT_MESSAGE, str(exc)
                continue
            part.start, part.count = len(plan.batches), len(bundles)
            plan.batches += [ProduceBatch(name, data.index, b) for b in bundles]
        plan.topics.append((name, parts))
    return plan


def produce_response(plan: ProducePlan, outcomes: list[ProduceOutcome]) -> ProduceResponse:
    """The answer once the backend reported ``outcomes`` (of ``plan.batches``)."""
    topics = []
    for name, parts in plan.topics:
        answers = []
        for part in parts:
            base = -1
            error, message = part.error, part.message
            if not error:
                mine = outcomes[part.start:part.start + part.count]
                bad = next((o for o in mine if o.code is not ProduceCode.OK), None)
                if bad is not None:
                    error = _CODES.get(bad.code, ErrorCode.UNKNOWN_SERVER_ERROR)
                    message = bad.reason or None
                elif mine:
                    base = mine[0].first_seq - 1
                else:
                    base = -1
            answers.append(PartitionProduceResponse(index=part.index, error_code=error,
                                                    base_offset=base,
                                                    error_message=message))
        topics.append(TopicProduceResponse(name=name, partition_responses=answers))
    return ProduceResponse(responses=topics)


def all_ok(response: ProduceResponse) -> bool:
    """Whether every partition was appended."""
    return all(p.error_code == 0 for t in response.responses for p in t.partition_responses)
