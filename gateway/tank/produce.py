"""Produce and ProduceWithSeqnum: requests to backend batches, outcomes to the response.

Bundles are not decoded here. The :class:`~gateway.core.contract.Backend` contract is that each
batch is validated before anything of it is appended and that a bad bundle fails only its
own batch; the embedded store does exactly that (a full ``validate_bundle`` walk), so a
second walk in the listener would double the CPU cost of every produce for nothing. A
malformed or oversized bundle comes back as I/O fault (code 2, which TANK 1 clients read
as "invalid request"), and nothing of it is appended.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, TypeAlias

from gateway.core.contract import ProduceBatch, ProduceCode, ProduceOutcome
from protocols.native import speedups
from protocols.tank.connection import frame
from protocols.tank.messages import (
    ProducePartition,
    ProducePartitionResult,
    ProduceRequest,
    ProduceResponse,
    ProduceTopicResult,
    ProduceWithSeqnumPartition,
    ProduceWithSeqnumRequest,
    encode_payload,
)
from protocols.tank.types import TOPIC_WIDE_PRODUCE_ERRORS, ProduceError

#: The two Produce requests (the second names the bundles' first sequence numbers).
AnyProduce: TypeAlias = ProduceRequest | ProduceWithSeqnumRequest


def produce_batches(request: AnyProduce) -> list[ProduceBatch]:
    """One :class:`ProduceBatch` per requested partition, in request order."""
    if type(request) is ProduceWithSeqnumRequest:
        return [ProduceBatch(topic.name, part.partition, part.bundle, part.first_seq_num or None)
                for topic in request.topics for part in topic.partitions]
    return [ProduceBatch(topic.name, part.partition, part.bundle)
            for topic in request.topics for part in topic.partitions]


def produce_response(request: AnyProduce, outcomes: Sequence[ProduceOutcome]) -> ProduceResponse:
    """The response to ``request`` from its batches' outcomes (in request order).

    A topic-wide code (unknown topic 0xff, read-only 0xfe) covers the whole topic on the
    wire. Should a topic get one for only some of its partitions (it was created or
    deleted between two of them), those partitions report unknown partition instead, so
    the other partitions' codes still reach the client.
    """
    results = []
    i = 0
    for topic in request.topics:
        parts: Sequence[ProducePartition | ProduceWithSeqnumPartition] = topic.partitions
        codes = _topic_codes([int(o.code) for o in outcomes[i:i + len(parts)]])
        i += len(parts)
        results.append(ProduceTopicResult(
            topic.name, [ProducePartitionResult(p.partition, c) for p, c in zip(parts, codes,
                                                                                strict=True)]))
    return ProduceResponse(request.request_id, results)


def _topic_codes(codes: list[int]) -> list[int]:
    if len(set(codes)) > 1 and any(c in TOPIC_WIDE_PRODUCE_ERRORS for c in codes):
        return [ProduceError.UNKNOWN_PARTITION if c in TOPIC_WIDE_PRODUCE_ERRORS else c
                for c in codes]
    return codes


def produce_response_frame_py(request_id: int, layout: Sequence[tuple[str, Sequence[int]]],
                              outcomes: Sequence[ProduceOutcome]) -> tuple[bytes, bool]:
    """The whole ProduceResponse frame for a
    :class:`~protocols.tank.scan.ProducePass` (its ``request_id`` and ``layout``) from its
    batches' outcomes (in request order), and whether every outcome is OK.

    The reference of ``protocols._speedups.tank_produce_response``; the codes follow
    :func:`produce_response`'s rule. ValueError for a count of outcomes that is not the
    count of partitions, or a code a Produce response cannot carry.
    """
    total = sum(len(partitions) for _, partitions in layout)
    if len(outcomes) != total:
        raise ValueError(f"{len(outcomes)} outcomes for the {total} partitions requested")
    codes = []
    for outcome in outcomes:
        code = int(outcome.code)
        if not 0 <= code <= 0xFF or code == ProduceError.OTHER_LEADER:
            raise ValueError(f"produce code {code} cannot be answered")
        codes.append(code)
    results = []
    i = 0
    for name, partitions in layout:
        mine = _topic_codes(codes[i:i + len(partitions)])
        i += len(partitions)
        results.append(ProduceTopicResult(
            name, [ProducePartitionResult(p, c) for p, c in zip(partitions, mine, strict=True)]))
    msg_id, payload = encode_payload(ProduceResponse(request_id, results))
    return frame(msg_id, payload), not any(codes)


#: The response builder in use: compiled when the extension is, else the reference.
produce_response_frame: Final = (
    produce_response_frame_py if speedups is None
    or not hasattr(speedups, "tank_produce_response") else speedups.tank_produce_response)


def all_ok(outcomes: Sequence[ProduceOutcome]) -> bool:
    return all(o.code is ProduceCode.OK for o in outcomes)
