"""Metadata: this one node (broker id 0) leads every partition of every topic.

An unknown topic is UNKNOWN_TOPIC_OR_PARTITION, unless the request allows creating it
(version 4 and later say so; earlier ones always do) and ``topics.auto_create`` does: it
is then created with the configured number of partitions and described at once. A
creation the store could not write (disk full, read-only, failing) is KAFKA_STORAGE_ERROR:
a fault of the server, which clients retry, not an unknown topic.
"""

from __future__ import annotations

from typing import Final

from gateway.auth.guard import ConnectionAccess
from gateway.auth.policy import Operation
from gateway.core.contract import Backend, TopicRefused
from protocols.kafka.records import (
    MetadataRequest,
    MetadataResponse,
    MetadataResponseBroker,
    MetadataResponsePartition,
    MetadataResponseTopic,
)
from protocols.kafka.types import ErrorCode
from protocols.topics import is_valid_topic_name

#: The one broker's id.
NODE_ID: Final = 0
#: The cluster id clients are told (Metadata version 2 and later).
CLUSTER_ID: Final = "figtank"


def _partitions(count: int) -> list[MetadataResponsePartition]:
    return [MetadataResponsePartition(error_code=0, partition_index=i, leader_id=NODE_ID,
                                      leader_epoch=0, replica_nodes=[NODE_ID],
                                      isr_nodes=[NODE_ID])
            for i in range(count)]


async def _describe(backend: Backend, name: str, may_create: bool) -> MetadataResponseTopic:
    infos = await backend.discover_partitions(name)
    if infos is None and may_create and backend.auto_create.allows(name):
        try:
            await backend.auto_create.create(name, backend.create_topic)
        except TopicRefused as exc:  # refused: answered as unknown, unless a store fault
            if exc.fault:
                return MetadataResponseTopic(error_code=ErrorCode.KAFKA_STORAGE_ERROR,
                                             name=name)
        infos = await backend.discover_partitions(name)
    if infos is None:
        code = (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if is_valid_topic_name(name)
                else ErrorCode.INVALID_TOPIC_EXCEPTION)
        return MetadataResponseTopic(error_code=code, name=name)
    return MetadataResponseTopic(error_code=0, name=name, partitions=_partitions(len(infos)))


async def metadata(backend: Backend, body: MetadataRequest, version: int,
                   advertised: tuple[str, int], access: ConnectionAccess) -> MetadataResponse:
    """The answer to a Metadata request ``body`` of ``version``."""
    topics: list[MetadataResponseTopic] = []
    if body.topics is None or (version == 0 and not body.topics):
        for info in await backend.discover_topics():
            if info.enabled and access.may_see(info.name):
                topics.append(MetadataResponseTopic(error_code=0, name=info.name,
                                                    partitions=_partitions(info.partitions)))
    else:
        allow = version < 4 or body.allow_auto_topic_creation
        for requested in body.topics:
            name = requested.name or ""
            if not access.open and not access.may_see(name):
                access.refused(name, "discover", "metadata", "topic_authorization_failed")
                topics.append(MetadataResponseTopic(
                    error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED, name=name))
                continue
            may_create = access.may(name, Operation.CREATE)
            described = await _describe(backend, name, allow and may_create)
            if (allow and not may_create and described.error_code
                    == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and backend.auto_create.allows(name)):
                access.refused(name, Operation.CREATE, "metadata", "unknown_topic_or_partition")
            topics.append(described)
    host, port = advertised
    return MetadataResponse(brokers=[MetadataResponseBroker(NODE_ID, host, port)],
                            cluster_id=CLUSTER_ID, controller_id=NODE_ID, topics=topics)
