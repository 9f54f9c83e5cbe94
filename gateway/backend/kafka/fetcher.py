"""One Fetch of one partition from its leader, its records turned into Tank bundles.

What the tail feeds (:mod:`gateway.backend.kafka.feeds`) and the reads away from the tail
(:mod:`gateway.backend.kafka.history`) share: the request, the leader routing, and the
conversion of the answer's record batches into bundles in one compiled call
(:func:`~protocols.kafka.upstream_codec.record_batches_to_bundles`): a whole fetched
run, not a record at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from gateway.backend.kafka.cluster import MAIN, STALE_METADATA, Cluster
from gateway.backend.kafka.wire import BrokerLost, error_name
from protocols.errors import ProtocolError
from protocols.kafka.records import FetchPartition, FetchRequest, FetchTopic
from protocols.kafka.types import ApiKey, ErrorCode
from protocols.kafka.upstream_codec import UpstreamBundle, record_batches_to_bundles

#: The max wait of a fetch that is not to wait: 1 ms, not 0 (Tansu answers a Fetch with a
#: max wait of 0 without any partition, data there or not).
NO_WAIT_MS: Final = 1
#: Read uncommitted: every record the leader has (a gateway does not filter aborted
#: transactions; figtank's own producers are not transactional).
_READ_UNCOMMITTED: Final = 0


@dataclass(slots=True)
class Fetched:
    """What one fetch found: bundles from the offset asked, or an error (Kafka's name and
    text); the partition's bounds as the leader told them (Kafka offsets)."""

    bundles: list[UpstreamBundle] = field(default_factory=list)
    #: The offset to fetch next.
    next_offset: int = 0
    high_watermark: int = -1
    log_start_offset: int = -1
    error: tuple[str, str] | None = None
    #: The broker's error code behind ``error`` (0 when the error is the gateway's own:
    #: a batch it could not read or map).
    error_code: int = 0


async def fetch_partition(cluster: Cluster, topic: str, partition: int, offset: int, *,
                          max_wait_ms: int, max_bytes: int, after_seq: int | None,
                          timeout: float, lane: str = MAIN, convert: bool = True
                          ) -> Fetched:
    """Fetch ``topic``/``partition`` from ``offset`` (waiting up to ``max_wait_ms`` for a
    first record) on the connection of ``lane`` (a long poll holds back what follows it
    on its connection). :class:`BrokerLost` when the leader can not be asked; a stale
    leader is forgotten (the next fetch asks the metadata) and reported as the error.
    ``convert=False``: the bounds only, the records left as they came."""
    connection = await cluster.leader(topic, partition, lane)
    answer = await connection.call(ApiKey.FETCH, FetchRequest(
        replica_id=-1, max_wait_ms=max_wait_ms, min_bytes=1, max_bytes=max_bytes,
        isolation_level=_READ_UNCOMMITTED, session_id=0, session_epoch=-1,
        topics=[FetchTopic(topic=topic, partitions=[FetchPartition(
            partition=partition, fetch_offset=offset, partition_max_bytes=max_bytes)])]),
        timeout=timeout + max_wait_ms / 1000)
    if answer.error_code:
        return Fetched(next_offset=offset, error=(error_name(answer.error_code), "fetch"),
                       error_code=answer.error_code)
    found = [p for t in answer.responses if t.topic == topic for p in t.partitions
             if p.partition_index == partition]
    if not found:
        raise BrokerLost(f"the answer to a fetch of {topic}/{partition} lacks it")
    data = found[0]
    result = Fetched(next_offset=offset, high_watermark=data.high_watermark,
                     log_start_offset=data.log_start_offset)
    if data.error_code:
        if data.error_code in STALE_METADATA and \
                data.error_code != ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            cluster.forget(topic, partition)
        result.error = (error_name(data.error_code), f"fetch of {topic}/{partition}")
        result.error_code = data.error_code
        return result
    if not data.records or not convert:
        return result
    try:
        got = record_batches_to_bundles(data.records, from_offset=offset, after_seq=after_seq)
    except ProtocolError as exc:
        result.error = ("CORRUPT_MESSAGE", f"{topic}/{partition} at {offset}: {exc}")
        return result
    result.bundles = got.bundles
    result.next_offset = got.next_offset
    if got.error is not None:
        result.error = ("INVALID_RECORD", f"a record Tank can not hold: {got.error}")
    return result
