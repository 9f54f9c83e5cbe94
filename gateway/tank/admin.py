"""Tank's admin requests answered from a :class:`~gateway.core.contract.Backend`.

Each function takes the decoded request and returns the response record. figtank is a
standalone broker: Status reports no cluster and DiscoverTopology answers ``0xFFFF``.
"""

from __future__ import annotations

from typing import TypeAlias

from gateway.core.contract import Backend
from protocols.tank.messages import (
    CreateTopicRequest,
    CreateTopicResponse,
    DiscoveredPartition,
    DiscoveredTopic,
    DiscoverPartitionsRequest,
    DiscoverPartitionsResponse,
    DiscoverTopicsRequest,
    DiscoverTopicsResponse,
    DiscoverTopologyRequest,
    DiscoverTopologyResponse,
    ReloadConfRequest,
    ReloadConfResponse,
    StatusRequest,
    StatusResponse,
)
from protocols.tank.types import ConsumeFlags, CreateTopicError
from protocols.wire import UINT64_MAX

#: The admin requests answered from the backend, and their responses.
AdminRequest: TypeAlias = (DiscoverPartitionsRequest | CreateTopicRequest | ReloadConfRequest
                           | StatusRequest | DiscoverTopicsRequest)
AdminResponse: TypeAlias = (DiscoverPartitionsResponse | CreateTopicResponse
                            | ReloadConfResponse | StatusResponse | DiscoverTopicsResponse)
#: Their types (what a session dispatches on).
ADMIN_REQUESTS: frozenset[type[AdminRequest]] = frozenset({
    DiscoverPartitionsRequest, CreateTopicRequest, ReloadConfRequest, StatusRequest,
    DiscoverTopicsRequest})


async def answer(backend: Backend, request: AdminRequest) -> AdminResponse:
    """The response to an admin request."""
    if type(request) is DiscoverPartitionsRequest:
        return await discover_partitions(backend, request)
    if type(request) is CreateTopicRequest:
        return await create_topic(backend, request)
    if type(request) is ReloadConfRequest:
        return await reload_conf(backend, request)
    if type(request) is StatusRequest:
        return await status(backend, request)
    assert type(request) is DiscoverTopicsRequest
    return await discover_topics(backend, request)


async def discover_partitions(backend: Backend, request: DiscoverPartitionsRequest
                              ) -> DiscoverPartitionsResponse:
    """Bounds of every partition, or of the listed ones in the order listed.

    The Tank broker aborts on a listed partition the topic does not have; here it is
    answered as a partition that cannot be served, reason 0xff (unknown partition).
    """
    infos = await backend.discover_partitions(request.topic)
    if infos is None:
        return DiscoverPartitionsResponse(request.request_id, request.topic, [])
    wanted = request.partitions if request.partitions else range(len(infos))
    partitions = []
    for index in wanted:
        if index >= len(infos):
            partitions.append(DiscoveredPartition(error=ConsumeFlags.UNKNOWN_PARTITION))
            continue
        info = infos[index]
        if info.first_available == info.high_water_mark == UINT64_MAX:
            partitions.append(DiscoveredPartition(error=ConsumeFlags.SYSTEM_FAULT))
        else:
            partitions.append(DiscoveredPartition(info.first_available, info.high_water_mark))
    return DiscoverPartitionsResponse(request.request_id, request.topic, partitions)


async def create_topic(backend: Backend, request: CreateTopicRequest) -> CreateTopicResponse:
    """Create a topic; the config is Tank's ``key=value`` text (bad UTF-8: bad config)."""
    try:
        config = bytes(request.config).decode()
    except UnicodeDecodeError:
        code: int = CreateTopicError.INVALID_CONFIG
    else:
        code = await backend.create_topic(request.topic, request.partitions, config)
    return CreateTopicResponse(request.request_id, request.topic, int(code))


async def reload_conf(backend: Backend, request: ReloadConfRequest) -> ReloadConfResponse:
    code = await backend.reload_conf(request.topic, request.partition)
    return ReloadConfResponse(request.request_id, request.topic, request.partition, int(code))


async def status(backend: Backend, request: StatusRequest) -> StatusResponse:
    s = await backend.status()
    return StatusResponse(request.request_id, 0, 0, s.topics, s.partitions, None,
                          s.open_partitions, s.open_time_ms, s.startup_ts, s.version)


async def discover_topics(backend: Backend, request: DiscoverTopicsRequest
                          ) -> DiscoverTopicsResponse:
    topics = await backend.discover_topics()
    return DiscoverTopicsResponse(request.request_id, [
        DiscoveredTopic(t.name, t.enabled, t.partitions) for t in topics])


def discover_topology(request: DiscoverTopologyRequest) -> DiscoverTopologyResponse:
    """A standalone broker: ``u16 0xFFFF``."""
    return DiscoverTopologyResponse(request.request_id, None)
