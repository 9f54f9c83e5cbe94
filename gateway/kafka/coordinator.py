"""FindCoordinator: figtank is the one node, so it coordinates every consumer group.

Transactions are not served: a transactional id's lookup (key type 1) is answered
TRANSACTIONAL_ID_AUTHORIZATION_FAILED with a message saying so, which clients treat as
fatal and show (librdkafka: "Failed to find transaction coordinator: ... Transactional
Id authorization failed: figtank does not coordinate transactions"), not retried.

A group's lookup needs ``discover`` on the group when the access policy has group rules
(as Kafka's needs Group DESCRIBE): else GROUP_AUTHORIZATION_FAILED, which librdkafka
reports to the application and kafka-python raises.
"""

from __future__ import annotations

from gateway.auth.policy import Operation
from gateway.kafka.context import RequestContext
from gateway.kafka.groups.handlers import group_allowed
from gateway.kafka.metadata import NODE_ID
from protocols.kafka.records import Coordinator, FindCoordinatorRequest, FindCoordinatorResponse
from protocols.kafka.types import ErrorCode

#: What a transactional id's lookup is told.
NO_TRANSACTIONS = "figtank does not coordinate transactions"
#: FindCoordinator's key type of a transactional id.
TRANSACTION_KEY = 1


async def find_coordinator(ctx: RequestContext, body: FindCoordinatorRequest,
                           version: int) -> FindCoordinatorResponse:
    """The answer to a FindCoordinator request: this node, for one key (versions 0-3) or
    for each key asked (version 4 and later)."""
    if version < 4:
        code, message, node, host, port = _locate(ctx, body.key_type, body.key)
        return FindCoordinatorResponse(error_code=code, error_message=message, node_id=node,
                                       host=host, port=port)
    coordinators = []
    for key in body.coordinator_keys:
        code, message, node, host, port = _locate(ctx, body.key_type, key)
        coordinators.append(Coordinator(key=key, node_id=node, host=host, port=port,
                                        error_code=code, error_message=message))
    return FindCoordinatorResponse(coordinators=coordinators)


def _locate(ctx: RequestContext, key_type: int, key: str
            ) -> tuple[int, str | None, int, str, int]:
    """``(error code, message, node, host, port)`` answering the lookup of ``key``."""
    if key_type == TRANSACTION_KEY:
        return ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, NO_TRANSACTIONS, -1, "", -1
    if not group_allowed(ctx, key, Operation.DISCOVER, "find_coordinator"):
        return (ErrorCode.GROUP_AUTHORIZATION_FAILED, ctx.services.groups_refused, -1, "",
                -1)
    host, port = ctx.advertised
    return ErrorCode.NONE, None, NODE_ID, host, port
