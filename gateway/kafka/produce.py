"""Produce: each record batch becomes one Tank bundle (:mod:`protocols.kafka.bundles`).

A partition's batches are decoded here (Kafka's CRC, codecs and record layout) and
re-encoded as bundles; a batch a Tank message can not hold (a key over 255 bytes,
headers, a null value, transactional or control batches) refuses its partition with
INVALID_RECORD (87) and the reason as the error message, one over
``store.max_bundle_bytes`` with MESSAGE_TOO_LARGE (10), an older message format (magic 0
or 1) with UNSUPPORTED_VERSION (35), a codec not known with UNSUPPORTED_COMPRESSION_TYPE
(76), a corrupt one with CORRUPT_MESSAGE (2); nothing of a refused partition is
appended. The answer's base offset is the first appended sequence - 1.

A batch with a producer id (an idempotent producer's) must be its partition's only batch
(as Kafka requires) and passes the sequence checks of :mod:`gateway.kafka.idempotence`
when the request is planned: refused, appended, or answered as the batch it retries once
that one has its outcome (:meth:`ProducePlan.when_answerable`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from gateway.auth.guard import ConnectionAccess
from gateway.auth.policy import Operation
from gateway.core.contract import ProduceBatch, ProduceCode, ProduceOutcome
from gateway.kafka.idempotence import BatchEntry, ProducerStates
from gateway.store.producers import ProducerBatch
from protocols.errors import ProtocolError
from protocols.kafka.batch import InvalidRecord, producer_stamps
from protocols.kafka.bundles import records_to_bundles
from protocols.kafka.records import (
    PartitionProduceResponse,
    ProduceRequest,
    ProduceResponse,
    TopicProduceResponse,
)
from protocols.kafka.types import ErrorCode
from protocols.tank.bundle import parse_bundle_header

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
    #: The idempotent batch: appended (``count`` 1) or a retry answered as ``entry``.
    entry: BatchEntry | None = None


@dataclass(slots=True)
class ProducePlan:
    """A Produce request turned into backend batches, and how to answer it."""

    batches: list[ProduceBatch] = field(default_factory=list)
    topics: list[tuple[str, list[_Part]]] = field(default_factory=list)
    #: Record bytes of the request (for the unacked budget).
    size: int = 0
    #: Partitions refused by the access policy, by topic.
    denied: set[str] = field(default_factory=set)
    #: The originals of the retried batches (answered once they are settled).
    retried: list[BatchEntry] = field(default_factory=list)

    def when_answerable(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once every retried batch's original has its outcome."""
        pending = [e for e in self.retried if not e.settled]
        if not pending:
            callback()
            return
        left = len(pending)

        def one_settled() -> None:
            nonlocal left
            left -= 1
            if not left:
                callback()

        for entry in pending:
            entry.when_settled(one_settled)


def plan_produce(body: ProduceRequest, access: ConnectionAccess, max_batch: int,
                 auto_create: bool = False,
                 producers: ProducerStates | None = None) -> ProducePlan:
    """Decode every partition's batches into bundles (ProtocolErrors of a batch refuse
    that partition only). A topic the principal may not publish to is refused with
    TOPIC_AUTHORIZATION_FAILED; one the backend would create (``auto_create``) but the
    principal may not, and not seen to exist (looked up first:
    :func:`gateway.serving.lookup.topics_to_look_up`), with UNKNOWN_TOPIC_OR_PARTITION, as
    a broker without auto-creation answers. With ``producers``, idempotent batches'
    sequences are checked (a refused request is planned without, so that it changes no
    state)."""
    plan = ProducePlan()
    for topic in body.topic_data:
        name = topic.name
        allowed = access.may(name, Operation.PUBLISH)
        code = ErrorCode.TOPIC_AUTHORIZATION_FAILED
        if not allowed:
            plan.denied.add(name)
            access.refused(name, Operation.PUBLISH, "produce", "topic_authorization_failed")
        elif access.must_look_up(name, auto_create):
            allowed = False
            code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            plan.denied.add(name)
            access.refused(name, Operation.CREATE, "produce", "unknown_topic_or_partition")
        parts = []
        for data in topic.partition_data:
            part = _Part(data.index)
            parts.append(part)
            records = data.records or b""
            plan.size += len(records)
            if not allowed:
                part.error = code
                continue
            try:
                # One compiled pass per batch: records checked and written as a bundle.
                bundles = records_to_bundles(records, max_batch_size=max_batch)
            except InvalidRecord as exc:
                part.error, part.message = ErrorCode.INVALID_RECORD, str(exc)
                continue
            except ProtocolError as exc:  # its Kafka code: MESSAGE_TOO_LARGE, ...
                part.error = exc.error_code or ErrorCode.CORRUPT_MESSAGE
                part.message = str(exc)
                continue
            stamps = producer_stamps(records) if producers is not None else []
            if producers is not None and any(b.producer_id >= 0 for b in stamps):
                if len(stamps) != 1:
                    part.error = ErrorCode.INVALID_RECORD
                    part.message = ("an idempotent producer's records must be one batch "
                                    "per partition")
                    continue
                stamp = stamps[0]
                verdict = producers.check(name, data.index, stamp.producer_id,
                                          stamp.producer_epoch, stamp.base_sequence,
                                          stamp.last_offset_delta)
                if verdict.error:
                    part.error, part.message = verdict.error, verdict.message
                    continue
                part.entry = verdict.entry
                if verdict.duplicate:
                    assert verdict.entry is not None
                    plan.retried.append(verdict.entry)
                    continue
            part.start, part.count = len(plan.batches), len(bundles)
            if part.entry is not None:  # one batch, one bundle: its stamp goes with it
                entry = part.entry
                producer = ProducerBatch(entry.key[2], stamp.producer_epoch,
                                         entry.first_seq, entry.last_seq)
                plan.batches += [ProduceBatch(name, data.index, b, producer=producer,
                                              info=parse_bundle_header(b)) for b in bundles]
            else:
                # The bundles were built here from checked records: their headers are
                # trusted (info), not the whole bundle validated again by the backend.
                plan.batches += [ProduceBatch(name, data.index, b, info=parse_bundle_header(b))
                                 for b in bundles]
        plan.topics.append((name, parts))
    return plan


def settle(plan: ProducePlan, outcomes: list[ProduceOutcome],
           producers: ProducerStates | None) -> None:
    """Give the idempotent batches appended by ``plan`` their outcome (retries of them
    wait for it); a failed one makes ``producers`` forget that producer's partition."""
    for _, parts in plan.topics:
        for part in parts:
            entry = part.entry
            if entry is None or entry.settled or part.error or not part.count:
                continue
            outcome = outcomes[part.start]
            if outcome.code is ProduceCode.OK:
                entry.settle(outcome.first_seq - 1, 0, None)
            else:
                if producers is not None:
                    producers.failed(entry)
                entry.settle(-1, outcome.kafka_error or _CODES.get(
                    outcome.code, ErrorCode.UNKNOWN_SERVER_ERROR),
                             outcome.reason or None)


def produce_response(plan: ProducePlan, outcomes: list[ProduceOutcome]) -> ProduceResponse:
    """The answer once the backend reported ``outcomes`` (of ``plan.batches``) and the
    retried batches' originals theirs."""
    topics = []
    for name, parts in plan.topics:
        answers = []
        for part in parts:
            base = -1
            error, message = part.error, part.message
            if not error and part.entry is not None and not part.count:
                # A retry: the original's answer.
                entry = part.entry
                base, error, message = entry.base_offset, entry.error, entry.message
            elif not error:
                mine = outcomes[part.start:part.start + part.count]
                bad = next((o for o in mine if o.code is not ProduceCode.OK), None)
                if bad is not None:
                    error = bad.kafka_error or _CODES.get(bad.code,
                                                          ErrorCode.UNKNOWN_SERVER_ERROR)
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
