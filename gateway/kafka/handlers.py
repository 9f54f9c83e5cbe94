"""The Kafka requests answered by a handler task, by API key.

Every handler is ``async (ctx, body, version) -> response``: it runs in its own task of
the connection (:class:`~gateway.kafka.session.KafkaSession`), and its answer goes out in
request order. Produce and ApiVersions are answered by the session itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final

from gateway.kafka.admin import create_topics, describe_configs
from gateway.kafka.context import RequestContext
from gateway.kafka.coordinator import find_coordinator
from gateway.kafka.fetch import SharedFetch, fetch
from gateway.kafka.groups.commits import offset_commit, offset_delete, offset_fetch
from gateway.kafka.groups.handlers import (
    describe_groups,
    heartbeat,
    join_group,
    leave_group,
    list_groups,
    sync_group,
)
from gateway.kafka.idempotence import init_producer_id
from gateway.kafka.metadata import metadata
from gateway.kafka.offsets import list_offsets
from gateway.kafka.sasl import refuse_authenticate, refuse_handshake
from protocols.kafka.records import (
    CreateTopicsRequest,
    CreateTopicsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    FetchRequest,
    FetchResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    MetadataRequest,
    MetadataResponse,
)
from protocols.kafka.types import ApiKey, ErrorCode

#: A handler takes its API's request record and answers with its response record: the
#: table below holds every API's, so its type can only say Any of them.
Handler = Callable[[RequestContext, Any, int], Awaitable[Any]]


async def _metadata(ctx: RequestContext, body: MetadataRequest, version: int
                    ) -> MetadataResponse:
    return await metadata(ctx.backend, body, version, ctx.advertised, ctx.access)


async def _fetch(ctx: RequestContext, body: FetchRequest, version: int
                 ) -> FetchResponse | SharedFetch:
    return await fetch(ctx.backend, body, ctx.access, ctx.services.fetch_compression,
                       version)


async def _list_offsets(ctx: RequestContext, body: ListOffsetsRequest, version: int
                        ) -> ListOffsetsResponse:
    return await list_offsets(ctx.backend, body, ctx.access)


async def _create_topics(ctx: RequestContext, body: CreateTopicsRequest, version: int
                         ) -> CreateTopicsResponse:
    response = await create_topics(ctx.backend, body, ctx.access)
    refused = [(t.name, t.error_code, t.error_message)
               for t in response.topics if t.error_code]
    if refused:
        ctx.refused("kafka_create_topics_refused", topics=refused[:10],
                    validate_only=body.validate_only)
    return response


async def _describe_configs(ctx: RequestContext, body: DescribeConfigsRequest, version: int
                            ) -> DescribeConfigsResponse:
    return await describe_configs(ctx.backend, body, ctx.access)


async def _init_producer_id(ctx: RequestContext, body: InitProducerIdRequest, version: int
                            ) -> InitProducerIdResponse:
    issued: int | None = None
    if body.transactional_id is None:
        # In front of a Kafka cluster the cluster numbers producers, so that an id is
        # unique across every gateway a client may reconnect to.
        try:
            issued = await ctx.backend.issue_producer_id()
        except ConnectionError as exc:
            ctx.refused("kafka_init_producer_id_refused",
                        error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE, reason=str(exc))
            return InitProducerIdResponse(error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE,
                                          producer_id=-1, producer_epoch=-1)
    response = init_producer_id(ctx.producers, body.transactional_id, body.producer_id,
                                body.producer_epoch, issued=issued)
    if response.error_code:
        ctx.refused("kafka_init_producer_id_refused", error_code=response.error_code,
                    transactional_id=body.transactional_id,
                    reason="transactions are not served" if body.transactional_id
                    is not None else "producer id and epoch must both be given or -1")
    return response


#: The handler of each API key served by a task.
HANDLERS: Final[dict[int, Handler]] = {
    ApiKey.METADATA: _metadata,
    ApiKey.FETCH: _fetch,
    ApiKey.LIST_OFFSETS: _list_offsets,
    ApiKey.CREATE_TOPICS: _create_topics,
    ApiKey.DESCRIBE_CONFIGS: _describe_configs,
    ApiKey.FIND_COORDINATOR: find_coordinator,
    ApiKey.INIT_PRODUCER_ID: _init_producer_id,
    ApiKey.JOIN_GROUP: join_group,
    ApiKey.SYNC_GROUP: sync_group,
    ApiKey.HEARTBEAT: heartbeat,
    ApiKey.LEAVE_GROUP: leave_group,
    ApiKey.DESCRIBE_GROUPS: describe_groups,
    ApiKey.LIST_GROUPS: list_groups,
    ApiKey.OFFSET_COMMIT: offset_commit,
    ApiKey.OFFSET_FETCH: offset_fetch,
    ApiKey.OFFSET_DELETE: offset_delete,
    # Before authentication a SASL listener's session answers these itself.
    ApiKey.SASL_HANDSHAKE: refuse_handshake,
    ApiKey.SASL_AUTHENTICATE: refuse_authenticate,
}
